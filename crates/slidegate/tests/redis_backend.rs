//! The Redis backend against real redis-server processes: script cache loss, expiry, writes,
//! uniqueness, exactness under concurrency from tasks and from processes, deadlines, bad input.
//! The exactness tests run twice: on the Lua scripts and on slidegate's Redis module.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use slidegate::{
    Algorithm, Check, Clock, Error, KeyTimeline, Limiter, MAX_CLOCK_MS, MAX_LIMIT, ManualClock, Quota, RedisBackend,
    RedisEngine, SystemClock, hash_tag,
};
use slidegate_testkit::RedisServer;

/// A backend with a generous deadline: these tests are about semantics on a busy 2-core CI
/// machine; the deadline itself has its own test.
async fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(&server.url()).await.expect("connect").with_timeout(Duration::from_secs(5))
}

async fn limiter(server: &RedisServer) -> Limiter<RedisBackend> {
    Limiter::new(backend(server).await)
}

/// A plain server for the Lua scripts and one with the module loaded, each with the engine that
/// must decide on it (forced, so that a test cannot pass on the other).
fn engines() -> [(RedisServer, RedisEngine); 2] {
    [(RedisServer::start(), RedisEngine::Lua), (RedisServer::start_with_module(&[]), RedisEngine::Module)]
}

async fn limiter_on(server: &RedisServer, engine: RedisEngine) -> Limiter<RedisBackend> {
    Limiter::new(backend(server).await.with_engine(engine))
}

fn quota(limit: u64, window_ms: u64) -> Quota {
    Quota::new(limit, Duration::from_millis(window_ms)).expect("valid quota")
}

#[tokio::test]
async fn time_comes_from_redis_by_default() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    let before: Vec<u64> = server.query(&["TIME"]);
    assert!(limiter.check("k", &quota(5, 60_000)).await.expect("check").allowed);
    let after: Vec<u64> = server.query(&["TIME"]);
    let ms = |t: &[u64]| t[0] * 1000 + t[1] / 1000;
    let entries: Vec<(String, u64)> = server.query(&["ZRANGE", "slidegate:k", "0", "-1", "WITHSCORES"]);
    assert_eq!(entries.len(), 1);
    assert!((ms(&before)..=ms(&after)).contains(&entries[0].1), "score {entries:?} not within Redis TIME");
    assert!(entries[0].0.starts_with(&format!("{}:", entries[0].1)), "member carries its time: {entries:?}");
    // A denial on Redis' clock: reset_after from the key's TTL, retry_after from the blocking entry.
    let q = quota(2, 60_000);
    limiter.check("k", &q).await.expect("second");
    let d = limiter.check("k", &q).await.expect("third");
    assert!(!d.allowed);
    let window = Duration::from_secs(60);
    let (reset, retry) = (d.reset_after, d.retry_after.expect("denied"));
    assert!(reset <= window && reset > window - Duration::from_secs(5), "{d:?}");
    assert!(retry <= reset && retry > window - Duration::from_secs(5), "{d:?}");
}

#[tokio::test]
async fn the_fixed_window_and_gcra_scripts_read_redis_time() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    let redis_ms = || {
        let t: Vec<u64> = server.query(&["TIME"]);
        t[0] * 1000 + t[1] / 1000
    };
    let minute = |a| Quota::per_minute(2).and_then(|q| q.with_algorithm(a)).expect("valid");
    // A fixed window starts at a multiple of its length on Redis' clock; a new key per attempt,
    // until one attempt does not straddle a window's edge.
    let mut attempt = None;
    for i in 0..3 {
        let key = format!("fixed{i}");
        let before = redis_ms();
        let d = limiter.check(&key, &minute(Algorithm::FixedWindow)).await.expect("check");
        let after = redis_ms();
        if before / 60_000 == after / 60_000 {
            attempt = Some((key, before, after, d));
            break;
        }
    }
    let (key, before, after, d) = attempt.expect("three attempts, at most one at a window's edge");
    assert!(d.allowed, "{d:?}");
    let reset = d.reset_after.as_millis() as u64;
    assert!((60_000 - after % 60_000..=60_000 - before % 60_000).contains(&reset), "{d:?} at {before}..{after}");
    let index: u64 = server.query(&["HGET", &format!("slidegate.fw:{key}"), "i"]);
    assert_eq!(index, before / 60_000);
    // A GCRA's first admission sets the theoretical arrival time one emission interval ahead.
    let before = redis_ms();
    assert!(limiter.check("gcra", &minute(Algorithm::Gcra { burst: None })).await.expect("check").allowed);
    let after = redis_ms();
    let tat: u64 = server.query(&["HGET", "slidegate.gcra:gcra", "t"]);
    assert!((before * 1000 + 30_000_000..=after * 1000 + 30_000_000).contains(&tat), "{tat} at {before}..{after}");
}

#[tokio::test]
async fn noscript_after_script_flush_is_recovered_transparently() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    let q = quota(3, 60_000);
    assert!(limiter.check("k", &q).await.expect("first").allowed);
    let _: String = server.query(&["SCRIPT", "FLUSH"]);
    assert_eq!(server.query::<Vec<i64>>(&["SCRIPT", "EXISTS", &script_sha()]), [0]);
    let d = limiter.check("k", &q).await.expect("after SCRIPT FLUSH");
    assert!(d.allowed);
    assert_eq!(d.remaining, 1, "state survived, decision exact");
    assert_eq!(server.query::<Vec<i64>>(&["SCRIPT", "EXISTS", &script_sha()]), [1], "script back in the cache");
    let stats: String = server.query(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_eval:calls=1,"), "one EVAL fallback: {stats}");
}

