//! Rules and overrides shared through Redis, with real processes: a redis-server, `slidegate
//! rules push` and `show`, and two `slidegate serve --rules-from-redis` instances on it.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::{Value, json};
use slidegate_server::shared_store::MAX_DOCUMENT_BYTES;
use slidegate_testkit::{RedisCluster, RedisServer};
use support::{RulesFile, Slidegate, check, metric};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The local file of every instance: the admin token stays local.
const LOCAL: &str = "admin_token = \"t\"\n";

/// A rules document of rules `(name, limit)`, one hour each.
fn document(rules: &[(&str, u64)]) -> String {
    rules
        .iter()
        .map(|(name, limit)| format!("[[rules]]\nname = \"{name}\"\nlimit = {limit}\nwindow = \"1h\"\n\n"))
        .collect()
}

/// `slidegate rules push --redis <url> <file>`: (success, stdout, stderr).
fn push(url: &str, file: &RulesFile) -> (bool, String, String) {
    let out = support::run(&["rules", "push", "--redis", url, file.arg()]);
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn pushed(url: &str, file: &RulesFile) {
    let (ok, stdout, stderr) = push(url, file);
    assert!(ok, "{stdout}{stderr}");
}

/// Two instances serving the rules of the Redis at `url`, the second told by the environment.
fn two_instances(url: &str, local: &RulesFile) -> (Slidegate, Slidegate) {
    let a = Slidegate::serve(&["--redis", url, "--rules-from-redis", "--config", local.arg()]);
    let b = Slidegate::serve_with_env(
        &["--redis", url, "--config", local.arg()],
        &[("SLIDEGATE_RULES_FROM_REDIS", "true")],
    );
    (a, b)
}

/// A redis-server with the rule `api` (5 an hour) pushed, and one instance serving it:
/// (redis, the local file, the rules file, the instance).
async fn one_instance(client: &Client) -> (RedisServer, RulesFile, RulesFile, Slidegate) {
    let redis = RedisServer::start();
    let (local, rules) = (RulesFile::new(LOCAL), RulesFile::new(&document(&[("api", 5)])));
    pushed(&redis.url(), &rules);
    let server = Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg()]);
    assert_eq!(limit_of(client, &server, "api").await, (5, false));
    (redis, local, rules, server)
}

/// Stores `text` as rules version `version`, as the push script does, but announces nothing.
fn store_silently(redis: &RedisServer, text: impl redis::ToRedisArgs, version: u64) {
    let mut conn = redis.conn();
    redis::cmd("HSET")
        .arg("slidegate:{rules}:state")
        .arg("rules")
        .arg(text)
        .arg(&["rules_version", &version.to_string(), "pushed_at_ms", "0", "pushed_from", "test"][..])
        .query::<()>(&mut conn)
        .expect("HSET");
    redis::cmd("HINCRBY").arg("slidegate:{rules}:state").arg("version").arg(1).query::<()>(&mut conn).expect("HINCRBY");
}

static KEYS: AtomicU64 = AtomicU64::new(0);

/// The limit a check of `rule` on a fresh key is decided with (and whether it was degraded),
/// or None while `server` has no such rule.
async fn decided(client: &Client, server: &Slidegate, rule: &str) -> Option<(u64, bool)> {
    let key = format!("k{}", KEYS.fetch_add(1, Ordering::Relaxed));
    let (status, _, v) = check(client, server, &json!({"rule": rule, "key": key})).await;
    if status == 404 && v["error"]["code"] == "unknown_rule" {
        return None;
    }
    assert_eq!(status, 200, "{v}");
    Some((v["limit"].as_u64().expect("a limit"), v["degraded"] == true))
}

/// The limit a check of `rule` on a fresh key is decided with (and whether it was degraded).
async fn limit_of(client: &Client, server: &Slidegate, rule: &str) -> (u64, bool) {
    decided(client, server, rule).await.unwrap_or_else(|| panic!("no rule {rule}"))
}

