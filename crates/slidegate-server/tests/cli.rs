//! The command line as an operator meets it, on the real binary: `slidegate validate`, every
//! `serve` flag from its environment variable, and the log format and level.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{RulesFile, Slidegate, run, run_with_env};

const MESSAGING: &str = include_str!("fixtures/envoy/messaging.yaml");

/// A scratch directory with the given files, removed on drop.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "slidegate-cli-{}-{}",
            std::process::id(),
            slidegate_testkit::free_port()
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write");
        }
        Self(dir)
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const RULES: &str = r#"admin_token = "s3cret"

[inline]
max_limit = 500

[[rules]]
name = "sms"
limit = 5
window = "60s"

[[rules]]
name = "api"
limit = 10
window = "60s"
tiers = { vip = { limit = 100 }, gold = { limit = 50 } }
"#;

#[test]
fn validate_summarizes_what_serve_would_run_and_exits_0() {
    let rules = RulesFile::new(RULES);
    let envoy = Dir::new(&[("messaging.yaml", MESSAGING)]);
    let out = run(&["validate", "--config", rules.arg(), "--envoy-config", envoy.arg()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains(&format!("{}: ok", rules.arg())), "{stdout}");
    assert!(stdout.contains("rules: 2 (api, sms)"), "{stdout}");
    assert!(stdout.contains("tiers: 2 (api.gold, api.vip)"), "{stdout}");
    assert!(stdout.contains("max_limit 500, max_window 1day, max_cost 100"), "{stdout}");
    assert!(stdout.contains("backend: memory"), "{stdout}");
    assert!(stdout.contains("admin routes: enabled"), "{stdout}");
    assert!(stdout.contains(&format!("{}: ok\n  envoy domains: 1 (messaging: 2 limits)", envoy.arg())), "{stdout}");
}

#[test]
fn validate_reads_the_listeners_tls_files_as_serve_does() {
    let pki = slidegate_testkit::TestPki::new("validate");
    let rules = pki.dir().join("rules.toml");
    let fields = "[server]\ntls_cert = \"server.pem\"\ntls_key = \"server.key\"\ntls_client_ca = \"ca.pem\"\n";
    std::fs::write(&rules, fields).expect("write rules");
    let out = run(&["validate", "--config", support::path(&rules)]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("(client certificates required)"), "{stdout}");
    assert!(stdout.contains(support::path(&pki.server().cert)), "{stdout}");
    // The key of another certificate: the problem `serve` would fail its start with.
    std::fs::write(&rules, fields.replace("server.key", "client.key")).expect("write rules");
    let out = run(&["validate", "--config", support::path(&rules)]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(support::path(&pki.client().key)) && stderr.contains("not the key of"), "{stderr}");
}

#[test]
fn validate_prints_each_problem_with_file_and_line_and_exits_1() {
    let rules = RulesFile::new("[[rules]]\nname = \"sms\"\nlimit = 0\nwindow = \"60s\"\n");
    let envoy = Dir::new(&[("broken.yaml", "domain: broken\ndescriptors:\n  - key: a\n    value: [unclosed\n")]);
    let out = run(&["validate", "--config", rules.arg(), "--envoy-config", envoy.arg()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.is_empty(), "no summary when anything is wrong: {stdout}");
    let problems: Vec<&str> = stderr.lines().collect();
    assert_eq!(problems.len(), 2, "{stderr}");
    assert!(problems[0].starts_with(&format!("{}:3:9: rules[0].limit: ", rules.arg())), "{stderr}");
    let yaml = envoy.0.join("broken.yaml");
    assert!(problems[1].starts_with(&format!("{}:5:1: error loading config file: ", yaml.display())), "{stderr}");

    // The same loaders, so `serve` stops with the same words.
    let serve = run(&["serve", "--http", "127.0.0.1:0", "--config", rules.arg()]);
    assert_eq!(serve.status.code(), Some(2));
    assert!(text(&serve.stderr).contains(problems[0]), "{}", text(&serve.stderr));
    let serve = run(&["serve", "--http", "127.0.0.1:0", "--envoy-config", envoy.arg()]);
    assert_eq!(serve.status.code(), Some(2));
    assert!(text(&serve.stderr).contains(problems[1]), "{}", text(&serve.stderr));

    // A problem the Envoy loader finds past the YAML names the file, the line and column of the
    // offending field, and the descriptor.
    let unit =
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n";
    let envoy = Dir::new(&[("d.yaml", unit)]);
    let out = run(&["validate", "--envoy-config", envoy.arg()]);
    assert_eq!(out.status.code(), Some(1));
    let path = envoy.0.join("d.yaml");
    assert_eq!(
        text(&out.stderr).trim(),
        format!("{}:5:7: descriptor 'd.a': invalid rate limit unit 'fortnight'", path.display())
    );
}

#[test]
fn validate_finds_the_envoy_directory_the_rules_file_names_and_needs_a_file() {
    let envoy = Dir::new(&[("messaging.yaml", MESSAGING)]);
    // Relative to the rules file, as `serve` reads it.
    let rules = RulesFile::new(&format!("envoy_config = {:?}\n", envoy.0.file_name().expect("name")));
    let out = run_with_env(&["validate"], &[("SLIDEGATE_CONFIG", rules.arg())]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("envoy domains: 1 (messaging: 2 limits)"), "{}", text(&out.stdout));

    // Two files of one domain: refused, unless merged as `serve` would merge them.
    let file = |key: &str| {
        format!("domain: d\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n")
    };
    let twice = Dir::new(&[("a.yaml", &file("a")), ("b.yaml", &file("b"))]);
    let refused = run(&["validate", "--envoy-config", twice.arg()]);
    assert_eq!(refused.status.code(), Some(1));
    let at = format!("{}:1:1: duplicate domain 'd'", twice.0.join("b.yaml").display());
    assert!(text(&refused.stderr).starts_with(&at), "the second file's domain: {}", text(&refused.stderr));
    let merged =
        run_with_env(&["validate", "--envoy-config", twice.arg()], &[("SLIDEGATE_ENVOY_MERGE_DOMAINS", "true")]);
    assert!(text(&merged.stdout).contains("envoy domains: 1 (d: 2 limits)"), "{}", text(&merged.stderr));

    let none = run(&["validate"]);
    assert_eq!(none.status.code(), Some(2), "a usage error");
    assert!(text(&none.stderr).contains("--config"), "{}", text(&none.stderr));
}

/// `serve --help`'s options: each flag with the text of its entry.
fn serve_options(help: &str) -> Vec<(String, String)> {
    let mut options: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed.split([' ', ',']).find(|w| w.starts_with("--")).filter(|_| trimmed.starts_with('-'));
        match (flag, options.last_mut()) {
            (Some(flag), _) => options.push((flag.trim_start_matches('-').to_owned(), String::new())),
            (None, Some((_, entry))) => entry.push_str(line),
            (None, None) => {}
        }
    }
    options
}

#[test]
fn every_serve_flag_names_its_environment_variable_in_help() {
    let out = run_with_env(&["serve", "--help"], &[("SLIDEGATE_REDIS", "redis://:hunter2@127.0.0.1:1")]);
    let help = text(&out.stdout);
    assert!(out.status.success(), "{help}");
    let options = serve_options(&help);
    assert!(options.len() >= 15, "{options:?}");
    for (flag, entry) in options.iter().filter(|(f, _)| f != "help" && f != "version") {
        let variable = format!("SLIDEGATE_{}", flag.to_uppercase().replace('-', "_"));
        assert!(entry.contains(&format!("[env: {variable}")), "--{flag} has no {variable}: {entry}");
    }
    // A variable's value is shown, but not a Redis URL's: it may hold a password.
    assert!(!help.contains("hunter2"), "{help}");
}

/// docs/settings.md shows the settings table `--help` is built from, as it is.
#[test]
fn the_settings_page_is_the_table_serve_is_built_from() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/settings.md")).expect("page");
    let table = page.split("<!-- settings -->\n").nth(1).and_then(|t| t.split("<!-- /settings -->").next());
    assert_eq!(table, Some(slidegate_server::config::settings_reference().as_str()), "docs/settings.md is stale");
    let help = text(&run(&["serve", "--help"]).stdout);
    for s in slidegate_server::config::SETTINGS {
        assert!(help.contains(&format!("--{} ", s.flag)) || help.contains(&format!("--{}\n", s.flag)), "--{}", s.flag);
    }
}

