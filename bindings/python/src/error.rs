//! The core's errors as the package's exceptions, which `slidegate/_errors.py` defines so that
//! `InvalidArgument` can be both a `slidegate.Error` and a `ValueError`.

use pyo3::prelude::*;
use pyo3::types::PyType;
use slidegate::{Error, ErrorClass};

/// Raises `class` (a name in `slidegate._errors`) with `message`.
pub(crate) fn raise(class: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let exception = || -> PyResult<Bound<'_, PyType>> {
            Ok(py.import("slidegate._errors")?.getattr(class)?.cast_into::<PyType>()?)
        };
        exception().map_or_else(|e| e, |t| PyErr::from_type(t, message))
    })
}

/// A caller's argument the limiter refuses: `slidegate.InvalidArgument`, a `ValueError`.
pub(crate) fn invalid(message: String) -> PyErr {
    raise("InvalidArgument", message)
}

/// The core's error as the exception of its class: the caller's input
/// (`InvalidArgument`), the backend failing for now (`BackendUnavailable`), or the backend
/// answering with an error (`BackendError`).
pub(crate) fn to_py(e: &Error) -> PyErr {
    let class = match e.class() {
        ErrorClass::Caller => "InvalidArgument",
        ErrorClass::BackendFailure => "BackendUnavailable",
        _ => "BackendError",
    };
    raise(class, e.to_string())
}
