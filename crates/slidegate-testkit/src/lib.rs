//! Test support: real `redis-server` processes, never mocks.
//!
//! [`RedisServer::start`] launches a server on a free port of 127.0.0.1 with persistence off and
//! a scratch directory of its own, waits (bounded) until it answers `PING`, and kills it by pid
//! when dropped — also when the test panics. Each test that needs Redis starts its own, so
//! tests never see each other's keys and can kill or stall their server freely.
//!
//! [`FaultProxy`] stands between a client and a server on loopback and fails the network
//! between them on demand ([`Fault`]: latency, loss, blackhole, half-open, reset).

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod fault;
mod module;
mod tls;
pub use fault::{CHUNK, Direction, Fault, FaultProxy, MAX_HELD_CHUNKS, TICK};
pub use module::module_path;
pub use tls::{CertFiles, Flaw, TestPki};

/// How long a server may take to answer its first `PING`.
const START_DEADLINE: Duration = Duration::from_secs(10);

/// A `redis-server` child process on a loopback port.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    /// Set when the server serves TLS too ([`RedisServer::start_tls`]).
    tls_port: Option<u16>,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a plain server (no persistence).
    ///
    /// # Panics
    /// When `redis-server` is not installed (`scripts/test.sh` installs it) or does not come up.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (`["--maxmemory", "10mb"]`).
    ///
    /// # Panics
    /// As [`RedisServer::start`].
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_retrying(|| extra.iter().map(|&a| a.to_owned()).collect())
    }

    /// Starts a server on a free port with the extra arguments `args` gives. A free port can be
    /// taken by someone else between our probe and Redis' bind: each attempt takes a new one,
    /// and new `args` (a cluster node's bus port is such a port too).
    fn start_retrying(args: impl Fn() -> Vec<String>) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let args = args();
            let extra: Vec<&str> = args.iter().map(String::as_str).collect();
            match Self::launch(free_port(), &extra) {
                Ok(server) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    /// Starts a server with slidegate's Redis module loaded ([`module_path`](fn@module_path)), `DEBUG` enabled
    /// (for `DEBUG RELOAD`) and `extra` arguments, and checks that the server runs that file.
    ///
    /// # Panics
    /// As [`RedisServer::start`], or when the module is not built, is stale, or is not the one
    /// the server loaded.
    pub fn start_with_module(extra: &[&str]) -> Self {
        Self::start_with_module_retrying(|| extra.iter().map(|&a| a.to_owned()).collect())
    }

    /// As [`RedisServer::start_with_module`], with new `args` for each attempt.
    fn start_with_module_retrying(args: impl Fn() -> Vec<String>) -> Self {
        let module = module_path();
        let arg = module.to_str().expect("a UTF-8 path");
        let server = Self::start_retrying(|| {
            let mut all: Vec<String> = ["--loadmodule", arg, "--enable-debug-command", "yes"].map(str::to_owned).into();
            all.extend(args());
            all
        });
        module::assert_loaded(&server, &module);
        server
    }

    /// Starts a server with slidegate's Redis module loaded on `port` (to bring a server back
    /// where a killed one was, now with the module).
    ///
    /// # Panics
    /// As [`RedisServer::start_on`] and [`RedisServer::start_with_module`].
    pub fn start_with_module_on(port: u16) -> Self {
        let module = module_path();
        let server = Self::launch(port, &["--loadmodule", module.to_str().expect("a UTF-8 path")])
            .unwrap_or_else(|e| panic!("redis-server on port {port}: {e}"));
        module::assert_loaded(&server, &module);
        server
    }

    /// Starts a plain server on `port` (to bring a server back where a killed one was).
    ///
    /// # Panics
    /// As [`RedisServer::start`], or when the port is taken.
    pub fn start_on(port: u16) -> Self {
        Self::launch(port, &[]).unwrap_or_else(|e| panic!("redis-server on port {port}: {e}"))
    }

    fn launch(port: u16, extra: &[&str]) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("slidegate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let log = std::fs::File::create(dir.join("redis.log")).map_err(|e| e.to_string())?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run redis-server (is it installed? scripts/test.sh installs it): {e}"))?;
        let mut server = Self { child, port, tls_port: None, dir };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read_to_string(server.dir.join("redis.log")).unwrap_or_default();
                return Err(format!("exited with {status}: {log}"));
            }
            if server.ping() {
                return Ok(server);
            }
            if started.elapsed() > START_DEADLINE {
                return Err(format!("no PING answer on port {port} within {START_DEADLINE:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// What the server has logged (warnings and worse): where a crash's report is, for a test's
    /// failure message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    fn ping(&self) -> bool {
        TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok()
            && redis::Client::open(self.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
    }

    /// Kills the server at once (`SIGKILL`, like `kill -9`): no shutdown, no goodbye to clients.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Holds what the server is sent until [`RedisServer::resume`]d, as `how` says.
    ///
    /// # Panics
    /// When the signal cannot be sent or the command fails.
    pub fn pause(&self, how: Stall) {
        match how {
            Stall::Process => self.signal("-STOP"),
            Stall::Writes => self.query(&["CLIENT", "PAUSE", "600000", "WRITE"]),
        }
    }

    /// Lets a [`RedisServer::pause`]d server go on.
    ///
    /// # Panics
    /// As [`RedisServer::pause`].
    pub fn resume(&self, how: Stall) {
        match how {
            Stall::Process => self.signal("-CONT"),
            Stall::Writes => self.query(&["CLIENT", "UNPAUSE"]),
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill {signal} {}", self.child.id());
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A new synchronous connection, for a test to look at or stir the server.
    ///
    /// # Panics
    /// When the server does not accept the connection.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn().unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
    }

    /// A new synchronous connection, or why the server did not accept one (within 2 s).
    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url()).and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
    }

    /// Waits (bounded, 10 s) until `replicas` replicas acknowledge this master's writes for
    /// good: a write and a `WAIT` on one connection, until the `WAIT` counts them, and again
    /// more than a second later. `INFO`'s `state=online` is not enough, nor is one
    /// acknowledgement: Redis shows a replica synced without a disk online before it streams to
    /// it, and may start streaming only on the replica's next `REPLCONF ACK`, which may come with
    /// its once-a-second cron. Writes the key `slidegate-testkit:synced`.
    ///
    /// # Panics
    /// When the replicas do not acknowledge within 10 s.
    pub fn wait_for_replicas(&self, replicas: usize) {
        let started = Instant::now();
        let mut conn = self.conn();
        let acknowledged = |conn: &mut redis::Connection| {
            let _: () = redis::cmd("SET").arg("slidegate-testkit:synced").arg(1).query(conn).expect("SET");
            let acked: usize = redis::cmd("WAIT").arg(replicas).arg(100).query(conn).expect("WAIT");
            assert!(started.elapsed() < Duration::from_secs(10), "{acked} of {replicas} replicas acknowledged");
            acked >= replicas
        };
        while !acknowledged(&mut conn) {}
        std::thread::sleep(Duration::from_millis(1100));
        while !acknowledged(&mut conn) {}
    }

    /// Runs one command on a new connection and returns its reply.
    ///
    /// # Panics
    /// When the command fails or the reply does not convert to `T`.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn()).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }
}

/// How [`RedisServer::pause`] holds a server up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// Its process stopped (`SIGSTOP`): its sockets stay open and the kernel still accepts
    /// connections and buffers what they send, which the server runs once resumed — a stall (a
    /// pause, a swap storm), not an outage.
    Process,
    /// Its writes paused (`CLIENT PAUSE WRITE`, as a `FAILOVER` pauses them): reads answered,
    /// writes and scripts that may write held.
    Writes,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port of 127.0.0.1 that was free a moment ago, and that this process was not given before:
/// the OS may hand a port just released out again, and two servers a test starts (a process's
/// HTTP and gRPC listeners) must not be told the same one.
///
/// # Panics
/// When the OS has no free port to give, or only ports given before (1,000 tries).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..1_000 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        if given.insert(port) {
            return port;
        }
    }
    panic!("no loopback port this process was not given before, in 1,000 tries");
}