#[tokio::test]
async fn survives_a_redis_restart_on_the_same_port() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.expect("connect").with_timeout(Duration::from_secs(2));
    let limiter = Limiter::new(backend);
    let q = quota(3, 60_000);
    assert!(limiter.check("k", &q).await.expect("before").allowed);
    let port = server.port();
    drop(server);
    let server = RedisServer::start_on(port);
    // The connection connects again; the new server's script cache is empty.
    let mut last = None;
    for _ in 0..50 {
        match limiter.check("k", &q).await {
            Ok(d) => {
                last = Some(d);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let d = last.expect("answers again within 5 s of the restart");
    assert_eq!((d.allowed, d.remaining), (true, 2), "a fresh server, a fresh key");
    drop(server);
}

#[tokio::test]
async fn the_auto_engine_follows_the_server_through_restarts() {
    let mut server = RedisServer::start();
    let port = server.port();
    let backend = backend(&server).await;
    let limiter = Limiter::new(backend.clone());
    let q = quota(2, 60_000);
    let check = async |key: &str| {
        // The first call after a restart may fail with the dropped connection; the next must not.
        for _ in 0..20 {
            if let Ok(d) = limiter.check(key, &q).await {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no answer after the restart");
    };
    assert!(check("a").await.allowed);
    assert_eq!(backend.engine(), RedisEngine::Lua, "no module: the scripts decide");
    server.kill();
    let server = RedisServer::start_with_module_on(port);
    assert!(check("b").await.allowed);
    assert_eq!(backend.engine(), RedisEngine::Module, "asked again after the reconnect");
    assert_eq!(server.query::<String>(&["TYPE", "slidegate:b"]), "slidegate");
    assert_eq!(limiter.inspect("b", &q).await.expect("inspect").count, 1);
    drop(server);
    let _plain = RedisServer::start_on(port);
    assert!(check("c").await.allowed);
    assert_eq!(backend.engine(), RedisEngine::Lua, "back to the scripts");
}

#[tokio::test]
async fn idle_keys_expire_one_window_after_the_last_admission() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    assert!(limiter.check("k", &quota(5, 300)).await.expect("check").allowed);
    let ttl: i64 = server.query(&["PTTL", "slidegate:k"]);
    assert!((1..=300).contains(&ttl), "PTTL {ttl}");
    let started = Instant::now();
    while server.query::<i64>(&["EXISTS", "slidegate:k"]) == 1 {
        assert!(started.elapsed() < Duration::from_secs(3), "key still there after 3 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A busy key's set stays bounded: never more than `limit` entries, whatever the costs, since
/// admissions drop what has expired (the key itself goes one window after its last admission).
#[tokio::test]
async fn a_key_never_holds_more_than_limit_entries() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_795_000_000_000);
    let limiter = Limiter::new(backend(&server).await.with_clock(clock.clone()));
    let q = quota(5, 1_000);
    let mut admitted = 0;
    for step in 0..200u64 {
        clock.advance(Duration::from_millis(170));
        let cost = 1 + step % 3;
        admitted += u64::from(limiter.check_cost("k", &q, cost).await.expect("check").allowed);
        let size: u64 = server.query(&["ZCARD", "slidegate:k"]);
        assert!(size <= 5, "step {step}: {size} entries under a limit of 5");
    }
    // 200 steps span 34 windows: far more admissions than one window holds.
    assert!(admitted > 100, "the key kept admitting: {admitted}");
}

#[tokio::test]
async fn denied_requests_leave_no_trace() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    let q = quota(2, 60_000);
    for _ in 0..2 {
        assert!(limiter.check("k", &q).await.expect("fill").allowed);
    }
    let entries = |s: &RedisServer| s.query::<Vec<(String, u64)>>(&["ZRANGE", "slidegate:k", "0", "-1", "WITHSCORES"]);
    let (before, writes_before) = (entries(&server), rdb_changes(&server));
    let ttl_before: i64 = server.query(&["PTTL", "slidegate:k"]);
    // The first denial is taken in the order for an admission (the key's last outcome), the
    // others in the order for a denial: neither writes.
    for cost in [1, 1, 2, 1] {
        let d = limiter.check_cost("k", &q, cost).await.expect("check");
        assert!(!d.allowed);
    }
    assert_eq!(entries(&server), before);
    assert_eq!(rdb_changes(&server), writes_before, "a denial wrote to Redis");
    assert!(server.query::<i64>(&["PTTL", "slidegate:k"]) <= ttl_before, "a denial extended the TTL");
}

/// A performance contract, not behaviour: the exact Redis calls the sliding-log script makes
/// for runs of one outcome. The script guesses each call's outcome from the key's last one:
/// runs of admissions count the set first, runs of denials look at the blocking entry first, so
/// each outcome costs its fewest calls once the run has started. A change to the script's call
/// order that keeps every decision fails here on purpose: update the counts (and the cost
/// figures in BENCHMARKS.md) knowingly. Counted by Redis' own `INFO commandstats` (calls made
/// by scripts included); the decisions themselves are asserted too.
#[tokio::test]
async fn cost_contract_runs_of_one_outcome_take_that_outcomes_cheaper_order() {
    let server = RedisServer::start();
    let limiter = Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua));
    let q = quota(10, 60_000);
    let calls = |s: &RedisServer| command_calls(s, ["zcard", "zrange", "zremrangebyscore", "zadd", "pttl"]);
    server.query::<()>(&["CONFIG", "RESETSTAT"]);
    for _ in 0..10 {
        assert!(limiter.check("k", &q).await.expect("admission").allowed);
    }
    // Counted first: nothing to remove from the new key; no look at a blocking entry; once the
    // key holds entries, a look at the oldest (when remaining next grows).
    assert_eq!(calls(&server), [10, 9, 9, 10, 0], "zcard, zrange, zremrangebyscore, zadd, pttl");
    server.query::<()>(&["CONFIG", "RESETSTAT"]);
    for _ in 0..20 {
        assert!(!limiter.check("k", &q).await.expect("denial").allowed);
    }
    // The first denial was guessed an admission (one count more); the 19 after it were not.
    assert_eq!(calls(&server), [1, 20, 0, 0, 20], "zcard, zrange, zremrangebyscore, zadd, pttl");
}

/// Redis' count of calls of each of `commands` since the last `CONFIG RESETSTAT` (calls made by
/// scripts included).
fn command_calls<const N: usize>(server: &RedisServer, commands: [&str; N]) -> [u64; N] {
    let info: String = server.query(&["INFO", "commandstats"]);
    commands.map(|command| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    })
}

fn script_loaded(server: &RedisServer, body: &str) -> bool {
    let sha = redis::Script::new(body).get_hash().to_owned();
    server.query::<Vec<i64>>(&["SCRIPT", "EXISTS", &sha]) == [1]
}

/// Which script decides a sliding window counter, seen in Redis' script cache after `SCRIPT
/// FLUSH` (the one that ran is back in it): one key without warm-up, its own lean script; with
/// a warm-up, or in a group, `check.lua`. All on the same hash.
#[tokio::test]
async fn a_one_key_sliding_window_counter_runs_its_lean_script() {
    let server = RedisServer::start();
    let limiter = Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua));
    let (lean, general) = (include_str!("../src/redis/sliding_window.lua"), include_str!("../src/redis/check.lua"));
    let q = quota(3, 60_000).with_algorithm(Algorithm::SlidingWindow { buckets: 6 }).expect("quota");
    let _: String = server.query(&["SCRIPT", "FLUSH"]);
    for remaining in [2, 1] {
        assert_eq!(limiter.check("w", &q).await.expect("check").remaining, remaining);
    }
    assert!(script_loaded(&server, lean), "the single check ran sliding_window.lua");
    assert!(!script_loaded(&server, general), "the single check did not run check.lua");
    let warm = q.with_warm_up(Duration::from_secs(60), 1.0).expect("quota");
    let d = limiter.check("w", &warm).await.expect("warm-up");
    assert_eq!((d.allowed, d.remaining), (true, 0), "check.lua counts what the lean script wrote");
    assert!(script_loaded(&server, general), "a warm-up runs check.lua");
    assert!(!limiter.check("w", &q).await.expect("check").allowed, "and the lean script what check.lua wrote");
}

