//! The caller's trace context from request headers (HTTP headers, gRPC metadata): W3C
//! `traceparent`/`tracestate`, else B3 as envoyproxy/ratelimit reads it, the single `b3`
//! header or the `X-B3-*` ones.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The context `headers` continue; an empty one when they name no valid trace.
pub(super) fn extract(headers: &http::HeaderMap) -> Context {
    let w3c = TraceContextPropagator::new().extract(&Headers(headers));
    if w3c.span().span_context().is_valid() {
        return w3c;
    }
    match b3_single(headers).or_else(|| b3_multi(headers)) {
        Some(remote) => Context::new().with_remote_span_context(remote),
        None => Context::new(),
    }
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

fn header<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// `b3: {trace id}-{span id}[-{sampling}[-{parent span id}]]`.
fn b3_single(headers: &http::HeaderMap) -> Option<SpanContext> {
    let mut parts = header(headers, "b3")?.split('-');
    let (trace, span) = (parts.next()?, parts.next()?);
    remote(trace, span, parts.next())
}

/// `X-B3-TraceId`, `X-B3-SpanId`, `X-B3-Sampled` (`1`/`true`), `X-B3-Flags: 1` (debug).
fn b3_multi(headers: &http::HeaderMap) -> Option<SpanContext> {
    let (trace, span) = (header(headers, "x-b3-traceid")?, header(headers, "x-b3-spanid")?);
    let sampling = match (header(headers, "x-b3-flags"), header(headers, "x-b3-sampled")) {
        (Some("1"), _) => Some("d"),
        (_, Some("true")) => Some("1"),
        (_, Some("false")) => Some("0"),
        (_, sampled) => sampled,
    };
    remote(trace, span, sampling)
}

/// A remote span from B3's hex ids (a 64-bit trace id is the low half of a 128-bit one) and
/// sampling state: `1` or `d` (debug) sampled, `0` not; absent ("deferred": the receiver
/// decides) is taken as sampled, so that the trace continues under this side's ratio's parent.
fn remote(trace: &str, span: &str, sampling: Option<&str>) -> Option<SpanContext> {
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !(hex(trace, 32) || hex(trace, 16)) || !hex(span, 16) {
        return None;
    }
    let (trace, span) = (TraceId::from_hex(trace).ok()?, SpanId::from_hex(span).ok()?);
    let flags = match sampling {
        None | Some("1" | "d") => TraceFlags::SAMPLED,
        Some("0") => TraceFlags::default(),
        Some(_) => return None,
    };
    let context = SpanContext::new(trace, span, flags, true, TraceState::default());
    context.is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        pairs.iter().map(|(k, v)| (http::HeaderName::from_static(k), http::HeaderValue::from_static(v))).collect()
    }

    fn continued(pairs: &[(&'static str, &'static str)]) -> Option<(String, String, bool)> {
        let cx = extract(&headers(pairs));
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| (sc.trace_id().to_string(), sc.span_id().to_string(), sc.is_sampled()))
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn traceparent_wins_over_b3() {
        let got = continued(&[
            ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1"),
        ]);
        assert_eq!(got, Some((TRACE.into(), SPAN.into(), true)));
    }

    #[test]
    fn b3_single_and_multi_are_read_with_their_sampling() {
        let single = continued(&[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0")]);
        assert_eq!(single, Some((TRACE.into(), SPAN.into(), false)));
        let multi = continued(&[
            ("x-b3-traceid", "a3ce929d0e0e4736"),
            ("x-b3-spanid", "00f067aa0ba902b7"),
            ("x-b3-sampled", "1"),
        ]);
        assert_eq!(multi, Some(("0000000000000000a3ce929d0e0e4736".into(), SPAN.into(), true)));
        let debug = continued(&[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN), ("x-b3-flags", "1")]);
        assert_eq!(debug.map(|t| t.2), Some(true));
    }

    #[test]
    fn malformed_headers_start_no_trace() {
        for bad in [
            &[("traceparent", "00-zz-00f067aa0ba902b7-01")][..],
            &[("b3", "0")],
            &[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-x")],
            &[("b3", "00000000000000000000000000000000-00f067aa0ba902b7")],
            &[("x-b3-traceid", "4bf92f")],
        ] {
            assert_eq!(continued(bad), None, "{bad:?}");
        }
    }
}
