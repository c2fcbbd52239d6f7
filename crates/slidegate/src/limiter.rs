//! The front door: validates input once, then asks the backend.

use crate::{Backend, Check, Decision, Error, KeyState, MemoryBackend, MultiDecision, Quota};

/// The most checks one multi-limit check may hold.
pub const MAX_CHECKS: usize = 16;

/// The longest key accepted, in bytes. Keys are data: they are hashed in memory and passed to
/// Redis only as `KEYS`, never spliced into script text, so any bytes of valid UTF-8 are fine.
pub const MAX_KEY_LEN: usize = 512;

/// Decides for keys over a backend. Cheap to clone when the backend is (both built-in ones are).
///
/// ```
/// use slidegate::{Limiter, Quota};
///
/// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// # rt.block_on(async {
/// let limiter = Limiter::in_memory();
/// let sms = Quota::per_minute(5)?;
/// let d = limiter.check("+15550100", &sms).await?;
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 4);
/// // A bulk send of 5 more does not fit; nothing is charged.
/// let d = limiter.check_cost("+15550100", &sms, 5).await?;
/// assert!(!d.allowed);
/// assert_eq!(d.remaining, 4);
/// # Ok::<(), slidegate::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct Limiter<B = MemoryBackend> {
    backend: B,
}

impl Limiter<MemoryBackend> {
    /// A limiter on the embedded memory backend: nothing to install.
    pub fn in_memory() -> Self {
        Self::new(MemoryBackend::new())
    }
}

impl<B: Backend> Limiter<B> {
    /// A limiter over `backend`.
    pub fn new(backend: B) -> Self {
        Self { backend }
    }

    /// Decides one permit of `quota` for `key`.
    pub async fn check(&self, key: &str, quota: &Quota) -> Result<Decision, Error> {
        self.check_cost(key, quota, 1).await
    }

    /// Decides `cost` permits of `quota` for `key` at once (a bulk send of 50 SMS costs 50).
    pub async fn check_cost(&self, key: &str, quota: &Quota, cost: u64) -> Result<Decision, Error> {
        validate_key(key)?;
        quota.validate_cost(cost)?;
        self.backend.check(key, quota, cost).await
    }

    /// Decides several limits together, all or nothing, in one backend round trip: "10 per
    /// second AND 1,000 per day for the user AND 100 per minute for the IP". When any check
    /// does not fit, nothing is charged anywhere and [`MultiDecision::denied_by`] names it.
    pub async fn check_all(&self, checks: &[Check<'_>]) -> Result<MultiDecision, Error> {
        if checks.is_empty() || checks.len() > MAX_CHECKS {
            return Err(Error::CheckCount { count: checks.len() });
        }
        for (i, c) in checks.iter().enumerate() {
            validate_key(c.key)?;
            c.quota.validate_cost(c.cost)?;
            if checks[..i].iter().any(|earlier| earlier.key == c.key) {
                return Err(Error::DuplicateKey { key: c.key.to_owned() });
            }
        }
        self.backend.check_all(checks).await
    }

    /// What `key` holds under `quota` now, without changing it.
    pub async fn inspect(&self, key: &str, quota: &Quota) -> Result<KeyState, Error> {
        validate_key(key)?;
        self.backend.inspect(key, quota).await
    }

    /// Forgets every admission of `key`.
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        validate_key(key)?;
        self.backend.reset(key).await
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }
}

/// Checks that `key` is a key the limiter accepts: non-empty, at most [`MAX_KEY_LEN`] bytes.
pub fn validate_key(key: &str) -> Result<(), Error> {
    match key.len() {
        0 => Err(Error::EmptyKey),
        len if len > MAX_KEY_LEN => Err(Error::KeyTooLong { len }),
        _ => Ok(()),
    }
}
