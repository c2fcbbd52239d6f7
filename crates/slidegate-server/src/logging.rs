//! Log lines on stderr, as text for people or as one JSON object per line for log shippers, at
//! the level `--log-level` (or `RUST_LOG`) names.

use tracing_subscriber::filter::{Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event: time, level, message, then `field=value` pairs.
    #[default]
    Text,
    /// One JSON object per event: `timestamp`, `level`, `message`, `target` and the event's
    /// fields at the top level.
    Json,
}

/// The logging flags every command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct LogOptions {
    /// Log lines as `text` or `json` (one object per line, on stderr).
    #[arg(long, global = true, value_enum, default_value_t, env = "SLIDEGATE_LOG_FORMAT", help_heading = "Logging")]
    pub log_format: LogFormat,
    /// Which events to log: a level (`error`, `warn`, `info`, `debug`, `trace`) or filter
    /// directives such as `warn,slidegate_server=debug`; without it `RUST_LOG`, else `info`.
    #[arg(long, global = true, env = "SLIDEGATE_LOG_LEVEL", help_heading = "Logging")]
    pub log_level: Option<String>,
}

impl LogOptions {
    /// The filter: `--log-level`, else `RUST_LOG`, else `info`.
    fn filter(&self) -> Result<EnvFilter, String> {
        match &self.log_level {
            Some(directives) => EnvFilter::try_new(directives).map_err(|e| format!("--log-level {directives:?}: {e}")),
            None => Ok(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))),
        }
    }

    /// Installs the process's subscriber, with the spans of [`crate::trace`] sent to `tracer`
    /// when there is one; an unusable `--log-level` is an error.
    pub fn init(&self, tracer: Option<opentelemetry_sdk::trace::SdkTracer>) -> Result<(), String> {
        match tracer {
            None => self.init_logs(),
            Some(tracer) => self.init_with_traces(tracer),
        }
    }

    /// Log lines alone: the decision spans' level is then off, and their macros cost a
    /// comparison.
    fn init_logs(&self) -> Result<(), String> {
        let builder = tracing_subscriber::fmt().with_env_filter(self.filter()?).with_writer(std::io::stderr);
        let installed = match self.log_format {
            LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).try_init(),
            // Flattened: the message and the event's fields beside `level`, as log shippers
            // index them; no colour codes inside JSON strings.
            LogFormat::Json => builder.json().flatten_event(true).with_ansi(false).try_init(),
        };
        installed.map_err(|e| format!("cannot install the logger: {e}"))
    }

    /// Log lines as [`Self::init_logs`] writes them, beside the exporter's layer: each takes
    /// its own events, so the log level neither hides decision spans nor logs them.
    fn init_with_traces(&self, tracer: opentelemetry_sdk::trace::SdkTracer) -> Result<(), String> {
        let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let fmt = match self.log_format {
            LogFormat::Text => fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).boxed(),
            LogFormat::Json => fmt.json().flatten_event(true).with_ansi(false).boxed(),
        };
        let not_traces = filter_fn(|meta| meta.target() != crate::trace::TARGET);
        let traces = Targets::new().with_target(crate::trace::TARGET, tracing::Level::TRACE);
        tracing_subscriber::registry()
            .with(fmt.with_filter(self.filter()?).with_filter(not_traces))
            .with(tracing_opentelemetry::layer().with_tracer(tracer).with_filter(traces))
            .try_init()
            .map_err(|e| format!("cannot install the logger: {e}"))
    }
}
