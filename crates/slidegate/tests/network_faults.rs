//! Network faults between the limiter and a real redis-server, made by the testkit's fault
//! proxy (`slidegate_testkit::FaultProxy`), on the Lua engine and on the module: latency under
//! and over the deadline, lost packets, a blackhole (partition), half-open connections and
//! resets. Every request must be answered within the deadline plus [`SLACK`], by Redis or by the
//! failure policy as it says; the circuit breaker must open and close; once healed, every load
//! task must decide from Redis again within [`BACK_WITHIN`] and a fresh key admit exactly its
//! limit; and a reply held by the network must never reach a later request. Each test writes
//! what it measured to stderr.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use slidegate::{Decision, FailurePolicy, Limiter, Quota, RedisBackend, RedisEngine};
use slidegate_testkit::{Direction, Fault, FaultProxy, RedisServer, TICK};

const DEADLINE: Duration = Duration::from_millis(50);

/// What a request may take past the deadline: scheduling delay on a shared 2-core machine
/// (the tokio timer, the proxy's threads), not the limiter's. Shorter than every fault that
/// holds a request here (a 300 ms round trip, partitions of 500 ms and more), so a request
/// that waited for the network instead of its deadline fails the bound.
const SLACK: Duration = Duration::from_millis(200);

/// How soon after the network heals every load task must be deciding from Redis again: past a
/// partition longer than the connection's one-second silence limit, a reconnect included.
const BACK_WITHIN: Duration = Duration::from_secs(1);

/// A quota large enough that the load never reaches it: decisions stay admissions, so a
/// misplaced denial shows.
fn roomy() -> Quota {
    Quota::per_minute(slidegate::MAX_LOG_LIMIT).expect("valid")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Lua,
    Module,
}

const ENGINES: [Engine; 2] = [Engine::Lua, Engine::Module];

/// A real Redis for `engine` and a fault proxy in front of it (in `Fault::Pass`).
fn redis(engine: Engine) -> (RedisServer, FaultProxy) {
    let server = match engine {
        Engine::Lua => RedisServer::start(),
        Engine::Module => RedisServer::start_with_module(&[]),
    };
    let proxy = FaultProxy::to_port(server.port());
    (server, proxy)
}

/// A limiter that reaches Redis only through `proxy`, its engine forced so the test knows which
/// code decides.
async fn limiter(proxy: &FaultProxy, engine: Engine, policy: FailurePolicy) -> Limiter<RedisBackend> {
    let engine = match engine {
        Engine::Lua => RedisEngine::Lua,
        Engine::Module => RedisEngine::Module,
    };
    let backend =
        RedisBackend::connect(&proxy.url()).await.expect("connect").with_engine(engine).with_timeout(DEADLINE);
    Limiter::new(backend).with_failure_policy(policy)
}

/// Sequential checks of a fresh key against a limit of 5: exactly 5 admitted, each by Redis.
async fn assert_exact(limiter: &Limiter<RedisBackend>, key: &str) {
    let quota = Quota::per_minute(5).expect("valid");
    let mut seen = Vec::new();
    for _ in 0..6 {
        let d = limiter.check(key, &quota).await.expect("answered");
        assert_eq!(d.degraded, None, "{key}: decided by Redis once healed: {d:?}");
        seen.push(d.allowed);
    }
    assert_eq!(seen, [true, true, true, true, true, false], "{key}: exactly the limit once healed");
}

/// One answer of the load, as its task saw it.
#[derive(Debug, Clone, Copy)]
struct Answer {
    task: usize,
    /// When the request started, from the run's start.
    at: Duration,
    took: Duration,
    /// `None`: an error reached the caller (no policy answered).
    decision: Option<(bool, Option<FailurePolicy>)>,
}

/// A run of the load through a fault: every answer and when the fault began and ended.
struct Run {
    answers: Vec<Answer>,
    fault_at: Duration,
    healed_at: Duration,
    /// The quota's limit.
    limit: u64,
}

const TASKS: usize = 8;

