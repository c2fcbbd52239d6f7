//! The tower layer's column of SECURITY.md's bounds matrix: the example app
//! (`examples/login_and_search.rs`, its rules and routes served here on a free port instead of
//! 3000) on each engine — memory, Redis Lua, the Redis module, a Redis Cluster — over real HTTP.
//!
//! Of the bounds, the key's is the one a client of that app chooses (its `x-user`, keyed as
//! `search:{<user>}`): its quotas and costs are the app's code, checked when the layer is built.

use std::net::SocketAddr;
use std::time::Duration;

use slidegate::{Backend, Limiter, MAX_KEY_LEN, RedisBackend, RedisEngine};
use slidegate_testkit::{RedisCluster, RedisServer};

// The example's `main` binds port 3000 and is not called: the test serves the same app on a
// free port.
#[allow(dead_code)]
#[path = "../examples/login_and_search.rs"]
mod example;

/// A deadline no busy machine misses: the test counts exact admissions.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the example app over `limiter` on a free loopback port.
async fn serve<B: Backend + Clone + 'static>(limiter: Limiter<B>) -> SocketAddr {
    let app = example::app(example::rules(limiter).expect("the example's rules"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await.expect("serve");
    });
    addr
}

/// A user one byte too long for the key is refused (400 `key_too_long`, the route not reached);
/// the longest is decided exactly: the example's 10 searches, then 429. Returns that user.
async fn the_key_bound_holds(addr: SocketAddr) -> String {
    let client = reqwest::Client::new();
    let search = |user: String| client.get(format!("http://{addr}/search")).header("x-user", user).send();
    let longest = "u".repeat(MAX_KEY_LEN - "search:{}".len());
    let refused = search(format!("{longest}u")).await.expect("an answer");
    assert_eq!(refused.status(), 400);
    let body: serde_json::Value = refused.json().await.expect("a JSON error");
    assert_eq!(body["error"]["code"], "key_too_long", "{body}");
    for i in 0..10 {
        let admitted = search(longest.clone()).await.expect("an answer");
        assert_eq!(admitted.status(), 200, "search {i}");
        assert!(admitted.text().await.expect("body").starts_with("results for u"));
    }
    assert_eq!(search(longest.clone()).await.expect("an answer").status(), 429);
    longest
}

/// The one key the app wrote to `redis` holds the user's ten searches, in `redis_type`.
fn held_in(redis: &RedisServer, user: &str, redis_type: &str) {
    let keys: Vec<String> = redis.query(&["KEYS", "*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].ends_with(&format!("search:{{{user}}}")), "{keys:?}");
    assert_eq!(redis.query::<String>(&["TYPE", &keys[0]]), redis_type, "the engine's own type");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_app_holds_the_key_bound_on_memory() {
    the_key_bound_holds(serve(Limiter::in_memory()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_app_holds_the_key_bound_on_redis_lua() {
    let redis = RedisServer::start();
    let backend = RedisBackend::connect(&redis.url()).await.expect("connect").with_engine(RedisEngine::Lua);
    let user = the_key_bound_holds(serve(Limiter::new(backend.with_timeout(TIMEOUT))).await).await;
    held_in(&redis, &user, "zset");
    assert_eq!(redis.query::<u64>(&["ZCARD", &redis.query::<Vec<String>>(&["KEYS", "*"])[0]]), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_app_holds_the_key_bound_on_the_redis_module() {
    let redis = RedisServer::start_with_module(&[]);
    let backend = RedisBackend::connect(&redis.url()).await.expect("connect").with_engine(RedisEngine::Module);
    let user = the_key_bound_holds(serve(Limiter::new(backend.with_timeout(TIMEOUT))).await).await;
    held_in(&redis, &user, "slidegate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_app_holds_the_key_bound_on_a_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisBackend::connect_cluster(&urls).await.expect("connect");
    let user = the_key_bound_holds(serve(Limiter::new(backend.with_timeout(TIMEOUT))).await).await;
    // The key's slot is the user's (its hash tag): the master serving it holds the ten searches.
    let slot = cluster.nodes()[0].query::<u16>(&["CLUSTER", "KEYSLOT", &format!("{{{user}}}")]);
    held_in(cluster.master_of(slot), &user, "zset");
}
