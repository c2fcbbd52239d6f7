//! `slidegate.Limiter`: the core's limiter, on memory or on Redis, for sync and asyncio
//! callers. A sync call releases the GIL while it waits; an async call is a future on the
//! binding's tokio runtime that resolves the asyncio future from there, so the event loop never
//! blocks.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyString;
use slidegate::memory::DEFAULT_MAX_KEYS;
use slidegate::redis::{DEFAULT_PREFIX, DEFAULT_TIMEOUT, FLEET_BEAT, FLEET_LAPSE, instance_id};
use slidegate::{Check, FailurePolicy, Limiter as CoreLimiter, MAX_CHECKS, MemoryBackend, RedisBackend, RedisEngine};

use crate::answer::{Charged, Decision, KeyState, MultiDecision, Refunded};
use crate::args::{CheckArgs, RawCheck, read_item, rule_key};
use crate::engine::{Engine, on_limiter, runtime};
use crate::error::{invalid, to_py};

/// The most Redis URLs one limiter takes (Cluster seed nodes, Sentinels).
pub(crate) const MAX_URLS: usize = 64;

/// The longest deadline a Redis call may be given.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Decides for keys, in this process or on Redis.
#[pyclass(frozen, module = "slidegate")]
pub(crate) struct Limiter {
    engine: Arc<Engine>,
    backend: &'static str,
}

#[pymethods]
impl Limiter {
    /// A limiter on the embedded memory backend holding at most `max_keys` keys.
    #[staticmethod]
    #[pyo3(signature = (max_keys = DEFAULT_MAX_KEYS))]
    fn in_memory(max_keys: usize) -> PyResult<Self> {
        if max_keys == 0 {
            return Err(invalid("max_keys must be at least 1".into()));
        }
        let limiter = CoreLimiter::new(MemoryBackend::new().with_max_keys(max_keys));
        Ok(Self { engine: Arc::new(Engine::Memory(limiter)), backend: "memory" })
    }