/// Waits until `server` decides `rule` with `limit`, undegraded, the rule perhaps still unknown
/// when it starts; returns how long it took.
async fn until_limit(client: &Client, server: &Slidegate, rule: &str, limit: u64, within: Duration) -> Duration {
    let started = Instant::now();
    while decided(client, server, rule).await != Some((limit, false)) {
        assert!(started.elapsed() < within, "no limit {limit} for {rule} after {within:?}: {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_changes_the_limit_on_every_instance_within_a_second() {
    let redis = RedisServer::start();
    let (local, rules) = (RulesFile::new(LOCAL), RulesFile::new(&document(&[("api", 5)])));
    pushed(&redis.url(), &rules);
    let (a, b) = two_instances(&redis.url(), &local);
    let client = Client::new();
    assert_eq!((limit_of(&client, &a, "api").await, limit_of(&client, &b, "api").await), ((5, false), (5, false)));

    rules.write(&document(&[("api", 7)]));
    let (ok, stdout, stderr) = push(&redis.url(), &rules);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("pushed rules version 2") && stdout.contains("api: 5 per 1h sliding_log → 7 per 1h"),
        "{stdout}"
    );
    let pushed_at = Instant::now();
    let (on_a, on_b) = tokio::join!(
        until_limit(&client, &a, "api", 7, Duration::from_secs(5)),
        until_limit(&client, &b, "api", 7, Duration::from_secs(5)),
    );
    println!("version 2 in force {on_a:?} (a) and {on_b:?} (b) after the push returned");
    assert!(pushed_at.elapsed() < Duration::from_secs(5));

    // `rules show` prints what is stored, with its version and push.
    let out = support::run(&["rules", "show", "--redis", &redis.url()]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    let (header, text) = shown.split_once('\n').expect("a header line");
    assert!(
        header.starts_with("# slidegate rules version 2, pushed 20") && header.ends_with(" from 127.0.0.1"),
        "{header}"
    );
    assert_eq!(text, document(&[("api", 7)]));
    // Each instance records the push it applied: old → new, when, from where.
    assert!(
        a.log_text()
            .lines()
            .any(|l| l.contains("rules version 2 in force") && l.contains("5 per 1h sliding_log → 7 per 1h"))
    );
    let ready: Value = client.get(b.url("/readyz")).send().await.expect("readyz").json().await.expect("json");
    assert_eq!(
        (&ready["shared"]["in_sync"], &ready["shared"]["rules"]["version"]),
        (&json!(true), &json!(2)),
        "{ready}"
    );
    // `/readyz` needs no token: it names no machine.
    assert!(ready["shared"]["rules"].get("pushed_from").is_none() && !ready.to_string().contains("127.0.0.1"));
    assert_eq!(metric(&client, &b, "slidegate_rules_version").await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_during_a_swap_never_see_a_mixed_rule_set() {
    let redis = RedisServer::start();
    let local = RulesFile::new(LOCAL);
    let rules = RulesFile::new(&document(&[("a", 10), ("b", 10)]));
    pushed(&redis.url(), &rules);
    let (a, b) = two_instances(&redis.url(), &local);
    // Checkers ask for both rules in one group, on fresh keys, and note the pair of limits.
    let stop = Arc::new(AtomicBool::new(false));
    let checkers: Vec<_> = [a.url("/v1/check"), b.url("/v1/check"), a.url("/v1/check"), b.url("/v1/check")]
        .into_iter()
        .map(|url| {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let client = Client::new();
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = KEYS.fetch_add(1, Ordering::Relaxed);
                    let group = json!({"checks": [{"rule": "a", "key": format!("x{n}")}, {"rule": "b", "key": format!("y{n}")}]});
                    let v: Value = client.post(&url).json(&group).send().await.expect("answer").json().await.expect("json");
                    seen.push((v["results"][0]["limit"].as_u64(), v["results"][1]["limit"].as_u64()));
                }
                seen
            })
        })
        .collect();
    // Both rules change together, twenty times.
    for i in 1..=20 {
        let limit = if i % 2 == 1 { 20 } else { 10 };
        rules.write(&document(&[("a", limit), ("b", limit)]));
        pushed(&redis.url(), &rules);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut pairs = Vec::new();
    for c in checkers {
        pairs.extend(c.await.expect("checker"));
    }
    let mixed: Vec<_> = pairs.iter().filter(|(x, y)| x != y).collect();
    assert!(
        mixed.is_empty(),
        "{} of {} checks saw a mixed rule set: {:?}",
        mixed.len(),
        pairs.len(),
        &mixed[..mixed.len().min(5)]
    );
    let changes = pairs.windows(2).filter(|w| w[0] != w[1]).count();
    let count = |limit| pairs.iter().filter(|p| p.0 == Some(limit)).count();
    println!(
        "{} checks, {} under (10, 10), {} under (20, 20), {changes} changes seen",
        pairs.len(),
        count(10),
        count(20)
    );
    assert!(count(10) > 0 && count(20) > 0 && changes >= 4, "the checks ran across the swaps");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_changes_one_keys_limit_on_every_instance_until_it_lapses() {
    let redis = RedisServer::start();
    let (local, rules) = (RulesFile::new(LOCAL), RulesFile::new(&document(&[("api", 5)])));
    pushed(&redis.url(), &rules);
    let (a, b) = two_instances(&redis.url(), &local);
    let client = Client::new();
    let limit = async |server: &Slidegate, key: &str| {
        let (_, _, v) = check(&client, server, &json!({"rule": "api", "key": key})).await;
        v["limit"].as_u64().expect("a limit")
    };
    let set = client
        .put(a.url("/v1/overrides/api/customer-42"))
        .bearer_auth("t")
        .json(&json!({"limit": 50, "ttl": "3s"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(set.status(), 200);
    let set_at = Instant::now();
    assert_eq!(limit(&a, "customer-42").await, 50, "the instance that took the change applies it before answering");
    while limit(&b, "customer-42").await != 50 {
        assert!(set_at.elapsed() < Duration::from_secs(5), "b did not apply the override: {}", b.log_text());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("the override in force on b {:?} after a answered", set_at.elapsed());
    assert_eq!((limit(&a, "customer-7").await, limit(&b, "customer-7").await), (5, 5), "other keys keep the rule's");
    let late = Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg()]);
    assert_eq!(limit(&late, "customer-42").await, 50, "an instance started since reads it");
    let list = client.get(b.url("/v1/overrides/api")).bearer_auth("t").send().await.expect("list");
    let list: Value = list.json().await.expect("json");
    assert_eq!((&list["total"], &list["overrides"][0]["set_from"]), (&json!(1), &json!("127.0.0.1")), "{list}");

    // After its ttl, both are back to the rule's limit, and Redis no longer holds it.
    for server in [&a, &b] {
        while limit(server, "customer-42").await != 5 {
            assert!(set_at.elapsed() < Duration::from_secs(15), "the override did not lapse");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    while redis.query::<u64>(&["HLEN", "slidegate:{rules}:overrides"]) != 0 {
        assert!(set_at.elapsed() < Duration::from_secs(15), "the lapsed override stays in redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut lapses = 0.0;
    for server in [&a, &b, &late] {
        lapses += metric(&client, server, "slidegate_override_changes_total{action=\"lapse\"}").await;
    }
    assert_eq!(lapses, 1.0, "one instance removed it, and recorded it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_instances_keep_their_rules_and_take_a_push_made_after_it_returns() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let local = RulesFile::new(&format!("{LOCAL}[backend]\ntimeout = \"100ms\"\n"));
    // Decided in the instance at half the limit while Redis is away: the limit stays visible.
    let rules = RulesFile::new(&format!("{}failure_policy = \"local\"\nlocal_share = 0.5\n", document(&[("api", 10)])));
    pushed(&url, &rules);
    let (a, b) = two_instances(&url, &local);
    let client = Client::new();
    redis.kill();
    for server in [&a, &b] {
        let started = Instant::now();
        loop {
            let ready: Value =
                client.get(server.url("/readyz")).send().await.expect("readyz").json().await.expect("json");
            if ready["shared"]["in_sync"] == false {
                assert!(ready["shared"]["error"].as_str().is_some_and(|e| e.contains("serving the last")), "{ready}");
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "no word of the lost redis: {ready}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(limit_of(&client, server, "api").await, (5, true), "the last rules, by the local policy");
        assert_eq!(metric(&client, server, "slidegate_shared_unreachable").await, 1.0);
    }

    // Redis comes back (empty: no persistence) and a push follows at once.
    let _back = RedisServer::start_on(redis.port());
    rules.write(&format!("{}failure_policy = \"local\"\nlocal_share = 0.5\n", document(&[("api", 20)])));
    pushed(&url, &rules);
    for server in [&a, &b] {
        until_limit(&client, server, "api", 20, Duration::from_secs(15)).await;
        assert_eq!(metric(&client, server, "slidegate_shared_unreachable").await, 0.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rules_file_is_refused_and_changes_nothing() {
    let redis = RedisServer::start();
    let (local, rules) = (RulesFile::new(LOCAL), RulesFile::new(&document(&[("api", 5)])));
    pushed(&redis.url(), &rules);
    let (a, _b) = two_instances(&redis.url(), &local);
    let client = Client::new();
    let bad = [
        (document(&[("api", 0)]), ":3:9: rules[0].limit: limit must be between 1"),
        ("[[rules]]\nname = \"api\"\nlimt = 5\n".to_owned(), ":3:1: unknown field `limt`"),
        (format!("admin_token = \"x\"\n{}", document(&[("api", 9)])), ":1:1: admin_token: stays local"),
        (
            format!("{}[backend]\nredis = \"redis://127.0.0.1:1\"\n", document(&[("api", 9)])),
            ":6:2: backend: stays local",
        ),
    ];
    for (text, error) in bad {
        rules.write(&text);
        let (ok, _, stderr) = push(&redis.url(), &rules);
        assert!(!ok, "{text} was pushed");
        assert!(stderr.contains(&format!("{}{error}", rules.arg())), "{stderr}");
    }
    assert_eq!(redis.query::<u64>(&["HGET", "slidegate:{rules}:state", "version"]), 1, "nothing stored");
    let shown = support::run(&["rules", "show", "--redis", &redis.url()]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("version 1,"));
    assert_eq!(limit_of(&client, &a, "api").await, (5, false));
    // Serving refuses a local file with rules of its own beside --rules-from-redis.
    let out = support::run(&["serve", "--redis", &redis.url(), "--rules-from-redis", "--config", rules.arg()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the rules come from Redis"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_shares_rules_and_overrides_from_one_slot() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let local = RulesFile::new(LOCAL);
    let rules = RulesFile::new(&document(&[("api", 5)]));
    // Pushed through a node that does not hold the slot: the push follows it there.
    let slot = slidegate::key_slot("slidegate:{rules}:state");
    let holder = cluster.master_of(slot).url();
    let elsewhere = urls.iter().find(|u| **u != holder).expect("another node").clone();
    pushed(&elsewhere, &rules);
    let nodes = urls.join(",");
    let server = Slidegate::serve(&["--redis-cluster", &nodes, "--rules-from-redis", "--config", local.arg()]);
    let client = Client::new();
    assert_eq!(limit_of(&client, &server, "api").await, (5, false));
    rules.write(&document(&[("api", 8)]));
    pushed(&elsewhere, &rules);
    until_limit(&client, &server, "api", 8, Duration::from_secs(5)).await;
    let set = client.put(server.url("/v1/overrides/api/k")).bearer_auth("t").json(&json!({"limit": 3})).send().await;
    assert_eq!(set.expect("answer").status(), 200);
    let (_, _, v) = check(&client, &server, &json!({"rule": "api", "key": "k"})).await;
    assert_eq!(v["limit"], 3, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_notice_is_lost_is_applied_by_the_version_check() {
    let client = Client::new();
    let (redis, _local, _rules, server) = one_instance(&client).await;
    // A push as the script makes it, without its PUBLISH.
    store_silently(&redis, document(&[("api", 6)]), 2);
    let took = until_limit(&client, &server, "api", 6, Duration::from_secs(5)).await;
    println!("applied {took:?} after the silent change");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_file_reloads_its_token_and_never_its_own_rules() {
    let redis = RedisServer::start();
    let (local, rules) = (RulesFile::new(LOCAL), RulesFile::new(&document(&[("api", 5)])));
    pushed(&redis.url(), &rules);
    let server = Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg()]);
    let client = Client::new();
    let status = async |token: &str| {
        let request = client.get(server.url("/v1/overrides/api")).bearer_auth(token);
        request.send().await.expect("answer").status().as_u16()
    };
    assert_eq!(status("t").await, 200);
    local.write("admin_token = \"u\"\n");
    let started = Instant::now();
    while status("u").await != 200 {
        assert!(started.elapsed() < Duration::from_secs(10), "the new token was not loaded: {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(limit_of(&client, &server, "api").await, (5, false), "the rules from redis stay");
    // Rules of its own in the local file: the reload is refused, nothing changes.
    local.write(&format!("admin_token = \"v\"\n{}", document(&[("api", 9)])));
    let refused = Instant::now();
    while !server.log_text().contains("the rules come from Redis") {
        assert!(refused.elapsed() < Duration::from_secs(10), "no refusal logged: {}", server.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((status("u").await, limit_of(&client, &server, "api").await), (200, (5, false)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_an_instance_follows_the_rules_through_a_failover() {
    let mut setup = slidegate_testkit::RedisSentinel::start();
    let (local, rules) = (RulesFile::new(LOCAL), RulesFile::new(&document(&[("api", 5)])));
    pushed(&setup.master.url(), &rules);
    let server =
        Slidegate::serve(&["--redis-sentinel", &setup.sentinel_url(), "--rules-from-redis", "--config", local.arg()]);
    let client = Client::new();
    assert_eq!(limit_of(&client, &server, "api").await, (5, false));
    let old = setup.master.port();
    setup.master.kill();
    let killed = Instant::now();
    let promoted = loop {
        match setup.master_port() {
            Some(port) if port != old => break port,
            _ => {}
        }
        assert!(killed.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The replica kept the rules; a push to the new master reaches the instance.
    rules.write(&document(&[("api", 8)]));
    pushed(&format!("redis://127.0.0.1:{promoted}"), &rules);
    until_limit(&client, &server, "api", 8, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_store_cannot_finish_writes_nothing_and_answers_no_redis_text() {
    let redis = RedisServer::start();
    let (local, rules) = (RulesFile::new(LOCAL), RulesFile::new(&document(&[("api", 5)])));
    pushed(&redis.url(), &rules);
    let server = Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg()]);
    let client = Client::new();
    let put = |key: &str| client.put(server.url(&format!("/v1/overrides/api/{key}"))).bearer_auth("t");
    assert_eq!(put("kept").json(&json!({"limit": 9})).send().await.expect("answer").status(), 200);
    let state: Vec<String> = redis.query(&["KEYS", "*{rules}:state"]);
    let overrides: Vec<String> = redis.query(&["KEYS", "*{rules}:overrides"]);
    let (state, overrides) = (&state[0], &overrides[0]);

    // The attack: the state's version is no longer a number, so counting the change would fail.
    let _: () = redis.query(&["HSET", state, "version", "x"]);
    let refused = put("new").json(&json!({"limit": 7, "ttl": "1h"})).send().await.expect("answer");
    assert_eq!(refused.status(), 503);
    let v: Value = refused.json().await.expect("JSON");
    assert_eq!(v["error"]["code"], "backend_unavailable", "{v}");
    assert!(v["error"]["request_id"].is_string() && !v.to_string().contains("version of"), "no Redis text: {v}");
    let deleted = client.delete(server.url("/v1/overrides/api/kept")).bearer_auth("t").send().await.expect("answer");
    assert_eq!(deleted.status(), 503);
    // Nothing was written: the one override stays, in Redis and in force, and none is new.
    let fields: Vec<String> = redis.query(&["HKEYS", overrides]);
    assert_eq!(fields, ["3:api:kept"]);
    let expiries: u64 = redis.query(&["ZCARD", &overrides.replace(":overrides", ":expiries")]);
    assert_eq!(expiries, 0);
    let (status, _, v) = check(&client, &server, &json!({"rule": "api", "key": "kept"})).await;
    assert_eq!((status, &v["limit"]), (200, &json!(9)), "{v}");
    let (ok, _, stderr) = push(&redis.url(), &RulesFile::new(&document(&[("api", 6)])));
    assert!(!ok, "a push is refused too: {stderr}");
    let text: String = redis.query(&["HGET", state, "rules"]);
    assert!(text.contains("limit = 5"), "the rules are unchanged: {text}");
    assert!(server.log_text().contains("not a whole number"), "the detail is in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_keeps_two_deployments_on_one_redis_apart() {
    let redis = RedisServer::start();
    let (default, other) = (RulesFile::new(&document(&[("api", 5)])), RulesFile::new(&document(&[("api", 6)])));
    pushed(&redis.url(), &default);
    let out = support::run(&["rules", "push", "--redis", &redis.url(), "--prefix", "rl", other.arg()]);
    assert!(out.status.success(), "{out:?}");
    let local = RulesFile::new(&format!("{LOCAL}[backend]\nprefix = \"rl\"\n"));
    let server = Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg()]);
    assert_eq!(limit_of(&Client::new(), &server, "api").await, (6, false));
    let shown = support::run(&["rules", "show", "--redis", &redis.url(), "--prefix", "rl"]);
    assert!(String::from_utf8_lossy(&shown.stdout).ends_with(&document(&[("api", 6)])));
    let refused = support::run(&["rules", "push", "--redis", &redis.url(), "--prefix", "{x}", other.arg()]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--prefix: must not contain"), "{refused:?}");
}

/// What the gRPC health service says of the whole server.
async fn serving(health: &mut HealthClient<Channel>) -> ServingStatus {
    let request = HealthCheckRequest { service: String::new() };
    health.check(request).await.expect("health").into_inner().status()
}

/// `/readyz` of `server`: (status, JSON).
async fn readyz(client: &Client, server: &Slidegate) -> (u16, Value) {
    let answer = client.get(server.url("/readyz")).send().await.expect("readyz");
    (answer.status().as_u16(), answer.json().await.expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_that_cannot_read_the_stored_rules_is_not_ready_until_it_can() {
    let client = Client::new();
    let (redis, local, rules, running) = one_instance(&client).await;
    // The attack: an unreadable document stored under the next version.
    store_silently(&redis, "[[rules]\nname = ", 2);
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let new =
        Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg(), "--grpc", &grpc]);
    let (status, ready) = readyz(&client, &new).await;
    assert_eq!(status, 503, "{ready}");
    let error = ready["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("no rules in force: redis rules version 2:1:"), "{ready}");
    assert!(ready["shared"]["error"].as_str().is_some_and(|e| e.contains("not in force")), "{ready}");
    let mut health = HealthClient::new(support::grpc_channel(&grpc).await);
    assert_eq!(serving(&mut health).await, ServingStatus::NotServing);
    // The running instance keeps its rules and stays ready (the version check has seen it).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(limit_of(&client, &running, "api").await, (5, false));
    assert_eq!(readyz(&client, &running).await.0, 200);

    // A readable push: the new instance serves it and says it is ready.
    rules.write(&document(&[("api", 7)]));
    pushed(&redis.url(), &rules);
    until_limit(&client, &new, "api", 7, Duration::from_secs(5)).await;
    let (status, ready) = readyz(&client, &new).await;
    assert_eq!(status, 200, "{ready}");
    let started = Instant::now();
    while serving(&mut health).await != ServingStatus::Serving {
        assert!(started.elapsed() < Duration::from_secs(5), "gRPC health still NOT_SERVING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `pid`'s resident memory, in MiB (`VmRSS` of /proc/PID/status).
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb / 1024.0
}

/// `count` minimal rules named `<prefix><i>`, as small as a rule is written.
fn minimal(prefix: &str, count: usize) -> String {
    (0..count).map(|i| format!("[[rules]]\nname=\"{prefix}{i}\"\nlimit=1\nwindow=\"1s\"\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_accepted_rules_cost_an_instance_under_256_mib_and_more_rules_are_refused() {
    use slidegate_server::config::MAX_RULES;
    use slidegate_server::shared_store::MAX_DOCUMENT_BYTES;
    let redis = RedisServer::start();
    let local = RulesFile::new(LOCAL);
    let rules = RulesFile::new(&minimal("a", MAX_RULES));
    pushed(&redis.url(), &rules);
    let server = Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg()]);
    let client = Client::new();
    assert_eq!(limit_of(&client, &server, &format!("a{}", MAX_RULES - 1)).await, (1, false));
    let first = rss_mib(server.pid());
    // A second push of as many other names: for a moment, both sets are held.
    rules.write(&minimal("b", MAX_RULES));
    pushed(&redis.url(), &rules);
    until_limit(&client, &server, &format!("b{}", MAX_RULES - 1), 1, Duration::from_secs(10)).await;
    let second = rss_mib(server.pid());
    println!("VmRSS with {MAX_RULES} rules: {first:.0} MiB; after {MAX_RULES} others: {second:.0} MiB");
    assert!(first.max(second) <= 256.0, "{first} / {second} MiB");

    // The attack: as many minimal rules as fit the document bound (24,000), pushed...
    let (mut text, mut most) = (String::new(), 0);
    while text.len() + minimal(&format!("c{most}-"), 1).len() <= MAX_DOCUMENT_BYTES {
        text.push_str(&minimal(&format!("c{most}-"), 1));
        most += 1;
    }
    rules.write(&text);
    let (ok, _, stderr) = push(&redis.url(), &rules);
    assert!(!ok && stderr.contains(&format!("{most} rules, over the {MAX_RULES} a rules file may have")), "{stderr}");
    // ...or written into Redis directly: refused by the instance, which keeps its rules.
    store_silently(&redis, &text, 9);
    let started = Instant::now();
    while !server.log_text().contains("rules version 9 from redis not applied") {
        assert!(started.elapsed() < Duration::from_secs(5), "{}", server.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(limit_of(&client, &server, "b0").await, (1, false));
    let third = rss_mib(server.pid());
    println!("VmRSS after the refused document of {most} rules: {third:.0} MiB");
    assert!(third <= 256.0, "{third} MiB");

    // A rules file over the bound is refused at start, and on reload.
    let file = RulesFile::new(&minimal("d", MAX_RULES + 1));
    let (status, stderr) = support::run_to_exit(&["serve", "--config", file.arg()]);
    let over = format!("rules[{MAX_RULES}]: {} rules, over the {MAX_RULES} a rules file may have", MAX_RULES + 1);
    assert!(!status.success() && stderr.contains(&over), "{stderr}");
    file.write(&minimal("d", MAX_RULES));
    let from_file = Slidegate::serve(&["--config", file.arg()]);
    file.write(&minimal("e", MAX_RULES + 1));
    let started = Instant::now();
    while !from_file.log_text().contains(&over) {
        assert!(started.elapsed() < Duration::from_secs(5), "{}", from_file.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(limit_of(&client, &from_file, "d0").await, (1, false), "the rules in force stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_notices_that_arrive_during_a_re_read_are_merged_into_one() {
    const OVERRIDES: usize = 20_000;
    let client = Client::new();
    let (redis, _local, _rules, server) = one_instance(&client).await;
    let set = client.put(server.url("/v1/overrides/api/seed")).bearer_auth("t").json(&json!({"limit": 3})).send();
    assert_eq!(set.await.expect("answer").status(), 200);
    // Many overrides, so that reading everything again takes a while: copies of the seed's.
    let mut conn = redis.conn();
    let seed: String =
        redis::cmd("HGET").arg("slidegate:{rules}:overrides").arg("3:api:seed").query(&mut conn).expect("HGET");
    let mut pipe = redis::pipe();
    for i in 0..OVERRIDES {
        let key = format!("k{i}");
        let json = seed.replace("\"seed\"", &format!("\"{key}\""));
        pipe.cmd("HSET").arg("slidegate:{rules}:overrides").arg(format!("3:api:{key}")).arg(json).ignore();
    }
    pipe.query::<()>(&mut conn).expect("HSET");
    let before = metric(&client, &server, "slidegate_shared_resyncs_total").await;

    // The attack: 300 unreadable notices at once.
    let mut pipe = redis::pipe();
    for _ in 0..300 {
        pipe.cmd("PUBLISH").arg("slidegate:{rules}:changes").arg("not a notice").ignore();
    }
    pipe.query::<()>(&mut conn).expect("PUBLISH");
    let started = Instant::now();
    while server.log_text().matches("an unreadable notice from redis").count() < 300 {
        assert!(started.elapsed() < Duration::from_secs(10), "300 notices not seen in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Settled when the count stays put; the copies read prove a read ran.
    let mut resyncs = metric(&client, &server, "slidegate_shared_resyncs_total").await;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = metric(&client, &server, "slidegate_shared_resyncs_total").await;
        if now == resyncs && metric(&client, &server, "slidegate_overrides").await == (OVERRIDES + 1) as f64 {
            break;
        }
        resyncs = now;
        assert!(started.elapsed() < Duration::from_secs(20), "still reading after 20 s");
    }
    println!(
        "300 bad notices: {} reads of {OVERRIDES} overrides, settled in {:?}",
        resyncs - before,
        started.elapsed()
    );
    assert!((1.0..=3.0).contains(&(resyncs - before)), "{} reads for 300 notices", resyncs - before);
    let (_, _, v) = check(&client, &server, &json!({"rule": "api", "key": "k7"})).await;
    assert_eq!(v["limit"], 3, "{v}");
}

/// How many scripts `redis` has run (`EVALSHA` and `EVAL` calls).
fn scripts_run(redis: &RedisServer) -> u64 {
    let info: String = redis.query(&["INFO", "commandstats"]);
    let calls = |cmd: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    calls("evalsha") + calls("eval")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_document_too_large_or_not_text_is_refused_unread_and_read_once() {
    let client = Client::new();
    let (redis, local, _rules, running) = one_instance(&client).await;
    let too_large = format!("{}#{}\n", document(&[("api", 9)]), "x".repeat(2 * MAX_DOCUMENT_BYTES));
    let cases: [(&[u8], &str); 2] =
        [(b"[[rules]]\nname = \"\xff\xfe\"\n", "not UTF-8 text"), (too_large.as_bytes(), "bytes, over 1048576")];
    for (version, (text, why)) in (2..).zip(cases) {
        // The attack: a client of the Redis writes such a document where the rules are.
        store_silently(&redis, text, version);
        let new = Slidegate::serve(&["--redis", &redis.url(), "--rules-from-redis", "--config", local.arg()]);
        let (status, ready) = readyz(&client, &new).await;
        assert!(status == 503 && ready["error"].as_str().is_some_and(|e| e.contains(why)), "{ready}");
        // The running instance refuses it once, keeps its rules, and does not read it again.
        let started = Instant::now();
        loop {
            let (_, ready) = readyz(&client, &running).await;
            if ready["shared"]["error"].as_str().is_some_and(|e| e.contains(why)) {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "not refused: {ready}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let before = scripts_run(&redis);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(scripts_run(&redis), before, "the document is read again and again");
        assert_eq!(readyz(&client, &running).await.0, 200);
        assert_eq!(limit_of(&client, &running, "api").await, (5, false));
        assert_eq!(metric(&client, &running, "slidegate_shared_unreachable").await, 0.0);
    }
}
