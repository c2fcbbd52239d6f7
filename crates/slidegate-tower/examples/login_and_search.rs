//! An axum app with two limits: 5 logins per minute per client IP, and 10 searches per 10 s per
//! user (100 for the `vip` plan). Users are "authenticated" by an `x-user` header — stand-in for
//! your auth layer, which would put the user in the request's extensions the same way.
//!
//!     cargo run -p slidegate-tower --example login_and_search
//!     SLIDEGATE_REDIS=redis://127.0.0.1:6379 cargo run -p slidegate-tower --example login_and_search
//!
//! Then, for example (the sixth login in a minute gets 429):
//!
//!     for i in 1 2 3 4 5 6; do curl -si -X POST localhost:3000/login | head -1; done
//!     curl -si localhost:3000/search -H 'x-user: ada'
//!     curl -si localhost:3000/search -H 'x-user: ada' -H 'x-plan: vip'

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::HeaderValue;
use slidegate::{FailurePolicy, Limiter, Quota, RedisBackend};
use slidegate_tower::{ForwardedHeader, PeerIp, RateLimitLayer, Rule};

/// The authenticated user, as an auth layer would record it.
#[derive(Clone, Debug)]
struct UserId(String);

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request.headers().get("x-user").and_then(|v| v.to_str().ok()).map(|u| UserId(u.to_owned()));
    if let Some(user) = user {
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

/// The two rules (`pub(crate)` with `app`: tests/docs.rs serves this very app).
pub(crate) fn rules<B: slidegate::Backend + Clone>(
    limiter: Limiter<B>,
) -> Result<RateLimitLayer<B>, Box<dyn std::error::Error>> {
    let plan = |req: &http::request::Parts| req.headers.get("x-plan").and_then(|v| v.to_str().ok()).map(str::to_owned);
    Ok(RateLimitLayer::new(limiter)
        // Behind a load balancer on 10.0.0.0/8 that writes X-Forwarded-For, trust that header
        // when it comes from the balancer; nobody else's, and no other header.
        .rule(
            Rule::new("login", Quota::per_minute(5)?)?
                .route("/login")
                .key(PeerIp::behind(["10.0.0.0/8"])?.forwarded_by(ForwardedHeader::XForwardedFor)),
        )?
        .rule(
            Rule::new("search", Quota::new(10, Duration::from_secs(10))?)?
                .route("/search")
                .key(slidegate_tower::Extension::<UserId>::new())
                .tier("vip", Quota::new(100, Duration::from_secs(10))?)
                .tier_by(plan),
        )?
        .deny_body(HeaderValue::from_static("text/plain; charset=utf-8"), "请求过于频繁，请稍后再试\n"))
}

/// The routes, behind the limits and the stand-in authentication.
pub(crate) fn app<B: slidegate::Backend + 'static>(limits: RateLimitLayer<B>) -> Router {
    Router::new()
        .route("/login", post(|| async { "welcome\n" }))
        .route(
            "/search",
            get(|user: Option<Extension<UserId>>| async move {
                format!("results for {}\n", user.map_or("anonymous".into(), |Extension(u)| u.0))
            }),
        )
        .layer(limits)
        .layer(middleware::from_fn(authenticate))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let router = match std::env::var("SLIDEGATE_REDIS") {
        // Many instances share one limit through Redis; if Redis goes away, each instance keeps
        // a quarter of every limit locally.
        Ok(url) => {
            let limiter =
                Limiter::new(RedisBackend::connect(&url).await?).with_failure_policy(FailurePolicy::local(0.25)?);
            app(rules(limiter.with_near_cache(10_000))?)
        }
        Err(_) => app(rules(Limiter::in_memory())?),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
