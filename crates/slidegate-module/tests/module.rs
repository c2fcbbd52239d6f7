//! The module inside real redis-server processes (`--loadmodule`): bad input never hurts the
//! server (fuzzed), the Lua scripts' keys are taken over, and the native type survives RDB
//! round trips, `DUMP`/`RESTORE` and `COPY`, AOF rewrites, replication and expiry, with checks,
//! charges and refunds. Decisions
//! themselves are checked against the specification in `crates/slidegate/tests/conformance.rs`.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::{Connection, Value};
use slidegate_testkit::RedisServer;

fn run(conn: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(conn)
}

fn ints(conn: &mut Connection, args: &[&str]) -> Vec<i64> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(conn).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The error Redis answers to `args`, as `CODE message`.
fn error(conn: &mut Connection, args: &[&str]) -> String {
    match run(conn, args) {
        Err(e) => format!("{} {}", e.code().unwrap_or("?"), e.detail().unwrap_or("")),
        Ok(v) => panic!("{args:?} answered {v:?}, not an error"),
    }
}

#[test]
fn bad_input_is_an_error_reply_and_the_server_lives_on() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    run(&mut c, &["SET", "string", "x"]).expect("set");
    run(&mut c, &["ZADD", "foreign", "1.5", "x"]).expect("zadd");
    run(&mut c, &["HSET", "hash", "f", "v"]).expect("hset");
    ints(&mut c, &["SLIDEGATE.CHECK", "log", "sliding_log", "5", "1000", "1"]);
    for (args, says) in [
        (&["SLIDEGATE.CHECK"][..], "ERR missing key"),
        (&["SLIDEGATE.CHECK", "k"], "ERR missing algorithm"),
        (&["SLIDEGATE.CHECK", "k", "sliding_log", "5", "1000"], "ERR missing cost"),
        (&["SLIDEGATE.CHECK", "k", "sliding_log", "five", "1000", "1"], "ERR limit must be a whole number"),
        (&["SLIDEGATE.CHECK", "k", "sliding_log", "99999999999999999999", "1000", "1"], "ERR limit must be"),
        (&["SLIDEGATE.CHECK", "k", "sliding_log", "1000000000000", "1000", "1"], "ERR limit must be between"),
        (
            &["SLIDEGATE.CHECK", "k", "sliding_log", "1000000000", "1000", "1000000000"],
            "ERR limit must be between 1 and 100000",
        ),
        (&["SLIDEGATE.CHECK", "k", "gcra", "5", "1000", "1", "BURST", "0"], "ERR invalid quota"),
        (&["SLIDEGATE.CHECK", "k", "sliding_log", "5", "1000", "1", "NOW", "-1"], "ERR NOW must be"),
        // Past 2^53 ms the decisions' arithmetic would overflow (it aborted Redis).
        (&["SLIDEGATE.CHECK", "k", "gcra", "5", "1000", "1", "NOW", "18446744073709551615"], "ERR NOW must be at most"),
        (&["SLIDEGATE.CHECK", "string", "sliding_log", "5", "1000", "1"], "WRONGTYPE"),
        (&["SLIDEGATE.CHECK", "foreign", "sliding_log", "5", "1000", "1"], "WRONGTYPE"),
        (&["SLIDEGATE.CHECK", "hash", "gcra", "5", "1000", "1"], "WRONGTYPE"),
        (&["SLIDEGATE.CHECK", "log", "gcra", "5", "1000", "1"], "WRONGTYPE the key counts by sliding_log"),
        (&["SLIDEGATE.CHARGE", "k", "sliding_log", "5", "1000", "6"], "ERR cost must be between 1 and 5"),
        (
            &["SLIDEGATE.CHARGE", "k", "sliding_log", "5", "1000", "1", "AND", "j", "gcra", "5", "1000", "1"],
            "ERR one key",
        ),
        (&["SLIDEGATE.REFUND", "k", "sliding_log", "5", "1000", "0"], "ERR cost must be"),
        (&["SLIDEGATE.CHARGE", "string", "sliding_log", "5", "1000", "1"], "WRONGTYPE"),
        (&["SLIDEGATE.REFUND", "log", "gcra", "5", "1000", "1"], "WRONGTYPE the key counts by sliding_log"),
        (&["SLIDEGATE.INSPECT"], "ERR wrong number of arguments"),
        (&["SLIDEGATE.INSPECT", "string"], "WRONGTYPE"),
        (&["SLIDEGATE.INSPECT", "k", "sliding_log"], "ERR missing limit"),
        (&["SLIDEGATE.RESTORE", "k"], "ERR wrong number of arguments"),
        (&["SLIDEGATE.RESTORE", "k", "not a payload"], "ERR the payload"),
        (&["SLIDEGATE.RESTORE", "string", "\0\0\0\0\0\0\0\0"], "ERR the payload"),
    ] {
        let e = error(&mut c, args);
        assert!(e.starts_with(says), "{args:?}: {e}");
    }
    // Nothing was written by any of them.
    assert_eq!(run(&mut c, &["EXISTS", "k"]).expect("exists"), Value::Int(0));
    assert_eq!(run(&mut c, &["TYPE", "foreign"]).expect("type"), Value::SimpleString("zset".into()));
    assert_eq!(run(&mut c, &["PING"]).expect("alive"), Value::SimpleString("PONG".into()));
}

