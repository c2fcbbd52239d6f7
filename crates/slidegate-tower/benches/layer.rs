//! The layer's overhead over a bare handler: the same axum router called in process (no
//! network, so the layer's own cost is not hidden by the kernel), without the layer, with it on
//! the memory backend, and with it on a Redis backend this bench starts.

// criterion_group! and criterion_main! generate undocumented items.
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::Request;
use slidegate::{Limiter, Quota, RedisBackend};
use slidegate_testkit::RedisServer;
use slidegate_tower::{RateLimitLayer, Rule};
use tower_service::Service;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let server = RedisServer::start();
    let redis =
        rt.block_on(RedisBackend::connect(&server.url())).expect("connect").with_timeout(Duration::from_secs(2));
    // The longest log in a tenth of a second: never reached at the layer's speed.
    let quota = Quota::new(slidegate::MAX_LOG_LIMIT, Duration::from_millis(100)).expect("quota");
    let bare = Router::new().route("/", get(|| async { "ok" }));
    let rule = || Rule::new("api", quota).expect("rule");
    let routers = [
        ("bare handler", bare.clone()),
        (
            "layer, memory backend",
            bare.clone().layer(RateLimitLayer::new(Limiter::in_memory()).rule(rule()).expect("layer")),
        ),
        ("layer, Redis backend", bare.layer(RateLimitLayer::new(Limiter::new(redis)).rule(rule()).expect("layer"))),
    ];
    let mut group = c.benchmark_group("tower layer");
    group.throughput(Throughput::Elements(1));
    for (name, router) in routers {
        let mut service = router.into_service::<Body>();
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut request = Request::get("/").body(Body::empty()).expect("request");
                request.extensions_mut().insert(SocketAddr::from(([192, 0, 2, 1], 4000)));
                let response = rt.block_on(service.call(request)).expect("infallible");
                assert!(response.status().is_success());
            });
        });
    }
    group.finish();
    drop(server);
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1)).sample_size(30);
    targets = bench
}
criterion_main!(benches);
