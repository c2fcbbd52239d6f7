//! The running service's shared state: the limiter and the live configuration, swapped whole
//! on reload. Beside it: `decide` (one decision as every surface takes it).

mod decide;

pub(crate) use decide::{count_decision, decide_one, rule_named};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use ::metrics::Histogram;
use slidegate::{FailurePolicy, Limiter};
use tracing::instrument::{Instrument, Instrumented};
use tracing::{info, warn};

use crate::admin::AdminToken;
use crate::backend::AnyBackend;
use crate::config::{BackendConfig, Config, ConfigError, ForwardAuthConfig, INLINE_RULE, Rules, Source, UiConfig};
use crate::envoy::{EnvoyConfig, EnvoyConfigError, EnvoyOptions};
use crate::inline::InlineConfig;
use crate::metrics::{self, DecisionCounters, Timed};
use crate::overrides::Overrides;
use crate::shared_store::{self, Shared, StoreError};
use crate::stats::{Stats, Traffic};

/// What a reload may change: the rules, the admin token and the inline bounds. The backend and
/// the HTTP listener's limits are fixed at start.
#[derive(Debug)]
pub struct Live {
    /// The active rules.
    pub rules: Rules,
    /// The admin routes' token; `None`: the admin routes are disabled.
    pub admin_token: Option<AdminToken>,
    /// Whether inline checks are served, and their bounds.
    pub inline: InlineConfig,
    /// Whether the dashboard and `/v1/stats` are served, and to whom (the rules file's, also
    /// with the rules from Redis).
    pub ui: UiConfig,
    /// Whose word on a forward-auth client's address is believed (the rules file's, also with
    /// the rules from Redis).
    pub forward_auth: ForwardAuthConfig,
    /// What each rule's decisions are counted in, by rule name, inline checks under
    /// [`INLINE_RULE`]: one lookup per decision.
    counters: HashMap<String, Counted>,
}

/// What one rule's decisions are counted in.
#[derive(Debug)]
pub struct Counted {
    /// Its Prometheus counters.
    pub decisions: DecisionCounters,
    /// Its traffic on the dashboard (`None` when `[ui] enabled = false`).
    pub traffic: Option<Arc<Traffic>>,
}

impl Live {
    pub(crate) fn new(config: Config) -> Self {
        let admin_token = config.admin_token.as_deref().map(AdminToken::new);
        Self::of(config.rules, admin_token, config.inline, (config.ui, config.forward_auth))
    }

    /// These rules and inline bounds, with the rules file's `local` settings: `[ui]` and
    /// `[forward_auth]`.
    fn of(
        rules: Rules,
        admin_token: Option<AdminToken>,
        inline: InlineConfig,
        local: (UiConfig, ForwardAuthConfig),
    ) -> Self {
        let counters = rules
            .iter()
            .map(|r| r.name.as_str())
            .chain([INLINE_RULE])
            .map(|name| (name.to_owned(), Counted { decisions: DecisionCounters::new(name), traffic: None }))
            .collect();
        let (ui, forward_auth) = local;
        Self { rules, admin_token, inline, ui, forward_auth, counters }
    }

    /// This configuration with its rules' traffic from `stats`, which forgets removed rules'.
    fn tracked(mut self, stats: &Stats) -> Self {
        let mut traffic = stats.track_rules(self.counters.keys().map(String::as_str), self.ui.enabled);
        for (name, counted) in &mut self.counters {
            counted.traffic = traffic.remove(name);
        }
        self
    }

