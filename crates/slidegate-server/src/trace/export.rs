//! `slidegate serve`'s tracing settings, and the OTLP exporter they install.

use std::sync::atomic::Ordering;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider};

/// The most finished spans waiting for export; past it a span is dropped, not waited for, so
/// that a slow or unreachable collector never holds a decision (a span is ~1 KiB queued).
pub const MAX_QUEUED_SPANS: usize = 4096;
/// The most spans in one export request.
const MAX_EXPORT_BATCH: usize = 512;
/// How long one export may take, connecting included, before it is given up.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the queue waits to fill a batch before exporting what it has.
const EXPORT_DELAY: Duration = Duration::from_secs(1);
/// The longest the stop waits for the queued spans' last export.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OtlpProtocol {
    /// OTLP over gRPC (`http://collector:4317`).
    Grpc,
    /// OTLP over HTTP, protobuf bodies (`http://collector:4318/v1/traces`).
    Http,
}

/// The tracing settings of `slidegate serve`: the rules file's `[server] otlp_*` fields, or
/// its `--otlp-*` flags over them, read once at start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OtlpOptions {
    /// Export a span per decision over OTLP to this collector: `http://host:4317` (gRPC) or
    /// `http://host:4318/v1/traces` (HTTP/protobuf). Without it nothing is traced
    /// (`[server] otlp_endpoint`).
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http` (HTTP/protobuf); default `http` when the endpoint's path ends in
    /// `/v1/traces`, `grpc` otherwise (`[server] otlp_protocol`).
    pub otlp_protocol: Option<OtlpProtocol>,
    /// The share of new traces exported, 0.0 to 1.0 (default 1.0); a request continuing a
    /// trace follows its parent's sampling decision instead (`[server] otlp_sampling_ratio`).
    pub otlp_sampling_ratio: Option<f64>,
}

/// A tracing setting that cannot be used: its name (a `[server]` field; the flag is the same
/// with dashes) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSetting {
    /// `otlp_endpoint`, `otlp_protocol` or `otlp_sampling_ratio`.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for BadSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "--{}: {}", self.field.replace('_', "-"), self.message)
    }
}

/// The exporter, once installed: its tracer feeds the subscriber's layer.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl OtlpOptions {
    /// The settings checked: the endpoint's URL and protocol, when one is given.
    pub fn checked(&self) -> Result<Option<(&str, OtlpProtocol)>, BadSetting> {
        let bad = |field, message: String| BadSetting { field, message };
        let ratio = self.sampling_ratio();
        if !(0.0..=1.0).contains(&ratio) {
            return Err(bad("otlp_sampling_ratio", format!("must be between 0.0 and 1.0, got {ratio}")));
        }
        let Some(url) = self.otlp_endpoint.as_deref() else {
            return match self.otlp_protocol {
                Some(_) => Err(bad("otlp_protocol", "give the OTLP endpoint (otlp_endpoint) too".to_owned())),
                None => Ok(None),
            };
        };
        let uri: http::Uri = url.parse().map_err(|e| bad("otlp_endpoint", format!("{url:?}: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(bad(
                "otlp_endpoint",
                format!(
                    "{url:?}: give http://host:port (the collector is reached without TLS: run it, or an \
                     agent, beside slidegate)"
                ),
            ));
        }
        let by_path = if uri.path().ends_with("/v1/traces") { OtlpProtocol::Http } else { OtlpProtocol::Grpc };
        Ok(Some((url, self.otlp_protocol.unwrap_or(by_path))))
    }

    /// The share of new traces exported.
    fn sampling_ratio(&self) -> f64 {
        self.otlp_sampling_ratio.unwrap_or(1.0)
    }

    /// Starts the exporter the flags ask for, on the current Tokio runtime; `None` without an
    /// endpoint. An unusable flag is an error.
    pub fn install(&self) -> Result<Option<Exporter>, String> {
        let Some((url, protocol)) = self.checked().map_err(|e| e.to_string())? else { return Ok(None) };
        let builder = opentelemetry_otlp::SpanExporter::builder();
        let exporter = match protocol {
            OtlpProtocol::Grpc => builder.with_tonic().with_endpoint(url).with_timeout(EXPORT_TIMEOUT).build(),
            OtlpProtocol::Http => builder
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(url)
                .with_timeout(EXPORT_TIMEOUT)
                .build(),
        }
        .map_err(|e| format!("--otlp-endpoint {url:?}: {e}"))?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(MAX_QUEUED_SPANS)
            .with_max_export_batch_size(MAX_EXPORT_BATCH)
            .with_scheduled_delay(EXPORT_DELAY)
            .build();
        let processor = BatchSpanProcessor::builder(exporter, Tokio).with_batch_config(batches).build();
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(self.sampling_ratio())));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .with_resource(Resource::builder().with_service_name("slidegate").build())
            .build();
        super::EXPORTING.store(true, Ordering::Relaxed);
        Ok(Some(Exporter { provider }))
    }
}

impl Exporter {
    /// The tracer the subscriber's layer writes spans to.
    pub fn tracer(&self) -> SdkTracer {
        self.provider.tracer("slidegate")
    }

    /// Exports the spans still queued, waiting at most [`FLUSH_TIMEOUT`].
    pub async fn shutdown(self) {
        // The SDK's shutdown blocks its thread until the runtime's export task answers.
        let flushed = tokio::task::spawn_blocking(move || self.provider.shutdown_with_timeout(FLUSH_TIMEOUT));
        let failed = match tokio::time::timeout(FLUSH_TIMEOUT, flushed).await {
            Ok(Ok(Ok(()))) => return,
            Ok(Ok(Err(e))) => e.to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("not done within {FLUSH_TIMEOUT:?}"),
        };
        tracing::warn!(error = %failed, "the last spans were not exported");
    }
}
