//! The figures behind BENCHMARKS.md's "Failover": how many admissions a Redis Sentinel or Redis
//! Cluster failover loses under load, so that a key at its limit admits them again.
//!
//! Redis replicates asynchronously: an admission the master acknowledged may not have reached
//! the replica when the master dies, and the promoted replica no longer holds it. Each round
//! drives a fresh key from 64 tasks (one sliding log of `LIMIT` per minute, `fail_closed`, so a
//! request answered while no master serves is a denial and admits nothing), kills the master
//! with SIGKILL while admissions are flowing, keeps the load on until the key is at its limit on
//! the promoted replica, and counts every admission acknowledged in the window: over `LIMIT` is
//! what the failover lost and the key admitted again; under it, admissions Redis recorded whose
//! replies the kill lost. With a Sentinel, the old master then comes back as the new one's
//! replica (the Sentinel reconfigures it) for the next round; with `--cluster`, each round has a
//! cluster of its own (three masters, a replica each), whose master of the key's slot is killed.
//!
//! Starts its own redis-server processes (loopback).
//!
//!     cargo run --release -p slidegate --example failover_report --features redis [--cluster] [rounds]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use slidegate::{Backend, FailurePolicy, Limiter, Quota, RedisBackend, key_slot};
use slidegate_testkit::{RedisCluster, RedisSentinel, RedisServer, SENTINEL_SERVICE};

/// The key's limit per minute: more than a round's load admits before the kill.
const LIMIT: u64 = slidegate::MAX_LOG_LIMIT;
/// Requests in flight.
const TASKS: usize = 64;
/// How long the load runs before the master is killed.
const BEFORE_KILL: Duration = Duration::from_millis(300);
/// The most a round waits for the key to be at its limit again.
const ROUND_DEADLINE: Duration = Duration::from_secs(30);

/// Each call's deadline; a request past it is a denial (`fail_closed`).
const DEADLINE: Duration = Duration::from_millis(50);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cluster = args.iter().any(|a| a == "--cluster");
    let rounds: usize = args.iter().find(|a| !a.starts_with("--")).map_or(Ok(20), |n| n.parse())?;
    let ratios = if cluster { cluster_rounds(rounds).await? } else { sentinel_rounds(rounds).await? };
    summarize(ratios);
    Ok(())
}

/// `rounds` failovers of one Sentinel set-up: admitted ÷ limit of each.
async fn sentinel_rounds(rounds: usize) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let mut setup = RedisSentinel::start();
    let url = setup.sentinel_url();
    let backend = RedisBackend::connect_sentinel(&[url.as_str()], SENTINEL_SERVICE).await?.with_timeout(DEADLINE);
    let limiter = Arc::new(Limiter::new(backend).with_failure_policy(FailurePolicy::FailClosed));
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let key = format!("round-{round}");
        ratios.push(round_ratio(round, &limiter, &key, || setup.master.kill()).await);
        rejoin(&mut setup)?;
    }
    Ok(ratios)
}

/// `rounds` failovers, each of a cluster of its own: admitted ÷ limit of each.
async fn cluster_rounds(rounds: usize) -> Result<Vec<f64>, Box<dyn std::error::Error>> {
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let mut cluster = RedisCluster::start(3, 1);
        let urls = cluster.urls();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let backend = RedisBackend::connect_cluster(&urls).await?.with_timeout(DEADLINE);
        let limiter = Arc::new(Limiter::new(backend).with_failure_policy(FailurePolicy::FailClosed));
        let key = format!("round-{round}");
        let victim = cluster.master_of(key_slot(format!("slidegate:{key}"))).port();
        ratios.push(round_ratio(round, &limiter, &key, || cluster.kill(victim)).await);
    }
    Ok(ratios)
}

/// One round on a fresh `key`: admitted ÷ limit, printed.
async fn round_ratio<B: Backend + 'static>(
    round: usize,
    limiter: &Arc<Limiter<B>>,
    key: &str,
    kill: impl FnOnce(),
) -> f64 {
    let quota = Quota::per_minute(LIMIT).expect("a valid quota");
    let admitted = round_admitted(limiter, &quota, key, kill).await;
    let ratio = admitted as f64 / LIMIT as f64;
    println!("round {round:2}: {admitted} admitted in the window of a {LIMIT} limit: {ratio:.4}");
    ratio
}