/// A key checked under a quota whose window is far longer than the one that counted it holds a
/// window index (or bucket) that, multiplied by the new window, passes 2^64: its expiry
/// saturates and is capped instead of overflowing (which aborted Redis).
#[test]
fn counts_from_another_quota_never_overflow_a_keys_expiry() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    let longest = "31622400000";
    // A fixed window of 1 ms counted window 1.7 * 10^12; a group denied by its other key then
    // reads that index under a 366-day window.
    ints(&mut c, &["SLIDEGATE.CHECK", "{s}f", "fixed_window", "5", "1", "1", "NOW", "1700000000000"]);
    ints(&mut c, &["SLIDEGATE.CHECK", "{s}g", "gcra", "1", "1000", "1", "NOW", "1700000000001"]);
    let group = ["{s}f", "fixed_window", "5", longest, "1", "AND", "{s}g", "gcra", "1", "1000", "1"];
    let denied = ints(&mut c, &[&["SLIDEGATE.CHECK"][..], &group, &["NOW", "1700000000001"]].concat());
    assert_eq!(denied[0], 0, "the GCRA key is empty");
    // A sliding window's 1 ms buckets, then one 366-day bucket: the old bucket stays, far ahead.
    ints(&mut c, &["SLIDEGATE.CHECK", "{s}w", "sliding_window", "100", "10", "1", "NOW", "1700000000000"]);
    let admitted =
        ints(&mut c, &["SLIDEGATE.CHECK", "{s}w", "sliding_window", "100", longest, "1", "BUCKETS", "1", "NOW", "1"]);
    assert_eq!(admitted[0], 1);
    let ttl: i64 = redis::cmd("PTTL").arg("{s}w").query(&mut c).expect("pttl");
    assert!(ttl > 0 && ttl <= 2 * 31_622_400_000, "capped at two of the longest windows, got {ttl} ms");
    assert_eq!(run(&mut c, &["PING"]).expect("alive"), Value::SimpleString("PONG".into()));
}

/// `SLIDEGATE.CHECK` has its own entry point: Redis still learns every key of an `AND` group
/// (`COMMAND GETKEYS`), and groups past the checks kept inline answer one row per key, all or
/// nothing.
#[test]
fn keys_are_reported_and_groups_of_any_size_answer_per_key() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&[
            "GETKEYS",
            "SLIDEGATE.CHECK",
            "a",
            "gcra",
            "5",
            "1000",
            "1",
            "AND",
            "b",
            "sliding_log",
            "5",
            "1000",
            "1",
        ])
        .query(&mut c)
        .expect("getkeys");
    assert_eq!(keys, ["a", "b"]);
    let first: Vec<String> =
        redis::cmd("COMMAND").arg(&["GETKEYS", "SLIDEGATE.CHECK", "a", "nonsense"]).query(&mut c).expect("getkeys");
    assert_eq!(first, ["a"], "a malformed command names its first argument");
    let group = |limit: &str| -> Vec<String> {
        let mut args = vec!["SLIDEGATE.CHECK".to_string()];
        for k in 0..5 {
            if k > 0 {
                args.push("AND".into());
            }
            // The last key's limit decides whether the group fits.
            let limit = if k == 4 { limit } else { "10" };
            args.extend([format!("g{k}"), "fixed_window".into(), limit.into(), "60000".into(), "1".into()]);
        }
        args.extend(["NOW".into(), "1700000000000".into()]);
        args
    };
    let admitted = ints(&mut c, &as_strs(&group("1")));
    assert_eq!(admitted.len(), 1 + 6 * 5);
    assert_eq!(admitted[0], 1);
    assert!(admitted[1..].chunks(6).all(|row| row[0] == 1), "{admitted:?}");
    assert_eq!((admitted[2], admitted[26]), (9, 0), "remaining per key");
    let denied = ints(&mut c, &as_strs(&group("1")));
    assert_eq!((denied.len(), denied[0], denied[25], denied[26]), (31, 0, 0, 0), "the last key is full: {denied:?}");
    assert_eq!(denied[2], 9, "nothing was recorded for the others");
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A pool of arguments that makes most generated commands almost valid.
fn argument() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "sliding_log", "sliding_window", "fixed_window", "gcra", "token_bucket", "AND", "NOW", "BUCKETS",
            "BURST", "WARMUP", "k1", "k2", "{t}a", "{t}b", "string",
        ])
        .prop_map(str::to_owned),
        4 => prop_oneof![Just(0u64), 1u64..=10, 1u64..=100_000, Just(u64::MAX), Just(1_000_000_000)].prop_map(|n| n.to_string()),
        1 => "-?[0-9]{1,22}",
        1 => any::<Vec<u8>>().prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

