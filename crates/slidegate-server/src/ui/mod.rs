//! The dashboard: `GET /ui`, one page whose script and style are compiled into the binary
//! (nothing fetched from elsewhere, no build step), and `GET /v1/stats`, the live traffic it
//! draws. `/` redirects to `/ui`.
//!
//! The page reads `/v1/rules` and `/v1/stats` every 2 s, and `/v1/keys/{rule}/{key}` for its key
//! inspector; each is a public JSON route (docs/service.md). `[ui] enabled = false` answers
//! `/ui` and `/v1/stats` 403 `ui_disabled` and records no traffic; `[ui] require_token = true`
//! puts `/v1/stats` behind the admin token, since the keys denied most are often personal data
//! (IP addresses, phone numbers).

mod report;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use crate::api_error::ApiError;
use crate::app::{App, Live};
use crate::http::{Route, authorize, route};

pub use report::MAX_LISTED;

pub use crate::config::UiConfig;

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("app.css");

/// The page runs only its own script and style and talks only to this service.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard's routes.
pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/", || async { Redirect::to("/ui") }),
        route(Method::GET, "/ui", |app| asset(app, PAGE, "text/html; charset=utf-8")),
        route(Method::GET, "/ui/app.js", |app| asset(app, SCRIPT, "text/javascript; charset=utf-8")),
        route(Method::GET, "/ui/app.css", |app| asset(app, STYLE, "text/css; charset=utf-8")),
        route(Method::GET, "/v1/stats", stats),
    ]
}

/// Refuses everything of the dashboard when `[ui] enabled = false`.
fn enabled(live: &Live) -> Result<(), ApiError> {
    if live.ui.enabled {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::FORBIDDEN, "ui_disabled", "the dashboard is disabled ([ui] enabled = false)"))
    }
}

async fn asset(State(app): State<Arc<App>>, body: &'static str, content_type: &'static str) -> Response {
    if let Err(e) = enabled(&app.live()) {
        return e.into_response();
    }
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn stats(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let live = app.live();
    enabled(&live)?;
    if live.ui.require_token {
        authorize(&live, &headers)?;
    }
    let body = report::build(&app, &live).await;
    Ok(([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response())
}
