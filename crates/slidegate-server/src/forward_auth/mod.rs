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

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

pub use crate::config::{
    Caller, CallerError, ClientHeader, ForwardAuthConfig, KeyPart, MAX_KEY_PARTS, MAX_METHOD_LEN, MAX_METHODS,
    MAX_PATH_PREFIX, MAX_TRUSTED_PROXIES,
};
use ::metrics::Histogram;
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
pub use caller::Described;
use hyper::body::Incoming;
use slidegate::{Decision, Quota, RuleKey};
use tracing::Instrument;

use crate::api_error::ApiError;
use crate::app::{App, decide_one, rule_named};
use crate::http::decision::decision_answer;
use crate::http::{Route, route};

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
pub(crate) enum Dialect {
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

/// The router's handler of both routes: a question the listener does not hand to [`Direct`]
/// (a `HEAD`, a rule's name percent-encoded). The question is taken whole, its headers
/// borrowed: axum's `HeaderMap` extractor would copy the whole map for every question.
async fn answer<const AUTH_REQUEST: bool>(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    rule: Result<Path<String>, PathRejection>,
    question: Request,
) -> Result<Response, ApiError> {
    let dialect = if AUTH_REQUEST { Dialect::AuthRequest } else { Dialect::ForwardAuth };
    let Path(rule) = rule.map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))?;
    decide(&app, dialect, peer.ip(), &rule, question.method(), question.headers()).await
}

/// Both routes outside axum's router, as `POST /v1/check` is (`crate::routes::Routes`): the router
/// would cost a question about a quarter of its work (the route lookup and its boxed clone, the
/// path's parameters decoded into the request's extension map), spent to find one of two paths.
pub(crate) struct Direct {
    app: Arc<App>,
    /// The latency histograms the router's routes have, forward-auth's then auth-request's.
    histograms: [Histogram; 2],
}

impl Direct {
    /// Both routes over `app`.
    pub(crate) fn new(app: Arc<App>) -> Self {
        let histogram = |route: &'static str| ::metrics::histogram!(crate::metrics::HTTP_SECONDS, "route" => route);
        Self { app, histograms: [histogram(FORWARD_AUTH), histogram(AUTH_REQUEST)] }
    }

    /// The dialect and the rule's name of a question `Direct` answers as the router would: one
    /// of [`METHODS`] (a `HEAD` is the router's, which answers it as a `GET` without the body),
    /// to a path of either route whose rule needs no decoding (a `%`, or a `/` that no route
    /// matches, are the router's too).
    pub(crate) fn takes<'p>(method: &Method, path: &'p str) -> Option<(Dialect, &'p str)> {
        let (dialect, rule) = if let Some(rule) = path.strip_prefix("/v1/forward-auth/") {
            (Dialect::ForwardAuth, rule)
        } else {
            (Dialect::AuthRequest, path.strip_prefix("/v1/auth-request/")?)
        };
        let plain = !rule.is_empty() && !rule.contains(['%', '/']);
        (plain && METHODS.contains(method)).then_some((dialect, rule))
    }

    /// Answers `question`, which [`Direct::takes`] as `dialect`'s, from `peer`.
    pub(crate) async fn answer(
        self: Arc<Self>,
        dialect: Dialect,
        peer: SocketAddr,
        question: hyper::Request<Incoming>,
    ) -> Response {
        let started = self.app.now();
        let rule = question.uri().path().rsplit_once('/').map_or("", |(_, rule)| rule);
        let answer = decide(&self.app, dialect, peer.ip(), rule, question.method(), question.headers()).await;
        let answer = answer.unwrap_or_else(IntoResponse::into_response);
        let histogram = &self.histograms[usize::from(matches!(dialect, Dialect::AuthRequest))];
        histogram.record(self.app.now().duration_since(started).as_secs_f64());
        answer
    }
}

/// Decides the request that the question's `headers` describe under `rule`, asked with
/// `method` by `peer`, and answers it in `dialect`.
async fn decide(
    app: &App,
    dialect: Dialect,
    peer: IpAddr,
    rule: &str,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    // One snapshot for the rule, the proxies and the counters, as for a check.
    let live = app.live();
    let rule = rule_named(&live, rule)?;
    let client = live.forward_auth.client(peer, headers).map_err(|e| {
        let message = format!("{}: {e}", live.forward_auth.client_header.name());
        ApiError::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "header_too_long", message)
    })?;
    let request = Described::read(method, headers, client)?;
    if !rule.caller.applies(&request) {
        return Ok(StatusCode::OK.into_response());
    }
    let cost = match caller::header(headers, &COST_HEADER)? {
        None => 1,
        Some(text) => text.parse().map_err(|_| {
            ApiError::bad_request("invalid_cost", format!("{COST_HEADER} must be a whole number of permits"))
        })?,
    };
    // Written in place after the rule's part: one allocation for the backend key, sized for the
    // longest address text (45 bytes, an IPv4-mapped IPv6 address).
    let mut key = RuleKey::new(&rule.name, 45);
    let start = key.key_mut().len();
    rule.caller.write_key(&request, key.key_mut())?;
    slidegate::validate_key(&key.key_mut()[start..])?;
    let key = key.finish();
    let quota = app.overrides.quota(&key, rule.quota);
    // A decision's span, continued from the trace the proxy's headers carry, as a check's is.
    let span = crate::trace::decision(headers);
    let decision = decide_one(app, &live, &rule.name, &key, &quota, cost).instrument(span).await?;
    Ok(dialect.answer(app, &rule.name, &quota, &decision))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_takes_the_plain_questions_of_both_routes_and_leaves_the_rest_to_the_router() {
        let rule = |route: &str| route.replace("{rule}", "api");
        let dialect =
            |method: &Method, path: &str| Direct::takes(method, path).map(|(d, r)| (format!("{d:?}"), r.to_owned()));
        let path = rule(FORWARD_AUTH);
        assert_eq!(dialect(&Method::GET, &path), Some(("ForwardAuth".into(), "api".into())));
        let path = rule(AUTH_REQUEST);
        assert_eq!(dialect(&Method::DELETE, &path), Some(("AuthRequest".into(), "api".into())));
        assert_eq!(dialect(&Method::HEAD, &path), None, "answered as a GET by the router");
        let router = ["/v1/auth-request/", "/v1/auth-request/%61pi", "/v1/auth-request/api/", "/v1/check"];
        for path in router {
            assert_eq!(dialect(&Method::GET, path), None, "{path}");
        }
    }
}