/// A performance contract, not behaviour: the Redis calls the sliding window counter's lean
/// script makes. Every decision reads the hash once; an admission increments its bucket, sets
/// the expiry only when the bucket is new, and deletes buckets that left the window; a denial
/// writes nothing. A change that keeps every decision but adds calls fails here on purpose:
/// update the counts (and BENCHMARKS.md) knowingly.
#[tokio::test]
async fn cost_contract_the_sliding_window_counter_writes_once_per_admission() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_795_000_000_000);
    let limiter = Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua).with_clock(clock.clone()));
    // 10 per minute in six buckets of 10 s; the clock starts on a bucket's edge.
    let q = quota(10, 60_000).with_algorithm(Algorithm::SlidingWindow { buckets: 6 }).expect("quota");
    let commands = ["get", "set", "setrange", "hgetall"];
    let key = "slidegate.sw:k";
    server.query::<()>(&["CONFIG", "RESETSTAT"]);
    for i in 0..10 {
        clock.set_ms(1_795_000_000_000 + i);
        assert!(limiter.check("k", &q).await.expect("admission").allowed);
    }
    assert_eq!(command_calls(&server, commands), [10, 1, 9, 0], "{commands:?}: one value set, then its count");
    // The bucket ends 10 s on, the window after six more: 70 s, plus the caller's clock's minute.
    let ttl: u64 = server.query(&["PTTL", key]);
    assert!((120_000..=130_000).contains(&ttl), "{ttl} ms");
    let (value, writes_before) = (server.query::<Vec<u8>>(&["GET", key]), rdb_changes(&server));
    server.query::<()>(&["CONFIG", "RESETSTAT"]);
    for _ in 0..20 {
        assert!(!limiter.check("k", &q).await.expect("denial").allowed);
    }
    assert_eq!(command_calls(&server, commands), [20, 0, 0, 0], "{commands:?}: denials only read");
    assert_eq!((server.query::<Vec<u8>>(&["GET", key]), rdb_changes(&server)), (value, writes_before));
    server.query::<()>(&["CONFIG", "RESETSTAT"]);
    // 70 s on, the first bucket has left the window and its weight: the new value drops it.
    clock.set_ms(1_795_000_070_000);
    assert_eq!(limiter.check("k", &q).await.expect("admission").remaining, 9);
    assert_eq!(command_calls(&server, commands), [1, 1, 0, 0], "{commands:?}: a new bucket, the old one gone");
    assert_eq!(server.query::<Vec<u8>>(&["GET", key]), window_value(1_795_000_070_000, &[1]));
}

/// The sliding window counter's value as docs/redis.md lays it out: a byte 1, the newest
/// bucket's start (ms) in 7 bytes, then 4 bytes per bucket's count, newest first, little-endian.
/// The most of `admitted` (times in ms) in any `window` ms.
fn most_in_a_window(admitted: &[u64], window: u64) -> usize {
    admitted.iter().map(|&t| admitted.iter().filter(|&&u| u >= t && u < t + window).count()).max().unwrap_or(0)
}

fn window_value(start_ms: u64, counts: &[u32]) -> Vec<u8> {
    let mut value = vec![1];
    value.extend_from_slice(&start_ms.to_le_bytes()[..7]);
    counts.iter().for_each(|c| value.extend_from_slice(&c.to_le_bytes()));
    value
}

/// The memory one sliding window counter key holds, measured as BENCHMARKS.md's bytes-per-key
/// table measures it (a one-minute window, the key named as there), with every bucket the
/// window spans holding permits: at most 150 bytes with six buckets and with the default ten,
/// warm-up's start included, at any limit (each count takes 4 bytes, whatever its size); at most
/// 520 with the most buckets, `MAX_BUCKETS` (the figure docs/library.md gives).
#[tokio::test]
async fn a_sliding_window_counter_key_holds_at_most_150_bytes_at_any_limit() {
    let server = RedisServer::start();
    let start = 1_795_000_000_000;
    let clock = ManualClock::new(start);
    let limiter = Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua).with_clock(clock.clone()));
    let cases = [(6, false, 150), (10, false, 150), (10, true, 150), (slidegate::quota::MAX_BUCKETS, false, 520)];
    for (buckets, warm_up, most) in cases {
        // A permit in each of the buckets + 1 the key spans needs a limit above that.
        for limit in [100, 100_000, MAX_LIMIT].map(|l| l.max(2 * u64::from(buckets))) {
            let mut q = Quota::per_minute(limit).and_then(|q| q.with_algorithm(Algorithm::SlidingWindow { buckets }));
            if warm_up {
                q = q.and_then(|q| q.with_warm_up(Duration::from_secs(30), 0.5));
            }
            let q = q.expect("quota");
            // One admission per bucket over the window and the weighted bucket before it.
            let bucket_ms = 60_000 / u64::from(buckets);
            let cost = (limit / u64::from(buckets + 1)).min(q.max_cost()).max(1);
            for i in 0..=u64::from(buckets) {
                clock.set_ms(start + i * bucket_ms);
                assert!(limiter.check_cost("footprint", &q, cost).await.expect("fill").allowed, "bucket {i}");
            }
            let key = "slidegate.sw:footprint";
            let len: u64 = server.query(&["STRLEN", key]);
            let head = if warm_up { 15 } else { 8 };
            assert_eq!(len, head + 4 * u64::from(buckets + 1), "{buckets} buckets: each holds a count");
            let bytes: u64 = server.query(&["MEMORY", "USAGE", key, "SAMPLES", "0"]);
            eprintln!("{buckets} buckets, limit {limit}, warm-up {warm_up}: {bytes} bytes");
            assert!(bytes <= most, "{buckets} buckets, limit {limit}, warm-up {warm_up}: {bytes} bytes");
            limiter.reset("footprint").await.expect("reset");
        }
    }
}

