//! The layer's metric names, through the `metrics` facade, in the slidegate service's scheme
//! (the same families where they count the same thing): counters end in `_total`, durations are
//! seconds ending in `_seconds`.

/// Decisions by `rule` and `result`: `allowed`, `denied`, or `shadow_denied` (over the limit in
/// shadow mode, let through).
pub const DECISIONS: &str = "slidegate_decisions_total";
/// Decisions the limiter's failure policy made because the backend could not, by `rule` and
/// `policy`.
pub const DEGRADED: &str = "slidegate_degraded_decisions_total";
/// Backend failures no failure policy answered (the request went through), by `kind`:
/// `timeout` or `error`.
pub const BACKEND_ERRORS: &str = "slidegate_backend_errors_total";
/// Requests answered with a [`crate::Rejection`] (a key or cost that cannot be counted), by
/// `rule` and `code`.
pub const REJECTIONS: &str = "slidegate_rejected_requests_total";
/// Time of each request's decision (the limiter's round trip), a histogram.
pub const DECISION_SECONDS: &str = "slidegate_decision_seconds";
