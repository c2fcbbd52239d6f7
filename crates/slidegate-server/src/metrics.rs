//! Prometheus metrics through the `metrics` facade: names live here, once, in one scheme —
//! `slidegate_<area>_<what>`, counters ending in `_total`, durations in seconds ending in
//! `_seconds`, labels in snake case.

use std::borrow::Borrow;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

pub mod held;

/// Decisions by rule and result (`allowed` / `denied`).
pub const DECISIONS: &str = "slidegate_decisions_total";
/// Backend calls that failed, by backend and error kind.
pub const BACKEND_ERRORS: &str = "slidegate_backend_errors_total";
/// Time of each backend call, by backend.
pub const BACKEND_SECONDS: &str = "slidegate_backend_call_seconds";
/// Time of each HTTP request, by route.
pub const HTTP_SECONDS: &str = "slidegate_http_request_seconds";
/// HTTP connections open now.
pub const HTTP_CONNECTIONS: &str = "slidegate_http_connections";
/// HTTP connections refused because `max_connections` were open.
pub const HTTP_CONNECTIONS_REFUSED: &str = "slidegate_http_connections_refused_total";
/// gRPC connections refused because `max_connections` were open.
pub const GRPC_CONNECTIONS_REFUSED: &str = "slidegate_grpc_connections_refused_total";
/// The number of active rules.
pub const RULES: &str = "slidegate_rules";
/// Reloads by `result` (`ok` / `failed`) and `file` (`rules`: the rules file; `envoy`: the
/// Envoy configuration directory; `redis`: the shared rules; `tls`: the listeners' certificate,
/// key and client CA).
pub const RELOADS: &str = "slidegate_config_reloads_total";
/// Configuration files refused before reading, by `file` (`rules`, `envoy`) and `reason`
/// (`not_a_file`: a FIFO, a device, a directory…; `too_large`).
pub const FILES_REFUSED: &str = "slidegate_config_files_refused_total";
/// Decisions a failure policy made because the backend could not, by rule and policy.
pub const DEGRADED: &str = "slidegate_degraded_decisions_total";
/// The causes of the decisions a failure policy made, by `kind` ([`failure_kind`]).
pub const POLICY_ANSWERS: &str = "slidegate_policy_answers_total";

/// The `kind` label of a backend failure: `timeout` (the deadline passed), `circuit_open`
/// (the breaker kept the backend from being called), `replicas_ack` (fewer replicas than
/// `replicas_ack` acknowledged an admission), `error` (anything else: a refused or lost
/// connection, a Redis that cannot serve).
pub fn failure_kind(error: &slidegate::Error) -> &'static str {
    use slidegate::Error as E;
    match error {
        E::Timeout(_) => "timeout",
        E::CircuitOpen => "circuit_open",
        E::ReplicasAck { .. } => "replicas_ack",
        _ => "error",
    }
}

