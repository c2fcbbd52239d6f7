//! The dashboard in a real headless Chromium (Debian's `chromium` and `chromium-driver`, which
//! scripts/setup.sh installs), driven over WebDriver against the real binary on the memory
//! backend and on Redis: the page loads without console errors, a burst of denials shows in the
//! rule's chart and top keys, the inspector draws a key's admissions and reset time, Reset is
//! refused without the right token and clears the key with it, and a rules-file reload shows
//! up without reloading the page. Screenshots go to `target/ui-screenshots/`.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use slidegate_testkit::RedisServer;
use support::{RulesFile, Slidegate, check};

const TOKEN: &str = "dashboard-token";

const RULES: &str = r#"
admin_token = "dashboard-token"

[[rules]]
name = "sms"
limit = 5
window = "60s"

[[rules]]
name = "api"
limit = 100
window = "1m"
algorithm = "gcra"
burst = 10
tiers = { vip = { limit = 1000 } }
"#;

/// The longest any page condition is waited for: generous, so a loaded machine never fails a
/// test that would pass; the page itself polls every 2 s.
const PATIENCE: Duration = Duration::from_secs(15);

/// A chromedriver on a free loopback port, in its own process group so that dropping it ends
/// the browsers it started too.
struct ChromeDriver {
    child: Child,
    url: String,
}