    /// A limiter on Redis: `url` (a `redis://` or `rediss://` URL), a list of Cluster nodes
    /// with `cluster=True`, or a list of Sentinels with `sentinel_service`.
    #[staticmethod]
    #[pyo3(signature = (
        url, *, cluster = false, sentinel_service = None, prefix = DEFAULT_PREFIX.to_owned(), engine = "auto",
        timeout = DEFAULT_TIMEOUT.as_secs_f64(), failure_policy = None, local_share = None,
        local_share_fallback = None, near_cache = 0, cluster_slot_check = false,
    ))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each with its default
    fn redis(
        py: Python<'_>,
        url: &Bound<'_, PyAny>,
        cluster: bool,
        sentinel_service: Option<&str>,
        prefix: String,
        engine: &str,
        timeout: f64,
        failure_policy: Option<&str>,
        local_share: Option<&Bound<'_, PyAny>>,
        local_share_fallback: Option<f64>,
        near_cache: usize,
        cluster_slot_check: bool,
    ) -> PyResult<Self> {
        let urls = urls(url)?;
        if !cluster && sentinel_service.is_none() && urls.len() != 1 {
            let n = urls.len();
            return Err(invalid(format!(
                "a standalone Redis takes one URL, got {n}: pass cluster=True or sentinel_service"
            )));
        }
        let timeout = Duration::try_from_secs_f64(timeout).ok().filter(|t| !t.is_zero() && *t <= MAX_TIMEOUT);
        let timeout = timeout.ok_or_else(|| {
            invalid(format!("timeout must be more than 0 and at most {} s, got {timeout:?}", MAX_TIMEOUT.as_secs()))
        })?;
        let options = Options {
            prefix,
            engine: engine.parse::<RedisEngine>().map_err(|e| to_py(&e))?,
            timeout,
            policy: policy(failure_policy, share(local_share)?, local_share_fallback)?,
            near_cache,
        };
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        let (engine, backend) = py
            .detach(|| {
                runtime().block_on(async {
                    Ok::<_, slidegate::Error>(if cluster {
                        let b =
                            RedisBackend::connect_cluster(&nodes).await?.with_cluster_slot_check(cluster_slot_check);
                        (Engine::Cluster(options.limiter(b)), "redis_cluster")
                    } else if let Some(service) = sentinel_service {
                        (
                            Engine::Sentinel(options.limiter(RedisBackend::connect_sentinel(&nodes, service).await?)),
                            "redis_sentinel",
                        )
                    } else {
                        (Engine::Redis(options.limiter(RedisBackend::connect(nodes[0]).await?)), "redis")
                    })
                })
            })
            .map_err(|e| to_py(&e))?;
        let engine = Arc::new(engine);
        if matches!(options.policy, Some(FailurePolicy::Local { .. } | FailurePolicy::LocalAuto { .. })) {
            runtime().spawn(write_back_while_used(Arc::downgrade(&engine)));
        }
        if matches!(options.policy, Some(FailurePolicy::LocalAuto { .. })) {
            runtime().spawn(count_the_fleet_while_used(Arc::downgrade(&engine)));
        }
        Ok(Self { engine, backend })
    }

    /// `memory`, `redis`, `redis_cluster` or `redis_sentinel`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend
    }

    /// What decides: `memory`, or on Redis `lua` or `module` (`auto` until Redis was asked).
    #[getter]
    fn engine(&self) -> &'static str {
        self.engine.name()
    }

    /// The fleet's live instances as last counted in Redis (`local_share="auto"`): what each
    /// limit is divided by while Redis is away; `None` before the first count, or without it.
    #[getter]
    fn fleet_instances(&self) -> Option<u32> {
        on_limiter!(&*self.engine, limiter => limiter.fleet().and_then(slidegate::Fleet::live))
    }

    /// Decides `cost` permits of `limit` per `window` for `key`, waiting without the GIL.
    #[pyo3(signature = (key, *, limit, window, cost = None, algorithm = "sliding_log", rule = None, burst = None, buckets = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each with its default
    fn check(
        &self,
        py: Python<'_>,
        key: &str,
        limit: &Bound<'_, PyAny>,
        window: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
        algorithm: &str,
        rule: Option<&str>,
        burst: Option<&Bound<'_, PyAny>>,
        buckets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Decision> {
        let a = RawCheck { key, limit, window, cost, algorithm, rule, burst, buckets }.read()?;
        let engine = &*self.engine;
        let d = py.detach(|| on_limiter!(engine, l => runtime().block_on(l.check_cost(&a.key, &a.quota, a.cost))));
        Ok(Decision::new(d.map_err(|e| to_py(&e))?, a.quota))
    }

    /// `check` as an awaitable: decided on the binding's runtime, the event loop never blocked.
    #[pyo3(signature = (key, *, limit, window, cost = None, algorithm = "sliding_log", rule = None, burst = None, buckets = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each with its default
    fn acheck<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        limit: &Bound<'py, PyAny>,
        window: &Bound<'py, PyAny>,
        cost: Option<&Bound<'py, PyAny>>,
        algorithm: &str,
        rule: Option<&str>,
        burst: Option<&Bound<'py, PyAny>>,
        buckets: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let a = RawCheck { key, limit, window, cost, algorithm, rule, burst, buckets }.read()?;
        let engine = Arc::clone(&self.engine);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let d = on_limiter!(&*engine, l => l.check_cost(&a.key, &a.quota, a.cost).await);
            Ok(Decision::new(d.map_err(|e| to_py(&e))?, a.quota))
        })
    }

    /// Decides several limits all or nothing: `checks` is a list of dicts of `check`'s
    /// arguments (at most `MAX_CHECKS`); when one does not fit, nothing is charged anywhere.
    fn check_all(&self, py: Python<'_>, checks: &Bound<'_, PyAny>) -> PyResult<MultiDecision> {
        let all = read_checks(checks)?;
        let engine = &*self.engine;
        let d = py.detach(|| on_limiter!(engine, l => runtime().block_on(l.check_all(&as_checks(&all)))));
        Ok(MultiDecision::new(d.map_err(|e| to_py(&e))?, all.into_iter().map(|a| a.quota).collect()))
    }

    /// `check_all` as an awaitable.
    fn acheck_all<'py>(&self, py: Python<'py>, checks: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let all = read_checks(checks)?;
        let engine = Arc::clone(&self.engine);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let d = on_limiter!(&*engine, l => l.check_all(&as_checks(&all)).await);
            Ok(MultiDecision::new(d.map_err(|e| to_py(&e))?, all.into_iter().map(|a| a.quota).collect()))
        })
    }

    /// Records `cost` permits for `key` whatever it holds (a cost known after the work, such as
    /// a response's tokens): never denied, clamped at twice the limit.
    #[pyo3(signature = (key, *, limit, window, cost, algorithm = "sliding_log", rule = None, burst = None, buckets = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each with its default
    fn charge(
        &self,
        py: Python<'_>,
        key: &str,
        limit: &Bound<'_, PyAny>,
        window: &Bound<'_, PyAny>,
        cost: &Bound<'_, PyAny>,
        algorithm: &str,
        rule: Option<&str>,
        burst: Option<&Bound<'_, PyAny>>,
        buckets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Charged> {
        let a = RawCheck { key, limit, window, cost: Some(cost), algorithm, rule, burst, buckets }.read()?;
        let engine = &*self.engine;
        let c = py.detach(|| on_limiter!(engine, l => runtime().block_on(l.charge(&a.key, &a.quota, a.cost))));
        Ok(Charged::new(c.map_err(|e| to_py(&e))?, a.quota))
    }

    /// `charge` as an awaitable.
    #[pyo3(signature = (key, *, limit, window, cost, algorithm = "sliding_log", rule = None, burst = None, buckets = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each with its default
    fn acharge<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        limit: &Bound<'py, PyAny>,
        window: &Bound<'py, PyAny>,
        cost: &Bound<'py, PyAny>,
        algorithm: &str,
        rule: Option<&str>,
        burst: Option<&Bound<'py, PyAny>>,
        buckets: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let a = RawCheck { key, limit, window, cost: Some(cost), algorithm, rule, burst, buckets }.read()?;
        let engine = Arc::clone(&self.engine);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let c = on_limiter!(&*engine, l => l.charge(&a.key, &a.quota, a.cost).await);
            Ok(Charged::new(c.map_err(|e| to_py(&e))?, a.quota))
        })
    }

    /// Gives back up to `cost` of `key`'s most recent admissions (an estimate that was too
    /// high); never below nothing.
    #[pyo3(signature = (key, *, limit, window, cost, algorithm = "sliding_log", rule = None, burst = None, buckets = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each with its default
    fn refund(
        &self,
        py: Python<'_>,
        key: &str,
        limit: &Bound<'_, PyAny>,
        window: &Bound<'_, PyAny>,
        cost: &Bound<'_, PyAny>,
        algorithm: &str,
        rule: Option<&str>,
        burst: Option<&Bound<'_, PyAny>>,
        buckets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Refunded> {
        let a = RawCheck { key, limit, window, cost: Some(cost), algorithm, rule, burst, buckets }.read()?;
        let engine = &*self.engine;
        let r = py.detach(|| on_limiter!(engine, l => runtime().block_on(l.refund(&a.key, &a.quota, a.cost))));
        Ok(Refunded::new(r.map_err(|e| to_py(&e))?, a.quota))
    }

    /// `refund` as an awaitable.
    #[pyo3(signature = (key, *, limit, window, cost, algorithm = "sliding_log", rule = None, burst = None, buckets = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each with its default
    fn arefund<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        limit: &Bound<'py, PyAny>,
        window: &Bound<'py, PyAny>,
        cost: &Bound<'py, PyAny>,
        algorithm: &str,
        rule: Option<&str>,
        burst: Option<&Bound<'py, PyAny>>,
        buckets: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let a = RawCheck { key, limit, window, cost: Some(cost), algorithm, rule, burst, buckets }.read()?;
        let engine = Arc::clone(&self.engine);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let r = on_limiter!(&*engine, l => l.refund(&a.key, &a.quota, a.cost).await);
            Ok(Refunded::new(r.map_err(|e| to_py(&e))?, a.quota))
        })
    }

    /// What `key` holds under this limit now, without changing it.
    #[pyo3(signature = (key, *, limit, window, algorithm = "sliding_log", rule = None, burst = None, buckets = None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, each with its default
    fn inspect(
        &self,
        py: Python<'_>,
        key: &str,
        limit: &Bound<'_, PyAny>,
        window: &Bound<'_, PyAny>,
        algorithm: &str,
        rule: Option<&str>,
        burst: Option<&Bound<'_, PyAny>>,
        buckets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<KeyState> {
        let a = RawCheck { key, limit, window, cost: None, algorithm, rule, burst, buckets }.read()?;
        let engine = &*self.engine;
        let state = py.detach(|| on_limiter!(engine, l => runtime().block_on(l.inspect(&a.key, &a.quota))));
        Ok(state.map_err(|e| to_py(&e))?.into())
    }

    /// Forgets every admission of `key` (under `rule`, when given), under every algorithm.
    #[pyo3(signature = (key, *, rule = None))]
    fn reset(&self, py: Python<'_>, key: &str, rule: Option<&str>) -> PyResult<()> {
        let key = rule_key(rule, key)?;
        let engine = &*self.engine;
        py.detach(|| on_limiter!(engine, l => runtime().block_on(l.reset(&key)))).map_err(|e| to_py(&e))
    }

    fn __repr__(&self) -> String {
        format!("Limiter(backend={:?}, engine={:?})", self.backend, self.engine.name())
    }
}