    /// What the decisions of `rule` (a rule of these rules, or the inline one) are counted in.
    pub fn counters(&self, rule: &str) -> Option<&Counted> {
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
    envoy: RwLock<Arc<EnvoyConfig>>,
    envoy_dir: Option<PathBuf>,
    envoy_options: EnvoyOptions,
    source: Source,
    backend_config: BackendConfig,
    backend_seconds: Histogram,
    /// The per-key overrides in force.
    pub overrides: Overrides,
    shared: Option<Shared>,
    /// Serializes changes of the live configuration (the rules file's, Redis' rules), each
    /// built from the one in force.
    changing: Mutex<()>,
    /// The dashboard's live traffic.
    pub stats: Stats,
}

impl App {
    /// Connects the backend `config` names, loads the Envoy configuration directory (when
    /// given) and builds the state; a reload reads `source` again.
    pub async fn start(config: Config, source: Source) -> Result<Self, StartError> {
        // Install the recorder before the first count, or it would be lost.
        let _ = metrics::handle();
        let envoy = match &config.envoy_config {
            Some(dir) => load_envoy(dir, config.envoy.merge_domains)?,
            None => EnvoyConfig::default(),
        };
        let backend = AnyBackend::connect(&config.backend).await?;
        let shared = Shared::connect(&config).await?;
        if config.rules_from_redis && shared.is_none() {
            return Err(StartError::RulesFromRedisWithoutRedis);
        }
        let overrides = Overrides::new(config.max_overrides);
        ::metrics::gauge!(metrics::RULES).set(config.rules.len() as f64);
        let (envoy_dir, envoy_options) = (config.envoy_config.clone(), config.envoy.clone());
        let backend_config = config.backend.clone();
        let stats = Stats::default();
        stats.track_domains(envoy.domains(), config.ui.enabled);
        Ok(Self {
            backend_seconds: ::metrics::histogram!(metrics::BACKEND_SECONDS, "backend" => backend.name()),
            limiter: backend.limiter(&config.backend),
            live: RwLock::new(Arc::new(Live::new(config).tracked(&stats))),
            envoy: RwLock::new(Arc::new(envoy)),
            envoy_dir,
            envoy_options,
            source,
            backend_config,
            overrides,
            shared,
            changing: Mutex::new(()),
            stats,
        })
    }

    /// Whether some failure policy in force divides by the fleet (`local_share = "auto"`): the
    /// backend's default or a rule's.
    pub fn counts_fleet(&self) -> bool {
        let auto = |p: Option<FailurePolicy>| matches!(p, Some(FailurePolicy::LocalAuto { .. }));
        auto(Some(self.backend_config.failure_policy))
            || self.live().rules.iter().any(|r| auto(r.quota.failure_policy()))
    }

    /// The rules and overrides shared through Redis, on a Redis backend.
    pub fn shared(&self) -> Option<&Shared> {
        self.shared.as_ref()
    }

    /// Puts `rules` and `inline` in force, keeping the admin token: the rules shared through
    /// Redis. Returns the configuration they replace.
    pub(crate) fn put_shared_rules(&self, rules: Rules, inline: InlineConfig) -> Arc<Live> {
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.live();
        ::metrics::gauge!(metrics::RULES).set(rules.len() as f64);
        let local = (old.ui, old.forward_auth.clone());
        let live = Arc::new(Live::of(rules, old.admin_token.clone(), inline, local).tracked(&self.stats));
        *self.live.write().unwrap_or_else(PoisonError::into_inner) = live;
        old
    }