#[tokio::test]
async fn environment_variables_configure_serve_and_flags_win() {
    let from_env = RulesFile::new("[[rules]]\nname = \"from_env\"\nlimit = 5\nwindow = \"1s\"\n");
    let from_flag = RulesFile::new("[[rules]]\nname = \"from_flag\"\nlimit = 5\nwindow = \"1s\"\n");
    let env = [("SLIDEGATE_CONFIG", from_env.arg()), ("SLIDEGATE_MAX_CONNECTIONS", "7")];
    let rule_names = async |server: &Slidegate| {
        let rules: Value = reqwest::get(server.url("/v1/rules")).await.expect("rules").json().await.expect("JSON");
        rules["rules"].as_array().expect("rules").iter().map(|r| r["name"].to_string()).collect::<Vec<_>>()
    };

    let by_env = Slidegate::serve_with_env(&[], &env);
    assert_eq!(rule_names(&by_env).await, [r#""from_env""#]);
    assert!(by_env.log_text().contains("max_connections=7"), "{}", by_env.log_text());

    let by_flag = Slidegate::serve_with_env(&["--config", from_flag.arg(), "--max-connections", "9"], &env);
    assert_eq!(rule_names(&by_flag).await, [r#""from_flag""#]);
    assert!(by_flag.log_text().contains("max_connections=9"), "{}", by_flag.log_text());

    // A flag's variable is read as the flag would be: a bad value stops the start, naming both.
    let bad = run_with_env(&["serve"], &[("SLIDEGATE_HTTP", "not-an-address")]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("--http"), "{}", text(&bad.stderr));
}

#[tokio::test]
async fn where_redis_is_comes_from_the_command_line_before_any_variable() {
    let redis = slidegate_testkit::RedisServer::start();
    // The sentinel variable names nothing that answers: were it used, the start would fail.
    let env = [("SLIDEGATE_REDIS_SENTINEL", "redis://127.0.0.1:1")];
    let server = Slidegate::serve_with_env(&["--redis", &redis.url()], &env);
    let ready: Value = reqwest::get(server.url("/readyz")).await.expect("readyz").json().await.expect("JSON");
    assert_eq!(ready["backend"], "redis", "{ready}");

    // Two places given the same way are a mistake, named.
    let both =
        run_with_env(&["serve"], &[("SLIDEGATE_REDIS", &redis.url()), ("SLIDEGATE_REDIS_CLUSTER", &redis.url())]);
    assert_eq!(both.status.code(), Some(2));
    let said = text(&both.stderr);
    assert!(said.contains("SLIDEGATE_REDIS and") && said.contains("SLIDEGATE_REDIS_CLUSTER are both set"), "{said}");
}

/// Waits (bounded) until the server's log has a line that satisfies `found`.
fn wait_for_log(server: &Slidegate, found: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let log = server.log_text();
        if log.lines().any(&found) {
            return log;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "no such line: {log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn json_logs_are_one_object_per_line_with_level_message_and_fields() {
    let rules = RulesFile::new("[[rules]]\nname = \"sms\"\nlimit = 5\nwindow = \"60s\"\n");
    let server = Slidegate::serve(&["--config", rules.arg(), "--log-format", "json"]);
    rules.write(RULES);
    let log = wait_for_log(&server, |l| l.contains("rules reloaded"));
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object: {l:?}: {e}")))
        .collect();
    for event in &events {
        assert!(event["timestamp"].is_string() && event["message"].is_string(), "{event}");
        assert!(["INFO", "WARN", "ERROR"].contains(&event["level"].as_str().unwrap_or_default()), "{event}");
    }
    let reload = events.iter().find(|e| e["message"] == "rules reloaded").expect("the reload event");
    assert_eq!(reload["rules"], 2, "{reload}");
    assert_eq!(reload["path"], rules.arg(), "{reload}");
    let start = events.iter().find(|e| e["message"] == "slidegate serving").expect("the start event");
    assert_eq!((start["backend"].as_str(), start["rules"].as_u64()), (Some("memory"), Some(1)), "{start}");
}

/// A reload reads the rules file with the flags over it, as the start did: a backend given as a
/// flag is not taken for a change of the file's backend settings.
#[test]
fn a_reload_reads_the_flags_over_the_file_again() {
    let redis = slidegate_testkit::RedisServer::start();
    let rules = RulesFile::new("[[rules]]\nname = \"sms\"\nlimit = 5\nwindow = \"60s\"\n");
    let server = Slidegate::serve(&["--config", rules.arg(), "--redis", &redis.url(), "--max-overrides", "9"]);
    rules.write(RULES);
    let log = wait_for_log(&server, |l| l.contains("rules reloaded"));
    assert!(!log.contains("backend settings changed"), "{log}");
}

#[test]
fn the_log_level_comes_from_the_flag_or_its_variable_then_rust_log() {
    let says_info = |server: &Slidegate| server.log_text().contains("slidegate serving");
    // Without either, `info`; RUST_LOG alone sets it; the flag and its variable win over it.
    assert!(says_info(&Slidegate::serve_with_env(&[], &[])));
    assert!(!says_info(&Slidegate::serve_with_env(&[], &[("RUST_LOG", "warn")])));
    assert!(says_info(&Slidegate::serve_with_env(&["--log-level", "info"], &[("RUST_LOG", "warn")])));
    assert!(!says_info(&Slidegate::serve_with_env(&[], &[("SLIDEGATE_LOG_LEVEL", "warn"), ("RUST_LOG", "info")])));
    assert!(says_info(&Slidegate::serve_with_env(&["--log-level", "warn,slidegate_server=info"], &[])));

    let bad = run(&["serve", "--log-level", "info,=="]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("--log-level"), "{}", text(&bad.stderr));
}

/// A file of the Debian package (`debian/` beside this crate's manifest).
fn packaged(name: &str) -> String {
    let path = format!("{}/debian/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_packaged_rules_file_loads_as_shipped_and_with_every_setting_uncommented() {
    let shipped = packaged("rules.toml");
    let config = slidegate_server::config::Config::parse(&shipped, "rules.toml").expect("loads as shipped");
    assert!(config.rules.is_empty() && config.backend.redis.is_none() && config.inline.enabled);
    // Settings are commented `#name = value` (explanations `# text`): each is a real setting.
    let uncommented: String = shipped
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(setting) if setting.starts_with(|c: char| c.is_ascii_lowercase() || c == '[') => setting,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let config = slidegate_server::config::Config::parse(&uncommented, "rules.toml")
        .unwrap_or_else(|e| panic!("every setting uncommented: {e}\n{uncommented}"));
    assert_eq!(config.rules.len(), 1);
    assert_eq!(config.backend.redis.as_deref(), Some("redis://127.0.0.1:6379"));
}

#[test]
fn the_packaged_environment_file_names_serve_s_variables() {
    let help = text(&run(&["serve", "--help"]).stdout);
    let file = packaged("default");
    let variables: Vec<&str> =
        file.lines().filter_map(|l| l.strip_prefix('#')?.split_once('=')).map(|(n, _)| n).collect();
    assert!(variables.len() >= 5, "{variables:?}");
    for variable in variables {
        assert!(help.contains(&format!("[env: {variable}")), "{variable} is no serve flag's");
    }
}

#[cfg(feature = "bench")]
#[test]
fn bench_refuses_more_keys_than_it_can_prepare_before_preparing_any() {
    // The attack on the operator's own tool: a key count that would have it build a name (and a
    // request) for each of 10^19 keys.
    let out = run(&["bench", "--target", "memory", "--keys", "18446744073709551615", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--keys"), "{}", text(&out.stderr));
    let out = run(&["bench", "--target", "memory", "--keys", "1000", "--duration", "100ms", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