/// A key written in the earlier layout (a hash: bucket index -> count, `s` the warm-up start)
/// is read as it stands, by the one-key script and by a group: a denial leaves it a hash, and
/// the first admission rewrites it as the string, with no admission lost.
#[tokio::test]
async fn a_sliding_window_key_in_the_earlier_hash_layout_keeps_its_counts() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_795_000_055_000);
    let limiter = Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua).with_clock(clock.clone()));
    // 10 per minute in six buckets of 10 s, at 55 s into bucket 179500005, which holds 3:
    // bucket 179499999 (4 permits) is the weighted one, half inside; the one before has left.
    let q = quota(10, 60_000).with_algorithm(Algorithm::SlidingWindow { buckets: 6 }).expect("quota");
    for (key, group) in [("k", false), ("g", true)] {
        let name = format!("slidegate.sw:{key}");
        server.query::<()>(&["HSET", &name, "179499998", "9", "179499999", "4", "179500005", "3"]);
        server.query::<()>(&["PEXPIRE", &name, "120000"]);
        let check = async |cost| {
            if group {
                let checks = [Check { key, quota: q, cost }];
                limiter.check_all(&checks).await.expect("group").decisions.remove(0)
            } else {
                limiter.check_cost(key, &q, cost).await.expect("check")
            }
        };
        // Estimate 3 + floor(4 * 5/10) = 5: 6 do not fit, and nothing is written.
        let denied = check(6).await;
        assert_eq!((denied.allowed, denied.remaining), (false, 5), "{key}");
        assert_eq!(server.query::<String>(&["TYPE", &name]), "hash", "{key}");
        let admitted = check(5).await;
        assert_eq!((admitted.allowed, admitted.remaining), (true, 0), "{key}");
        assert_eq!(server.query::<String>(&["TYPE", &name]), "string", "{key}");
        assert_eq!(
            server.query::<Vec<u8>>(&["GET", &name]),
            window_value(1_795_000_050_000, &[8, 0, 0, 0, 0, 0, 4]),
            "{key}"
        );
        assert!(!check(1).await.allowed, "{key}: the limit holds across the rewrite");
    }
    // With the warm-up start an earlier check.lua kept beside the buckets (ms since 1970): read,
    // and kept in the string after its bucket counts' head.
    // And the buckets a rule of 100 buckets (1 s each) left: only those of this rule's window
    // count (the field past the fields of 6 buckets, 179500005, among them).
    let since = 1_794_999_000_000u64;
    let mut hset: Vec<String> = ["HSET", "slidegate.sw:w", "s"].map(str::to_owned).into();
    hset.push(since.to_string());
    hset.extend((0..101).flat_map(|k| [(1_795_000_055 - k).to_string(), "0".to_owned()]));
    hset.extend(["179500005".to_owned(), "3".to_owned()]);
    server.query::<()>(&hset.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(limiter.check_cost("w", &q, 7).await.expect("check").remaining, 0);
    let mut warm = window_value(1_795_000_050_000, &[10, 0, 0, 0, 0, 0, 0]);
    warm[0] = 2;
    warm.splice(8..8, since.to_le_bytes()[..7].iter().copied());
    assert_eq!(server.query::<Vec<u8>>(&["GET", "slidegate.sw:w"]), warm);
}

/// Callers' clocks apart: one whose window does not reach the key's newest bucket (its clock
/// behind another's by more than the window less a bucket, however far) is decided as at that
/// bucket's start, so the limit holds across both clocks; the expiry stays the one the newest
/// bucket set, and the value one window's counts.
#[tokio::test]
async fn a_caller_more_than_a_window_behind_shares_the_sliding_window_limit() {
    let server = RedisServer::start();
    let start = 1_795_000_010_000;
    let (ahead, behind) = (ManualClock::new(start), ManualClock::new(start));
    let connect = async |clock: &ManualClock| {
        Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua).with_clock(clock.clone()))
    };
    let (a, b) = (connect(&ahead).await, connect(&behind).await);
    // 10 per second in ten buckets of 100 ms; the second clock 1.1 s (11 buckets: no bucket of
    // its window is the first clock's), 1.5 s or 65 s behind.
    let q = quota(10, 1_000).with_algorithm(Algorithm::SlidingWindow { buckets: 10 }).expect("quota");
    for lag in [1_100, 1_500, 65_000] {
        let (key, name) = (format!("lag{lag}"), format!("slidegate.sw:lag{lag}"));
        ahead.set_ms(start);
        behind.set_ms(start - lag);
        assert!(a.check_cost(&key, &q, 10).await.expect("fill").allowed);
        let ttl: u64 = server.query(&["PTTL", &name]);
        for group in [false, true] {
            let d = if group {
                b.check_all(&[Check { key: &key, quota: q, cost: 1 }]).await.expect("group").decisions.remove(0)
            } else {
                b.check(&key, &q).await.expect("check")
            };
            assert!(!d.allowed, "{lag} ms: the limit holds across the clocks (group {group})");
            // Free again 1 ms after the first clock's window has passed (the filled bucket's
            // share then drops): 1,001 ms on that clock, as much more on this one as it lags.
            assert_eq!(d.retry_after, Some(Duration::from_millis(1_001 + lag)), "{lag} ms, group {group}");
        }
        // Both clocks past that window: the first clock's new bucket is shared again.
        ahead.set_ms(start + 1_600);
        behind.set_ms(start + 1_600 - lag);
        assert!(a.check_cost(&key, &q, 8).await.expect("check").allowed, "{lag} ms");
        assert!(b.check(&key, &q).await.expect("check").allowed, "{lag} ms");
        assert!(b.check_all(&[Check { key: &key, quota: q, cost: 1 }]).await.expect("group").allowed, "{lag} ms");
        assert!(!b.check(&key, &q).await.expect("check").allowed, "{lag} ms");
        assert!(!a.check(&key, &q).await.expect("check").allowed, "{lag} ms");
        let len: u64 = server.query(&["STRLEN", &name]);
        assert!(len <= 8 + 4 * 11, "{lag} ms: {len} bytes");
        // The expiry is the one the first clock's new bucket set, 1.6 s after the first.
        let later: u64 = server.query(&["PTTL", &name]);
        assert!(later <= ttl + 1_600, "{lag} ms: {later} ms, the first bucket's {ttl} ms");
    }
}

