//! The Envoy rate limit service: `envoy.service.ratelimit.v3.RateLimitService` over gRPC,
//! configured with envoyproxy/ratelimit's YAML files, deciding with slidegate's exact limits.
//!
//! - [`config`]: the descriptor trees of the configuration directory, and finding a limit;
//!   `spec` reads one file as upstream reads it, `position` finds where a refused node is
//!   written, [`wildcard`] matches `*` values.
//! - [`service`]: the gRPC service — a request's descriptors matched, decided (`decide`) and
//!   answered, with [`headers`] and dynamic [`metadata`].
//! - [`stats`]: the per-descriptor counters under upstream's Prometheus names.
//! - [`bounds`], [`key`]: what a request may size, and the backend key of a descriptor.
//! - `traffic`: decided descriptors in the dashboard's traffic.

pub mod bounds;
pub mod config;
mod decide;
pub mod headers;
pub mod key;
pub mod metadata;
mod position;
pub mod service;
mod spec;
pub mod stats;
mod traffic;
pub mod wildcard;

pub use crate::config::{EnvoyOptions, HeaderStyle, ResponseHeaders};
pub use bounds::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_REQUEST_BYTES};
pub use config::{EnvoyConfig, EnvoyConfigError, MAX_FILE_BYTES, MAX_FILES};
pub use key::descriptor_key;
pub use position::Position;
pub use service::EnvoyRateLimit;
pub use spec::MAX_FLOW_NESTING;
pub use stats::{MAX_DETAILED_SERIES, MAX_UNKNOWN_DOMAINS};
