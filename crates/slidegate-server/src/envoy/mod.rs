//! The Envoy rate limit service: `envoy.service.ratelimit.v3.RateLimitService` over gRPC,
//! configured with envoyproxy/ratelimit's YAML files, deciding with slidegate's exact limits.

pub mod bounds;
pub mod config;
pub mod key;
pub mod service;
pub mod stats;

pub use bounds::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_REQUEST_BYTES};
pub use config::{EnvoyConfig, EnvoyConfigError};
pub use key::descriptor_key;
pub use service::EnvoyRateLimit;
pub use stats::MAX_DETAILED_SERIES;
