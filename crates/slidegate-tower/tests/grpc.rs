//! The layer in front of a real tonic server (the standard health service), called by a real
//! tonic client: a call over its limit fails with `RESOURCE_EXHAUSTED` and the retry delay where
//! tonic clients read it, not with the `UNAVAILABLE` a bare 429 would become.

use std::time::Duration;

use http::HeaderName;
use slidegate::{Limiter, Quota};
use slidegate_tower::{Header, RateLimitLayer, Rule};
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
use tonic_types::StatusExt;

/// Serves the health service behind `layer` on 127.0.0.1:0; a client connected to it.
async fn serve(layer: RateLimitLayer) -> HealthClient<Channel> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(tonic::transport::Server::builder().layer(layer).add_service(health).serve_with_incoming(incoming));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("uri");
    HealthClient::new(channel.connect().await.expect("connect"))
}

/// Two calls a minute per `x-user`.
fn layer() -> RateLimitLayer {
    let rule = Rule::new("calls", Quota::per_minute(2).expect("quota"))
        .expect("rule")
        .key(Header::new(HeaderName::from_static("x-user")));
    RateLimitLayer::new(Limiter::in_memory()).rule(rule).expect("layer")
}

async fn check(client: &mut HealthClient<Channel>, user: &'static str) -> Result<i32, tonic::Status> {
    let mut request = tonic::Request::new(HealthCheckRequest { service: String::new() });
    request.metadata_mut().insert("x-user", MetadataValue::from_static(user));
    Ok(client.check(request).await?.into_inner().status)
}

#[tokio::test]
async fn a_call_over_the_limit_is_resource_exhausted_with_the_retry_delay() {
    let mut client = serve(layer()).await;
    for _ in 0..2 {
        assert_eq!(check(&mut client, "ada").await.expect("within the limit"), ServingStatus::Serving as i32);
    }
    let status = check(&mut client, "ada").await.expect_err("over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().starts_with("rate limit exceeded, retry after "), "{status:?}");

    // The delay as tonic-types reads it (google.rpc.RetryInfo), and as gRPC's retry policy
    // reads it (server pushback): the window of a minute, less the time these calls took.
    let delay = status.get_details_retry_info().and_then(|r| r.retry_delay).expect("RetryInfo");
    assert!(delay > Duration::from_secs(50) && delay <= Duration::from_secs(60), "{delay:?}");
    let pushback = status.metadata().get("grpc-retry-pushback-ms").expect("pushback").to_str().expect("ASCII");
    assert_eq!(pushback.parse::<u128>().expect("ms"), delay.as_millis());
    // The RateLimit headers travel as metadata too.
    assert_eq!(status.metadata().get("ratelimit-policy").expect("policy"), r#""calls";q=2;w=60"#);

    // Another key is not limited.
    assert_eq!(check(&mut client, "bob").await.expect("another key"), ServingStatus::Serving as i32);
}

#[tokio::test]
async fn a_call_whose_key_cannot_be_counted_is_invalid_argument() {
    let mut client = serve(layer()).await;
    let status = check(&mut client, "").await.expect_err("an empty key");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(status.message(), "the rate limit key of this request is empty");
}
