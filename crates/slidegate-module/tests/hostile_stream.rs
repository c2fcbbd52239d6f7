//! A real redis-server with the module loaded, under a stream of random `SLIDEGATE.*` commands
//! from several connections at once (valid and invalid: every subcommand, any arity, numbers up
//! to and past every bound, the largest work a command may ask for, binary keys, `RESTORE`
//! payloads valid and corrupted), while another connection keeps asking `PING`. Afterwards the
//! server is alive, every key survives an RDB round trip (`DEBUG RELOAD`), and its memory is what
//! the keys written account for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use slidegate::state::MAX_TIME_MS;
use slidegate::{MAX_CHECKS, MAX_LIMIT, MAX_LOG_LIMIT, MAX_WINDOW};
use slidegate_testkit::RedisServer;

/// How long the commands stream, and how many each connection sends at most.
const STREAM_FOR: Duration = Duration::from_secs(20);
const MAX_COMMANDS_PER_CONNECTION: usize = 50_000;
const CONNECTIONS: u64 = 3;
/// Distinct keys each connection writes to (so the memory they may take is known).
const KEYS_PER_CONNECTION: u64 = 40;
/// The bound on how long Redis may leave a `PING` unanswered.
const PING_BOUND: Duration = Duration::from_millis(10);

/// The bound this build is held to: [`PING_BOUND`] for an optimized module (`cargo test
/// --release`, the build Redis runs). An unoptimized one does the same work several times
/// slower: a check whose time precedes its log's newest admission (another caller's `NOW` can
/// make it so) rebuilds the log, about 2 ms per 50,000 permits unoptimized, and one command may
/// hold 16 such checks; so it is held to five times the bound.
fn ping_bound() -> Duration {
    if cfg!(debug_assertions) { PING_BOUND * 5 } else { PING_BOUND }
}

/// splitmix64: a seeded, reproducible stream of numbers (the seed is printed on failure).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// A number at an edge (0, 1, a bound, one past it, 2^64 - 1) or anywhere.
    fn number(&mut self) -> u64 {
        let window_ms = MAX_WINDOW.as_millis() as u64;
        let edges = [0, 1, 2, 5, 100, 1_000, 60_000, MAX_LOG_LIMIT, MAX_LOG_LIMIT + 1, MAX_LIMIT, MAX_LIMIT + 1];
        match self.below(4) {
            0 => *self.pick(&edges),
            1 => *self.pick(&[window_ms, window_ms + 1, MAX_TIME_MS, MAX_TIME_MS + 1, u64::MAX]),
            2 => self.below(1_000),
            _ => self.next() >> self.below(64),
        }
    }
}

/// The algorithms, in the order keys are given them (a key checked under another algorithm
/// than it counts by is refused with `WRONGTYPE`, which the stream asks for only now and then).
const ALGORITHMS: [&str; 5] = ["sliding_log", "sliding_window", "fixed_window", "gcra", "token_bucket"];

/// One check's arguments: `key algorithm limit window_ms cost [options]`, mostly valid, with the
/// largest work a check may ask for (a 100,000-permit log charged 100,000 at once, GCRA bursts
/// up to 10^9) often, and now and then numbers at and past every bound.
fn check(rng: &mut Rng, (key, algorithm): (Vec<u8>, &str), out: &mut Vec<Vec<u8>>) {
    let algorithm = match rng.below(50) {
        0 => "Leaky",
        1 => rng.pick(&ALGORITHMS),
        _ => algorithm,
    };
    // The largest limit of the algorithm, and a cost up to it.
    let max = if algorithm == "sliding_log" { MAX_LOG_LIMIT } else { MAX_LIMIT };
    let (limit, window, cost) = match rng.below(16) {
        0..=3 => (MAX_LOG_LIMIT, 1_000 * (1 + rng.below(120)), MAX_LOG_LIMIT),
        4..=10 => (1 + rng.below(100), 1_000 * (1 + rng.below(60)), 1 + rng.below(3)),
        11..=14 => (max, 1_000_000, 1 + rng.below(max)),
        _ => (rng.number(), rng.number(), rng.number()),
    };
    out.extend([key, algorithm.into(), limit.to_string().into(), window.to_string().into(), cost.to_string().into()]);
    let number = |n: u64| n.to_string().into_bytes();
    match (algorithm, rng.below(4)) {
        ("sliding_window", 0) => out.extend([b"BUCKETS".to_vec(), number(*rng.pick(&[1, 10, 100, 101, 7]))]),
        ("gcra" | "token_bucket", 0) => {
            out.extend([b"burst".to_vec(), number(*rng.pick(&[1_000_000_000, 1_000_000_000, 1, 0]))]);
        }
        // A warm-up starting fully warm admits any cost; a colder one only small costs.
        (_, 1) => out.extend([b"WARMUP".to_vec(), number(1 + rng.below(60_000)), number(1_000)]),
        (_, 2) if cost <= 3 => {
            out.extend([b"WARMUP".to_vec(), number(1 + rng.below(60_000)), number(1 + rng.below(1_000))]);
        }
        (_, 3) if rng.below(8) == 0 => out.extend([b"WARMUP".to_vec(), number(rng.number()), number(rng.number())]),
        _ => {}
    }
}

