//! Runs the real `slidegate` binary on a free loopback port.

#![allow(dead_code, unreachable_pub)] // each test file uses a different part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod envoy;
pub mod otlp;
pub mod tls;

/// A `slidegate serve` child process.
pub struct Slidegate {
    child: Child,
    pub base: String,
    pub log: PathBuf,
}

impl Slidegate {
    /// Starts `slidegate serve --http 127.0.0.1:<free> <args>` and waits (bounded) for /healthz.
    pub fn serve(args: &[&str]) -> Self {
        Self::serve_with_env(args, &[])
    }

    /// [`Slidegate::serve`] with these environment variables set (and no `SLIDEGATE_*` or
    /// `RUST_LOG` of the test's own environment).
    pub fn serve_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start(args, env, "http", |server| blocking_get(&server.url("/healthz")).is_some())
    }

    /// Starts `slidegate serve --http 127.0.0.1:<free> <args>` with `env`, its base URL of
    /// `scheme`, and waits (bounded) until `up` says it serves.
    pub fn start(args: &[&str], env: &[(&str, &str)], scheme: &str, up: impl Fn(&Self) -> bool) -> Self {
        let port = slidegate_testkit::free_port();
        let log = std::env::temp_dir().join(format!("slidegate-serve-{}-{port}.log", std::process::id()));
        let child = command(env)
            .args(["serve", "--http", &format!("127.0.0.1:{port}")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start slidegate");
        let mut server = Self { child, base: format!("{scheme}://127.0.0.1:{port}"), log };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("slidegate exited with {status}: {}", server.log_text());
            }
            if up(&server) {
                return server;
            }
            assert!(started.elapsed() < Duration::from_secs(15), "slidegate not up: {}", server.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").args([&format!("-{name}"), &self.pid().to_string()]).status().expect("kill");
        assert!(status.success());
    }

    /// Waits (bounded) for the process to exit by itself.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(started.elapsed() < within, "slidegate still running after {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Slidegate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The real binary, with `env` and none of the variables it reads from the test's environment.
pub fn command(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_slidegate"));
    for (name, _) in std::env::vars() {
        if name.starts_with("SLIDEGATE_") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command
}

fn blocking_get(url: &str) -> Option<()> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut s = std::net::TcpStream::connect(host).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200").then_some(())
}

/// A gRPC channel to `addr` (`127.0.0.1:<port>`), for the generated clients that have no
/// `connect` of their own.
pub async fn grpc_channel(addr: &str) -> tonic::transport::Channel {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("a URI");
    endpoint.connect().await.expect("connect")
}

/// Runs `slidegate <args>` to its end (within a minute): its exit status and output. The
/// output goes through files, so a long one cannot fill a pipe and stall the child.
pub fn run<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    run_with_env(args, &[])
}

/// [`run`] with the environment variables `env` (as [`command`] sets them).
pub fn run_with_env<S: AsRef<std::ffi::OsStr>>(args: &[S], env: &[(&str, &str)]) -> Output {
    let file = |name: &str| {
        std::env::temp_dir().join(format!(
            "slidegate-run-{}-{}.{name}",
            std::process::id(),
            slidegate_testkit::free_port()
        ))
    };
    let (out, err) = (file("out"), file("err"));
    let mut child = command(env)
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("output file"))
        .stderr(std::fs::File::create(&err).expect("error file"))
        .spawn()
        .expect("start slidegate");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("slidegate still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |path: &PathBuf| {
        let bytes = std::fs::read(path).unwrap_or_default();
        let _ = std::fs::remove_file(path);
        bytes
    };
    Output { status, stdout: read(&out), stderr: read(&err) }
}

/// Runs `slidegate <args>` to its end (within a minute): its exit status and standard error.
pub fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let out = run(args);
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A rules file in a temporary folder, removed on drop.
pub struct RulesFile {
    pub path: PathBuf,
}

impl RulesFile {
    pub fn new(text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "slidegate-rules-{}-{}.toml",
            std::process::id(),
            slidegate_testkit::free_port()
        ));
        std::fs::write(&path, text).expect("write rules");
        Self { path }
    }

    pub fn write(&self, text: &str) {
        // Write then rename, as editors do, so the server never reads half a file.
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write rules");
        std::fs::rename(&tmp, &self.path).expect("rename rules");
    }

    pub fn arg(&self) -> &str {
        self.path.to_str().expect("utf-8 path")
    }
}

impl Drop for RulesFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// POSTs `body` to `/v1/check`: (status, headers, JSON).
pub async fn check(
    client: &reqwest::Client,
    server: &Slidegate,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = client.post(server.url("/v1/check")).json(body).send().await.expect("request");
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    let json = response.json().await.expect("JSON body");
    (status, headers, json)
}

/// `GET /v1/keys/{path}` (`rule/key`, escaped as the key needs) with the admin `token`: the
/// key's state as JSON.
pub async fn key_state(client: &reqwest::Client, server: &Slidegate, path: &str, token: &str) -> Value {
    let url = server.url(&format!("/v1/keys/{path}"));
    client.get(url).bearer_auth(token).send().await.expect("keys").json().await.expect("JSON body")
}

/// What `GET /v1/keys/{path}` counts, with the admin token `t`.
pub async fn key_count(client: &reqwest::Client, server: &Slidegate, path: &str) -> u64 {
    let v = key_state(client, server, path, "t").await;
    v["count"].as_u64().unwrap_or_else(|| panic!("no count: {v}"))
}

/// The value of one Prometheus sample line that starts with `prefix`, or 0.
pub async fn metric(client: &reqwest::Client, server: &Slidegate, prefix: &str) -> f64 {
    let text = client.get(server.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Whether the server closes `s` before `deadline`.
pub fn closed_before(s: &mut std::net::TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 256];
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
            return false;
        };
        s.set_read_timeout(Some(left)).expect("timeout");
        match std::io::Read::read(s, &mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return true,
        }
    }
}

pub fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8")
}
