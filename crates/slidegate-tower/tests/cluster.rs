//! The layer over a real local Redis Cluster (3 masters, started by slidegate-testkit): a
//! request whose rules' keys live in different slots — which no one script can decide — is
//! decided rule by rule, never passed; rules of one key stay all or nothing.

mod support;

use std::time::Duration;

use http::HeaderName;
use slidegate::{Check, Error, Limiter, RedisBackend, key_slot};
use slidegate_testkit::RedisCluster;
use slidegate_tower::{Header, RateLimitLayer};
use support::{App, charged, quota, rule};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_in_different_cluster_slots_are_decided_one_by_one_not_passed() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisBackend::connect_cluster(&urls).await.expect("connect");
    let limiter = Limiter::new(backend.with_cluster_slot_check(true).with_timeout(Duration::from_secs(2)));
    let user = Header::new(HeaderName::from_static("x-user"));
    let layer = RateLimitLayer::new(limiter.clone())
        .rule(rule("ip", 4))
        .and_then(|l| l.rule(rule("user", 2).key(user)))
        .expect("layer");
    let app = App::new(layer);
    let (ip, ada, bob) = ("ip:{203.0.113.9}", "user:{ada}", "user:{bob}");
    assert_ne!(key_slot(ip), key_slot(ada), "the two rules' keys are in different slots");
    let together = [Check::new(ip, quota(4)), Check::new(ada, quota(2))];
    assert!(matches!(limiter.check_all(&together).await, Err(Error::CrossSlot { .. })), "one check cannot hold them");

    let mut statuses = Vec::new();
    for name in ["ada", "ada", "ada", "bob", "bob"] {
        statuses.push(app.send("/", "203.0.113.9:1", &[("x-user", name.as_bytes())]).await.status.as_u16());
    }
    // ada's third is over her limit; bob's second is over the address's (3 + 1 of 4 used).
    assert_eq!(statuses, [200, 200, 429, 200, 429]);
    assert_eq!(app.reached(), 3);
    // In rule order, stopping at the first denial: `ip` was charged for ada's denied third
    // request (it came first), `user:{bob}` was not asked for bob's second.
    assert_eq!(charged(&limiter, ip, 4).await, 4);
    assert_eq!(charged(&limiter, ada, 2).await, 2);
    assert_eq!(charged(&limiter, bob, 2).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_of_one_key_stay_all_or_nothing_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisBackend::connect_cluster(&urls).await.expect("connect");
    let limiter = Limiter::new(backend.with_cluster_slot_check(true).with_timeout(Duration::from_secs(2)));
    let layer = RateLimitLayer::new(limiter.clone())
        .rule(rule("minute", 10))
        .and_then(|l| l.rule(rule("burst", 1)))
        .expect("layer");
    let app = App::new(layer);
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(app.send("/", "203.0.113.9:1", &[]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 429, 429]);
    // One hash tag, one slot, one script: the burst denials charged nothing to the minute.
    assert_eq!(charged(&limiter, "minute:{203.0.113.9}", 10).await, 1);
}
