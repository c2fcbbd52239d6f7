//! The standard gRPC health service on the gRPC port of the real binary, asked by tonic's
//! health client: it follows the backend's readiness as `/readyz` does.

mod support;

use std::time::{Duration, Instant};

use slidegate_server::health::MAX_HEALTH_REQUEST_BYTES;
use slidegate_testkit::RedisServer;
use support::{RulesFile, Slidegate};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// The Envoy rate limit service's name, as gRPC health checks name it.
const RATE_LIMIT_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// A server with `--grpc` on a free port (and `args`), and a health client connected to it.
async fn start(args: &[&str]) -> (Slidegate, HealthClient<Channel>) {
    let grpc = format!("127.0.0.1:{}", slidegate_testkit::free_port());
    let mut all = vec!["--grpc", grpc.as_str()];
    all.extend_from_slice(args);
    let server = Slidegate::serve(&all);
    let client = HealthClient::new(support::grpc_channel(&grpc).await);
    (server, client)
}

async fn status(client: &mut HealthClient<Channel>, service: &str) -> Result<ServingStatus, tonic::Status> {
    let request = HealthCheckRequest { service: service.to_owned() };
    let answer: HealthCheckResponse = client.check(request).await?.into_inner();
    Ok(answer.status())
}

/// Waits (at most `within`) until both the server and the rate limit service report `want`.
async fn wait_for(client: &mut HealthClient<Channel>, want: ServingStatus, within: Duration) {
    let started = Instant::now();
    loop {
        let server = status(client, "").await.expect("the server's status");
        let service = status(client, RATE_LIMIT_SERVICE).await.expect("the service's status");
        if (server, service) == (want, want) {
            return;
        }
        assert!(started.elapsed() < within, "still {server:?}/{service:?} after {within:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn on_the_memory_backend_both_services_are_serving_others_unknown_and_huge_names_refused() {
    let (_server, mut client) = start(&[]).await;
    assert_eq!(status(&mut client, "").await.expect("server"), ServingStatus::Serving);
    assert_eq!(status(&mut client, RATE_LIMIT_SERVICE).await.expect("service"), ServingStatus::Serving);
    let unknown = status(&mut client, "no.such.Service").await.expect_err("not a service here");
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    let huge = "s".repeat(MAX_HEALTH_REQUEST_BYTES);
    let refused = status(&mut client, &huge).await.expect_err("over the bound");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "refused before decoding: {refused:?}");
    assert_eq!(status(&mut client, "").await.expect("still serving"), ServingStatus::Serving);
}

#[tokio::test]
async fn with_redis_killed_health_is_not_serving_and_serving_again_once_it_is_back() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    let rules = RulesFile::new(&format!("[backend]\nredis = {:?}\n", redis.url()));
    let (server, mut client) = start(&["--config", rules.arg()]).await;
    wait_for(&mut client, ServingStatus::Serving, Duration::from_secs(10)).await;
    let mut watch = client.watch(HealthCheckRequest { service: String::new() }).await.expect("watch").into_inner();
    let mut next = async || {
        let message = tokio::time::timeout(Duration::from_secs(10), watch.message()).await.expect("a change in time");
        message.expect("the stream").expect("a status").status()
    };
    assert_eq!(next().await, ServingStatus::Serving, "the status when the watch starts");

    redis.kill();
    wait_for(&mut client, ServingStatus::NotServing, Duration::from_secs(10)).await;
    assert_eq!(next().await, ServingStatus::NotServing, "the watch is told");
    // As /readyz says.
    let ready = reqwest::get(server.url("/readyz")).await.expect("readyz");
    assert_eq!(ready.status(), 503);

    let _back = RedisServer::start_on(port);
    wait_for(&mut client, ServingStatus::Serving, Duration::from_secs(15)).await;
    assert_eq!(next().await, ServingStatus::Serving, "the watch is told");
    let ready = reqwest::get(server.url("/readyz")).await.expect("readyz");
    assert_eq!(ready.status(), 200);
}