/// A time around the present (often), or anywhere up to and past `MAX_TIME_MS`.
fn now(rng: &mut Rng) -> u64 {
    match rng.below(3) {
        0 => 1_700_000_000_000 + rng.below(1_000_000),
        1 => rng.below(100_000),
        _ => rng.number(),
    }
}

/// A `SLIDEGATE.RESTORE` payload: a value as the module writes it (a quota in six words, then
/// a counter), often with a byte flipped, cut or added.
fn payload(rng: &mut Rng) -> Vec<u8> {
    let n = rng.below(300);
    let mut words = vec![MAX_LOG_LIMIT, 60_000, 0, 0, 0, 0, 0, 0, n];
    let mut t = 1_700_000_000_000;
    for _ in 0..n {
        t += rng.below(100);
        words.push(t);
    }
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match rng.below(4) {
        0 => {}
        1 => {
            let at = rng.below(bytes.len() as u64) as usize;
            bytes[at] ^= 1 << rng.below(8);
        }
        2 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
        _ => bytes.extend((0..8).map(|_| rng.next() as u8)),
    }
    bytes
}

/// One random command of connection `worker`, as its arguments.
fn command(rng: &mut Rng, worker: u64) -> Vec<Vec<u8>> {
    // A key and the algorithm it counts by.
    let key = |rng: &mut Rng| -> (Vec<u8>, &str) {
        let k = rng.below(KEYS_PER_CONNECTION);
        // Hash tags, binary keys, keys spelled like a keyword, non-ASCII keys.
        let key = match k % 4 {
            0 => format!("{{t{worker}}}k{k}").into_bytes(),
            1 => [b"\x00\xff\r\n".as_slice(), &k.to_le_bytes(), &worker.to_le_bytes()].concat(),
            2 => format!("NOW{worker}-{k}").into_bytes(),
            _ => format!("w{worker}\u{2603}{k}").into_bytes(),
        };
        (key, ALGORITHMS[(k / 4 % 5) as usize])
    };
    let mut args = Vec::new();
    match rng.below(10) {
        0..=6 => {
            args.push(b"SLIDEGATE.CHECK".to_vec());
            // Up to MAX_CHECKS checks (sometimes one more), keys of one hash tag.
            let checks = if rng.below(8) == 0 { rng.below(MAX_CHECKS as u64 + 2) } else { 1 + rng.below(3) };
            for i in 0..checks {
                if i > 0 {
                    args.push(b"AND".to_vec());
                }
                let k = if rng.below(2) == 0 {
                    key(rng)
                } else {
                    (format!("{{t{worker}}}and{i}").into_bytes(), ALGORITHMS[i as usize % 5])
                };
                check(rng, k, &mut args);
            }
            if rng.below(3) == 0 {
                args.extend([b"NOW".to_vec(), now(rng).to_string().into_bytes()]);
            }
        }
        7 => {
            let (name, algorithm) = key(rng);
            args.extend([b"SLIDEGATE.INSPECT".to_vec(), name]);
            if rng.below(2) == 0 {
                check(rng, (b"-".to_vec(), algorithm), &mut args);
                // INSPECT takes no key and no cost in its quota.
                args.remove(2);
                args.remove(5);
            }
        }
        8 => {
            // The payloads are sliding logs: restored over the keys that count by one.
            let log_key = std::iter::repeat_with(|| key(rng)).find(|(_, a)| *a == "sliding_log").map(|(k, _)| k);
            args.extend([b"SLIDEGATE.RESTORE".to_vec(), log_key.expect("a key"), payload(rng)]);
        }
        _ => {
            args.push(rng.pick(&[&b"SLIDEGATE.CHECK"[..], b"SLIDEGATE.INSPECT", b"SLIDEGATE.RESTORE"]).to_vec());
            for _ in 0..rng.below(8) {
                args.push((0..rng.below(12)).map(|_| rng.next() as u8).collect());
            }
        }
    }
    // Random arity: now and then an argument too few or too many.
    match rng.below(12) {
        0 if args.len() > 1 => {
            args.pop();
        }
        1 => args.push(rng.number().to_string().into_bytes()),
        _ => {}
    }
    args
}

