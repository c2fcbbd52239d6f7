//! The running service's shared state: the limiter and the live configuration, swapped whole
//! on reload.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

use ::metrics::Histogram;
use slidegate::Limiter;
use tracing::{info, warn};

use crate::backend::AnyBackend;
use crate::config::{BackendConfig, Config, ConfigError, INLINE_RULE, Rules};
use crate::metrics::{self, DecisionCounters};

/// What a reload may change: the rules and the admin token. The backend is fixed at start.
#[derive(Debug)]
pub struct Live {
    /// The active rules.
    pub rules: Rules,
    /// The admin token of the key endpoints.
    pub admin_token: Option<String>,
    /// Decision counters by rule name, inline checks under [`INLINE_RULE`].
    counters: HashMap<String, DecisionCounters>,
}

impl Live {
    fn new(rules: Rules, admin_token: Option<String>) -> Self {
        let counters = rules
            .iter()
            .map(|r| r.name.as_str())
            .chain([INLINE_RULE])
            .map(|name| (name.to_owned(), DecisionCounters::new(name)))
            .collect();
        Self { rules, admin_token, counters }
    }

    /// The decision counters of `rule` (a rule of these rules, or the inline one).
    pub fn counters(&self, rule: &str) -> Option<&DecisionCounters> {
        self.counters.get(rule)
    }
}

/// Shared by every request. Readers take an `Arc` of the live configuration under a read lock
/// held for a pointer copy, so a reload never waits on a request and no request sees half a
/// reload.
#[derive(Debug)]
pub struct App {
    /// Decides.
    pub limiter: Limiter<AnyBackend>,
    live: RwLock<Arc<Live>>,
    config_path: Option<PathBuf>,
    backend_config: BackendConfig,
    backend_seconds: Histogram,
}

impl App {
    /// Connects the backend `config` names and builds the state.
    pub async fn start(config: Config, config_path: Option<PathBuf>) -> Result<Self, slidegate::Error> {
        let backend = AnyBackend::connect(&config.backend).await?;
        // Install the recorder before the first decision, or its counts would be lost.
        let _ = metrics::handle();
        ::metrics::gauge!(metrics::RULES).set(config.rules.len() as f64);
        Ok(Self {
            backend_seconds: ::metrics::histogram!(metrics::BACKEND_SECONDS, "backend" => backend.name()),
            limiter: backend.limiter(&config.backend),
            live: RwLock::new(Arc::new(Live::new(config.rules, config.admin_token))),
            config_path,
            backend_config: config.backend,
        })
    }

    /// The configuration in force now.
    pub fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs one backend call, recording its duration.
    pub async fn timed<T>(&self, call: impl Future<Output = T>) -> T {
        let started = std::time::Instant::now();
        let out = call.await;
        self.backend_seconds.record(started.elapsed().as_secs_f64());
        out
    }

    /// The rules file, when the service has one.
    pub fn config_path(&self) -> Option<&PathBuf> {
        self.config_path.as_ref()
    }

    /// Reads the rules file again and, if it is valid, puts it in force for the next request.
    /// An invalid file changes nothing.
    pub fn reload(&self) -> Result<usize, ConfigError> {
        let Some(path) = &self.config_path else {
            return Ok(self.live().rules.len());
        };
        let result = Config::load(path);
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        ::metrics::counter!(metrics::RELOADS, "result" => outcome).increment(1);
        let config = result?;
        if config.backend != self.backend_config {
            warn!(path = %path.display(), "backend settings changed in the rules file; they apply at the next start");
        }
        let rules = config.rules.len();
        ::metrics::gauge!(metrics::RULES).set(rules as f64);
        *self.live.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Live::new(config.rules, config.admin_token));
        info!(path = %path.display(), rules, "rules reloaded");
        Ok(rules)
    }
}