/// Two callers whose clocks are less than a window apart, each taking every permit it is given
/// every 100 ms for three windows: the key's time never steps back (the caller behind is decided
/// at the newest bucket), so together they get no more than one caller on one clock — not about
/// a limit each per bucket, as when the caller behind counted only its own window's buckets.
#[tokio::test]
async fn callers_less_than_a_window_apart_share_one_sliding_window_limit() {
    let q = quota(100, 10_000).with_algorithm(Algorithm::SlidingWindow { buckets: 10 }).expect("quota");
    let start = 1_795_000_000_000;
    let tally = |admitted: &[u64]| (most_in_a_window(admitted, 10_000), admitted.len());
    // One caller on the first clock, asking as often as both do (the specification).
    let (mut one, mut alone) = (slidegate::spec::Key::new(q.algorithm()), Vec::new());
    for step in 0..300 {
        while alone.len() <= 1_000 && one.check(start + step * 100, &q, 1).allowed {
            alone.push(step * 100);
        }
    }
    let (most_alone, total_alone) = tally(&alone);
    for (server, engine) in engines() {
        for lag in [40, 1_000, 9_500] {
            let (ahead, behind) = (ManualClock::new(start), ManualClock::new(start - lag));
            let connect = async |clock: &ManualClock| {
                Limiter::new(backend(&server).await.with_engine(engine).with_clock(clock.clone()))
            };
            let (a, b) = (connect(&ahead).await, connect(&behind).await);
            let key = format!("apart{lag}");
            // Admissions by the first clock's time.
            let mut admitted = Vec::new();
            for step in 0..300 {
                ahead.set_ms(start + step * 100);
                behind.set_ms(start + step * 100 - lag);
                for caller in [&a, &b] {
                    for _ in 0..=q.limit() {
                        if !caller.check(&key, &q).await.expect("check").allowed {
                            break;
                        }
                        admitted.push(step * 100);
                    }
                }
            }
            let (most, total) = tally(&admitted);
            assert!(most <= most_alone, "{engine:?}, {lag} ms apart: {most} in one window, one clock {most_alone}");
            assert!(total <= total_alone, "{engine:?}, {lag} ms apart: {total} in all, one clock {total_alone}");
        }
    }
}

/// A rule's window and buckets changed while instances of both settings run (a rolling
/// change), each taking every permit it is given, in turn, every 50 ms for 30 s: a value of
/// the other bucket length is never read as fresh, so no window lets more through than twice
/// the limit (one setting alone: 20 to 28 here), through either script.
#[tokio::test]
async fn a_change_of_bucket_length_keeps_the_sliding_window_limit() {
    let server = RedisServer::start();
    let start = 1_795_000_000_000;
    let clock = ManualClock::new(start);
    let connect = async || Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua).with_clock(clock.clone()));
    let (first, second) = (connect().await, connect().await);
    let limit = 20;
    let settings = [(&first, 9_999, 3), (&second, 9_998, 2), (&second, 10_000, 8)];
    for group in [false, true] {
        for pair in [[0, 1], [0, 2], [1, 2]] {
            let key = format!("changed{group}{pair:?}");
            let mut admitted = Vec::new();
            for step in 0..600 {
                clock.set_ms(start + step * 50);
                let (limiter, window, buckets) = settings[pair[step as usize % 2]];
                let q = quota(limit, window).with_algorithm(Algorithm::SlidingWindow { buckets }).expect("quota");
                for _ in 0..=limit {
                    let d = if group {
                        limiter.check_all(&[Check::new(&key, q)]).await.expect("group").decisions.remove(0)
                    } else {
                        limiter.check(&key, &q).await.expect("check")
                    };
                    if !d.allowed {
                        break;
                    }
                    admitted.push(step * 50);
                }
            }
            let most = most_in_a_window(&admitted, 9_998);
            assert!(most <= 2 * limit as usize, "group {group}, {pair:?}: {most} in one window");
        }
    }
}

/// A value the scripts did not write is an error, never an admission, and is left as it is.
#[tokio::test]
async fn a_sliding_window_key_holding_anything_else_is_an_error() {
    let server = RedisServer::start();
    let limiter = Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua));
    let q = quota(10, 1_000).with_algorithm(Algorithm::SlidingWindow { buckets: 10 }).expect("quota");
    let ours = window_value(1_795_000_000_000, &[1]);
    let long = [&ours[..], &[0; 4 * 202][..]].concat();
    for value in [&b"hello world"[..], &[], &ours[..10], &[3; 12], &long] {
        redis::cmd("SET").arg("slidegate.sw:k").arg(value).query::<()>(&mut server.conn()).expect("set");
        let stored: Vec<u8> = server.query(&["GET", "slidegate.sw:k"]);
        for group in [false, true] {
            let e = if group {
                limiter.check_all(&[Check { key: "k", quota: q, cost: 1 }]).await.map(|_| ()).expect_err("group")
            } else {
                limiter.check("k", &q).await.map(|_| ()).expect_err("check")
            };
            assert_eq!(e.class(), slidegate::ErrorClass::BackendError, "{value:?}: {e}");
            assert_eq!(server.query::<Vec<u8>>(&["GET", "slidegate.sw:k"]), stored);
        }
    }
    // Hashes no earlier release wrote: a count below zero, over any limit or not a number (which
    // would admit past the limit), a bucket or start not written as a whole number, more fields
    // than an earlier release kept (work that grows with the hash).
    let j = SystemClock.now_ms() / 100;
    let bucket = |k: u64| (j - k).to_string();
    let many: Vec<String> = (0..205).flat_map(|k| [bucket(k), "1".to_owned()]).collect();
    let hashes: [Vec<String>; 8] = [
        vec![bucket(0), "-1000".into()],
        // Another name of the same bucket, whose count would replace the first's.
        vec![bucket(0), "5".into(), format!("{:#x}", j), "0".into()],
        vec![bucket(0), "5".into(), "s".into(), "1e3".into()],
        vec![bucket(0), "5".into(), bucket(1), "-5".into()],
        vec![bucket(0), "abc".into()],
        vec![bucket(0), "4294967296".into()],
        vec![bucket(0), "1".into(), format!("{j}.5"), "0".into()],
        many,
    ];
    for fields in hashes {
        server.query::<()>(&["DEL", "slidegate.sw:k"]);
        let mut hset = vec!["HSET", "slidegate.sw:k"];
        hset.extend(fields.iter().map(String::as_str));
        server.query::<()>(&hset);
        for group in [false, true] {
            let answer = if group {
                limiter.check_all(&[Check { key: "k", quota: q, cost: 1 }]).await.map(|_| ())
            } else {
                limiter.check("k", &q).await.map(|_| ())
            };
            let e = answer.expect_err("never an admission");
            assert_eq!(e.class(), slidegate::ErrorClass::BackendError, "{fields:?}: {e}");
            assert_eq!(server.query::<String>(&["TYPE", "slidegate.sw:k"]), "hash", "{fields:?}: left as it is");
        }
    }
}

/// Bucket indexes up to the latest time a caller's clock may give (`MAX_CLOCK_MS`, 2^52 ms) are
/// kept whole, on both engines.
#[tokio::test]
async fn sliding_window_bucket_indexes_past_2_to_the_48_are_kept_whole() {
    let q = quota(3, 10).with_algorithm(Algorithm::SlidingWindow { buckets: 10 }).expect("quota");
    for (server, engine) in engines() {
        let clock = ManualClock::new(MAX_CLOCK_MS - 5);
        let limiter = Limiter::new(backend(&server).await.with_engine(engine).with_clock(clock.clone()));
        let mut allowed = Vec::new();
        for _ in 0..6 {
            allowed.push(limiter.check("k", &q).await.expect("check").allowed);
        }
        assert_eq!(allowed, [true, true, true, false, false, false], "{engine:?}");
    }
}