/// 1 while the backend's circuit breaker is open (the backend is not being called).
pub const CIRCUIT_OPEN: &str = "slidegate_circuit_open";
/// Envoy descriptor hits, by `domain`, `key1` and `key2` (the exporter's labels of
/// envoyproxy/ratelimit's stats key: see `envoy::stats`), under envoyproxy/ratelimit's own
/// Prometheus names, which its users' dashboards graph.
pub const RATE_LIMIT_TOTAL_HITS: &str = "ratelimit_service_rate_limit_total_hits";
/// Envoy descriptor hits over the limit.
pub const RATE_LIMIT_OVER_LIMIT: &str = "ratelimit_service_rate_limit_over_limit";
/// Envoy descriptor hits past the near-limit ratio (`--envoy-near-limit-ratio`) of the limit.
pub const RATE_LIMIT_NEAR_LIMIT: &str = "ratelimit_service_rate_limit_near_limit";
/// Envoy descriptor hits within the limit.
pub const RATE_LIMIT_WITHIN_LIMIT: &str = "ratelimit_service_rate_limit_within_limit";
/// Envoy descriptor hits over a shadow-mode limit (answered OK).
pub const RATE_LIMIT_SHADOW_MODE: &str = "ratelimit_service_rate_limit_shadow_mode";
/// Envoy descriptors of a domain no file configures, by `domain` (bounded).
pub const ENVOY_DOMAIN_NOT_FOUND: &str = "ratelimit_service_rate_limit_domain_not_found";
/// Envoy configuration directory loads that succeeded (at start and on reload).
pub const ENVOY_CONFIG_LOAD_SUCCESS: &str = "ratelimit_service_config_load_success";
/// Envoy configuration directory loads that were refused.
pub const ENVOY_CONFIG_LOAD_ERROR: &str = "ratelimit_service_config_load_error";
/// gRPC calls, by `grpc_method` (`ShouldRateLimit`).
pub const GRPC_REQUESTS: &str = "ratelimit_service_total_requests";
/// Time of each gRPC call, by `grpc_method`.
pub const GRPC_SECONDS: &str = "ratelimit_service_response_time_seconds";
/// gRPC calls answered with an error, by `err_type` (`redis_error`: the backend failed;
/// `service_error`: the request was malformed).
pub const GRPC_ERRORS: &str = "ratelimit_service_should_rate_limit_error";
/// Requests over their limits answered OK because of the global shadow mode.
pub const ENVOY_GLOBAL_SHADOW_MODE: &str = "ratelimit_service_global_shadow_mode";
/// gRPC descriptors refused and not decided, by domain and reason (`too_many_descriptors`,
/// `too_many_entries`, `key_too_long`, `duplicate`, `rejected`).
pub const ENVOY_INVALID_DESCRIPTORS: &str = "slidegate_envoy_invalid_descriptors_total";
/// 1 for the code deciding now (`engine` = `memory`, `lua` or `module`), 0 for the others.
pub const ENGINE: &str = "slidegate_engine";
/// Keys the near-cache holds as denied.
pub const NEAR_CACHE_KEYS: &str = "slidegate_near_cache_keys";
/// 1 while the Redis that holds the shared rules and overrides cannot be reached: the instance
/// serves the last ones it had.
pub const SHARED_UNREACHABLE: &str = "slidegate_shared_unreachable";
/// Times everything shared was read again from Redis: at start, after Redis returns, after a
/// gap in the versions or an unreadable notice (those waiting are merged into one read).
pub const SHARED_RESYNCS: &str = "slidegate_shared_resyncs_total";
/// The fleet's live instances as last counted in Redis, while a policy has `local_share = "auto"`.
pub const FLEET_INSTANCES: &str = "slidegate_fleet_instances";
/// Permits a local failure policy admitted while Redis was away, by `outcome`: `written` into
/// Redis once it answered again, or `dropped` (out of their window by then, past a bound).
pub const WRITE_BACK_PERMITS: &str = "slidegate_write_back_permits_total";
/// Local admissions waiting to be written back into Redis.
pub const WRITE_BACK_PENDING: &str = "slidegate_write_back_pending";
/// The version of the rules from Redis in force (`--rules-from-redis`).
pub const RULES_VERSION: &str = "slidegate_rules_version";
/// Per-key overrides held.
pub const OVERRIDES: &str = "slidegate_overrides";
/// Override changes made through this instance, by `action` (`set`, `delete`, `lapse`).
pub const OVERRIDE_CHANGES: &str = "slidegate_override_changes_total";

/// How often the recorder's upkeep runs (the exporter's own default): it drains the samples
/// histograms collected since into their buckets, which a scrape does too; without it, a
/// histogram nobody scrapes keeps every sample it is given.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// A recorder as the service configures it: histograms (every `_seconds` family) in buckets
/// from 10 µs (memory) to seconds (a sick backend).
pub fn recorder() -> PrometheusRecorder {
    let buckets = [
        0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
        0.5, 1.0, 2.5,
    ];
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
        .expect("buckets are non-empty")
        .build_recorder()
}

