//! docs/proxies.md's configurations run as written (their addresses made this test's free
//! loopback ports) in front of the real binary: nginx (`auth_request`), Caddy (`forward_auth`,
//! also Traefik's dialect, which is not packaged for Debian) and HAProxy (the doc's Lua
//! action); the Traefik file
//! is held to the endpoint and settings the doc names. Through each proxy, a client that sends
//! a new `X-Forwarded-For` on every request still has one limit, its own; a caller that reaches
//! slidegate directly with forged headers is counted by its own address.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::Value;
use slidegate_testkit::free_port;
use support::{RulesFile, Slidegate};

const DOC: &str = include_str!("../../../docs/proxies.md");

/// The documented addresses, each replaced by this test's.
const SLIDEGATE: &str = "127.0.0.1:8080";
const APP: &str = "127.0.0.1:3000";
const PROXY: &str = "127.0.0.1:8000";

/// The rules file's limit.
const LIMIT: usize = 10;

/// The body of the first fenced block in `lang` after the line `marker`.
fn block(marker: &str, lang: &str) -> String {
    let section = &DOC[DOC.find(&format!("\n{marker}\n")).unwrap_or_else(|| panic!("no {marker:?}"))..];
    let fence = format!("```{lang}\n");
    let body = &section[section.find(&fence).unwrap_or_else(|| panic!("no {lang} block")) + fence.len()..];
    body[..body.find("```").expect("closed block")].to_owned()
}