/// How often a limiter with a local failure policy looks for local admissions to write back.
const WRITE_BACK_EVERY: Duration = Duration::from_millis(250);

/// Writes into Redis, once it answers again, what the local policy admitted while it was away
/// ([`slidegate::Limiter::write_back`]), until the limiter is dropped.
async fn write_back_while_used(engine: std::sync::Weak<Engine>) {
    let mut tick = tokio::time::interval(WRITE_BACK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(engine) = engine.upgrade() else { return };
        on_limiter!(&*engine, limiter => if limiter.write_back_pending() > 0 {
            limiter.write_back().await;
        });
    }
}

/// Renews this limiter's heartbeat in Redis every [`FLEET_BEAT`] and records the fleet's live
/// instances it reads back (`local_share="auto"`), until the limiter is dropped; the last count
/// stands while Redis is away. The service beats into the same set: a fleet of both counts as one.
async fn count_the_fleet_while_used(engine: std::sync::Weak<Engine>) {
    async fn beat<C>(limiter: &CoreLimiter<RedisBackend<C>>, id: &str)
    where
        C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
    {
        if let (Some(fleet), Ok(live)) = (limiter.fleet(), limiter.backend().heartbeat(id, FLEET_LAPSE).await) {
            fleet.set_live(live);
        }
    }
    let id = instance_id();
    let mut tick = tokio::time::interval(FLEET_BEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(engine) = engine.upgrade() else { return };
        match &*engine {
            Engine::Memory(_) => return,
            Engine::Redis(limiter) => beat(limiter, &id).await,
            Engine::Cluster(limiter) => beat(limiter, &id).await,
            Engine::Sentinel(limiter) => beat(limiter, &id).await,
        }
    }
}

