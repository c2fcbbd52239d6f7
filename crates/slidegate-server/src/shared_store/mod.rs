//! The rules and per-key overrides shared through Redis, as an instance holds them: the store
//! (its keys, the scripts that change them atomically, the subscription), what a pushed rules
//! document may hold, and an instance's link to them (the version applied, reachable or not).
//! What follows their changes and applies them is `crate::shared_rules`.
//!
//! - `store`: the keys, the scripts, the subscription.
//! - `document`: what a pushed rules file may hold (`[[rules]]` and `[inline]`).
//! - `shared`: an instance's link to the store: the version applied, reachable or not.

mod document;
mod shared;
mod store;

pub use document::{MAX_DOCUMENT_BYTES, PushError, check_local, local_only, parse_stored, validate_push};
pub use shared::{APPLY_WAIT, Shared};
pub use store::{SCAN_COUNT, STORE_TIMEOUT, SetOutcome, Snapshot, Store, StoreError, StoredRules, field};