/// The application behind the proxy: answers `hello` to every request until dropped.
struct App {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl App {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let (addr, stop) = (listener.local_addr().expect("addr"), Arc::new(AtomicBool::new(false)));
        let stopping = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((socket, _)) => {
                        std::thread::spawn(move || answer_hello(socket));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { addr, stop }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answers each request of one connection (bodiless, as the test sends them) until it closes.
fn answer_hello(socket: TcpStream) {
    let _ = socket.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(socket.try_clone().expect("clone"));
    let mut writer = socket;
    loop {
        let mut line = String::new();
        let mut head_lines = 0;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => head_lines += 1,
            }
            if head_lines > 100 {
                return;
            }
        }
        let answer = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nhello";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// A proxy process, killed by its pid when dropped.
struct Proxy {
    child: Child,
    port: u16,
    _dir: Dir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    /// Waits (bounded) until the proxy accepts connections.
    fn started(mut child: Child, port: u16, dir: Dir, log: &Path) -> Self {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the proxy exited with {status}: {}", std::fs::read_to_string(log).unwrap_or_default());
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Self { child, port, _dir: dir };
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "proxy not up: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A temporary directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("slidegate-{name}-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&path).expect("temp dir");
        Self(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The doc's `text` with its addresses made `slidegate`'s, `app`'s and the proxy's `port`.
fn placed(text: &str, slidegate: &Slidegate, app: &App, port: u16) -> String {
    text.replace(SLIDEGATE, slidegate.base.trim_start_matches("http://"))
        .replace(APP, &app.addr.to_string())
        .replace(PROXY, &format!("127.0.0.1:{port}"))
}

/// nginx with the doc's configuration inside `http { … }`, one process, its files in a
/// directory of its own.
fn nginx(slidegate: &Slidegate, app: &App) -> Proxy {
    let (dir, port) = (Dir::new("nginx"), free_port());
    let d = dir.0.display();
    let config = format!(
        "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{}}\nhttp {{\n\
         access_log off;\nclient_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\nfastcgi_temp_path {d}/fastcgi;\n\
         uwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\n{}\n}}\n",
        placed(&block("## nginx", "nginx"), slidegate, app, port)
    );
    std::fs::write(dir.0.join("nginx.conf"), config).expect("write nginx.conf");
    let log = dir.0.join("error.log");
    let child = Command::new("nginx")
        .args(["-p", &d.to_string(), "-c", &format!("{d}/nginx.conf"), "-e", &format!("{d}/error.log")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.0.join("stderr.log")).expect("log"))
        .spawn()
        .expect("start nginx");
    Proxy::started(child, port, dir, &log)
}

/// Caddy with the doc's Caddyfile, its state in a directory of its own.
fn caddy(slidegate: &Slidegate, app: &App) -> Proxy {
    let (dir, port) = (Dir::new("caddy"), free_port());
    std::fs::write(dir.0.join("Caddyfile"), placed(&block("## Caddy", "caddyfile"), slidegate, app, port))
        .expect("write Caddyfile");
    let log = dir.0.join("caddy.log");
    let child = Command::new("caddy")
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(dir.0.join("Caddyfile"))
        .env("XDG_DATA_HOME", &dir.0)
        .env("XDG_CONFIG_HOME", &dir.0)
        .env("HOME", &dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start caddy");
    Proxy::started(child, port, dir, &log)
}

/// HAProxy with the doc's configuration and Lua action, in the foreground.
fn haproxy(slidegate: &Slidegate, app: &App) -> Proxy {
    let (dir, port) = (Dir::new("haproxy"), free_port());
    let lua = dir.0.join("slidegate.lua");
    std::fs::write(&lua, block("## HAProxy", "lua")).expect("write slidegate.lua");
    let config = placed(&block("## HAProxy", "haproxy"), slidegate, app, port)
        .replace("/etc/haproxy/slidegate.lua", lua.to_str().expect("utf-8 path"));
    std::fs::write(dir.0.join("haproxy.cfg"), config).expect("write haproxy.cfg");
    let log = dir.0.join("haproxy.log");
    let child = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(dir.0.join("haproxy.cfg"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start haproxy");
    Proxy::started(child, port, dir, &log)
}

/// A client whose connections come from `ip` (a loopback address of its own).
fn client_from(ip: &str) -> Client {
    Client::builder().local_address(ip.parse::<IpAddr>().ok()).build().expect("client")
}

/// The doc's rules file, served.
fn slidegate() -> (Slidegate, RulesFile) {
    let rules = RulesFile::new(&block("## The rules file", "toml"));
    (Slidegate::serve(&["--config", rules.arg()]), rules)
}

/// Through `proxy`, a client on 127.0.0.3 sends a new `X-Forwarded-For` (and `X-Real-IP`,
/// `Forwarded`) on every request: exactly the limit reaches the application, the rest are 429s
/// with `Retry-After`, all counted as 127.0.0.3, each question on a connection the proxy keeps.
/// Then a caller on 127.0.0.2 asks slidegate
/// directly, forging 127.0.0.3's address: its own counts, with a full limit.
async fn one_limit_whatever_the_client_forwards(proxy: &Proxy, slidegate: &Slidegate, name: &str) {
    let client = client_from("127.0.0.3");
    let (mut reached, closed_before) = (0, closed_connections(slidegate));
    for i in 0..LIMIT + 5 {
        let forged = format!("198.51.100.{}", i + 1);
        let answer = client
            .get(format!("http://127.0.0.1:{}/orders?page={i}", proxy.port))
            .header("x-forwarded-for", &forged)
            .header("x-real-ip", &forged)
            .header("forwarded", format!("for={forged}"))
            .send()
            .await
            .expect("request through the proxy");
        let status = answer.status().as_u16();
        let headers = answer.headers().clone();
        let body = answer.text().await.expect("body");
        if status == 200 {
            assert_eq!(body, "hello", "{name}: the application's answer");
            reached += 1;
        } else {
            assert_eq!(status, 429, "{name}: {body}");
            let retry = headers.get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
            assert!(retry.is_some_and(|s| (1..=60).contains(&s)), "{name}: {headers:?}");
            assert!(headers.get("ratelimit").is_some_and(|v| v.as_bytes().starts_with(b"\"api\";r=0")), "{name}");
        }
    }
    assert_eq!(reached, LIMIT, "{name}: one limit for the client, whatever it forwards");
    let closed = closed_connections(slidegate) - closed_before;
    assert_eq!(closed, 0, "{name}: its connections to slidegate kept for the next question");
    let stats: Value =
        Client::new().get(slidegate.url("/v1/stats")).send().await.expect("stats").json().await.expect("JSON");
    let api = stats["rules"].as_array().and_then(|r| r.iter().find(|r| r["rule"] == "api")).expect("api's traffic");
    assert_eq!(api["top_denied"]["keys"][0]["key"], "127.0.0.3", "{name}: counted as the client: {api}");

    let direct = client_from("127.0.0.2");
    for i in 0..LIMIT + 1 {
        let answer = direct
            .get(slidegate.url("/v1/forward-auth/api"))
            .header("x-forwarded-for", "127.0.0.3")
            .header("x-real-ip", "127.0.0.3")
            .send()
            .await
            .expect("request");
        let want = if i < LIMIT { 200 } else { 429 };
        assert_eq!(answer.status().as_u16(), want, "{name}: the direct caller's own limit, request {i}");
    }
}

/// The connections to or from `slidegate`'s port closed in the last minute: the sockets in
/// TIME-WAIT (the kernel's `/proc/net/tcp`, state 06) with that port at either end.
fn closed_connections(slidegate: &Slidegate) -> usize {
    let port = slidegate.base.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).expect("port");
    let end = format!(":{port:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let time_wait = |line: &&str| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(3) == Some(&"06") && fields[1..3].iter().any(|address| address.ends_with(&end))
    };
    table.lines().skip(1).filter(time_wait).count()
}

/// The doc's rules served, the application, and the proxy `start` starts in front of both.
async fn through(start: fn(&Slidegate, &App) -> Proxy, name: &str) {
    let (slidegate, _rules) = slidegate();
    let app = App::start();
    let proxy = start(&slidegate, &app);
    one_limit_whatever_the_client_forwards(&proxy, &slidegate, name).await;
}

#[tokio::test]
async fn nginx_as_documented_turns_a_denial_into_a_429_and_believes_no_client() {
    through(nginx, "nginx").await;
}

#[tokio::test]
async fn caddy_as_documented_passes_the_429_on_and_believes_no_client() {
    through(caddy, "caddy").await;
}

#[tokio::test]
async fn haproxy_as_documented_answers_the_429_itself_and_believes_no_client() {
    through(haproxy, "haproxy").await;
}

#[test]
fn the_traefik_file_asks_the_forward_auth_endpoint_and_writes_the_client_itself() {
    let file: Value = serde_yaml_ng::from_str(&block("## Traefik (file provider)", "yaml")).expect("YAML");
    let auth = &file["http"]["middlewares"]["slidegate"]["forwardAuth"];
    assert_eq!(auth["address"], format!("http://{SLIDEGATE}/v1/forward-auth/api"));
    assert_eq!(auth["trustForwardHeader"], false, "Traefik writes X-Forwarded-For over the client's");
    assert_eq!(auth["authResponseHeaders"], serde_json::json!(["RateLimit", "RateLimit-Policy"]));
    let router = &file["http"]["routers"]["app"];
    assert_eq!((&router["middlewares"][0], &router["service"]), (&"slidegate".into(), &"app".into()));
    assert_eq!(file["http"]["services"]["app"]["loadBalancer"]["servers"][0]["url"], format!("http://{APP}"));
}