/// A local Redis Cluster of real processes: `masters` masters with `replicas` replicas each,
/// created with `redis-cli --cluster create`, every node on a free loopback port (and a free
/// cluster-bus port), killed when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The ports of the nodes the test killed ([`RedisCluster::kill`]): the only ones that may
    /// be down.
    killed: Vec<u16>,
}

/// How long a new cluster may take to agree that every slot is served.
const CLUSTER_DEADLINE: Duration = Duration::from_secs(30);

impl RedisCluster {
    /// Starts and creates the cluster; returns once every node reports `cluster_state:ok`.
    ///
    /// # Panics
    /// When `redis-server` or `redis-cli` is missing or the cluster does not form in time.
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::start_nodes(masters, replicas, RedisServer::start_retrying)
    }

    /// As [`RedisCluster::start`], with slidegate's Redis module loaded on every node.
    ///
    /// # Panics
    /// As [`RedisCluster::start`], or when the module is not built.
    pub fn start_with_module(masters: usize, replicas: usize) -> Self {
        Self::start_nodes(masters, replicas, RedisServer::start_with_module_retrying)
    }

    fn start_nodes(masters: usize, replicas: usize, start: impl Fn(fn() -> Vec<String>) -> RedisServer) -> Self {
        // A failover needs the replicas to notice a dead master: one second, not fifteen. Each
        // attempt to start a node takes a new cluster-bus port.
        let node_args = || {
            let bus = free_port().to_string();
            ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"]
                .into_iter()
                .map(str::to_owned)
                .chain(["--cluster-port".to_owned(), bus])
                .collect()
        };
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas)).map(|_| start(node_args)).collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}"));
        assert!(out.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&out.stdout));
        let cluster = Self { nodes, killed: Vec::new() };
        let started = Instant::now();
        while !cluster.is_ok() {
            assert!(started.elapsed() < CLUSTER_DEADLINE, "the cluster did not reach cluster_state:ok");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// Whether every node the test did not kill answers, reports `cluster_state:ok`, and, as a
    /// replica, has its link to its master up (a replica that never synced would refuse to
    /// fail over: its data looks too old). A node that died without [`RedisCluster::kill`]
    /// makes it false, and so does a cluster with no node left.
    pub fn is_ok(&self) -> bool {
        let mut expected_up = self.nodes.iter().filter(|n| !self.killed.contains(&n.port())).peekable();
        expected_up.peek().is_some()
            && expected_up.all(|n| {
                let Ok(mut conn) = n.try_conn() else { return false };
                let cluster = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut conn);
                let replication = redis::cmd("INFO").arg("replication").query::<String>(&mut conn);
                cluster.is_ok_and(|i| i.contains("cluster_state:ok"))
                    && replication.is_ok_and(|r| r.contains("role:master") || r.contains("master_link_status:up"))
            })
    }

    /// The nodes' URLs, masters and replicas.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every node.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node that serves `slot` as master now (asked of a live node, `CLUSTER SLOTS`).
    ///
    /// # Panics
    /// When no live node answers or no master serves the slot.
    pub fn master_of(&self, slot: u16) -> &RedisServer {
        let node = self.nodes.iter().find(|n| n.ping()).expect("a live node");
        // Each range: [first slot, last slot, [master host, master port, id, …], replicas…].
        let ranges =
            redis::cmd("CLUSTER").arg("SLOTS").query::<Vec<redis::Value>>(&mut node.conn()).expect("CLUSTER SLOTS");
        let int = |v: &redis::Value| match v {
            redis::Value::Int(i) => u16::try_from(*i).ok(),
            _ => None,
        };
        let port = ranges
            .iter()
            .find_map(|range| {
                let redis::Value::Array(range) = range else { return None };
                let (first, last) = (int(range.first()?)?, int(range.get(1)?)?);
                let redis::Value::Array(master) = range.get(2)? else { return None };
                (first..=last).contains(&slot).then(|| int(master.get(1)?)).flatten()
            })
            .expect("slot served");
        self.nodes.iter().find(|n| n.port() == port).expect("a node of ours")
    }

    /// Kills the node on `port` (`SIGKILL`); [`RedisCluster::is_ok`] no longer expects it.
    ///
    /// # Panics
    /// When no node of this cluster is on `port`.
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port() == port).unwrap_or_else(|| panic!("no node on port {port}"));
        node.kill();
        self.killed.push(port);
    }

    /// Puts a [`FaultProxy`] in front of every node and makes each node announce its proxy's
    /// port (`cluster-announce-port`) instead of its own, so that a client given the proxies'
    /// URLs finds, through `CLUSTER SLOTS` and `MOVED`, only proxies. Returns once every node
    /// names only proxies, the proxies in the order of [`RedisCluster::nodes`]. Replicas
    /// replicate through their master's proxy too: a fault on it holds replication as well.
    /// [`RedisCluster::master_of`] no longer finds a node afterwards.
    ///
    /// # Panics
    /// When a node refuses the setting or the nodes do not agree within 30 s.
    pub fn behind_proxies(&self) -> Vec<FaultProxy> {
        let proxies: Vec<FaultProxy> = self.nodes.iter().map(|n| FaultProxy::to_port(n.port())).collect();
        for (node, proxy) in self.nodes.iter().zip(&proxies) {
            let _: () = node.query(&["CONFIG", "SET", "cluster-announce-port", &proxy.port().to_string()]);
        }
        // The new port reaches the other nodes with the next gossip about the node.
        let announced: Vec<String> = proxies.iter().map(|p| format!("127.0.0.1:{}@", p.port())).collect();
        let started = Instant::now();
        loop {
            let agreed = self.nodes.iter().all(|n| {
                let nodes: String = n.query(&["CLUSTER", "NODES"]);
                nodes.lines().all(|line| announced.iter().any(|a| line.contains(a.as_str())))
            });
            if agreed {
                return proxies;
            }
            assert!(started.elapsed() < CLUSTER_DEADLINE, "the nodes did not announce their proxies");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A Sentinel-monitored Redis: a master, a replica, and one Sentinel (quorum 1) watching them as
/// `mymaster`, noticing a dead master after one second. Every process is killed when dropped.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The master at start.
    pub master: RedisServer,
    /// Its replica, the master after a failover.
    pub replica: RedisServer,
    sentinel: Child,
    sentinel_port: u16,
    /// Set when the Sentinel serves TLS too ([`RedisSentinel::start_tls`]).
    sentinel_tls_port: Option<u16>,
    dir: PathBuf,
}

/// How long the Sentinel of [`RedisSentinel::start_behind_proxy`] waits for a silent master
/// before it fails over: longer than the faults a test sets on the proxy.
pub const BEHIND_PROXY_DOWN_AFTER: Duration = Duration::from_secs(5);

/// The name the Sentinel monitors.
pub const SENTINEL_SERVICE: &str = "mymaster";

impl RedisSentinel {
    /// Starts the three processes; returns once the replica is in sync and the Sentinel knows it.
    ///
    /// # Panics
    /// When a process does not come up in time.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
        let port = master.port();
        Self::watch(master, replica, port, "")
    }

    /// As [`RedisSentinel::start`], the Sentinel monitoring the master through a
    /// [`FaultProxy`], which it returns: the Sentinel names the proxy as the master, so its
    /// clients reach the master only through the proxy's faults. The replica replicates from
    /// the master directly. The Sentinel's down-after time is [`BEHIND_PROXY_DOWN_AFTER`]
    /// here: a fault that keeps it from the master for longer makes it fail over.
    ///
    /// # Panics
    /// As [`RedisSentinel::start`].
    pub fn start_behind_proxy() -> (Self, FaultProxy) {
        let master = RedisServer::start();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
        let proxy = FaultProxy::to_port(master.port());
        let down_after = BEHIND_PROXY_DOWN_AFTER.as_millis();
        let conf = format!("sentinel down-after-milliseconds {SENTINEL_SERVICE} {down_after}\n");
        (Self::watch(master, replica, proxy.port(), &conf), proxy)
    }

    /// Starts a Sentinel over `master` and its `replica`, monitoring the master on
    /// `master_port`, with `conf` added to its configuration; returns once the replica is in
    /// sync and the Sentinel knows it.
    fn watch(master: RedisServer, replica: RedisServer, master_port: u16, conf: &str) -> Self {
        let sentinel_port = free_port();
        let dir = std::env::temp_dir().join(format!("slidegate-sentinel-{}-{sentinel_port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("sentinel dir");
        let conf_file = dir.join("sentinel.conf");
        std::fs::write(
            &conf_file,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\nsentinel failover-timeout {SENTINEL_SERVICE} 3000\n{conf}",
                dir.display(),
                master_port
            ),
        )
        .expect("sentinel.conf");
        let sentinel = Command::new("redis-server")
            .arg(&conf_file)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let setup = Self { master, replica, sentinel, sentinel_port, sentinel_tls_port: None, dir };
        let started = Instant::now();
        loop {
            let synced = redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut setup.replica.conn())
                .is_ok_and(|i| i.contains("master_link_status:up"));
            if synced && !setup.sentinel_query("REPLICAS").is_empty() {
                return setup;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "sentinel setup did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis://127.0.0.1:<sentinel port>`.
    pub fn sentinel_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.sentinel_port)
    }

    /// The port of the master the Sentinel names now (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    pub fn master_port(&self) -> Option<u16> {
        let reply = self.sentinel_query("GET-MASTER-ADDR-BY-NAME");
        reply.get(1).and_then(|p| p.parse().ok())
    }

    fn sentinel_query(&self, what: &str) -> Vec<String> {
        redis::Client::open(self.sentinel_url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut c| redis::cmd("SENTINEL").arg(what).arg(SENTINEL_SERVICE).query::<redis::Value>(&mut c))
            .map(|v| match v {
                redis::Value::Array(items) => items
                    .into_iter()
                    .map(|i| match i {
                        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                        other => format!("{other:?}"),
                    })
                    .collect(),
                _ => Vec::new(),
            })
            .unwrap_or_default()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        let _ = self.sentinel.kill();
        let _ = self.sentinel.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
