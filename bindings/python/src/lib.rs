//! The `slidegate._slidegate` extension: slidegate's [`Limiter`](slidegate::Limiter) for Python.
//!
//! Every decision is the core crate's; this layer only converts arguments and answers. The
//! Python package (`python/slidegate`) re-exports these classes beside its exceptions and web
//! framework integrations.
//!
//! # Layout
//!
//! - `limiter.rs`: `Limiter`, its constructors and `check`/`acheck`/`check_all`/`inspect`/`reset`.
//! - `engine.rs`: the backend a limiter runs on, one enum over the core's limiters, and the
//!   tokio runtime that serves them.
//! - `args.rs`: a check's Python arguments read into a key, a [`Quota`](slidegate::Quota) and a cost.
//! - `answer.rs`: `Decision`, `MultiDecision`, `Charged`, `Refunded` and `KeyState`, and the
//!   RateLimit headers of a decision.
//! - `error.rs`: the core's errors raised as the package's exceptions.

use pyo3::prelude::*;

mod answer;
mod args;
mod engine;
mod error;
mod limiter;

/// The module Python imports as `slidegate._slidegate`.
#[pymodule]
fn _slidegate(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<limiter::Limiter>()?;
    m.add_class::<answer::Decision>()?;
    m.add_class::<answer::MultiDecision>()?;
    m.add_class::<answer::KeyState>()?;
    m.add_class::<answer::Charged>()?;
    m.add_class::<answer::Refunded>()?;
    m.add("MAX_KEY_LEN", slidegate::MAX_KEY_LEN)?;
    m.add("MAX_CHECKS", slidegate::MAX_CHECKS)?;
    m.add("MAX_LIMIT", slidegate::MAX_LIMIT)?;
    m.add("MAX_LOG_LIMIT", slidegate::MAX_LOG_LIMIT)?;
    m.add("MAX_RULE_LEN", args::MAX_RULE_LEN)?;
    Ok(())
}
