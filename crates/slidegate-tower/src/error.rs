//! The one error type of the crate: building a layer with settings that cannot work.

/// A rule or layer setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A trusted proxy that is neither an IP address nor a CIDR block.
    #[error("trusted proxy {0:?} is not an IP address or a CIDR block like 10.0.0.0/8")]
    InvalidProxy(String),
    /// A rule name that cannot appear in keys and headers.
    #[error("rule name {0:?} must be 1 to 64 letters, digits, `_`, `-` or `.`")]
    InvalidRuleName(String),
}
