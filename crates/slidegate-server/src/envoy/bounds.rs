//! What one `ShouldRateLimit` request may size, and why a descriptor is refused.
//!
//! Descriptor values come from the headers of the request Envoy is deciding on, so each is
//! hostile. A refused descriptor is that descriptor's problem only: it is not decided, its
//! `DescriptorStatus` has code `UNKNOWN` ("not known") and no `current_limit`, it is counted by
//! [`Invalid`] reason, and the request's other descriptors are decided as if it were not there —
//! one of them over its limit makes the request `OVER_LIMIT`. Envoy admits on `overall_code`
//! alone and skips statuses without a `current_limit` for its `x-ratelimit-*` headers, so the
//! code only tells an operator which descriptor was not decided. Only a request with no
//! decidable descriptor fails as a whole (`INVALID_ARGUMENT`): an RPC error is an admission,
//! since Envoy's rate limit filter admits on any gRPC error unless `failure_mode_deny` is set.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

use super::key::encoded_len;

/// The most descriptors of one request that are decided; those after it are refused
/// ([`Invalid::TooManyDescriptors`]). A route's descriptors come from its `rate_limits`
/// actions, a handful in practice. It is the library's [`slidegate::MAX_CHECKS`], so that one
/// request's limits always fit one atomic multi-limit check; with [`slidegate::MAX_KEY_LEN`] it
/// bounds the key bytes one request builds to 16 × 512 = 8 KiB.
pub const MAX_DESCRIPTORS: usize = slidegate::MAX_CHECKS;

/// The most entries one descriptor may have. A descriptor has one entry per action of a
/// `rate_limits` entry, and one level of the configuration's descriptor tree per entry.
pub const MAX_ENTRIES: usize = 16;

/// The largest encoded `ShouldRateLimit` request accepted (1 MiB), refused by gRPC before it is
/// decoded (`OUT_OF_RANGE`, which Envoy answers with its `failure_mode_deny`). Large enough for
/// [`MAX_DESCRIPTORS`] descriptors that each carry a whole 60 KiB header (Envoy's default
/// `max_request_headers_kb`): every request such an Envoy sends is decided, its long values
/// refused one by one. Small enough that a request of empty descriptors (2 bytes each), decoded
/// (56 bytes each) and answered (a 120-byte status each), stays under 100 MB.
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// Why a descriptor was refused, the `reason` label of
/// [`crate::metrics::ENVOY_INVALID_DESCRIPTORS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// After the first [`MAX_DESCRIPTORS`] of its request.
    TooManyDescriptors,
    /// More than [`MAX_ENTRIES`] entries.
    TooManyEntries,
    /// A backend key ([`super::descriptor_key`]) longer than [`slidegate::MAX_KEY_LEN`] bytes.
    KeyTooLong,
    /// The same entries as an earlier descriptor of the request, which alone is decided (a key
    /// is charged once per decision).
    Duplicate,
    /// The limiter refused it as the caller's mistake (not a backend failure).
    Rejected,
}

impl Invalid {
    /// Every reason, in the order [`Invalid::index`] numbers them.
    pub const ALL: [Self; 5] =
        [Self::TooManyDescriptors, Self::TooManyEntries, Self::KeyTooLong, Self::Duplicate, Self::Rejected];

    /// This reason's place in [`Invalid::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooManyDescriptors => "too_many_descriptors",
            Self::TooManyEntries => "too_many_entries",
            Self::KeyTooLong => "key_too_long",
            Self::Duplicate => "duplicate",
            Self::Rejected => "rejected",
        }
    }
}

/// A descriptor's `(key, value)` entries, once its sizes are checked — from lengths only:
/// nothing is copied or looked up before.
pub fn entries<'a>(domain: &str, descriptor: &'a RateLimitDescriptor) -> Result<Vec<(&'a str, &'a str)>, Invalid> {
    if descriptor.entries.len() > MAX_ENTRIES {
        return Err(Invalid::TooManyEntries);
    }
    let entries: Vec<(&str, &str)> = descriptor.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
    if encoded_len(domain, &entries) > slidegate::MAX_KEY_LEN {
        return Err(Invalid::KeyTooLong);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    use super::*;
    use crate::envoy::descriptor_key;

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        let entries = entries.iter().map(|(k, v)| Entry { key: (*k).to_owned(), value: (*v).to_owned() }).collect();
        RateLimitDescriptor { entries, ..RateLimitDescriptor::default() }
    }

    #[test]
    fn sizes_are_checked_against_the_key_the_limiter_would_take() {
        let fits = "v".repeat(slidegate::MAX_KEY_LEN - descriptor_key("d", &[("k", "")]).len() - 2);
        let d = descriptor(&[("k", &fits)]);
        assert_eq!(entries("d", &d), Ok(vec![("k", fits.as_str())]));
        assert!(slidegate::validate_key(&descriptor_key("d", &[("k", &fits)])).is_ok());
        let over = format!("{fits}v");
        assert_eq!(entries("d", &descriptor(&[("k", &over)])), Err(Invalid::KeyTooLong));
        assert!(slidegate::validate_key(&descriptor_key("d", &[("k", &over)])).is_err());
        assert!(entries("d", &descriptor(&[("k", "v"); MAX_ENTRIES])).is_ok());
        assert_eq!(entries("d", &descriptor(&[("k", "v"); MAX_ENTRIES + 1])), Err(Invalid::TooManyEntries));
    }
}