/// What a connection's commands got back.
#[derive(Debug, Default)]
struct Tally {
    sent: usize,
    /// `SLIDEGATE.CHECK`s admitted, and those that charged a 100,000-permit log at once.
    admitted: usize,
    largest_admitted: usize,
    denied: usize,
    errors: usize,
    other_replies: usize,
}

/// Sends random commands until `deadline` or the command cap; panics on anything but a reply
/// (an error reply is an answer; a dropped connection is not).
fn stream(server: &RedisServer, worker: u64, seed: u64, deadline: Instant) -> Tally {
    let mut c = server.conn();
    let mut rng = Rng(seed ^ worker.wrapping_mul(0x1000_0000_01b3));
    let mut tally = Tally::default();
    let largest = MAX_LOG_LIMIT.to_string().into_bytes();
    // `sliding_log 100000 <window> 100000`: the largest log charged its whole limit at once.
    let is_largest = |w: &[Vec<u8>]| w[0] == b"sliding_log" && w[1] == largest && w[3] == largest;
    while tally.sent < MAX_COMMANDS_PER_CONNECTION && Instant::now() < deadline {
        let args = command(&mut rng, worker);
        let mut cmd = redis::cmd(std::str::from_utf8(&args[0]).expect("a command name"));
        for a in &args[1..] {
            cmd.arg(a.as_slice());
        }
        match cmd.query::<Value>(&mut c) {
            Ok(Value::Array(reply)) if args[0] == b"SLIDEGATE.CHECK" => {
                assert!(reply.len() % 6 == 1, "seed {seed}: {args:?} answered {reply:?}");
                if reply[0] == Value::Int(1) {
                    tally.admitted += 1;
                    tally.largest_admitted += usize::from(args.windows(4).any(is_largest));
                } else {
                    tally.denied += 1;
                }
            }
            Ok(_) => tally.other_replies += 1,
            Err(e) => {
                assert!(e.code().is_some(), "seed {seed}: {args:?}: {e}\n{}", server.log());
                tally.errors += 1;
            }
        }
        tally.sent += 1;
    }
    tally
}

/// `PING`s every few ms until `stop`, returning each answer's latency.
fn pings(server: &RedisServer, stop: &AtomicBool) -> Vec<Duration> {
    let mut c = server.conn();
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let pong: String = redis::cmd("PING").query(&mut c).expect("PING answered");
        latencies.push(sent.elapsed());
        assert_eq!(pong, "PONG");
        std::thread::sleep(Duration::from_millis(2));
    }
    latencies
}

fn info_field(c: &mut Connection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg(section).query(c).expect("info");
    let line = info.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).expect("the field");
    line.trim().parse().expect("a number")
}

/// The most memory one key may take: a sliding log at its largest (`MAX_LOG_LIMIT` admissions
/// of up to 9 bytes each — the gap of a time up to 2^53 ms as LEB128 — in a ring that may be
/// twice that, and a mark every 256), or any counter (a few hundred bytes), plus Redis' own
/// per-key overhead and the key.
const MAX_BYTES_PER_KEY: u64 = 2 * 9 * MAX_LOG_LIMIT + 2 * 24 * (MAX_LOG_LIMIT / 256) + 4_096;