fn summarize(mut ratios: Vec<f64>) {
    ratios.sort_by(f64::total_cmp);
    // Below 1: admissions Redis recorded whose replies the kill lost (their callers saw a denial).
    let lost: Vec<i64> = ratios.iter().map(|r| ((r - 1.0) * LIMIT as f64).round() as i64).collect();
    println!(
        "{} failovers: admitted ÷ limit median {:.4}, min {:.4}, max {:.4}; admitted over the limit: median {}, max {}",
        ratios.len(),
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
        lost[lost.len() / 2].max(0),
        lost[lost.len() - 1].max(0)
    );
}

/// What the load's tasks saw, in ms since the round began.
#[derive(Default)]
struct Seen {
    admitted: AtomicU64,
    last_admission: AtomicU64,
    /// The longest time between two admissions: after the kill, how long none came.
    longest_pause: AtomicU64,
    /// The last denial Redis itself decided (the key at its limit), not the policy.
    last_denial: AtomicU64,
}

/// The admissions acknowledged on `key` from a load that `kill` interrupts after
/// [`BEFORE_KILL`], counted until the promoted replica has denied the key (at its limit) and
/// admitted nothing for a second, or [`ROUND_DEADLINE`].
async fn round_admitted<B: Backend + 'static>(
    limiter: &Arc<Limiter<B>>,
    quota: &Quota,
    key: &str,
    kill: impl FnOnce(),
) -> u64 {
    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let ms = move || started.elapsed().as_millis() as u64;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (limiter, quota, key) = (Arc::clone(limiter), *quota, key.to_owned());
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match limiter.check(&key, &quota).await {
                        Ok(d) if d.allowed && d.degraded.is_none() => {
                            seen.admitted.fetch_add(1, Ordering::Relaxed);
                            let last = seen.last_admission.swap(ms(), Ordering::Relaxed);
                            seen.longest_pause.fetch_max(ms().saturating_sub(last), Ordering::Relaxed);
                        }
                        // Denied: at the limit, or no master (fail_closed); a denial costs no load.
                        Ok(d) => {
                            if d.degraded.is_none() {
                                seen.last_denial.store(ms(), Ordering::Relaxed);
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(BEFORE_KILL).await;
    let before = seen.admitted.load(Ordering::Relaxed);
    let killed_at = ms();
    kill();
    while ms() < ROUND_DEADLINE.as_millis() as u64 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let last = seen.last_admission.load(Ordering::Relaxed);
        if last > killed_at && seen.last_denial.load(Ordering::Relaxed) > last && ms() > last + 1_000 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let admitted = seen.admitted.load(Ordering::Relaxed);
    assert!(before < LIMIT, "the key reached its limit before the kill: nothing was in flight");
    println!(
        "  {before} admitted before the kill, {} after; the longest pause {} ms; {} ms from the kill",
        admitted - before,
        seen.longest_pause.load(Ordering::Relaxed),
        ms() - killed_at
    );
    admitted
}

/// Starts a replica of the promoted master in place of the killed one and returns once the
/// Sentinel counts it as a healthy replica, with `setup.master` the serving master again.
fn rejoin(setup: &mut RedisSentinel) -> Result<(), Box<dyn std::error::Error>> {
    let promoted = setup.master_port().ok_or("the Sentinel names no master")?;
    if promoted == setup.master.port() {
        return Err("the Sentinel did not fail over".into());
    }
    std::mem::swap(&mut setup.master, &mut setup.replica);
    setup.replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &promoted.to_string()]);
    let port = setup.replica.port().to_string();
    let mut sentinel =
        redis::Client::open(setup.sentinel_url())?.get_connection_with_timeout(Duration::from_secs(1))?;
    let started = Instant::now();
    loop {
        // Each replica as a flat list of field, value pairs.
        let replicas: Vec<Vec<String>> =
            redis::cmd("SENTINEL").arg("REPLICAS").arg(SENTINEL_SERVICE).query(&mut sentinel)?;
        let healthy = replicas.iter().any(|fields| {
            let field = |name: &str| fields.chunks(2).find(|p| p[0] == name).map(|p| p[1].as_str());
            field("port") == Some(port.as_str())
                && field("flags") == Some("slave")
                && field("master-link-status") == Some("ok")
        });
        if healthy {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err("the Sentinel did not take the new replica".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