impl ChromeDriver {
    fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let port = slidegate_testkit::free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver runs (scripts/setup.sh installs chromium and chromium-driver)");
        let driver = Self { child, url: format!("http://127.0.0.1:{port}") };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < PATIENCE, "chromedriver not listening on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        driver
    }

    /// A new headless browser session with its console log kept.
    async fn browser(&self) -> Client {
        let caps = json!({
            "goog:chromeOptions": {
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1500", "--disable-extensions", "--no-first-run"],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        });
        let Value::Object(caps) = caps else { unreachable!("an object") };
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a chromium session")
    }

    /// The browser's console messages at level SEVERE since the last call.
    async fn severe_logs(&self, client: &Client) -> Vec<String> {
        let session = client.session_id().await.expect("session id").expect("a session");
        let url = format!("{}/session/{session}/se/log", self.url);
        let answer: Value = reqwest::Client::new()
            .post(url)
            .json(&json!({"type": "browser"}))
            .send()
            .await
            .expect("the log")
            .json()
            .await
            .expect("JSON");
        let entries = answer["value"].as_array().cloned().unwrap_or_default();
        entries.iter().filter(|e| e["level"] == "SEVERE").map(|e| e["message"].to_string()).collect()
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        // The group this test made: chromedriver and the browsers it started.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until `script`, a JavaScript expression, is true in the page.
async fn until(client: &Client, what: &str, script: &str) {
    let started = Instant::now();
    loop {
        let v = client.execute(&format!("return !!({script});"), vec![]).await.expect("script runs");
        if v == Value::Bool(true) {
            return;
        }
        if started.elapsed() > PATIENCE {
            let page = client.source().await.unwrap_or_default();
            panic!("{what}: not so after {PATIENCE:?} ({script})\n{}", &page[..page.len().min(4_000)]);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The text of the first element `css` matches.
async fn text(client: &Client, css: &str) -> String {
    client.find(Locator::Css(css)).await.expect(css).text().await.expect("text")
}

async fn click(client: &Client, css: &str) {
    client.find(Locator::Css(css)).await.expect(css).click().await.expect("click");
}

async fn type_into(client: &Client, css: &str, value: &str) {
    let field = client.find(Locator::Css(css)).await.expect(css);
    field.clear().await.expect("clear");
    field.send_keys(value).await.expect("type");
}

async fn screenshot(client: &Client, name: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/ui-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot folder");
    let png = client.screenshot().await.expect("screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
}

/// The page's own record of script errors (`window.slidegateErrors`).
async fn script_errors(client: &Client) -> Vec<Value> {
    let v = client.execute("return window.slidegateErrors;", vec![]).await.expect("errors");
    v.as_array().cloned().expect("the page's error hook is installed")
}

/// The whole tour of the page against `server`, whose rules file is `rules`.
async fn tour(server: &Slidegate, rules: &RulesFile, name: &str) {
    let driver = ChromeDriver::start();
    let client = driver.browser().await;
    client.goto(&server.url("/")).await.expect("open the page");
    assert!(client.current_url().await.expect("url").path().ends_with("/ui"), "/ redirects to /ui");
    until(&client, "the first stats drawn", "document.querySelector('#traffic .card[data-rule=\"sms\"]')").await;
    until(&client, "the rules listed", "document.querySelector('#rules tr[data-rule=\"api\"][data-tier=\"vip\"]')")
        .await;
    assert_eq!(driver.severe_logs(&client).await, Vec::<String>::new(), "console errors on load");
    assert_eq!(script_errors(&client).await, Vec::<Value>::new());

    // A burst: alice 5 admitted then 10 denied, bob 2 denied.
    let http = reqwest::Client::new();
    for (key, n) in [("alice", 15), ("bob", 7)] {
        for _ in 0..n {
            let (status, _, _) = check(&http, server, &json!({"rule": "sms", "key": key})).await;
            assert_eq!(status, 200);
        }
    }
    let shown = Instant::now();
    let card = "#traffic .card[data-rule=\"sms\"]";
    until(&client, "the denials in the chart", &format!("document.querySelector('{card}').dataset.denied === '12'"))
        .await;
    until(
        &client,
        "alice first among the denied keys",
        &format!("document.querySelector('{card} .top-keys li').dataset.key === 'alice'"),
    )
    .await;
    assert!(shown.elapsed() < Duration::from_secs(5), "shown after {:?}", shown.elapsed());
    assert!(text(&client, &format!("{card} .top-keys")).await.contains("alice 10 · 83.3%"));
    let bars = client.find_all(Locator::Css(&format!("{card} svg.chart rect.bar.denied"))).await.expect("bars");
    assert!(!bars.is_empty(), "a denied bar is drawn");
    screenshot(&client, &format!("{name}-desktop")).await;

    // The inspector without a token: nothing is read or reset, the token is asked for.
    client.find(Locator::Css("#inspect-rule")).await.expect("rule").select_by_value("sms").await.expect("select");
    type_into(&client, "#inspect-key", "alice").await;
    click(&client, "#inspect-form button[type=submit]").await;
    until(&client, "the token asked for", "!document.getElementById('token-form').hidden").await;
    click(&client, "#reset").await;
    until(
        &client,
        "reset refused without a token",
        "document.getElementById('reset-msg').textContent.includes('needs the admin token')",
    )
    .await;
    // A wrong token: the service refuses the reset.
    type_into(&client, "#token-input", "wrong").await;
    click(&client, "#token-form button[type=submit]").await;
    click(&client, "#reset").await;
    until(
        &client,
        "reset refused with a wrong token",
        "document.getElementById('reset-msg').textContent.startsWith('Refused')",
    )
    .await;
    let (_, _, v) = check(&http, server, &json!({"rule": "sms", "key": "alice"})).await;
    assert_eq!(v["allowed"], false, "a refused reset changed nothing: {v}");

    // The right token, entered from the keyboard (Enter submits): the admissions drawn, then a
    // reset clears the key.
    type_into(&client, "#token-input", &format!("{TOKEN}\u{E007}")).await;
    until(&client, "the token form closed", "document.getElementById('token-form').hidden").await;
    click(&client, "#inspect-form button[type=submit]").await;
    until(&client, "five admissions drawn", "document.querySelectorAll('#timeline line.tick').length === 5").await;
    until(&client, "the reset time drawn", "document.querySelector('#timeline line.reset')").await;
    let facts = text(&client, "#key-facts").await;
    assert!(facts.contains("Used\n5 of 5") || facts.contains("5 of 5"), "{facts}");
    assert!(facts.contains("Reset in") && !facts.contains("Reset in\n—"), "{facts}");
    screenshot(&client, &format!("{name}-inspector")).await;
    click(&client, "#reset").await;
    until(&client, "the reset done", "document.getElementById('reset-msg').textContent.startsWith('Reset:')").await;
    let (_, _, v) = check(&http, server, &json!({"rule": "sms", "key": "alice"})).await;
    assert_eq!(v["allowed"], true, "the next check after a reset is admitted: {v}");

    // A rules-file reload shows up without reloading the page.
    rules.write(&format!("{RULES}\n[[rules]]\nname = \"login\"\nlimit = 3\nwindow = \"5m\"\n"));
    until(&client, "the reloaded rule listed", "document.querySelector('#rules tr[data-rule=\"login\"]')").await;
    until(&client, "the reloaded rule's traffic", "document.querySelector('#traffic .card[data-rule=\"login\"]')")
        .await;

    client.set_window_size(390, 844).await.expect("phone width");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let html = "document.documentElement";
    let overflow = client.execute(&format!("return {html}.scrollWidth - {html}.clientWidth;"), vec![]).await;
    assert_eq!(overflow.expect("width").as_i64(), Some(0), "nothing wider than a phone's screen");
    screenshot(&client, &format!("{name}-phone")).await;

    assert_eq!(script_errors(&client).await, Vec::<Value>::new());
    // The one console error allowed: the service's 401 to the wrong token.
    let logs = driver.severe_logs(&client).await;
    assert!(logs.iter().all(|l| l.contains("401")), "{logs:?}");
    client.close().await.expect("close the browser");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_on_the_memory_backend() {
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg()]);
    tour(&server, &rules, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_on_redis() {
    let redis = RedisServer::start();
    let rules = RulesFile::new(RULES);
    let server = Slidegate::serve(&["--config", rules.arg(), "--redis", &redis.url()]);
    tour(&server, &rules, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_token_the_page_says_admin_is_disabled() {
    let rules = RulesFile::new(&RULES.replace("admin_token = \"dashboard-token\"", ""));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let driver = ChromeDriver::start();
    let client = driver.browser().await;
    client.goto(&server.url("/ui")).await.expect("open the page");
    until(
        &client,
        "Reset explained",
        "document.getElementById('reset-msg').textContent.includes('admin routes, which are disabled')",
    )
    .await;
    assert!(!client.find(Locator::Css("#reset")).await.expect("reset").is_enabled().await.expect("enabled"));
    type_into(&client, "#inspect-key", "alice").await;
    click(&client, "#inspect-form button[type=submit]").await;
    until(
        &client,
        "Inspect explained",
        "document.getElementById('inspect-msg').textContent.includes('disabled: set admin_token')",
    )
    .await;
    assert!(
        client.find(Locator::Css("#token-form")).await.expect("form").attr("hidden").await.expect("attr").is_some(),
        "no token asked for"
    );
    assert_eq!(driver.severe_logs(&client).await, Vec::<String>::new());
    assert_eq!(script_errors(&client).await, Vec::<Value>::new());
    client.close().await.expect("close the browser");
}
