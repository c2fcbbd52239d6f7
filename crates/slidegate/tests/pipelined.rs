//! slidegate's pipelined connection against real redis-server processes: every reply reaches
//! the caller that asked, in batches and after callers gave up; AUTH and SELECT from the URL; a
//! Unix socket; transactions; a dropped connection fails its callers and the next call connects
//! again, and so does one that went silent; the queue is bounded, and callers that gave up
//! are not sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use slidegate::redis::MAX_IN_FLIGHT;
use slidegate::{Error, Limiter, PipelinedConnection, Quota, RedisBackend, RedisEngine};
use slidegate_testkit::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, tcp};

async fn connect(url: &str) -> PipelinedConnection {
    PipelinedConnection::connect(url).await.expect("connect")
}

async fn echo(conn: &mut PipelinedConnection, what: &str) -> String {
    redis::cmd("ECHO").arg(what).query_async(conn).await.expect("ECHO")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_each_get_their_own_replies() {
    let server = RedisServer::start();
    let conn = connect(&server.url()).await;
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let mut conn = conn.clone();
            tokio::spawn(async move {
                for i in 0..300 {
                    // Replies of every shape, so that a misplaced one shows as a wrong value.
                    let what = format!("{t}:{i}");
                    assert_eq!(echo(&mut conn, &what).await, what);
                    let n: i64 =
                        redis::cmd("INCR").arg(format!("counter:{t}")).query_async(&mut conn).await.expect("INCR");
                    assert_eq!(n, i + 1);
                    let both: Vec<Option<i64>> = redis::cmd("MGET")
                        .arg("missing")
                        .arg(format!("counter:{t}"))
                        .query_async(&mut conn)
                        .await
                        .expect("MGET");
                    assert_eq!(both, [None, Some(i + 1)]);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let info: String = server.query(&["INFO", "stats"]);
    let reads: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_reads_processed");
    // Batched, Redis reads ~20 commands at a time here; a write per command made it ~1.7.
    let commands = 64 * 300 * 3;
    assert!(reads < commands / 4, "{reads} reads for {commands} commands: the writes were not batched");
}

#[tokio::test]
async fn callers_that_give_up_do_not_shift_the_replies_of_others() {
    let server = RedisServer::start();
    let mut conn = connect(&server.url()).await;
    for round in 0..3 {
        // A BLPOP on an empty list holds this connection's replies back past the caller's
        // patience; the ECHOs sent after it queue behind it. Half a second: far longer than
        // the callers' patience below, even on a machine that stalls a thread now and then,
        // and shorter than the second of silence after which a connection whose callers gave
        // up is replaced.
        let sleep = redis::cmd("BLPOP").arg("empty").arg("0.5").to_owned();
        let mut slow = conn.clone();
        let gave_up =
            tokio::time::timeout(Duration::from_millis(20), async move { slow.req_packed_command(&sleep).await }).await;
        assert!(gave_up.is_err(), "round {round}: the sleep answered early");
        let mut waiting = conn.clone();
        let behind = tokio::time::timeout(Duration::from_millis(10), async move { echo(&mut waiting, "behind").await });
        assert!(behind.await.is_err(), "round {round}: a reply overtook the sleep");
        assert_eq!(echo(&mut conn, &format!("after {round}")).await, format!("after {round}"));
    }
}

#[tokio::test]
async fn auth_and_select_come_from_the_url() {
    let server = RedisServer::start();
    server.query::<String>(&["ACL", "SETUSER", "alice", "on", ">wonderland", "~*", "+@all"]);
    server.query::<String>(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let port = server.port();
    let mut by_password = connect(&format!("redis://:s3cret@127.0.0.1:{port}/3")).await;
    let _: () = redis::cmd("SET").arg("where").arg("db3").query_async(&mut by_password).await.expect("SET");
    assert_eq!(by_password.get_db(), 3);
    let mut by_user = connect(&format!("redis://alice:wonderland@127.0.0.1:{port}/3")).await;
    let seen: String = redis::cmd("GET").arg("where").query_async(&mut by_user).await.expect("GET");
    assert_eq!(seen, "db3", "both connections selected db 3");
    let whoami: String = redis::cmd("ACL").arg("WHOAMI").query_async(&mut by_user).await.expect("WHOAMI");
    assert_eq!(whoami, "alice");
    let mut default_db = connect(&format!("redis://:s3cret@127.0.0.1:{port}")).await;
    let none: Option<String> = redis::cmd("GET").arg("where").query_async(&mut default_db).await.expect("GET");
    assert_eq!(none, None);
    let refused = PipelinedConnection::connect(&format!("redis://:wrong@127.0.0.1:{port}")).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("WRONGPASS")), "a wrong password is refused");
}

#[tokio::test]
async fn a_unix_socket_serves_decisions() {
    let dir = std::env::temp_dir().join(format!("slidegate-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let socket = dir.join("redis.sock");
    let path = socket.to_str().expect("utf-8 path");
    let server = RedisServer::start_with(&["--unixsocket", path, "--unixsocketperm", "700"]);
    let limiter = Limiter::new(RedisBackend::connect(&format!("unix://{path}")).await.expect("connect"));
    let q = Quota::new(2, Duration::from_secs(60)).expect("quota");
    let mut decisions = Vec::new();
    for _ in 0..3 {
        decisions.push(limiter.check("k", &q).await.expect("check").allowed);
    }
    assert_eq!(decisions, [true, true, false]);
    assert_eq!(server.query::<u64>(&["ZCARD", "slidegate:k"]), 2);
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn transactions_answer_their_commands_only() {
    let server = RedisServer::start();
    let mut conn = connect(&server.url()).await;
    let (a, b): (i64, i64) =
        redis::pipe().atomic().incr("t", 5).incr("t", 2).query_async(&mut conn).await.expect("MULTI");
    assert_eq!((a, b), (5, 7));
    let (c, s): (i64, String) =
        redis::pipe().incr("t", 1).cmd("ECHO").arg("x").query_async(&mut conn).await.expect("pipeline");
    assert_eq!((c, s), (8, "x".to_owned()));
}

#[tokio::test]
async fn a_killed_connection_fails_its_callers_and_the_next_call_connects_again() {
    let server = RedisServer::start();
    let mut conn = connect(&server.url()).await;
    let id: i64 = redis::cmd("CLIENT").arg("ID").query_async(&mut conn).await.expect("CLIENT ID");
    // A caller waits on the connection (a BLPOP that never returns) when it is killed.
    let mut waiting = conn.clone();
    let sleeper =
        tokio::spawn(async move { redis::cmd("BLPOP").arg("empty").arg("0").query_async::<()>(&mut waiting).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(server.query::<i64>(&["CLIENT", "KILL", "ID", &id.to_string()]), 1);
    let failed = tokio::time::timeout(Duration::from_secs(5), sleeper).await.expect("answered").expect("task");
    assert!(failed.is_err_and(|e| e.is_io_error()), "the waiting caller sees the connection fail");
    assert_eq!(echo(&mut conn, "again").await, "again");
    let new_id: i64 = redis::cmd("CLIENT").arg("ID").query_async(&mut conn).await.expect("CLIENT ID");
    assert_ne!(new_id, id, "a new connection");
}

/// A TCP proxy in front of Redis that can turn the connections it holds into black holes: their
/// bytes are taken and dropped both ways, and nothing is reset — a partition, a host gone or a
/// NAT entry dropped, as the client sees it. Connections accepted later forward again.
struct BlackHoleProxy {
    port: u16,
    accepted: Arc<AtomicUsize>,
    /// Connections numbered below this are black holes.
    holes_below: Arc<AtomicUsize>,
    /// Connections whose client side has closed.
    closed: Arc<AtomicUsize>,
}

impl BlackHoleProxy {
    async fn start(redis_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let [accepted, holes_below, closed] = [0; 3].map(|_| Arc::new(AtomicUsize::new(0)));
        let proxy = Self { port, accepted: accepted.clone(), holes_below: holes_below.clone(), closed: closed.clone() };
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let n = accepted.fetch_add(1, Ordering::SeqCst);
                let redis = TcpStream::connect(("127.0.0.1", redis_port)).await.expect("connect to Redis");
                let ((client_r, client_w), (redis_r, redis_w)) = (client.into_split(), redis.into_split());
                let (holes, closed) = (holes_below.clone(), closed.clone());
                tokio::spawn(async move {
                    pump(client_r, redis_w, n, &holes).await;
                    closed.fetch_add(1, Ordering::SeqCst);
                });
                let holes = holes_below.clone();
                tokio::spawn(async move { pump(redis_r, client_w, n, &holes).await });
            }
        });
        proxy
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every connection open now goes silent.
    fn swallow_open_connections(&self) {
        self.holes_below.store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until `from` closes, dropping the bytes once connection `n` is a hole.
async fn pump(mut from: tcp::OwnedReadHalf, mut to: tcp::OwnedWriteHalf, n: usize, holes_below: &AtomicUsize) {
    let mut buf = vec![0; 16 * 1024];
    while let Ok(len @ 1..) = from.read(&mut buf).await {
        if n >= holes_below.load(Ordering::SeqCst) && to.write_all(&buf[..len]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_connection_silent_past_its_callers_deadline_is_replaced() {
    let server = RedisServer::start();
    let proxy = BlackHoleProxy::start(server.port()).await;
    // The backend's default deadline (50 ms): each decision on the silent connection gives up.
    let limiter = Limiter::new(RedisBackend::connect(&proxy.url()).await.expect("connect"));
    let q = Quota::per_minute(1_000).expect("quota");
    assert!(limiter.check("k", &q).await.expect("through the proxy").allowed);
    proxy.swallow_open_connections();
    let silent_since = Instant::now();
    let mut timeouts = 0;
    let recovered_after = loop {
        match limiter.check("k", &q).await {
            Ok(d) => break (d.allowed, silent_since.elapsed()),
            Err(slidegate::Error::Timeout(_)) => timeouts += 1,
            // The calls in flight when the link is given up get its error.
            Err(e) => assert!(e.to_string().contains("presumed dead"), "{e}"),
        }
        assert!(silent_since.elapsed() < Duration::from_secs(5), "no decision 5 s after the connection went silent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(recovered_after.0, "a decision through a new connection");
    // A caller giving up alone does not drop the connection: a second of silence does.
    assert!(timeouts >= 5, "{timeouts} decisions timed out first");
    assert!(recovered_after.1 >= Duration::from_millis(900), "replaced after {:?}", recovered_after.1);
    assert_eq!(proxy.accepted.load(Ordering::SeqCst), 2, "one new connection");
    let closed_by = Instant::now() + Duration::from_secs(3);
    while proxy.closed.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < closed_by, "the silent connection was never closed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn silence_alone_keeps_the_connection() {
    let server = RedisServer::start();
    let mut conn = connect(&server.url()).await;
    let client_id = async |conn: &mut PipelinedConnection| -> i64 {
        redis::cmd("CLIENT").arg("ID").query_async(conn).await.expect("CLIENT ID")
    };
    let id = client_id(&mut conn).await;
    // Idle past the silence limit, then a caller that waits longer than it without giving up.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let popped: Option<(String, String)> =
        redis::cmd("BLPOP").arg("empty").arg("1.5").query_async(&mut conn).await.expect("BLPOP times out empty");
    assert_eq!(popped, None);
    assert_eq!(client_id(&mut conn).await, id, "the same connection throughout");
}

/// Blocks the Redis at `url` for `seconds` (`DEBUG SLEEP`) from a thread of its own, so that the
/// caller goes on while Redis stalls; the handle returns once Redis is back.
fn stall(url: String, seconds: &'static str) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).and_then(|c| c.get_connection()).expect("conn");
        let _: () = redis::cmd("DEBUG").arg("SLEEP").arg(seconds).query(&mut conn).expect("DEBUG SLEEP");
    })
}

/// Calls of `EVALSHA` and `EVAL` Redis has run since its statistics were last reset.
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = server.query(&["INFO", "commandstats"]);
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_beyond_the_queue_bound_fail_at_once_with_a_timeout() {
    const BOUND: usize = 64;
    const CALLERS: usize = 500;
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let conn = connect(&server.url()).await.with_max_queued(BOUND);
    // A deadline longer than the stall: queued callers wait it out and are answered.
    let backend =
        RedisBackend::with_connection(conn.clone()).with_engine(RedisEngine::Lua).with_timeout(Duration::from_secs(10));
    let limiter = Limiter::new(backend);
    let q = Quota::per_minute(10).expect("quota");
    let stalled = stall(server.url(), "2");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The attack: far more concurrent callers than the queue holds while Redis does not answer.
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let result = limiter.check(&format!("k{i}"), &q).await;
                (result, started.elapsed())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(conn.queued() <= BOUND, "{} commands held, the bound is {BOUND}", conn.queued());
    let (mut admitted, mut refused) = (0, 0);
    for t in tasks {
        match t.await.expect("task") {
            (Ok(d), _) => admitted += usize::from(d.allowed),
            (Err(Error::Timeout(_)), waited) => {
                refused += 1;
                // Refused when sent, not after the stall (2 s) or the deadline (10 s).
                assert!(waited < Duration::from_secs(1), "a refused caller waited {waited:?}");
            }
            (Err(e), _) => panic!("unexpected error: {e}"),
        }
    }
    stalled.join().expect("stall");
    assert_eq!(admitted, BOUND, "the queued callers are answered once Redis is back");
    assert_eq!(refused, CALLERS - BOUND, "every caller beyond the bound is refused");
    assert_eq!(conn.queued(), 0);
    assert!(limiter.check("after", &q).await.expect("decided").allowed, "the connection serves on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_of_callers_that_gave_up_are_not_sent_when_redis_returns() {
    const CALLERS: usize = 1_000;
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let conn = connect(&server.url()).await;
    let backend = RedisBackend::with_connection(conn.clone())
        .with_engine(RedisEngine::Lua)
        .with_timeout(Duration::from_millis(100));
    let limiter = Limiter::new(backend);
    let q = Quota::per_minute(10).expect("quota");
    assert!(limiter.check("warm", &q).await.expect("decided").allowed, "the script is cached");
    server.query::<String>(&["CONFIG", "RESETSTAT"]);
    // Shorter than the connection's silence limit (1 s): the same connection lives through it.
    let stalled = stall(server.url(), "0.6");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check(&format!("k{i}"), &q).await })
        })
        .collect();
    for t in tasks {
        let result = t.await.expect("task");
        assert!(matches!(result, Err(Error::Timeout(_))), "every caller gives up: {result:?}");
    }
    stalled.join().expect("stall");
    // Redis is back: it answers what was in flight, and nothing else reaches it.
    let settled_by = Instant::now() + Duration::from_secs(5);
    while conn.queued() > 0 {
        assert!(Instant::now() < settled_by, "{} commands still held", conn.queued());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ran = script_calls(&server);
    assert!((1..=MAX_IN_FLIGHT as u64).contains(&ran), "{ran} of {CALLERS} abandoned decisions reached Redis");
    assert_eq!(server.query::<u64>(&["DBSIZE"]), ran + 1, "one key per decision Redis ran, and `warm`");
    assert!(limiter.check("after", &q).await.expect("decided").allowed, "replies still reach their callers");
    assert_eq!(script_calls(&server), ran + 1);
}