/// A caller's clock past `MAX_CLOCK_MS`, where a script's bucket loop would step by nothing and
/// hold Redis for ever (a timeout: a backend failure, which fail-open admits), is refused before
/// anything is sent, on every path and engine; a stored start past it is an error too, on Redis'
/// own clock, not a hung script.
#[tokio::test]
async fn a_clock_past_max_clock_ms_is_refused_before_anything_is_sent() {
    let window = quota(100, 10).with_algorithm(Algorithm::SlidingWindow { buckets: 1 }).expect("quota");
    for (server, engine) in engines() {
        let clock = ManualClock::new((1 << 53) - 1);
        let limiter = Limiter::new(backend(&server).await.with_engine(engine).with_clock(clock.clone()));
        for q in [window, quota(100, 10), window.with_algorithm(Algorithm::Gcra { burst: None }).expect("gcra")] {
            let warm = q.with_warm_up(Duration::from_secs(1), 0.5).expect("warm-up");
            let answers = [
                limiter.check("k", &q).await.map(|_| ()),
                limiter.check_all(&[Check::new("k", q), Check::new("l", warm)]).await.map(|_| ()),
                limiter.inspect("k", &q).await.map(|_| ()),
            ];
            for answer in answers {
                let e = answer.expect_err("refused");
                assert!(
                    matches!(e, Error::ClockOutOfRange { now, max } if now == (1 << 53) - 1 && max == MAX_CLOCK_MS)
                );
                assert_eq!(e.class(), slidegate::ErrorClass::BackendError, "{engine:?}: never a failure to fail open");
            }
        }
        assert_eq!(server.query::<u64>(&["DBSIZE"]), 0, "{engine:?}: nothing written");
    }
    // Buckets of 1 ms: bucket 2^53, where `k + 1 == k` in a double.
    let tiny = quota(100, 1).with_algorithm(Algorithm::SlidingWindow { buckets: 1 }).expect("quota");
    let server = RedisServer::start();
    let limiter = Limiter::new(backend(&server).await.with_engine(RedisEngine::Lua));
    redis::cmd("SET")
        .arg("slidegate.sw:k")
        .arg(window_value(1 << 53, &[100]))
        .query::<()>(&mut server.conn())
        .expect("set");
    for group in [false, true] {
        let e = if group {
            limiter.check_all(&[Check::new("k", tiny)]).await.map(|_| ()).expect_err("group")
        } else {
            limiter.check("k", &tiny).await.map(|_| ()).expect_err("check")
        };
        // Not a timeout (the backend's deadline is 5 s): the script answered.
        assert_eq!(e.class(), slidegate::ErrorClass::BackendError, "{e}");
    }
}

fn rdb_changes(server: &RedisServer) -> u64 {
    let info: String = server.query(&["INFO", "persistence"]);
    info.lines()
        .find_map(|l| l.strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("rdb_changes_since_last_save")
}

#[tokio::test]
async fn admissions_in_one_millisecond_are_never_merged() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_795_000_000_000);
    // Two instances (two member ids) at the very same millisecond, with cost > 1 mixed in.
    let a = Limiter::new(backend(&server).await.with_clock(clock.clone()));
    let b = Limiter::new(backend(&server).await.with_clock(clock.clone()));
    // A member per permit up to limit 256, a counted entry per admission above: none merged.
    for (key, limit, counted) in [("per-permit", 256, false), ("counted", 1_000, true)] {
        let q = quota(limit, 60_000);
        let costs: Vec<u64> = (0..100).map(|i| 1 + i % 2).collect();
        for (i, cost) in costs.iter().enumerate() {
            let limiter = if i % 2 == 0 { &a } else { &b };
            assert!(limiter.check_cost(key, &q, *cost).await.expect("check").allowed, "{key}");
        }
        let expected: u64 = costs.iter().sum();
        let stored = if counted { costs.len() as u64 } else { expected };
        assert_eq!(server.query::<u64>(&["ZCARD", &format!("slidegate:{key}")]), stored, "{key}");
        let d = a.check(key, &q).await.expect("check");
        assert_eq!(d.remaining, limit - expected - 1, "{key}");
    }
}

