//! Per-key overrides: one key's own limit over its rule's (or tier's, or Envoy descriptor's),
//! for a while or until deleted. The key keeps its state — an override changes the limit, not
//! the count. Set through the admin routes; shared by every instance on Redis
//! ([`crate::shared_rules`]), the instance's own on the memory backend; held in each instance's
//! memory, so that a decision never asks Redis for them.
//!
//! - `record`: an override ([`Limits`] over the quota under it) and its JSON [`Record`].
//! - `table`: the overrides in force, looked up by every decision.
//! - `target`: the key an admin route's `{rule}/{key}` names.
//! - `body`: a `PUT`'s body.
//!
//! Setting, deleting and lapsing them is `crate::override_changes`; their HTTP routes are the
//! API's (`api/override_routes.rs`).

mod body;
mod record;
mod table;
mod target;

pub use body::{MAX_TTL, MIN_TTL, OverrideBody};
pub use record::{Counting, Limits, Override, Record};
pub use table::{DEFAULT_MAX_OVERRIDES, Full, MAX_OVERRIDES_CAP, Overrides, now_ms};
pub use target::{ENVOY_PREFIX, Source, Target, TargetError};
