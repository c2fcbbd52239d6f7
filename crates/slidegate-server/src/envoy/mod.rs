//! Envoy's rate limit configuration: envoyproxy/ratelimit's YAML files as descriptor trees,
//! what a request may size, and the backend key of a descriptor; the service that answers
//! Envoy's calls over them is `crate::envoy_rls`.
//!
//! - [`config`]: the descriptor trees of the configuration directory, and finding a limit;
//!   `spec` reads one file as upstream reads it, `position` finds where a refused node is
//!   written, [`wildcard`] matches `*` values.
//! - [`limit`]: a descriptor's `rate_limit`, checked as upstream checks it, and its quota.
//! - [`stats`]: the per-descriptor counters under upstream's Prometheus names.
//! - [`bounds`], [`key`]: what a request may size, and the backend key of a descriptor.

pub mod bounds;
pub mod config;
pub mod key;
pub mod limit;
mod position;
mod spec;
pub mod stats;
pub mod wildcard;

pub use crate::config::{EnvoyOptions, HeaderStyle, ResponseHeaders};
pub use bounds::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_REQUEST_BYTES};
pub use config::{EnvoyConfig, EnvoyConfigError, MAX_FILE_BYTES, MAX_FILES};
pub use key::descriptor_key;
pub use position::Position;
pub use spec::MAX_FLOW_NESTING;
pub use stats::{MAX_DETAILED_SERIES, MAX_UNKNOWN_DOMAINS};