    /// The configuration in force now.
    pub fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The Envoy configuration in force now.
    pub fn envoy(&self) -> Arc<EnvoyConfig> {
        Arc::clone(&self.envoy.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The Envoy service's settings.
    pub fn envoy_options(&self) -> &EnvoyOptions {
        &self.envoy_options
    }

    /// The Envoy configuration directory, when the service has one.
    pub fn envoy_dir(&self) -> Option<&PathBuf> {
        self.envoy_dir.as_ref()
    }

    /// Reads the Envoy configuration directory again and, if every file is valid, puts it in
    /// force. An invalid file changes nothing.
    pub fn reload_envoy(&self) -> Result<usize, EnvoyConfigError> {
        let Some(dir) = &self.envoy_dir else { return Ok(0) };
        let result = load_envoy(dir, self.envoy_options.merge_domains);
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        ::metrics::counter!(metrics::RELOADS, "result" => outcome, "file" => "envoy").increment(1);
        let config = result?;
        let domains = config.len();
        self.stats.track_domains(config.domains(), self.live().ui.enabled);
        *self.envoy.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
        info!(dir = %dir.display(), domains, "envoy configuration reloaded");
        Ok(domains)
    }

    /// Runs one backend call, recording its duration, in a span of its own (a child of the
    /// decision's, when traces are exported).
    pub fn timed<F: Future>(&self, call: F) -> Instrumented<Timed<F, &Histogram>> {
        Timed::new(&self.backend_seconds, call).instrument(crate::trace::backend(self.limiter.backend().engine()))
    }

    /// The time that latencies are measured by: one clock for every histogram and the dashboard,
    /// read from the processor's counter where it can be (a few instructions, not a system call).
    pub fn now(&self) -> quanta::Instant {
        self.stats.now()
    }

    /// The rules file, when the service has one.
    pub fn config_path(&self) -> Option<&PathBuf> {
        self.source.path.as_ref()
    }

    /// Reads the rules file again and, if it is valid, puts it in force for the next request.
    /// An invalid file changes nothing.
    pub fn reload(&self) -> Result<usize, ConfigError> {
        let Some(path) = &self.source.path else {
            return Ok(self.live().rules.len());
        };
        let from_redis = self.shared.as_ref().is_some_and(Shared::rules_from_redis);
        let result = self.source.load().and_then(|c| shared_store::check_local(c, from_redis, path));
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        ::metrics::counter!(metrics::RELOADS, "result" => outcome, "file" => "rules").increment(1);
        let config = result?;
        if config.backend != self.backend_config {
            warn!(path = %path.display(), "backend settings changed in the rules file; they apply at the next start");
        }
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.live();
        if old.admin_token.is_some() != config.admin_token.is_some() {
            warn!(path = %path.display(), "{}", admin_state(config.admin_token.is_some()));
        }
        let admin_token = config.admin_token.as_deref().map(AdminToken::new);
        // With the rules from Redis, the file holds the admin token only.
        if config.ui.enabled != old.ui.enabled {
            self.stats.track_domains(self.envoy().domains(), config.ui.enabled);
        }
        let live = if from_redis {
            Live::of(old.rules.clone(), admin_token, old.inline.clone(), (config.ui, config.forward_auth))
        } else {
            Live::of(config.rules, admin_token, config.inline, (config.ui, config.forward_auth))
        };
        let live = live.tracked(&self.stats);
        let rules = live.rules.len();
        ::metrics::gauge!(metrics::RULES).set(rules as f64);
        *self.live.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(live);
        info!(path = %path.display(), rules, "rules reloaded");
        Ok(rules)
    }
}

/// Loads the Envoy configuration directory, counting the load as envoyproxy/ratelimit does and
/// logging each warning (a field accepted but not read as written).
fn load_envoy(dir: &std::path::Path, merge_domains: bool) -> Result<EnvoyConfig, EnvoyConfigError> {
    let result = EnvoyConfig::load_dir(dir, merge_domains);
    let counter = if result.is_ok() { metrics::ENVOY_CONFIG_LOAD_SUCCESS } else { metrics::ENVOY_CONFIG_LOAD_ERROR };
    ::metrics::counter!(counter).increment(1);
    for warning in result.iter().flat_map(EnvoyConfig::warnings) {
        warn!("envoy configuration: {warning}");
    }
    result
}

/// The log line that says whether the admin routes are served.
pub fn admin_state(token_set: bool) -> &'static str {
    if token_set {
        "admin routes enabled (admin_token is set)"
    } else {
        "admin routes disabled: no admin_token in the rules file, /v1/keys/* answer 403 admin_disabled"
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The backend could not be reached.
    #[error(transparent)]
    Backend(#[from] slidegate::Error),
    /// The Envoy configuration directory is invalid.
    #[error(transparent)]
    Envoy(#[from] EnvoyConfigError),
    /// The shared rules and overrides could not be read from Redis.
    #[error("shared rules and overrides: {0}")]
    Shared(#[from] StoreError),
    /// `rules_from_redis` without a Redis backend.
    #[error("rules_from_redis needs a Redis backend (--redis, --redis-cluster or --redis-sentinel)")]
    RulesFromRedisWithoutRedis,
}
