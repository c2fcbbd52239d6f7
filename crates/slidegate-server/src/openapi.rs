//! The HTTP API's OpenAPI 3.1 document, served at `/openapi.json`. It is written beside the
//! handlers, not generated from them: `tests/openapi.rs` holds every endpoint's real answers,
//! successes and errors, to it, so it cannot drift from what the server does.

/// The document (JSON).
pub const DOCUMENT: &str = include_str!("openapi.json");
