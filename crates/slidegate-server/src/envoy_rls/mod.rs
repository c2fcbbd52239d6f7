//! The Envoy rate limit service: `envoy.service.ratelimit.v3.RateLimitService` over gRPC,
//! deciding with slidegate's exact limits the descriptors `crate::envoy` configures.
//!
//! - [`service`]: the gRPC service — a request's descriptors matched, decided (`decide`) and
//!   answered, with [`headers`] and dynamic [`metadata`].
//! - `traffic`: decided descriptors in the dashboard's traffic.

mod decide;
pub mod headers;
pub mod metadata;
pub mod service;
mod traffic;

pub use service::EnvoyRateLimit;
