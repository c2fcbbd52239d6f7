//! Every HTTP route the service serves, assembled from the surfaces (the API's, the
//! forward-auth endpoints', the dashboard's), and the dispatch the listener calls: the routes
//! decisions take straight to their handlers, everything else through axum's router.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::metrics::Histogram;
use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request};
use axum::http::{Method, StatusCode};
use hyper::body::Incoming;
use tracing::Instrument;

use crate::api::{self, CHECK, CheckRoute};
use crate::api_error::{ApiError, MAX_BODY};
use crate::app::App;
use crate::forward_auth::{self, Direct};
use crate::http::{Answer, Dispatch, Route};
use crate::{metrics, ui};

/// The service's routes over `app`, as the listener calls them: `POST /v1/check` and the
/// forward-auth questions (`forward_auth::Direct`), the routes decisions take, straight to
/// their handlers; everything else through [`router`]. Axum's router costs a decision about a
/// fifth of the service's work (the route lookup, a boxed clone of the route and a boxed future
/// per layer, the request's extension map), spent to find the one route whose path and method
/// are two comparisons.
#[derive(Clone)]
pub struct Routes {
    router: Router,
    check: Arc<CheckRoute>,
    forward_auth: Arc<Direct>,
}

impl Routes {
    /// The routes over `app`.
    pub fn new(app: Arc<App>) -> Self {
        let forward_auth = Arc::new(Direct::new(Arc::clone(&app)));
        Self { router: router(Arc::clone(&app)), check: Arc::new(CheckRoute::new(app)), forward_auth }
    }
}

impl Dispatch for Routes {
    fn call(&self, mut request: hyper::Request<Incoming>, peer: SocketAddr) -> Answer {
        // The id an error answer and its log line share (`crate::request_id`).
        let given = request.headers().get(crate::request_id::HEADER).cloned();
        if request.method() == Method::POST && request.uri().path() == CHECK {
            let span = crate::trace::decision(request.headers());
            let answer = Arc::clone(&self.check).answer(request.into_body());
            return Box::pin(crate::request_id::scope(given, answer).instrument(span));
        }
        if let Some((dialect, _)) = Direct::takes(request.method(), request.uri().path()) {
            let answer = Arc::clone(&self.forward_auth).answer(dialect, peer, request);
            return Box::pin(crate::request_id::scope(given, answer));
        }
        // The admin routes' audit trail names the client; decisions have no use for it.
        request.extensions_mut().insert(ConnectInfo(peer));
        // A router is always ready (axum's `Router::poll_ready` returns `Ready` at once).
        let answer = tower_service::Service::call(&mut self.router.clone(), request);
        Box::pin(crate::request_id::scope(given, async move {
            match answer.await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }))
    }
}

/// Every route the service serves: the API's and the forward-auth endpoints', each with its
/// latency histogram, then the dashboard's. [`router`] serves these and no other, and
/// `tests/openapi.rs` holds this list to the OpenAPI document both ways.
pub fn all() -> Vec<Route> {
    // Each route's latency histogram is registered here, once, not looked up per request.
    let timed = api::routes().into_iter().chain(forward_auth::routes()).map(|(method, path, handler)| {
        let histogram = ::metrics::histogram!(metrics::HTTP_SECONDS, "route" => path);
        (method, path, handler.layer(TimedLayer(histogram)))
    });
    timed.chain(ui::routes()).collect()
}

/// The service's routes over `app`, through axum's router.
pub fn router(app: Arc<App>) -> Router {
    // Two methods of one path merge into one route.
    all()
        .into_iter()
        .fold(Router::new(), |router, (_, path, handler)| router.route(path, handler))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed here")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app)
}

/// Records each request's latency in a route's histogram. A plain tower layer rather than
/// `middleware::from_fn`, whose `Next` boxes the inner service and its future on every request
/// (~2,400 instructions of a ~34,000-instruction check, measured with callgrind).
#[derive(Clone)]
struct TimedLayer(Histogram);

impl<S> tower_layer::Layer<S> for TimedLayer {
    type Service = Timed<S>;

    fn layer(&self, inner: S) -> Timed<S> {
        Timed { inner, histogram: self.0.clone() }
    }
}

#[derive(Clone)]
struct Timed<S> {
    inner: S,
    histogram: Histogram,
}

impl<S: tower_service::Service<Request>> tower_service::Service<Request> for Timed<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = metrics::Timed<S::Future, Histogram>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        metrics::Timed::new(self.histogram.clone(), self.inner.call(request))
    }
}
