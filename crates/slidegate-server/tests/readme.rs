//! The README's examples, run as written against the real binary: the quick start's request and
//! the answer it shows, the rules file (with this test's redis-server in place of the documented
//! address), and the Python client. The README is read at test time, so an edit that breaks an
//! example fails here.

mod support;

use serde_json::Value;
use slidegate_testkit::RedisServer;
use support::{RulesFile, Slidegate};

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).expect("README.md")
}

/// The body of the first fenced block in `lang` after the line `heading`.
fn block(readme: &str, heading: &str, lang: &str) -> String {
    let section = &readme[readme.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("no {heading:?}"))..];
    let fence = format!("```{lang}\n");
    let body =
        &section[section.find(&fence).unwrap_or_else(|| panic!("no {lang} block in {heading:?}")) + fence.len()..];
    body[..body.find("```").expect("closed block")].to_owned()
}

/// The README's address of the service, `localhost:8080` or `127.0.0.1:8080`, made `server`'s.
fn at(text: &str, server: &Slidegate) -> String {
    let addr = server.base.trim_start_matches("http://");
    text.replace("localhost:8080", addr).replace("127.0.0.1:8080", addr)
}

#[tokio::test]
async fn the_quick_start_answers_what_the_readme_shows() {
    let quick_start = block(&readme(), "## Quick start (fresh Debian/Ubuntu machine with Rust)", "sh");
    assert!(quick_start.contains("cargo run --release -- serve\n"), "{quick_start}");
    let text = readme();
    let curl = block(&text, "Then, from another terminal:", "sh");
    let mut lines = curl.lines();
    let request = lines.next().expect("the curl line");
    let shown = lines.next().and_then(|l| l.strip_prefix("# ")).expect("the answer, as a comment");
    let body = request.split('\'').nth(1).expect("the body, in single quotes");
    assert!(request.starts_with("curl -s -X POST localhost:8080/v1/check -d '"), "{request}");

    let server = Slidegate::serve(&[]);
    let answer = reqwest::Client::new()
        .post(server.url("/v1/check"))
        .body(body.to_owned())
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("body");
    assert_eq!(answer, shown, "the answer differs from the README's");
}

#[tokio::test]
async fn the_rules_file_and_the_python_client_work_as_written() {
    let text = readme();
    let redis = RedisServer::start();
    let rules = RulesFile::new(&block(&text, "### Rules file", "toml").replace("redis://127.0.0.1:6379", &redis.url()));
    let server = Slidegate::serve(&["--config", rules.arg()]);
    let client = reqwest::Client::new();

    let listed: Value = client.get(server.url("/v1/rules")).send().await.expect("rules").json().await.expect("JSON");
    let names: Vec<&str> =
        listed["rules"].as_array().expect("rules").iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names.len(), 4, "{listed}");
    for name in ["sms", "api", "search", "upload"] {
        assert!(names.contains(&name), "{name} missing: {listed}");
    }

    // `is_allowed` as the README defines it, seven times against the "sms" rule (5 per 60 s).
    let python = format!(
        "{}\nprint([is_allowed(\"192.168.1.100\") for _ in range(7)])\n",
        at(&block(&text, "### From any language", "python"), &server)
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &python])
        .output()
        .expect("python3 runs (scripts/setup.sh installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[True, True, True, True, True, False, False]");

    // The documented key layout, in the documented Redis.
    let entries: usize = redis.query(&["ZCARD", "slidegate:sms:{192.168.1.100}"]);
    assert_eq!(entries, 5);
    // The admin token guards the key endpoints.
    let key = server.url("/v1/keys/sms/192.168.1.100");
    assert_eq!(client.get(&key).send().await.expect("keys").status(), 401);
    let authorized = client.get(&key).bearer_auth("change-me").send().await.expect("keys");
    assert_eq!(authorized.status(), 200);
}
