//! The gRPC baseline for benchmarks: `ShouldRateLimit` answering a fixed response of the shape
//! slidegate's Envoy service gives for one descriptor admitted under 100 per minute, deciding
//! nothing. It is served exactly as `slidegate serve --grpc` serves (the same listener,
//! connection cap, HTTP/2 settings, deadlines, message size cap, health service beside it and
//! allocator), so the
//! difference between the two is the service's own work (bench/grpc_floor.py).
//!
//! ```text
//! cargo run --release -p slidegate-server --example bare_tonic -- 127.0.0.1:8091
//! ```

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;
use slidegate_server::http::HttpLimits;
use tonic::{Request, Response, Status};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Fixed;

#[tonic::async_trait]
impl RateLimitService for Fixed {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        std::hint::black_box(request.into_inner());
        let status = DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit { name: String::new(), requests_per_unit: 100, unit: Unit::Minute as i32 }),
            limit_remaining: 99,
            duration_until_reset: Some(Duration { seconds: 60, nanos: 0 }),
            quota: None,
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![status],
            ..RateLimitResponse::default()
        }))
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8091".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let service =
        RateLimitServiceServer::new(Fixed).max_decoding_message_size(slidegate_server::envoy::MAX_REQUEST_BYTES);
    // The same two services as `serve --grpc`: the router matches the path among them.
    let (_reporter, health) = tonic_health::server::health_reporter();
    let routes = slidegate_server::grpc::routes(service, health);
    slidegate_server::grpc::serve(listener, routes, HttpLimits::default(), None, std::future::pending())
        .await
        .map_err(std::io::Error::other)
}