#[test]
fn fuzzed_commands_never_hurt_the_server() {
    let server = RedisServer::start_with_module(&[]);
    let c = std::cell::RefCell::new(server.conn());
    run(&mut c.borrow_mut(), &["SET", "string", "x"]).expect("set");
    let commands = prop::sample::select(vec![
        "SLIDEGATE.CHECK",
        "SLIDEGATE.INSPECT",
        "SLIDEGATE.RESTORE",
        "SLIDEGATE.CHARGE",
        "SLIDEGATE.REFUND",
    ]);
    let mut runner = TestRunner::new(Config { cases: 2_000, failure_persistence: None, ..Config::default() });
    runner
        .run(&(commands, prop::collection::vec(argument(), 0..20)), |(command, args)| {
            let mut cmd = redis::cmd(command);
            for a in &args {
                cmd.arg(a.as_str());
            }
            match cmd.query::<Value>(&mut *c.borrow_mut()) {
                Ok(Value::Array(reply)) if command == "SLIDEGATE.CHECK" => {
                    prop_assert!(reply.len() % 6 == 1, "{reply:?}");
                }
                Ok(Value::Array(reply)) if command != "SLIDEGATE.INSPECT" => {
                    prop_assert!(reply.len() == 7, "{reply:?}");
                }
                Ok(_) => {}
                // An error reply is fine; a dropped connection or an unreadable reply is not.
                Err(e) => prop_assert!(e.code().is_some(), "{args:?}: {e}"),
            }
            Ok(())
        })
        .expect("every command answered");
    assert_eq!(run(&mut c.borrow_mut(), &["PING"]).expect("alive"), Value::SimpleString("PONG".into()));
}

#[test]
fn a_lua_sorted_set_is_taken_over_with_its_admissions() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    // What sliding_log.lua writes: members `<ms>:<id>` scored by their time.
    run(&mut c, &["ZADD", "k", "1000", "1000:a", "1200", "1200:b", "1200", "1200:c"]).expect("zadd");
    let expected = Value::Array(vec![
        Value::Int(3),
        Value::Int(1000),
        Value::Int(9700),
        Value::SimpleString("sliding_log".into()),
        Value::Int(3),
        Value::Int(10_000),
    ]);
    // INSPECT reads the scripts' set as it is, converting nothing.
    let state = run(&mut c, &["SLIDEGATE.INSPECT", "k", "sliding_log", "3", "10000", "NOW", "1500"]).expect("inspect");
    assert_eq!(state, expected);
    assert_eq!(run(&mut c, &["TYPE", "k"]).expect("type"), Value::SimpleString("zset".into()));
    let d = ints(&mut c, &["SLIDEGATE.CHECK", "k", "sliding_log", "3", "10000", "1", "NOW", "1500"]);
    assert_eq!(d, [0, 0, 0, 9700, 9500, 3, 9500], "denied: the oldest leaves at 11,000");
    assert_eq!(run(&mut c, &["TYPE", "k"]).expect("type"), Value::SimpleString("slidegate".into()));
    let state = run(&mut c, &["SLIDEGATE.INSPECT", "k", "NOW", "1500"]).expect("inspect");
    assert_eq!(state, expected, "the same state, now the module's");
    assert_eq!(ints(&mut c, &["SLIDEGATE.CHECK", "k", "sliding_log", "3", "10000", "1", "NOW", "11000"])[0], 1);
}