/// 8 tasks, each checking its own key `t<i>` every 2 ms until `stop`.
async fn load(limiter: Arc<Limiter<RedisBackend>>, quota: Quota, stop: Arc<AtomicBool>, start: Instant) -> Vec<Answer> {
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let result = limiter.check(&format!("t{task}"), &quota).await;
                    let decision = result.ok().map(|d: Decision| (d.allowed, d.degraded));
                    answers.push(Answer { task, at: t - start, took: t.elapsed(), decision });
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                answers
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("load task"));
    }
    all
}

/// Runs the load for 300 ms, then through `fault` for `hold`, then for a second healed.
async fn through(
    proxy: &FaultProxy,
    limiter: Limiter<RedisBackend>,
    quota: Quota,
    fault: Fault,
    hold: Duration,
) -> Run {
    let (stop, start) = (Arc::new(AtomicBool::new(false)), Instant::now());
    let running = tokio::spawn(load(Arc::new(limiter), quota, Arc::clone(&stop), start));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fault_at = start.elapsed();
    proxy.set(fault);
    tokio::time::sleep(hold).await;
    let healed_at = start.elapsed();
    proxy.set(Fault::Pass);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    Run { answers: running.await.expect("load"), fault_at, healed_at, limit: quota.limit() }
}

impl Run {
    fn slowest(&self) -> Duration {
        self.answers.iter().map(|a| a.took).max().unwrap_or_default()
    }

    fn errors(&self) -> usize {
        self.answers.iter().filter(|a| a.decision.is_none()).count()
    }

    /// The answers to requests made wholly inside the fault (begun a tick after it was set, so
    /// the proxy had seen it, and ended before the heal).
    fn inside(&self) -> impl Iterator<Item = &Answer> {
        self.answers.iter().filter(|a| a.at >= self.fault_at + TICK && a.at + a.took <= self.healed_at)
    }

