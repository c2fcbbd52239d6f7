//! What instances share through Redis, bounded: a rules document's size, the overrides each
//! instance holds; and when a configuration leaves its rules to Redis.

use super::Rules;
use crate::inline::InlineConfig;

/// The largest rules document pushed or read back: every instance parses it on every push.
/// A thousand rules with tiers fit in a tenth of it.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// Overrides an instance holds unless `max_overrides` says otherwise: each costs a few hundred
/// bytes in every instance (BENCHMARKS.md), and on Redis every instance loads them all when it
/// starts or comes back.
pub const DEFAULT_MAX_OVERRIDES: usize = 100_000;

/// The largest `max_overrides` accepted.
pub const MAX_OVERRIDES_CAP: usize = 1_000_000;

/// Whether a configuration leaves the rules to Redis: no rules, and `[inline]` as by default.
pub fn local_only(rules: &Rules, inline: &InlineConfig) -> bool {
    rules.is_empty() && *inline == InlineConfig::default()
}
