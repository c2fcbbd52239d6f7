//! Rules and per-key overrides shared through Redis: `slidegate rules push` stores a rules
//! document, the admin routes store overrides, and every instance on that Redis applies each
//! change within a second — announced on a channel, checked by version as a safety net — into
//! its own memory, so that a decision never asks Redis for them.
//!
//! The store, the document's format and an instance's link to them are `crate::shared_store`.
//!
//! - `sync`: the task that follows the changes; `apply`: what applying one does.
//! - `fleet`: the heartbeat that counts the live instances for `local_share = "auto"`.
//! - `diff`: a push's changes, for the audit trail; `cli`: `slidegate rules push | show`.

mod apply;
pub mod cli;
mod diff;
mod fleet;
mod sync;

use std::time::{Duration, UNIX_EPOCH};

pub use fleet::beat_forever;
pub use sync::{CHECK_INTERVAL, start};

/// Unix ms as an RFC 3339 time, for logs and `rules show`.
pub(crate) fn format_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}