#[test]
fn inspect_with_times_answers_the_newest_admissions_of_either_store() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    let times = |c: &mut Connection, key: &str, n: &str| match run(
        c,
        &["SLIDEGATE.INSPECT", key, "sliding_log", "3", "10000", "NOW", "1500", "TIMES", n],
    ) {
        Ok(Value::Array(reply)) => reply.get(6).cloned(),
        other => panic!("{other:?}"),
    };
    let array = |ts: &[i64]| Some(Value::Array(ts.iter().map(|t| Value::Int(*t)).collect()));
    // The Lua scripts' sorted set, read as it is, and the module's own value.
    run(&mut c, &["ZADD", "lua", "1000", "1000:a", "1200", "1200:b", "1200", "1200:c"]).expect("zadd");
    assert_eq!(times(&mut c, "lua", "2"), array(&[1200, 1200]));
    ints(&mut c, &["SLIDEGATE.CHECK", "own", "sliding_log", "3", "10000", "2", "NOW", "1000"]);
    assert_eq!(times(&mut c, "own", "10"), array(&[1000, 1000]));
    assert_eq!(times(&mut c, "missing", "10"), array(&[]));
    let e = error(&mut c, &["SLIDEGATE.INSPECT", "own", "TIMES", "10001"]);
    assert!(e.starts_with("ERR TIMES must be at most 10000"), "{e}");
}

