//! Every configuration file the real binary reads is checked for its type and size: a FIFO,
//! a device or an oversized file is refused with a log line and a counter, and never blocks
//! the process (the watcher, `/healthz`, SIGHUP, SIGTERM).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Client;
use slidegate_server::envoy::MAX_FILE_BYTES;
use slidegate_server::shared_store::MAX_DOCUMENT_BYTES;
use support::envoy::{Envoy, OK, OVER, codes};
use support::{RulesFile, Slidegate, metric};

const EDGE: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n";

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// `/healthz` answers within a second.
async fn healthy(client: &Client, server: &Slidegate) -> bool {
    let answer = client.get(server.url("/healthz")).timeout(Duration::from_secs(1)).send().await;
    answer.is_ok_and(|a| a.status() == 200)
}

/// Waits (at most 5 s) until `pred` holds of `server`'s log.
async fn until_logged(server: &Slidegate, what: &str) {
    let started = Instant::now();
    while !server.log_text().contains(what) {
        assert!(started.elapsed() < Duration::from_secs(5), "no {what:?} in the log: {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most 5 s) until a request of one hit on `edge` is decided under `limit`.
async fn until_edge_limit(e: &mut Envoy, limit: u32) {
    let started = Instant::now();
    loop {
        let r = e.ask("edge", &[&[("user", "probe")]], 0).await;
        if r.statuses[0].current_limit.as_ref().is_some_and(|l| l.requests_per_unit == limit) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "limit {limit} not in force: {}", e.server.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_the_envoy_directory_is_skipped_and_blocks_nothing_on_one_runtime_thread() {
    let mut e = Envoy::start_with_env(&[("edge.yaml", EDGE)], &[], &[("TOKIO_WORKER_THREADS", "1")]).await;
    let client = Client::new();
    // The attack: a FIFO named like a configuration file, that no one ever writes to.
    mkfifo(&e.dir.0.join("evil.yaml"));
    until_logged(&e.server, "evil.yaml: a FIFO, not a regular file: only regular files are read: skipped").await;
    assert!(healthy(&client, &e.server).await, "/healthz answers beside the FIFO");
    let refused = r#"slidegate_config_files_refused_total{file="envoy",reason="not_a_file"}"#;
    assert!(metric(&client, &e.server, refused).await >= 1.0);
    // Later edits apply, and SIGHUP too.
    std::fs::write(e.dir.0.join("edge.yaml"), EDGE.replace("100", "1")).expect("write");
    until_edge_limit(&mut e, 1).await;
    assert_eq!(codes(&e.ask("edge", &[&[("user", "ann")]], 1).await), (OK, vec![OK]));
    assert_eq!(codes(&e.ask("edge", &[&[("user", "ann")]], 1).await), (OVER, vec![OVER]));
    e.server.signal("HUP");
    assert!(healthy(&client, &e.server).await, "/healthz answers after SIGHUP");

    // An oversized file is refused as a whole; the configuration in force stays.
    let huge = format!("{EDGE}#{}\n", "x".repeat(MAX_FILE_BYTES));
    std::fs::write(e.dir.0.join("huge.yaml"), huge).expect("write");
    until_logged(&e.server, &format!("huge.yaml: over the {MAX_FILE_BYTES} bytes it may have")).await;
    let too_large = r#"slidegate_config_files_refused_total{file="envoy",reason="too_large"}"#;
    assert!(metric(&client, &e.server, too_large).await >= 1.0);
    until_edge_limit(&mut e, 1).await;

    // SIGTERM still stops it.
    e.server.signal("TERM");
    assert!(e.server.wait_exit(Duration::from_secs(10)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_file_that_is_a_fifo_or_too_large_is_refused_at_start_on_reload_and_on_push() {
    let dir = std::env::temp_dir().join(format!("slidegate-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let fifo = dir.join("rules.toml");
    mkfifo(&fifo);
    // At start, and by `rules push`: refused at once, not waited on.
    let started = Instant::now();
    let (status, stderr) = support::run_to_exit(&["serve", "--config", support::path(&fifo)]);
    assert!(!status.success() && stderr.contains("a FIFO, not a regular file"), "{stderr}");
    let out = support::run(&["rules", "push", "--redis", "redis://127.0.0.1:1", support::path(&fifo)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("a FIFO, not a regular file"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));

    // On reload: the rules file replaced by a FIFO, then by a file over the bound.
    let rules = RulesFile::new("[[rules]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n");
    let server = Slidegate::serve_with_env(&["--config", rules.arg()], &[("TOKIO_WORKER_THREADS", "1")]);
    let client = Client::new();
    std::fs::rename(&fifo, &rules.path).expect("the FIFO in the file's place");
    until_logged(&server, "rules file not reloaded").await;
    assert!(server.log_text().contains("a FIFO, not a regular file"), "{}", server.log_text());
    assert!(healthy(&client, &server).await);
    let refused = r#"slidegate_config_files_refused_total{file="rules",reason="not_a_file"}"#;
    assert!(metric(&client, &server, refused).await >= 1.0);
    rules.write(&format!(
        "[[rules]]\nname = \"api\"\nlimit = 6\nwindow = \"1m\"\n#{}\n",
        "x".repeat(MAX_DOCUMENT_BYTES)
    ));
    until_logged(&server, &format!("over the {MAX_DOCUMENT_BYTES} bytes it may have")).await;
    let too_large = r#"slidegate_config_files_refused_total{file="rules",reason="too_large"}"#;
    assert!(metric(&client, &server, too_large).await >= 1.0);
    let (status, _, v) = support::check(&client, &server, &serde_json::json!({"rule": "api", "key": "k"})).await;
    assert_eq!((status, v["limit"].as_u64()), (200, Some(5)), "the rules in force stay");
    std::fs::remove_dir_all(&dir).expect("clean");
}
