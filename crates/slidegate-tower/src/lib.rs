//! Rate limit any tower service — axum, tonic, hyper — with one limit across every instance:
//! a [`RateLimitLayer`] over a [`slidegate::Limiter`] (in memory, or Redis for many instances)
//! with per-route [`Rule`]s, keys from the client IP (proxy-aware, never trusting forwarding
//! headers by default), a header, the authenticated user or any closure, tiers and costs per
//! request, `429 Too Many Requests` with `Retry-After` and the IETF `RateLimit` headers, shadow
//! mode, failure policies and metrics.
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{Router, routing::{get, post}};
//! use slidegate::{Limiter, Quota};
//! use slidegate_tower::{ForwardedHeader, PeerIp, RateLimitLayer, Rule};
//!
//! # fn build() -> Result<(), Box<dyn std::error::Error>> {
//! let limits = RateLimitLayer::new(Limiter::in_memory())
//!     .rule(Rule::new("login", Quota::per_minute(5)?)?.route("/login").key(
//!         PeerIp::behind(["10.0.0.0/8"])?.forwarded_by(ForwardedHeader::XForwardedFor),
//!     ))?
//!     .rule(Rule::new("search", Quota::per_second(10)?)?.route("/search"))?;
//! let app = Router::new()
//!     .route("/login", post(|| async { "welcome" }))
//!     .route("/search", get(|| async { "results" }))
//!     .layer(limits)
//!     .into_make_service_with_connect_info::<SocketAddr>();
//! # let _ = app; Ok(()) }
//! ```
//!
//! # Layout
//!
//! - [`layer`]: [`RateLimitLayer`], its rules and settings.
//! - `decide`: what a request's decision is: keys and costs checked, then one round trip.
//! - [`service`]: [`RateLimit`], the service: 429, a rejection or the inner response.
//! - [`rule`]: [`Rule`], routes, key, tiers, cost.
//! - [`key`]: [`KeyExtractor`] and the built-in keys [`Header`], [`Extension`], [`Route`].
//! - [`peer`]: [`PeerIp`], the client's address, behind [`TrustedProxies`] that write one
//!   [`ForwardedHeader`].
//! - [`headers`]: the RateLimit headers as an `http::HeaderMap` (their values come from
//!   [`slidegate::headers`]).
//! - `grpc`: the answers to gRPC calls (`RESOURCE_EXHAUSTED` with the retry delay).
//! - [`metrics`]: the metric names.
//! - [`error`]: [`Error`], for settings that cannot work; [`Rejection`], for requests that
//!   cannot be counted.

mod decide;
pub mod error;
mod grpc;
pub mod headers;
pub mod key;
pub mod layer;
pub mod metrics;
pub mod peer;
pub mod rule;
pub mod service;

pub use error::{Error, Rejection};
pub use headers::rate_limit_headers;
pub use key::{Extension, Header, KeyExtractor, Route};
pub use layer::RateLimitLayer;
pub use peer::{ForwardedHeader, PeerIp, PeerIpBehind, TrustedProxies};
pub use rule::Rule;
pub use service::{RateLimit, RateLimitBody};

/// The Rust examples of the README and of docs/ (library, algorithms, middleware), compiled as
/// doctests here, the one crate that sees all of them, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
#[doc = include_str!("../../../docs/library.md")]
#[doc = include_str!("../../../docs/middleware.md")]
#[doc = include_str!("../../../docs/service.md")]
#[doc = include_str!("../../../docs/envoy.md")]
#[doc = include_str!("../../../docs/redis.md")]
#[doc = include_str!("../../../docs/operations.md")]
#[doc = include_str!("../../../docs/development.md")]
#[doc = include_str!("../../../docs/architecture.md")]
pub struct ReadmeDoctests;
