//! What a run measured, as a table or one JSON object.

use std::time::Duration;

use serde::Serialize;

use super::BenchOptions;
use super::worker::Tally;

/// The outcome, as the table and `--json` show it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The target.
    pub target: String,
    /// With a library target, the code that decided at the end: `memory`, `lua` or `module`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<&'static str>,
    /// Distinct keys.
    pub keys: u64,
    /// Decisions in flight (at most, with a `rate`).
    pub concurrency: usize,
    /// The scheduled decisions per second, when open loop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<u64>,
    /// Open loop: decisions held back by the target, timed from when they were due.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late: Option<u64>,
    /// Seconds measured.
    pub duration_s: f64,
    /// Decisions answered per second (admitted or denied).
    pub decisions_per_sec: f64,
    /// Latency percentiles of answered decisions, µs.
    pub p50_us: u64,
    /// 90th percentile, µs.
    pub p90_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Slowest, µs.
    pub max_us: u64,
    /// Admitted decisions.
    pub allowed: u64,
    /// Denied decisions.
    pub denied: u64,
    /// Failed calls (transport, backend, HTTP or gRPC errors).
    pub errors: u64,
}

impl Report {
    /// What `tally` counted in `elapsed`, for a run of `options` that `engine` decided.
    pub(super) fn new(options: &BenchOptions, engine: Option<&'static str>, tally: &Tally, elapsed: Duration) -> Self {
        let elapsed = elapsed.as_secs_f64();
        let answered = tally.latencies.count();
        Self {
            // The report is printed and shared: a Redis target's password stays out of it.
            target: crate::redact::redact(&options.target).into_owned(),
            engine,
            keys: options.keys,
            concurrency: options.concurrency,
            rate: options.rate,
            late: options.rate.map(|_| tally.late),
            duration_s: elapsed,
            decisions_per_sec: answered as f64 / elapsed,
            p50_us: tally.latencies.percentile(50.0),
            p90_us: tally.latencies.percentile(90.0),
            p99_us: tally.latencies.percentile(99.0),
            max_us: tally.latencies.max(),
            allowed: tally.allowed,
            denied: answered - tally.allowed,
            errors: tally.errors,
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "target        {}", self.target)?;
        if let Some(engine) = self.engine {
            writeln!(f, "engine        {engine}")?;
        }
        writeln!(f, "keys          {}", self.keys)?;
        writeln!(f, "concurrency   {}", self.concurrency)?;
        if let (Some(rate), Some(late)) = (self.rate, self.late) {
            writeln!(f, "rate          {rate}/s scheduled; {late} held back by the target")?;
        }
        writeln!(f, "duration      {:.2} s", self.duration_s)?;
        writeln!(f, "decisions/s   {:.0}", self.decisions_per_sec)?;
        writeln!(
            f,
            "latency µs    p50 {}  p90 {}  p99 {}  max {}",
            self.p50_us, self.p90_us, self.p99_us, self.max_us
        )?;
        writeln!(f, "admitted      {}", self.allowed)?;
        writeln!(f, "denied        {}", self.denied)?;
        write!(f, "errors        {}", self.errors)
    }
}