/// `tasks` concurrent tasks each check `key` `each` times; returns how many were admitted.
async fn admitted_by_tasks(limiter: Limiter<RedisBackend>, key: &'static str, q: Quota, tasks: u32, each: u32) -> u32 {
    let limiter = Arc::new(limiter);
    let tasks: Vec<_> = (0..tasks)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..each {
                    admitted += u32::from(limiter.check(key, &q).await.expect("check").allowed);
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("task");
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_admit_exactly_the_limit() {
    for (server, engine) in engines() {
        let limiter = limiter_on(&server, engine).await;
        let admitted = admitted_by_tasks(limiter_on(&server, engine).await, "hot", quota(100, 60_000), 64, 20).await;
        assert_eq!(admitted, 100, "{engine:?}: of 1,280 concurrent checks");
        assert_eq!(limiter.inspect("hot", &quota(100, 60_000)).await.expect("inspect").count, 100, "{engine:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_admits_exactly_its_limit_under_sixty_four_tasks() {
    // Redis' clock: an hour's window, so no bucket, refill or window edge can free a permit
    // while the test runs — except the fixed window's edge, so it runs on a frozen caller's
    // clock (still 64 tasks racing on one key).
    let hour = |a| Quota::per_hour(100).and_then(|q| q.with_algorithm(a)).expect("valid");
    for (server, engine) in engines() {
        for algorithm in [Algorithm::SlidingWindow { buckets: 6 }, Algorithm::Gcra { burst: None }] {
            let admitted = admitted_by_tasks(limiter_on(&server, engine).await, "hot", hour(algorithm), 64, 20).await;
            assert_eq!(admitted, 100, "{engine:?}, {algorithm}: of 1,280 concurrent checks");
        }
        let frozen =
            Limiter::new(backend(&server).await.with_engine(engine).with_clock(ManualClock::new(1_795_000_000_000)));
        let admitted = admitted_by_tasks(frozen, "hot", hour(Algorithm::FixedWindow), 64, 20).await;
        assert_eq!(admitted, 100, "{engine:?}, fixed_window: of 1,280 concurrent checks");
    }
}

/// Runs inside each child process of `four_processes_admit_exactly_the_limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of four_processes_admit_exactly_the_limit, which runs it"]
async fn hammer_child() {
    let url = std::env::var("SLIDEGATE_HAMMER_URL").expect("run by four_processes_admit_exactly_the_limit");
    let start_at: u64 = std::env::var("SLIDEGATE_HAMMER_START_AT").expect("start time").parse().expect("ms");
    let engine: RedisEngine = std::env::var("SLIDEGATE_HAMMER_ENGINE").expect("engine").parse().expect("known");
    let limiter = Arc::new(Limiter::new(
        RedisBackend::connect(&url).await.expect("connect").with_timeout(Duration::from_secs(5)).with_engine(engine),
    ));
    let algorithm: Algorithm = std::env::var("SLIDEGATE_HAMMER_ALGORITHM").expect("algorithm").parse().expect("known");
    let q = per_day(algorithm);
    // All processes start together, so their checks interleave.
    let now = SystemClock.now_ms();
    tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(now).min(5_000))).await;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let mut admitted = 0u32;
                for _ in 0..16 {
                    admitted += u32::from(limiter.check("multi", &q).await.expect("check").allowed);
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("task");
    }
    println!("admitted={admitted}");
}

/// The four-process run's quota: 100 a day, so that no permit frees while the run lasts (a GCRA
/// frees one every 864 s, the log's first entry leaves after a day) and exactly 100 admissions
/// is the right answer however late a child starts.
fn per_day(algorithm: Algorithm) -> Quota {
    Quota::new(100, Duration::from_secs(86_400)).and_then(|q| q.with_algorithm(algorithm)).expect("valid")
}

#[test]
fn four_processes_admit_exactly_the_limit() {
    for (server, engine) in engines() {
        for algorithm in ["sliding_log", "gcra"] {
            let started = Instant::now();
            let admitted = admitted_by_four_processes(&server, engine, algorithm);
            // The quota's premise, checked: the run ended before a permit could free (a GCRA's
            // emission interval, window / limit, the soonest any algorithm frees one).
            let q = per_day(algorithm.parse().expect("known"));
            let first_free = q.window() / u32::try_from(q.limit()).expect("a small limit");
            assert!(started.elapsed() < first_free, "{engine:?}, {algorithm}: the run outlasted {first_free:?}");
            assert_eq!(admitted, 100, "{engine:?}, {algorithm}: 4 processes × 256 checks, limit 100 a day");
        }
    }
}

/// Four child processes check one key 256 times each, all at once; returns the admissions.
fn admitted_by_four_processes(server: &RedisServer, engine: RedisEngine, algorithm: &str) -> u32 {
    let exe = std::env::current_exe().expect("test binary");
    let now = SystemClock.now_ms();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args(["hammer_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
                .env("SLIDEGATE_HAMMER_URL", server.url())
                .env("SLIDEGATE_HAMMER_START_AT", (now + 1_500).to_string())
                .env("SLIDEGATE_HAMMER_ALGORITHM", algorithm)
                .env("SLIDEGATE_HAMMER_ENGINE", engine.as_str())
                .output_async()
        })
        .collect();
    let mut total = 0;
    for child in wait_or_kill(children) {
        let out = child.wait_with_output().expect("child ran");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        let admitted: u32 = stdout
            .lines()
            .find_map(|l| l.split_once("admitted=").map(|(_, n)| n))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count in child output: {stdout}"));
        total += admitted;
    }
    total
}

/// How long the children may run: a 1.5 s start delay and 256 checks each, many times over.
const CHILDREN_DEADLINE: Duration = Duration::from_secs(120);

/// Returns the children once all have exited; kills them all and panics when one still runs
/// at [`CHILDREN_DEADLINE`].
fn wait_or_kill(mut children: Vec<std::process::Child>) -> Vec<std::process::Child> {
    let by = Instant::now() + CHILDREN_DEADLINE;
    while children.iter_mut().any(|c| c.try_wait().expect("child status").is_none()) {
        if Instant::now() > by {
            for c in &mut children {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("a child still ran after {CHILDREN_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    children
}

trait SpawnOutput {
    fn output_async(&mut self) -> std::process::Child;
}

impl SpawnOutput for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn child")
    }
}

#[tokio::test]
async fn keys_are_data_never_code() {
    let server = RedisServer::start();
    let limiter = Limiter::new(backend(&server).await.with_prefix("app"));
    let q = quota(1, 60_000);
    let hostile = ["x'); redis.call('FLUSHALL'); --", "a\nb\r\n*1\r\n$8\r\nFLUSHALL", "{user:42}", "ключ 🔑", " "];
    for key in hostile {
        assert!(limiter.check(key, &q).await.expect("check").allowed, "{key:?}");
        assert!(!limiter.check(key, &q).await.expect("check").allowed, "{key:?}");
    }
    let mut keys: Vec<String> = server.query(&["KEYS", "*"]);
    keys.sort();
    let mut expected: Vec<String> = hostile.iter().map(|k| format!("app:{k}")).collect();
    expected.sort();
    assert_eq!(keys, expected);
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_touches_nothing() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    let q = quota(5, 1_000);
    assert!(matches!(limiter.check_cost("k", &q, 0).await, Err(Error::InvalidCost { cost: 0, max: 5 })));
    assert!(matches!(limiter.check_cost("k", &q, 6).await, Err(Error::InvalidCost { cost: 6, .. })));
    assert!(matches!(limiter.check("", &q).await, Err(Error::EmptyKey)));
    let long = "x".repeat(slidegate::MAX_KEY_LEN + 1);
    assert!(
        matches!(limiter.check(&long, &q).await, Err(Error::KeyTooLong { len }) if len == slidegate::MAX_KEY_LEN + 1)
    );
    assert!(limiter.check(&long[1..], &q).await.expect("the longest key is fine").allowed);
    assert_eq!(server.query::<u64>(&["DBSIZE"]), 1, "only the valid key was written");
}

#[tokio::test]
async fn a_stalled_redis_costs_the_deadline_not_more() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let backend = RedisBackend::connect(&server.url()).await.expect("connect");
    assert!(format!("{backend:?}").contains("timeout: 50ms"), "default deadline is 50 ms: {backend:?}");
    let limiter = Limiter::new(backend);
    let q = quota(5, 1_000);
    let url = server.url();
    let sleeper = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).and_then(|c| c.get_connection()).expect("connect");
        redis::cmd("DEBUG").arg("SLEEP").arg("0.6").query::<()>(&mut conn).expect("DEBUG SLEEP");
    });
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let result = limiter.check("k", &q).await;
    let waited = started.elapsed();
    assert!(matches!(result, Err(Error::Timeout(t)) if t == Duration::from_millis(50)), "{result:?}");
    // Never hung: the deadline plus a margin for a loaded machine, still well under the 0.5 s
    // the stall had left (how close to 50 ms the answer comes is a benchmark's figure).
    assert!(waited < Duration::from_millis(250), "waited {waited:?}");
    sleeper.join().expect("sleeper");
    // Once Redis is back, the same limiter answers again.
    let started = Instant::now();
    loop {
        match limiter.check("k", &q).await {
            Ok(d) => break assert!(d.allowed),
            Err(e) => assert!(started.elapsed() < Duration::from_secs(3), "no recovery: {e}"),
        }
    }
}

