//! OpenTelemetry traces (`--otlp-endpoint`): one span per decision, continued from the caller's
//! W3C `traceparent` or B3 headers, with the backend call a child span.
//!
//! Off by default, and then free: the spans are at TRACE level under their own [`TARGET`], which
//! no subscriber but the exporter's layer enables, so with no endpoint each span macro is one
//! comparison against the process's maximum level and nothing is recorded.

pub mod export;
mod propagate;

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The spans' target: the exporter's layer takes exactly these.
pub const TARGET: &str = "slidegate::trace";

/// Whether spans are exported: set once, when the exporter is installed.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether decisions are traced (a relaxed load: callers skip building attributes when not).
pub(crate) fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The span of one decision, a child of the trace `headers` carry (none: a new trace); a
/// disabled span when nothing is exported, and then the headers are not read.
pub(crate) fn decision(headers: &http::HeaderMap) -> Span {
    let span = tracing::trace_span!(
        target: TARGET,
        "slidegate.decision",
        otel.kind = "server",
        rule = Empty,
        domain = Empty,
        algorithm = Empty,
        engine = Empty,
        outcome = Empty,
        degraded = Empty,
    );
    if !span.is_disabled() {
        // A context without a span (no usable headers) leaves the span a root.
        let _ = span.set_parent(propagate::extract(headers));
    }
    span
}

/// The span of one call to the backend, inside the current decision's.
pub(crate) fn backend(engine: &'static str) -> Span {
    tracing::trace_span!(target: TARGET, "slidegate.backend", otel.kind = "client", engine)
}

/// What a decision's span carries once decided.
pub(crate) struct Decided<'a> {
    /// `rule` (HTTP) or `domain` (Envoy), and its value.
    pub subject: (&'static str, &'a str),
    /// The algorithms that decided, comma-separated when several did.
    pub algorithm: &'a str,
    pub engine: &'static str,
    pub allowed: bool,
    pub degraded: bool,
}

/// Writes `d` on the current decision span.
pub(crate) fn record(d: &Decided<'_>) {
    let span = Span::current();
    span.record(d.subject.0, d.subject.1);
    span.record("algorithm", d.algorithm);
    span.record("engine", d.engine);
    span.record("outcome", if d.allowed { "allowed" } else { "denied" });
    span.record("degraded", d.degraded);
}
