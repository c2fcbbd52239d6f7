//! The fleet's live instances, for [`crate::FailurePolicy::LocalAuto`]: each instance renews a
//! heartbeat in Redis — a member of one sorted set, `<prefix>:{rules}:fleet`, scored by when it
//! lapses — and reads back how many are live, which it records in the limiter's
//! [`crate::Fleet`]. `slidegate serve` and the Python package beat into the same set, so a
//! fleet of both counts as one.

use std::hash::{BuildHasher, RandomState};
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Script;
use redis::aio::ConnectionLike;

use super::RedisBackend;
use crate::Error;

/// How often an instance renews its heartbeat and counts the fleet.
pub const FLEET_BEAT: Duration = Duration::from_secs(1);

/// How long a heartbeat counts: an instance that stopped leaves the count within this.
pub const FLEET_LAPSE: Duration = Duration::from_secs(3);

static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("fleet.lua")));

/// The fleet's sorted set under `prefix`: in the shared store's slot (`{rules}`), beside no
/// limiter key (those are `<prefix>:<rule or inline>:…`).
pub fn fleet_key(prefix: &str) -> String {
    if prefix.is_empty() { "{rules}:fleet".to_owned() } else { format!("{prefix}:{{rules}}:fleet") }
}

/// A random id per process and call: two instances drawing the same one would count as one.
pub fn instance_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:016x}", RandomState::new().hash_one((std::process::id(), nanos)))
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Renews instance `id`'s heartbeat for `lapse` and counts the live instances, this one
    /// included, within the backend's deadline.
    pub async fn heartbeat(&self, id: &str, lapse: Duration) -> Result<u32, Error> {
        let mut invocation = HEARTBEAT.key(fleet_key(&self.config.prefix));
        invocation.arg(id).arg(u64::try_from(lapse.as_millis()).unwrap_or(u64::MAX));
        let mut conn = self.conn.clone();
        let live: u64 = self.deadline(async move { Ok(invocation.invoke_async(&mut conn).await?) }).await?;
        Ok(u32::try_from(live).unwrap_or(u32::MAX))
    }
}