/// The checks of `check_all`, read after their number is checked against [`MAX_CHECKS`].
fn read_checks(checks: &Bound<'_, PyAny>) -> PyResult<Vec<CheckArgs>> {
    let n = checks.len().map_err(|_| invalid("check_all takes a list of dicts".into()))?;
    if n == 0 || n > MAX_CHECKS {
        return Err(invalid(format!("check_all needs 1 to {MAX_CHECKS} checks, got {n}")));
    }
    checks.try_iter()?.map(|item| read_item(&item?)).collect()
}

/// The core's checks over read arguments.
fn as_checks(all: &[CheckArgs]) -> Vec<Check<'_>> {
    all.iter().map(|a| Check::new(&a.key, a.quota).with_cost(a.cost)).collect()
}

/// What `Limiter.redis` sets on the backend and the limiter, whatever the kind of server.
struct Options {
    prefix: String,
    engine: RedisEngine,
    timeout: Duration,
    policy: Option<FailurePolicy>,
    near_cache: usize,
}

impl Options {
    /// The limiter over `backend` with these options.
    fn limiter<C>(&self, backend: RedisBackend<C>) -> CoreLimiter<RedisBackend<C>>
    where
        C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
    {
        let backend = backend.with_prefix(self.prefix.clone()).with_timeout(self.timeout).with_engine(self.engine);
        let limiter = CoreLimiter::new(backend);
        let limiter = match self.policy {
            Some(p @ (FailurePolicy::Local { .. } | FailurePolicy::LocalAuto { .. })) => {
                limiter.with_failure_policy(p).with_write_back()
            }
            Some(p) => limiter.with_failure_policy(p),
            None => limiter,
        };
        if self.near_cache > 0 { limiter.with_near_cache(self.near_cache) } else { limiter }
    }
}