/// A sorted set whose scores lie past `MAX_TIME_MS` is not taken over: its times would be
/// saved in the RDB file and refused when loaded back.
#[test]
fn a_sorted_set_of_times_past_the_bound_is_refused_and_reloads() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    run(&mut c, &["ZADD", "far", "10000000000000000", "10000000000000000:a"]).expect("zadd");
    let e = error(&mut c, &["SLIDEGATE.CHECK", "far", "sliding_log", "5", "1000", "1"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    assert_eq!(run(&mut c, &["TYPE", "far"]).expect("type"), Value::SimpleString("zset".into()));
    ints(&mut c, &["SLIDEGATE.CHECK", "near", "sliding_log", "5", "1000", "1"]);
    if let Err(e) = run(&mut c, &["DEBUG", "RELOAD"]) {
        panic!("every key saved and loaded again: {e} ({:?} {:?}); log: {}", e.code(), e.detail(), server.log());
    }
}

/// Admissions of every algorithm on `c`, on the server's clock, some of them denied.
fn traffic(c: &mut Connection) {
    for i in 0..30 {
        for (key, quota) in [
            ("log", &["sliding_log", "10", "60000"][..]),
            ("window", &["sliding_window", "10", "60000", "BUCKETS", "6"][..]),
            ("fixed", &["fixed_window", "10", "60000"][..]),
            ("gcra", &["gcra", "10", "60000", "BURST", "4"][..]),
        ] {
            let cost = (1 + i % 2).to_string();
            // Charges and refunds now and then: they replicate, and replay from the AOF, too.
            let command = match i % 10 {
                3 => "SLIDEGATE.CHARGE",
                7 => "SLIDEGATE.REFUND",
                _ => "SLIDEGATE.CHECK",
            };
            let mut args = vec![command, key, quota[0], quota[1], quota[2], &cost];
            args.extend_from_slice(&quota[3..]);
            ints(c, &args);
        }
    }
    let group = ["SLIDEGATE.CHECK", "{u}a", "sliding_log", "5", "60000", "1", "AND", "{u}b", "gcra", "3", "60000", "1"];
    for _ in 0..6 {
        ints(c, &group);
    }
}

const KEYS: [&str; 6] = ["log", "window", "fixed", "gcra", "{u}a", "{u}b"];

/// The server's clock in ms.
fn now_ms(c: &mut Connection) -> String {
    let time: Vec<u64> = redis::cmd("TIME").query(c).expect("time");
    (time[0] * 1000 + time[1] / 1000).to_string()
}

/// Every key's serialized value (`DUMP`, which is the RDB encoding) and its state as
/// `SLIDEGATE.INSPECT` reads it at `at` (ms).
fn snapshot(c: &mut Connection, at: &str) -> Vec<(Value, Value)> {
    KEYS.iter()
        .map(|k| {
            let dump = run(c, &["DUMP", k]).expect("dump");
            let state = run(c, &["SLIDEGATE.INSPECT", k, "NOW", at]).expect("inspect");
            assert!(matches!(&state, Value::Array(v) if v[0] != Value::Int(0)), "{k} holds admissions at {at}");
            (dump, state)
        })
        .collect()
}

#[test]
fn values_survive_debug_reload_and_dump_restore() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    traffic(&mut c);
    let at = now_ms(&mut c);
    let before = snapshot(&mut c, &at);
    run(&mut c, &["DEBUG", "RELOAD"]).expect("save and load the RDB file");
    assert_eq!(snapshot(&mut c, &at), before, "the same values after an RDB round trip");
    let Value::BulkString(dump) = &before[0].0 else { panic!("a dump") };
    redis::cmd("RESTORE").arg("copy").arg(0).arg(dump.as_slice()).query::<()>(&mut c).expect("restore");
    let copy = run(&mut c, &["SLIDEGATE.INSPECT", "copy", "NOW", &at]).expect("inspect");
    assert_eq!(copy, before[0].1);
    // COPY makes an independent value: charging the copy leaves the original as it was.
    assert_eq!(run(&mut c, &["COPY", "gcra", "gcra2"]).expect("copy"), Value::Int(1));
    ints(&mut c, &["SLIDEGATE.CHECK", "gcra2", "gcra", "1000", "60000", "1", "BURST", "500"]);
    assert_eq!(snapshot(&mut c, &at)[3], before[3], "the original is untouched");
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_aof_rewrite_replays_to_the_same_values() {
    let server = RedisServer::start_with_module(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let mut c = server.conn();
    traffic(&mut c);
    let at = now_ms(&mut c);
    let before = snapshot(&mut c, &at);
    run(&mut c, &["BGREWRITEAOF"]).expect("rewrite");
    wait_for("the AOF rewrite", || {
        let info: String = redis::cmd("INFO").arg("persistence").query(&mut c).expect("info");
        info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0")
    });
    // After the rewrite, more traffic lands in the incremental file; both replay.
    let admitted = ints(&mut c, &["SLIDEGATE.CHECK", "log", "sliding_log", "100", "60000", "1"]);
    assert_eq!(admitted[0], 1);
    let expected = snapshot(&mut c, &at);
    assert_ne!(expected, before, "the last check changed the log");
    run(&mut c, &["DEBUG", "LOADAOF"]).expect("flush and reload the AOF");
    assert_eq!(snapshot(&mut c, &at), expected);
}

#[test]
fn a_replica_holds_exactly_what_the_master_holds() {
    let master = RedisServer::start_with_module(&[]);
    let port = master.port().to_string();
    let replica = RedisServer::start_with_module(&["--replicaof", "127.0.0.1", &port]);
    let (mut m, mut r) = (master.conn(), replica.conn());
    wait_for("the replica's link", || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut r).expect("info");
        info.contains("master_link_status:up")
    });
    traffic(&mut m);
    // Denials that drop expired admissions change the master's value: they replicate too.
    for t in ["1000", "70000", "70001"] {
        ints(&mut m, &["SLIDEGATE.CHECK", "old", "sliding_log", "1", "60000", "1", "NOW", t]);
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query(&mut m).expect("wait");
    assert_eq!(acked, 1, "the replica acknowledged every write");
    let at = now_ms(&mut m);
    assert_eq!(snapshot(&mut r, &at), snapshot(&mut m, &at), "byte for byte (DUMP) and decision for decision");
    let dumps = |c: &mut Connection| run(c, &["DUMP", "old"]).expect("dump");
    assert_eq!(dumps(&mut r), dumps(&mut m));
    let ttl = |c: &mut Connection| redis::cmd("PTTL").arg("log").query::<i64>(c).expect("pttl");
    assert!(ttl(&mut r) > 0 && ttl(&mut m) > 0, "both expire");
}

#[test]
fn keys_expire_after_their_last_admission_and_report_their_memory() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    ints(&mut c, &["SLIDEGATE.CHECK", "short", "sliding_log", "5", "300", "1"]);
    let ttl: i64 = redis::cmd("PTTL").arg("short").query(&mut c).expect("pttl");
    assert!((1..=300).contains(&ttl), "expires one window after the admission, got {ttl} ms");
    wait_for("the key to expire", || redis::cmd("EXISTS").arg("short").query::<i64>(&mut c).expect("exists") == 0);
    for _ in 0..100 {
        ints(&mut c, &["SLIDEGATE.CHECK", "hundred", "sliding_log", "100", "60000", "1"]);
    }
    let bytes: i64 = redis::cmd("MEMORY").arg("USAGE").arg("hundred").query(&mut c).expect("memory usage");
    assert!(
        (100..600).contains(&bytes),
        "100 admissions of a byte or two each (their gaps in ms) and some overhead, got {bytes}"
    );
}