#[tokio::test]
async fn inspect_reads_and_reset_forgets() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let limiter = Limiter::new(backend(&server).await.with_clock(clock.clone()));
    let q = quota(5, 10_000);
    assert_eq!(limiter.inspect("k", &q).await.expect("inspect").count, 0);
    limiter.check_cost("k", &q, 2).await.expect("check");
    clock.set_ms(1_004_000);
    limiter.check("k", &q).await.expect("check");
    clock.set_ms(1_005_000);
    let state = limiter.inspect("k", &q).await.expect("inspect");
    assert_eq!((state.count, state.oldest_ms, state.reset_after), (3, Some(1_000_000), Duration::from_millis(9_000)));
    clock.set_ms(1_010_000);
    assert_eq!(limiter.inspect("k", &q).await.expect("inspect").count, 1, "the first two left");
    limiter.reset("k").await.expect("reset");
    assert_eq!(server.query::<i64>(&["EXISTS", "slidegate:k"]), 0);
    assert_eq!(limiter.check("k", &q).await.expect("check").remaining, 4);
}

#[tokio::test]
async fn a_timeline_lists_the_admissions_in_the_window_on_either_engine() {
    for (server, engine) in engines() {
        let clock = ManualClock::new(1_000_000);
        let limiter = Limiter::new(backend(&server).await.with_engine(engine).with_clock(clock.clone()));
        let q = quota(10, 10_000);
        assert_eq!(limiter.timeline("k", &q, 100).await.expect("timeline"), KeyTimeline::default(), "{engine:?}");
        for (at, cost) in [(1_000_000, 1), (1_002_000, 2), (1_004_000, 1)] {
            clock.set_ms(at);
            assert!(limiter.check_cost("k", &q, cost).await.expect("check").allowed);
        }
        clock.set_ms(1_010_500);
        let t = limiter.timeline("k", &q, 100).await.expect("timeline");
        assert_eq!(t.admissions_ms, [1_002_000, 1_002_000, 1_004_000], "{engine:?}: the first left the window");
        assert_eq!((t.state.count, t.state.oldest_ms), (3, Some(1_002_000)), "{engine:?}");
        let newest = limiter.timeline("k", &q, 1).await.expect("timeline").admissions_ms;
        assert_eq!(newest, [1_004_000], "{engine:?}: the newest only");
        let fixed = quota(5, 60_000).with_algorithm(Algorithm::FixedWindow).expect("quota");
        limiter.check("f", &fixed).await.expect("check");
        let counted = limiter.timeline("f", &fixed, 100).await.expect("timeline");
        assert_eq!((counted.state.count, counted.admissions_ms.len()), (1, 0), "{engine:?}: counts, not times");
    }
}

fn script_sha() -> String {
    redis::Script::new(include_str!("../src/redis/sliding_log.lua")).get_hash().to_owned()
}

#[tokio::test]
async fn a_denied_multi_limit_check_charges_nothing_anywhere() {
    let server = RedisServer::start();
    let limiter = limiter(&server).await;
    let (per_second, per_day) = (quota(2, 1_000), quota(1_000, 86_400_000));
    let both = [Check::new("user:42:s", per_second), Check::new("user:42:d", per_day)];
    assert!(limiter.check_all(&both).await.expect("1").allowed);
    assert!(limiter.check_all(&both).await.expect("2").allowed);
    let day_before: u64 = server.query(&["ZCARD", "slidegate:user:42:d"]);
    let d = limiter.check_all(&both).await.expect("3");
    assert_eq!((d.allowed, d.denied_by), (false, Some(0)));
    assert!(d.retry_after().is_some_and(|r| r <= Duration::from_secs(1)));
    assert_eq!(d.decisions[1].remaining, 998, "the daily limit reports its uncharged remaining");
    assert_eq!(server.query::<u64>(&["ZCARD", "slidegate:user:42:d"]), day_before, "daily limit not charged");
    assert!(matches!(
        limiter.check_all(&[Check::new("a", per_second), Check::new("a", per_day)]).await,
        Err(Error::DuplicateKey { key }) if key == "a"
    ));
    assert!(matches!(limiter.check_all(&[]).await, Err(Error::CheckCount { count: 0 })));
    let many: Vec<String> = (0..=slidegate::MAX_CHECKS).map(|i| format!("k{i}")).collect();
    let many: Vec<Check<'_>> = many.iter().map(|k| Check::new(k, per_second)).collect();
    assert!(matches!(limiter.check_all(&many).await, Err(Error::CheckCount { .. })));
}

#[tokio::test]
async fn on_the_callers_clock_entries_do_not_expire_by_redis_real_time() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_795_000_000_000);
    let limiter = Limiter::new(backend(&server).await.with_clock(clock.clone()));
    let q = quota(1, 10);
    assert!(limiter.check("k", &q).await.expect("first").allowed);
    assert!(limiter.check_all(&[Check::new("m", q)]).await.expect("first multi").allowed);
    // Real time passes, the caller's clock does not: the window is still full.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!limiter.check("k", &q).await.expect("second").allowed);
    assert!(!limiter.check_all(&[Check::new("m", q)]).await.expect("second multi").allowed);
    clock.advance(Duration::from_millis(10));
    assert!(limiter.check("k", &q).await.expect("third").allowed);
}

#[tokio::test]
async fn keys_in_different_cluster_slots_are_refused_before_sending() {
    let server = RedisServer::start();
    let limiter = Limiter::new(backend(&server).await.with_cluster_slot_check(true));
    let (per_second, per_day) = (quota(1, 1_000), quota(100, 86_400_000));
    let apart = [Check::new("user:42:sms", per_second), Check::new("user:42:login", per_day)];
    let e = limiter.check_all(&apart).await.expect_err("different slots");
    assert!(matches!(&e, Error::CrossSlot { first, .. } if first == "slidegate:user:42:sms"), "{e}");
    assert!(e.to_string().contains("hash_tag"), "the message says how to fix it: {e}");
    assert_eq!(server.query::<u64>(&["DBSIZE"]), 0, "nothing was sent");
    let (sms, login) = (hash_tag("user:42", "sms"), hash_tag("user:42", "login"));
    let tagged = [
        Check::new(&sms, per_second),
        Check::new(&login, per_day.with_algorithm(Algorithm::Gcra { burst: None }).expect("valid")),
    ];
    assert!(limiter.check_all(&tagged).await.expect("one slot").allowed);
    assert!(!limiter.check_all(&tagged).await.expect("one slot").allowed, "the per-second limit holds");
}