    fn degraded(&self) -> impl Iterator<Item = (bool, FailurePolicy, usize)> + '_ {
        self.answers.iter().filter_map(|a| match a.decision {
            Some((allowed, Some(policy))) => Some((allowed, policy, a.task)),
            _ => None,
        })
    }

    /// How long after the heal the slowest task had its first decision from Redis; `None`
    /// when a task never had one.
    fn back_after(&self) -> Option<Duration> {
        (0..TASKS)
            .map(|task| {
                self.answers
                    .iter()
                    .find(|a| a.task == task && a.at >= self.healed_at && matches!(a.decision, Some((_, None))))
                    .map(|a| a.at + a.took - self.healed_at)
            })
            .try_fold(Duration::ZERO, |slowest, back| back.map(|b| slowest.max(b)))
    }

    /// The figures of BENCHMARKS.md's fault tables: inside the fault, decisions per second,
    /// the 99th percentile and the share answered by the policy; over the run (one window),
    /// the most admitted on one key ÷ the limit.
    fn report(&self, name: &str) {
        let mut inside: Vec<_> = self.inside().collect();
        inside.sort_by_key(|a| a.took);
        let p99 = inside.get(inside.len() * 99 / 100).map(|a| a.took).unwrap_or_default();
        let degraded = inside.iter().filter(|a| matches!(a.decision, Some((_, Some(_))))).count();
        let per_second = inside.len() as f64 / (self.healed_at - self.fault_at).as_secs_f64();
        let most = (0..TASKS)
            .map(|task| self.answers.iter().filter(|a| a.task == task && matches!(a.decision, Some((true, _)))).count())
            .max()
            .unwrap_or_default();
        let _ = writeln!(
            std::io::stderr(),
            "network fault {name}: inside {per_second:.0} decisions/s, p99 {p99:?}, degraded {:.0} %; most admitted on a key {:.1} x the limit; \
             answered {}, errors {}, slowest {:?}, every task from Redis again after {:?}",
            100.0 * degraded as f64 / inside.len().max(1) as f64,
            most as f64 / self.limit as f64,
            self.answers.len(),
            self.errors(),
            self.slowest(),
            self.back_after()
        );
    }

    /// What every run must show: each request answered in time by a decision, every request
    /// inside the fault answered by the policy (when the fault lets nothing through), and every
    /// task back on Redis soon after the heal.
    fn assert_answered_in_time_and_back(&self, name: &str, nothing_passes: bool) {
        self.report(name);
        assert_eq!(self.errors(), 0, "{name}: the policy answers every failure");
        assert!(self.slowest() <= DEADLINE + SLACK, "{name}: slowest {:?}", self.slowest());
        let inside: Vec<_> = self.inside().collect();
        assert!(!inside.is_empty(), "{name}: requests were made inside the fault");
        if nothing_passes {
            let from_redis = inside.iter().filter(|a| matches!(a.decision, Some((_, None)))).count();
            assert_eq!(from_redis, 0, "{name}: nothing reached Redis and came back, yet {from_redis} decisions did");
        }
        let back = self.back_after().unwrap_or_else(|| panic!("{name}: every task decides from Redis again"));
        assert!(back <= BACK_WITHIN, "{name}: every task back after {back:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackhole_is_answered_in_time_by_each_policy_and_healed_exactly() {
    // Ten per minute per key, half of it locally: the local fallback's count is exact.
    let quota = Quota::per_minute(10).expect("valid");
    let policies = [FailurePolicy::FailOpen, FailurePolicy::FailClosed, FailurePolicy::local(0.5).expect("valid")];
    // The policies are applied above the engine: each on the Lua engine, the module once.
    let cases = policies.map(|p| (Engine::Lua, p)).into_iter().chain([(Engine::Module, FailurePolicy::FailClosed)]);
    for (engine, policy) in cases {
        let (_server, proxy) = redis(engine);
        let name = format!("blackhole 1.2 s, {engine:?}, {policy}");
        // Longer than the connection's silence limit (1 s): the client must give the
        // connection up and connect again once healed.
        let run = through(
            &proxy,
            limiter(&proxy, engine, policy).await,
            quota,
            Fault::Blackhole,
            Duration::from_millis(1_200),
        )
        .await;
        run.assert_answered_in_time_and_back(&name, true);
        let degraded: Vec<_> = run.degraded().collect();
        assert!(degraded.iter().all(|&(_, p, _)| p == policy), "{name}: answered by {policy}");
        match policy {
            FailurePolicy::FailOpen => assert!(degraded.iter().all(|d| d.0), "{name}: fail_open admits"),
            FailurePolicy::FailClosed => assert!(degraded.iter().all(|d| !d.0), "{name}: fail_closed denies"),
            _ => {
                for task in 0..TASKS {
                    let asked = degraded.iter().filter(|d| d.2 == task).count();
                    let admitted = degraded.iter().filter(|d| d.2 == task && d.0).count();
                    // Half of 10: exactly 5 once a key was asked more often than that.
                    assert!(admitted <= 5 && (asked <= 5 || admitted == 5), "{name}: t{task} {admitted} of {asked}");
                }
            }
        }
        assert!(proxy.accepted() >= 2, "{name}: the silent connection was replaced");
        let limiter = limiter(&proxy, engine, policy).await;
        assert_exact(&limiter, "healed").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_held_by_a_partition_never_reach_a_later_request() {
    for engine in ENGINES {
        // Shorter than the connection's one-second silence limit, the held replies arrive on
        // the same connection while later requests wait behind them; longer, the client has
        // replaced the connection by the heal.
        for (hold, same_connection) in [(Duration::from_millis(400), true), (Duration::from_millis(1_400), false)] {
            let (_server, proxy) = redis(engine);
            let limiter = Arc::new(limiter(&proxy, engine, FailurePolicy::FailClosed).await);
            let (spent, fresh) = (Quota::per_minute(1).expect("valid"), Quota::per_minute(3).expect("valid"));
            assert!(limiter.check("a", &spent).await.expect("check").allowed);
            proxy.set(Fault::Blackhole);
            // 32 checks of `a` in flight, each a denial if Redis ever answers it.
            let in_flight: Vec<_> = (0..32)
                .map(|_| {
                    let limiter = Arc::clone(&limiter);
                    tokio::spawn(async move { limiter.check("a", &spent).await })
                })
                .collect();
            for t in in_flight {
                let d = t.await.expect("task").expect("the policy answers");
                assert_eq!((d.allowed, d.degraded), (false, Some(FailurePolicy::FailClosed)));
            }
            tokio::time::sleep(hold.saturating_sub(DEADLINE)).await;
            proxy.set(Fault::Pass);
            // `b` at once, on the same connection with a deadline no loaded machine misses: a
            // held denial of `a` handed to one of these shows as a denial or a wrong count.
            let patient = Limiter::new(limiter.backend().clone().with_timeout(Duration::from_secs(2)));
            let mut b = Vec::new();
            for _ in 0..4 {
                let d = patient.check("b", &fresh).await.expect("answered");
                b.push((d.allowed, d.remaining, d.degraded));
            }
            let name = format!("{engine:?}, partition of {hold:?}");
            let connections = proxy.accepted();
            let _ = writeln!(
                std::io::stderr(),
                "network fault held replies, {name}: b saw {b:?}, connections {connections}"
            );
            let expected = [(true, 2, None), (true, 1, None), (true, 0, None), (false, 0, None)];
            assert_eq!(b, expected, "{name}: b's own answers, from Redis");
            assert_eq!(connections == 1, same_connection, "{name}: {connections} connections");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_under_the_deadline_is_exact_and_over_it_the_policy_answers_in_time() {
    for engine in ENGINES {
        let (_server, proxy) = redis(engine);
        let limiter = limiter(&proxy, engine, FailurePolicy::FailClosed).await;
        // A 20 ms round trip (± 10 ms), under the 50 ms deadline: Redis decides, exactly.
        proxy.set(Fault::Latency { delay: Duration::from_millis(10), jitter: Duration::from_millis(5) });
        assert_exact(&limiter, "slow").await;
        // A 300 ms round trip: every call misses its deadline and fail_closed answers, in time.
        proxy.set(Fault::Latency { delay: Duration::from_millis(150), jitter: Duration::from_millis(20) });
        let mut slowest = Duration::ZERO;
        for _ in 0..5 {
            let t = Instant::now();
            let d = limiter.check("late", &roomy()).await.expect("the policy answers");
            slowest = slowest.max(t.elapsed());
            assert_eq!((d.allowed, d.degraded), (false, Some(FailurePolicy::FailClosed)), "{engine:?}");
        }
        let _ = writeln!(std::io::stderr(), "network fault latency 150 ms one way, {engine:?}: slowest {slowest:?}");
        assert!(slowest <= DEADLINE + SLACK, "{engine:?}: slowest {slowest:?}");
        proxy.set(Fault::Pass);
        // What the slow network carries still arrives late (a chunk never overtakes the one
        // before it): past one slow round trip, the connection is fast again.
        tokio::time::sleep(Duration::from_millis(2 * 170)).await;
        assert_exact(&limiter, "healed").await;
    }
}

/// The load under fail_open on `engine` through `fault` for `hold`: what every run must show,
/// every policy answer an admission, and a fresh key exact after the heal. Returns the run and
/// the proxy for the test's own checks.
async fn fail_open_through(
    engine: Engine,
    name: &str,
    fault: Fault,
    hold: Duration,
    nothing_passes: bool,
) -> (Run, FaultProxy) {
    let (_server, proxy) = redis(engine);
    let limiter = limiter(&proxy, engine, FailurePolicy::FailOpen).await;
    let run = through(&proxy, limiter, roomy(), fault, hold).await;
    run.assert_answered_in_time_and_back(name, nothing_passes);
    assert!(run.degraded().all(|(allowed, _, _)| allowed), "{name}: fail_open admits");
    assert_exact(&limiter_on(&proxy, engine).await, "healed").await;
    (run, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_packets_cost_the_requests_they_hold_up_the_deadline_and_no_more() {
    for engine in ENGINES {
        let name = format!("loss 2 %, {engine:?}");
        let fault = Fault::Loss { ratio: 0.02, retransmit: Duration::from_millis(200) };
        let (run, _) = fail_open_through(engine, &name, fault, Duration::from_secs(1), false).await;
        // Some requests got through the loss and some were held past their deadline.
        let inside: Vec<_> = run.inside().collect();
        let degraded = inside.iter().filter(|a| matches!(a.decision, Some((_, Some(_))))).count();
        assert!(degraded > 0 && degraded < inside.len(), "{name}: {degraded} of {} degraded", inside.len());
    }
}

/// A fail_closed limiter through `proxy`: for the checks a test makes after a fault.
async fn limiter_on(proxy: &FaultProxy, engine: Engine) -> Limiter<RedisBackend> {
    limiter(proxy, engine, FailurePolicy::FailClosed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_answers_in_time_and_a_check_it_lost_still_counts() {
    for engine in ENGINES {
        for open in [Direction::ToServer, Direction::ToClient] {
            let (_server, proxy) = redis(engine);
            let limiter = limiter_on(&proxy, engine).await;
            let quota = Quota::per_minute(5).expect("valid");
            proxy.set(Fault::HalfOpen(open));
            for _ in 0..3 {
                let t = Instant::now();
                let d = limiter.check("h", &quota).await.expect("the policy answers");
                assert!(t.elapsed() <= DEADLINE + SLACK, "{engine:?}, {open:?}: took {:?}", t.elapsed());
                assert_eq!((d.allowed, d.degraded), (false, Some(FailurePolicy::FailClosed)));
            }
            proxy.set(Fault::Pass);
            // The three checks reached Redis (at once, or held and sent on the heal) and were
            // admitted there though their callers were denied: two admissions are left, never
            // more. A network that loses replies costs a key admissions; it never adds any.
            let patient = Limiter::new(limiter.backend().clone().with_timeout(Duration::from_secs(2)));
            let mut seen = Vec::new();
            for _ in 0..3 {
                let d = patient.check("h", &quota).await.expect("answered");
                assert_eq!(d.degraded, None);
                seen.push(d.allowed);
            }
            let _ =
                writeln!(std::io::stderr(), "network fault half-open {open:?}, {engine:?}: after the heal {seen:?}");
            assert_eq!(seen, [true, true, false], "{engine:?}, {open:?}: the unanswered checks counted once");
            assert_exact(&limiter, "healed").await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_under_load_are_answered_in_time_and_the_client_connects_again() {
    for engine in ENGINES {
        let name = format!("reset 600 ms, {engine:?}");
        let (_, proxy) = fail_open_through(engine, &name, Fault::Reset, Duration::from_millis(600), true).await;
        // Reset connections fail at once, not at the deadline: the client kept trying.
        assert!(proxy.accepted() > 2, "{name}: reconnected {} times", proxy.accepted());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_opens_in_a_partition_and_closes_once_healed() {
    for engine in ENGINES {
        let (_server, proxy) = redis(engine);
        let open_for = Duration::from_millis(200);
        let limiter = limiter_on(&proxy, engine).await.with_circuit_breaker(3, open_for);
        let quota = roomy();
        proxy.set(Fault::Blackhole);
        let mut waits = Vec::new();
        for _ in 0..6 {
            let t = Instant::now();
            let d = limiter.check("k", &quota).await.expect("the policy answers");
            waits.push(t.elapsed());
            assert_eq!((d.allowed, d.degraded), (false, Some(FailurePolicy::FailClosed)));
        }
        let _ = writeln!(std::io::stderr(), "network fault breaker in a blackhole, {engine:?}: waits {waits:?}");
        // Closed, each of the first three waits its deadline; open, none waits for the network.
        assert!(waits[..3].iter().all(|w| *w >= DEADLINE - Duration::from_millis(5)), "{engine:?}: {waits:?}");
        assert!(waits.iter().all(|w| *w <= DEADLINE + SLACK), "{engine:?}: {waits:?}");
        assert!(limiter.circuit_open(), "{engine:?}: open after three failures");
        assert!(waits[3..].iter().all(|w| *w < DEADLINE / 2), "{engine:?}: open answers without waiting: {waits:?}");
        proxy.set(Fault::Pass);
        let healed = Instant::now();
        loop {
            tokio::time::sleep(open_for / 4).await;
            let d = limiter.check("k", &quota).await.expect("answered");
            if d.degraded.is_none() {
                break;
            }
            assert!(healed.elapsed() < open_for + BACK_WITHIN, "{engine:?}: the circuit stayed open after the heal");
        }
        assert!(!limiter.circuit_open(), "{engine:?}: closed by the probe's success");
        assert_exact(&limiter, "healed").await;
    }
}