/// Runs `handle`'s upkeep every `every` on a thread of its own, for as long as the process
/// lives (`install_recorder` leaves this to its caller; a thread keeps it independent of any
/// runtime).
pub fn spawn_upkeep(handle: PrometheusHandle, every: Duration) {
    let upkeep = move || {
        loop {
            std::thread::sleep(every);
            handle.run_upkeep();
        }
    };
    if let Err(e) = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(upkeep) {
        tracing::warn!("cannot start the metrics upkeep thread, histograms drain only when scraped: {e}");
    }
}

/// The process-wide recorder, installed on first use (the facade allows one per process), its
/// upkeep running.
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = recorder();
            let handle = recorder.handle();
            match metrics::set_global_recorder(recorder) {
                Ok(()) => {
                    spawn_upkeep(handle.clone(), UPKEEP_INTERVAL);
                    handle
                }
                // Another recorder is installed (an embedding application's): render an empty page.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

/// The failure policies' names, as [`slidegate::FailurePolicy::as_str`] gives them.
const POLICIES: [&str; 3] = ["fail_open", "fail_closed", "local"];

/// One rule's decision counters, made once per configuration so that counting is an atomic
/// add, not a label allocation and a registry lookup per request; [`held`], so that they leave
/// `/metrics` with the rule.
#[derive(Debug, Clone)]
pub struct DecisionCounters {
    allowed: Counter,
    denied: Counter,
    rule: String,
    /// By failure policy ([`POLICIES`]), from the rule's first such decision on.
    degraded: [OnceLock<Counter>; 3],
}

impl DecisionCounters {
    /// The counters of `rule`, those of the configuration before kept.
    pub fn new(rule: &str) -> Self {
        let of = |result: &str| held::counter(DECISIONS, &[("rule", rule.to_owned()), ("result", result.to_owned())]);
        let degraded = POLICIES.map(|policy| {
            let kept = held::existing(DEGRADED, &[("rule", rule.to_owned()), ("policy", policy.to_owned())]);
            kept.map_or_else(OnceLock::new, OnceLock::from)
        });
        Self { allowed: of("allowed"), denied: of("denied"), rule: rule.to_owned(), degraded }
    }

    /// Counts one decision.
    pub fn count(&self, allowed: bool) {
        if allowed { &self.allowed } else { &self.denied }.increment(1);
    }

    /// Counts one decision that `policy` made because the backend could not.
    pub fn count_degraded(&self, policy: slidegate::FailurePolicy) {
        let name = policy.as_str();
        let i = POLICIES.iter().position(|p| *p == name).unwrap_or(POLICIES.len() - 1);
        let labels = || [("rule", self.rule.clone()), ("policy", name.to_owned())];
        self.degraded[i].get_or_init(|| held::counter(DEGRADED, &labels())).increment(1);
    }
}

pin_project_lite::pin_project! {
    /// A future whose duration, from its making to its output, goes into a histogram (owned,
    /// or borrowed as `&Histogram`). A named future rather than an `async fn`, which would hold
    /// the future twice (as its argument and as what it awaits): a check's answer, boxed per
    /// request, stays small.
    pub struct Timed<F, H> {
        #[pin]
        inner: F,
        started: quanta::Instant,
        histogram: H,
    }
}

impl<F: Future, H: Borrow<Histogram>> Timed<F, H> {
    /// `inner`, timed into `histogram` from now on.
    pub fn new(histogram: H, inner: F) -> Self {
        Self { inner, started: quanta::Instant::now(), histogram }
    }
}

impl<F: Future, H: Borrow<Histogram>> Future for Timed<F, H> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let out = ready!(this.inner.poll(cx));
        Borrow::<Histogram>::borrow(this.histogram).record(this.started.elapsed().as_secs_f64());
        Poll::Ready(out)
    }
}
