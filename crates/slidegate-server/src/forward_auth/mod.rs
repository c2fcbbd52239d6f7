//! Forward-auth: the decision point of a proxy's external-authorization hook. The proxy asks
//! before each request, describing it in headers (`X-Forwarded-Method`, `-Host`, `-Uri`,
//! `-For`; nginx set-ups `X-Original-URI`), and lets it through on a 2xx:
//!
//! - `/v1/forward-auth/{rule}` (Traefik `forwardAuth`, Caddy `forward_auth`, HAProxy): allowed,
//!   200; denied, 429 with `Retry-After` and `/v1/check`'s JSON decision, which these proxies
//!   hand to the client as they are; either with the RateLimit headers.
//! - `/v1/auth-request/{rule}` (nginx `auth_request`): the same, denied as a 403 without a body,
//!   since nginx turns any answer but a 2xx, 401 or 403 into a 500 (its documented
//!   configuration maps the 403 to a 429).
//!
//! Here: the routes and the answer. Beside it: `caller` (the request a question describes, and
//! a rule's key and matches applied to it).
//! The settings are configuration's: what a rule counts a request as and which requests it
//! applies to (`config/caller.rs`), whose word on the client's address is believed
//! (`[forward_auth]`, `config/proxies.rs`).

mod caller;

use std::net::SocketAddr;
use std::sync::Arc;

pub use crate::config::{
    Caller, CallerError, ClientHeader, ForwardAuthConfig, KeyPart, MAX_KEY_PARTS, MAX_METHOD_LEN, MAX_METHODS,
    MAX_PATH_PREFIX, MAX_TRUSTED_PROXIES,
};
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
pub use caller::Described;
use slidegate::{Decision, Quota};

use crate::api::{ApiError, Route, decide_one, decision_answer, route, rule_named};
use crate::app::App;

/// The route of Traefik, Caddy and HAProxy.
pub const FORWARD_AUTH: &str = "/v1/forward-auth/{rule}";

/// nginx's route.
pub const AUTH_REQUEST: &str = "/v1/auth-request/{rule}";

/// The header a request's cost comes in (1 without it), bounded as every cost is.
pub const COST_HEADER: HeaderName = HeaderName::from_static("x-ratelimit-cost");

/// The methods both routes answer: every method OpenAPI names, since a proxy may ask with the
/// method of the request it asks about (`HEAD` is answered as `GET`, without the body).
const METHODS: [Method; 7] =
    [Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS, Method::TRACE];

/// How a proxy reads the answer: which status denies.
#[derive(Debug, Clone, Copy)]
enum Dialect {
    /// Any answer but a 2xx goes to the client as it is: a denial is a 429.
    ForwardAuth,
    /// Only a 401 or 403 denies: a denial is a 403.
    AuthRequest,
}

impl Dialect {
    /// `decision` as this dialect's proxy reads it. A proxy that lets a request through reads
    /// the status and the headers of the answer only, and nginx's subrequest reads nothing more
    /// of a denial either: their answers have no body, and none is written. A proxy closes its
    /// connection to slidegate after an answer whose body it has not read (nginx's upstream
    /// `keepalive` would keep nothing, Caddy's pool neither), and every question would cost a
    /// connection — and a socket in TIME-WAIT. A denial for the other proxies keeps
    /// `/v1/check`'s JSON, which they hand to the client.
    fn answer(self, app: &App, rule: &str, quota: &Quota, decision: &Decision) -> Response {
        let (json, denied) = match self {
            Self::ForwardAuth => (!decision.allowed, StatusCode::TOO_MANY_REQUESTS),
            Self::AuthRequest => (false, StatusCode::FORBIDDEN),
        };
        let mut response = decision_answer(app, rule, quota, decision, json);
        if !decision.allowed {
            *response.status_mut() = denied;
        }
        response
    }
}

/// Both routes, for every method.
pub fn routes() -> Vec<Route> {
    let each =
        |m: &Method| [route(m.clone(), FORWARD_AUTH, answer::<false>), route(m.clone(), AUTH_REQUEST, answer::<true>)];
    METHODS.iter().flat_map(each).collect()
}

/// Decides the request that the question's headers describe under `rule`, answered for nginx
/// when `AUTH_REQUEST`, else for the other proxies. The question is taken whole, its headers
/// borrowed: axum's `HeaderMap` extractor would copy the whole map for every question.
async fn answer<const AUTH_REQUEST: bool>(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    rule: Result<Path<String>, PathRejection>,
    question: Request,
) -> Result<Response, ApiError> {
    let headers = question.headers();
    let dialect = if AUTH_REQUEST { Dialect::AuthRequest } else { Dialect::ForwardAuth };
    let Path(rule) = rule.map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))?;
    // One snapshot for the rule, the proxies and the counters, as for a check.
    let live = app.live();
    let rule = rule_named(&live, &rule)?;
    let client = live.forward_auth.client(peer.ip(), headers).map_err(|e| {
        let message = format!("{}: {e}", live.forward_auth.client_header.name());
        ApiError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "header_too_long", message)
    })?;
    let request = Described::read(question.method(), headers, client)?;
    if !rule.caller.applies(&request) {
        return Ok(StatusCode::OK.into_response());
    }
    let cost = match caller::header(headers, &COST_HEADER)? {
        None => 1,
        Some(text) => text.parse().map_err(|_| {
            ApiError::bad_request("invalid_cost", format!("{COST_HEADER} must be a whole number of permits"))
        })?,
    };
    let mut key = String::new();
    rule.caller.write_key(&request, &mut key)?;
    slidegate::validate_key(&key)?;
    let key = slidegate::rule_key(&rule.name, &key);
    let quota = app.overrides.quota(&key, rule.quota);
    let decision = decide_one(&app, &live, &rule.name, &key, &quota, cost).await?;
    Ok(dialect.answer(&app, &rule.name, &quota, &decision))
}
