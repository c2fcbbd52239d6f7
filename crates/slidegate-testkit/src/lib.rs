//! Test support: real `redis-server` processes, never mocks.
//!
//! [`RedisServer::start`] launches a server on a free port of 127.0.0.1 with persistence off and
//! a scratch directory of its own, waits (bounded) until it answers `PING`, and kills it by pid
//! when dropped — also when the test panics. Each test that needs Redis starts its own, so
//! tests never see each other's keys and can kill or stall their server freely.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer its first `PING`.
const START_DEADLINE: Duration = Duration::from_secs(10);

/// A `redis-server` child process on a loopback port.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
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
        let mut last_error = String::new();
        // A free port can be taken by someone else between our probe and Redis' bind: retry.
        for _ in 0..5 {
            let port = free_port();
            match Self::launch(port, extra) {
                Ok(server) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
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
        let mut server = Self { child, port, dir };
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

    fn ping(&self) -> bool {
        TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok()
            && redis::Client::open(self.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
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
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()))
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port of 127.0.0.1 that was free a moment ago.
///
/// # Panics
/// When the OS has no free port to give.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
