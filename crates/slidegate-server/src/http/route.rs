//! The pieces the HTTP surfaces build their routes from: a route, an answer on its way, and
//! the admin routes' token check.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::handler::Handler;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::{MethodFilter, MethodRouter, on};

use crate::api_error::ApiError;
use crate::app::{App, Live};

/// An answer on its way.
pub type Answer = Pin<Box<dyn Future<Output = Response> + Send>>;

/// One route: its method, its path, and what answers it.
pub type Route = (Method, &'static str, MethodRouter<Arc<App>>);

/// The route `method path`, answered by `handler`.
pub(crate) fn route<H, T>(method: Method, path: &'static str, handler: H) -> Route
where
    H: Handler<T, Arc<App>>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).expect("a method axum routes by");
    (method, path, on(filter, handler))
}

/// Admits an admin request: 403 `admin_disabled` when no token is configured (an open admin
/// route would let any caller reset its own limit), 401 without the right bearer token.
pub(crate) fn authorize(live: &Live, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &live.admin_token else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin_disabled",
            "the admin routes are disabled: set admin_token in the rules file to use them",
        ));
    };
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if given.is_some_and(|g| token.matches(g)) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer` token is required",
        ))
    }
}
