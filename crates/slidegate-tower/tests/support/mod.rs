//! Drives a layer in process: a real axum router over a real limiter, called through tower's
//! `Service` with the TCP peer as a `SocketAddr` extension — so that a test can play any client
//! or proxy address, which a client on 127.0.0.1 cannot.

#![allow(dead_code, unreachable_pub)] // each test file uses its own part of this module

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::any;
use http::{HeaderMap, Request, StatusCode};
use slidegate::{Backend, Limiter, Quota};
use slidegate_tower::{RateLimitLayer, Rule};
use tower_service::Service;

/// A router answering every path with "ok" behind `layer`, and how many requests reached it.
pub struct App {
    router: Router,
    reached: Arc<AtomicUsize>,
}

/// What the app answered.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl App {
    pub fn new<B: Backend + Clone + 'static>(layer: RateLimitLayer<B>) -> Self {
        let reached = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&reached);
        let handler = move || {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                "ok"
            }
        };
        let router = Router::new().route("/{*path}", any(handler.clone())).route("/", any(handler)).layer(layer);
        Self { router, reached }
    }

    /// Sends a GET of `path` from `peer` with `headers` (raw bytes, to send what a client can).
    pub async fn send(&self, path: &str, peer: &str, headers: &[(&str, &[u8])]) -> Answer {
        let mut request = Request::get(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut request = request.body(Body::empty()).expect("request");
        request.extensions_mut().insert(peer.parse::<SocketAddr>().expect("peer address"));
        let response = self.router.clone().call(request).await.expect("infallible");
        let (head, body) = response.into_parts();
        let body = axum::body::to_bytes(body, 1 << 16).await.expect("body");
        Answer { status: head.status, headers: head.headers, body: String::from_utf8_lossy(&body).into_owned() }
    }

    /// How many requests reached the service behind the layer.
    pub fn reached(&self) -> usize {
        self.reached.load(Ordering::SeqCst)
    }
}

pub fn quota(limit: u64) -> Quota {
    Quota::per_minute(limit).expect("quota")
}

pub fn rule(name: &str, limit: u64) -> Rule {
    Rule::new(name, quota(limit)).expect("rule")
}

/// How many permits of `quota` the backend holds for `key` (`<rule>:{<key>}`).
pub async fn charged<B: Backend>(limiter: &Limiter<B>, key: &str, limit: u64) -> u64 {
    limiter.inspect(key, &quota(limit)).await.expect("inspect").count
}

/// The `error.code` of a rejection's JSON body `{"error":{"code":…,"message":…}}`.
pub fn error_code(answer: &Answer) -> String {
    assert_eq!(answer.headers["content-type"], "application/json", "{answer:?}");
    let body: serde_json::Value = serde_json::from_str(&answer.body).expect("a JSON body");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    body["error"]["code"].as_str().expect("a code").to_owned()
}