/// The URLs of `Limiter.redis`: one, or a list of at most [`MAX_URLS`].
fn urls(url: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if url.is_instance_of::<PyString>() {
        return Ok(vec![url.extract()?]);
    }
    let n = url.len().map_err(|_| invalid("url must be a str or a list of str".into()))?;
    if n == 0 || n > MAX_URLS {
        return Err(invalid(format!("url must hold 1 to {MAX_URLS} URLs, got {n}")));
    }
    url.extract::<Vec<String>>().map_err(|_| invalid("url must be a str or a list of str".into()))
}

/// `local_share` as given: a share of each limit, or `"auto"` (the limit ÷ the fleet).
enum Share {
    Fixed(f64),
    Auto,
}

fn share(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Share>> {
    let Some(value) = value else { return Ok(None) };
    let wrong = || invalid(format!("local_share must be a number (0.001 to 1) or \"auto\", got {value}"));
    match value.extract::<String>() {
        Ok(s) if s == "auto" => Ok(Some(Share::Auto)),
        Ok(_) => Err(wrong()),
        Err(_) => value.extract::<f64>().map(|f| Some(Share::Fixed(f))).map_err(|_| wrong()),
    }
}

/// The failure policy by the name the service's configuration uses; `local` takes a share, or
/// `"auto"` with the share while the fleet has never been counted.
fn policy(name: Option<&str>, share: Option<Share>, fallback: Option<f64>) -> PyResult<Option<FailurePolicy>> {
    match (name, share, fallback) {
        (None, None, None) => Ok(None),
        (Some("fail_open"), None, None) => Ok(Some(FailurePolicy::FailOpen)),
        (Some("fail_closed"), None, None) => Ok(Some(FailurePolicy::FailClosed)),
        (Some("local"), Some(Share::Fixed(share)), None) => {
            FailurePolicy::local(share).map(Some).map_err(|e| to_py(&e))
        }
        (Some("local"), Some(Share::Auto), Some(fallback)) => {
            FailurePolicy::local_auto(fallback).map(Some).map_err(|e| to_py(&e))
        }
        (Some("local"), Some(Share::Auto), None) => Err(invalid(
            "local_share=\"auto\" needs local_share_fallback: the share while the fleet has never been counted (e.g. 0.25)"
                .into(),
        )),
        (Some("local"), None, _) => {
            Err(invalid("failure_policy=\"local\" needs local_share (0.001 to 1, or \"auto\")".into()))
        }
        (Some("local" | "fail_open" | "fail_closed") | None, _, Some(_)) => {
            Err(invalid("local_share_fallback applies to local_share=\"auto\" only".into()))
        }
        (Some("fail_open" | "fail_closed") | None, Some(_), None) => {
            Err(invalid("local_share applies to failure_policy=\"local\" only".into()))
        }
        (Some(other), ..) => {
            Err(invalid(format!("failure_policy must be fail_open, fail_closed or local, got {other:?}")))
        }
    }
}
