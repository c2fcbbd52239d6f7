//! The Envoy rate limit service: `envoy.service.ratelimit.v3.RateLimitService` over gRPC,
//! configured with envoyproxy/ratelimit's YAML files, deciding with slidegate's exact limits.

pub mod config;
pub mod service;

pub use config::{EnvoyConfig, EnvoyConfigError};
pub use service::EnvoyRateLimit;