/// Every key's `MEMORY USAGE` is within [`MAX_BYTES_PER_KEY`], and Redis' allocated memory
/// beyond `baseline` within twice their sum plus a margin for client buffers: values freed when
/// overwritten, deleted or expired are not kept.
fn memory_is_accounted_for(c: &mut Connection, baseline: u64, when: &str) -> (u64, u64) {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(c).expect("keys");
    let mut total = 0;
    for key in &keys {
        let bytes: Option<u64> = redis::cmd("MEMORY").arg("USAGE").arg(key.as_slice()).query(c).expect("usage");
        let bytes = bytes.unwrap_or(0);
        assert!(bytes <= MAX_BYTES_PER_KEY, "{when}: {key:?} takes {bytes} bytes");
        total += bytes;
    }
    assert!(
        keys.len() as u64 <= CONNECTIONS * (KEYS_PER_CONNECTION + MAX_CHECKS as u64 + 1),
        "{when}: {} keys",
        keys.len()
    );
    let used = info_field(c, "memory", "used_memory");
    let margin = 8 << 20;
    assert!(
        used <= baseline + 2 * total + margin,
        "{when}: {used} bytes used, {baseline} before the stream, keys account for {total}"
    );
    (used, total)
}

#[test]
fn a_stream_of_hostile_commands_leaves_redis_responsive_and_consistent() {
    let server = RedisServer::start_with_module(&[]);
    let mut c = server.conn();
    let baseline = info_field(&mut c, "memory", "used_memory");
    let seed = std::env::var("SLIDEGATE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("seed {seed} (SLIDEGATE_FUZZ_SEED replays it)");
    // Redis' own record of every command that ran 10 ms or longer (queueing excluded).
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(PING_BOUND.as_micros() as u64)
        .query::<()>(&mut c)
        .expect("config");
    redis::cmd("CONFIG").arg("SET").arg("slowlog-max-len").arg(10_000).query::<()>(&mut c).expect("config");
    let deadline = Instant::now() + STREAM_FOR;
    let stop = AtomicBool::new(false);
    let (tallies, mut latencies) = std::thread::scope(|s| {
        let ping = s.spawn(|| pings(&server, &stop));
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|w| {
                s.spawn({
                    let server = &server;
                    move || stream(server, w, seed, deadline)
                })
            })
            .collect();
        // Every worker joined before any verdict, and the pinger stopped whatever they did: a
        // worker's panic fails the test instead of leaving the pinger (and the scope) running.
        let joined: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::Relaxed);
        let latencies = ping.join().expect("the pinger finished");
        (joined.into_iter().map(|w| w.expect("a worker finished")).collect::<Vec<Tally>>(), latencies)
    });
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!("{tallies:?}");
    println!(
        "{} PINGs: p50 {:?}, p90 {:?}, p99 {:?}, p99.9 {:?}, max {:?}",
        latencies.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(0.999),
        at(1.0)
    );
    // Redis' own record of the commands that ran 10 ms or longer.
    let slow: Vec<Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query(&mut c).expect("slowlog");
    let longest = slow.iter().filter_map(|e| match e {
        Value::Array(fields) => match fields.get(2) {
            Some(Value::Int(us)) => Some(Duration::from_micros(*us as u64)),
            _ => None,
        },
        _ => None,
    });
    println!("{} commands ran {PING_BOUND:?} or longer inside Redis, the longest {:?}", slow.len(), longest.max());
    // The stream did what it is for: many admissions, among them the largest a check may ask.
    let sum = |f: fn(&Tally) -> usize| tallies.iter().map(f).sum::<usize>();
    assert!(sum(|t| t.admitted) > 1_000 && sum(|t| t.largest_admitted) > 10, "{tallies:?}");
    assert!(sum(|t| t.denied) > 100 && sum(|t| t.errors) > 100 && sum(|t| t.other_replies) > 100, "{tallies:?}");
    // The 99th percentile, not the worst: the test shares two vCPUs with builds and other tests,
    // so a PING may wait for a CPU rather than for Redis; a command that stalled Redis would
    // delay every PING sent during it, which the percentile catches.
    assert!(at(0.99) < ping_bound(), "PING latency p99 {:?} (max {:?})", at(0.99), at(1.0));

    assert_eq!(redis::cmd("PING").query::<String>(&mut c).expect("alive"), "PONG");
    let (_, before) = memory_is_accounted_for(&mut c, baseline, "after the stream");
    redis::cmd("DEBUG").arg("RELOAD").query::<()>(&mut c).expect("every value saved and loaded again");
    let (_, after) = memory_is_accounted_for(&mut c, baseline, "after DEBUG RELOAD");
    println!("keys account for {before} bytes before the reload, {after} after");
    assert_eq!(redis::cmd("PING").query::<String>(&mut c).expect("alive"), "PONG");
}
