//! The HTTP listener: every connection and every request has a deadline, and the number of
//! open connections a cap, so slow or many clients cannot starve the others.
//!
//! - A connection must deliver each request head (request line and headers) within
//!   [`HttpLimits::header_read_timeout`] of starting to wait for it — from its opening, and from
//!   each answer on a kept-alive connection — or it is closed (within a quarter of the timeout
//!   after it passes: a watch of each connection's requests). Half a request line held open
//!   costs a slot for that long at most.
//! - A request, from its head to the end of its answer (its body read included, so a body sent
//!   a byte at a time too), gets [`HttpLimits::request_timeout`]; past it the answer is
//!   `408 {"error":{"code":"request_timeout"}}`, and a connection whose body was not read whole
//!   is closed.
//! - At most [`HttpLimits::max_connections`] connections are open. One more is accepted and
//!   closed at once, answered (when the socket takes it without waiting) `503
//!   {"error":{"code":"too_many_connections"}}`, and counted in
//!   `slidegate_http_connections_refused_total`: the accept loop never waits and nothing
//!   queues in the process; clients see a prompt refusal they can retry instead of a stall.
//! - A request head is at most [`MAX_HEAD_BYTES`]; a longer one is answered 431 and closed.
//! - Over TLS ([`crate::tls`]), the handshake counts as the wait for the first head: a client
//!   that opens a connection and never finishes its handshake holds a slot, and is closed at
//!   the header deadline. One over the cap is closed without an answer (a plaintext 503 would
//!   be noise to a TLS client), and counted as over plaintext.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{error, warn};

use crate::api_error::request_timed_out;

pub(crate) mod decision;
mod route;

pub use route::{Answer, Route};
pub(crate) use route::{authorize, route};

pub use crate::config::{
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT, HttpLimit, HttpLimits,
    InvalidHttpLimit, MAX_CONNECTIONS, TIMEOUT_RANGE,
};
use crate::metrics;
use crate::tls::ListenerTls;

/// The largest request head (request line and headers) read into memory per connection: a
/// check's head is well under 1 KiB and a percent-encoded 512-byte key in a path is 1.5 KiB;
/// hyper's own cap (~400 KiB) times [`DEFAULT_MAX_CONNECTIONS`] would be 200 MiB.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// What answers the listener's requests: the service's routes (`crate::routes::Routes`).
pub trait Dispatch: Clone + Send + Sync + 'static {
    /// Answers `request`, which came from `peer`.
    fn call(&self, request: hyper::Request<Incoming>, peer: SocketAddr) -> Answer;
}

/// Serves `routes` on `listener` within `limits`, over `tls` when given, until `shutdown`
/// completes; then stops accepting, and lets requests in flight finish (each is bounded by its
/// deadlines).
pub async fn serve(
    listener: TcpListener,
    routes: impl Dispatch,
    limits: HttpLimits,
    tls: Option<Arc<ListenerTls>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder.max_buf_size(MAX_HEAD_BYTES);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                accept_failed(e).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refuse(stream, tls.is_none());
            continue;
        };
        // An answer is one small write and its caller waits for it (a proxy's subrequest holds
        // its client's request): no Nagle delay behind an unacknowledged segment.
        let _ = stream.set_nodelay(true);
        let idle = Arc::new(IdleWatch::default());
        let service =
            RequestDeadline { routes: routes.clone(), limit: limits.request_timeout, peer, idle: Arc::clone(&idle) };
        let (watcher, builder) = (graceful.watcher(), builder.clone());
        // The acceptor of the configuration in force when the connection came.
        let acceptor = tls.as_ref().map(|tls| tls.http());
        let header_read_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let _open = OpenConnection::new(slot);
            let served = async move {
                let _ = match acceptor {
                    None => watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await,
                    // A failed handshake is the client's (no certificate, another CA): closed.
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(stream) => watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await,
                        Err(_) => return,
                    },
                };
            };
            // A connection's errors (a client gone, a head too large) are its own; one that
            // waits too long for a head (or its handshake) is dropped, which closes it.
            tokio::select! {
                () = served => {}
                () = idle.expired(header_read_timeout) => {}
            }
        });
    }
    drop(listener);
    // Every request left is bounded by the request deadline, every head by the header one.
    let drain = limits.request_timeout.max(limits.header_read_timeout);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        warn!("connections still open {drain:?} after the shutdown signal were dropped");
    }
    Ok(())
}

/// How long a connection has waited for a request head, watched from outside hyper.
///
/// hyper's own header timeout arms a timer per request (an allocation, a registration in the
/// runtime's timer wheel and its removal: a twentieth of what a check costs the service). Here a
/// request costs two counter increments, and each connection one timer that ticks four times per
/// timeout: a connection whose counters did not move while no answer was pending, for a whole
/// timeout of ticks, is waiting for a head (or trickling one) and is closed. It closes between
/// one timeout and a quarter more after its last answer (or its opening).
#[derive(Default)]
struct IdleWatch {
    /// Request heads received (each starts a call to the routes).
    heads: AtomicU64,
    /// Answers given (the routes' future done, the answer handed to hyper to write).
    answers: AtomicU64,
}

impl IdleWatch {
    /// Completes once the connection has waited `timeout` for a head.
    async fn expired(&self, timeout: Duration) {
        const TICKS: u32 = 4;
        let period = timeout / TICKS;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Both counters: an answer given since the last tick is activity too, so the idle ticks
        // count from the tick after the last answer, not from one that saw it pending.
        let (mut seen, mut idle_ticks) = ((0, 0), 0);
        while idle_ticks < TICKS {
            tick.tick().await;
            let now = (self.heads.load(Ordering::Relaxed), self.answers.load(Ordering::Relaxed));
            if now != seen || now.0 != now.1 {
                (seen, idle_ticks) = (now, 0);
            } else {
                idle_ticks += 1;
            }
        }
    }
}

/// A connection's slot, and the open-connections gauge, for as long as it lives.
struct OpenConnection {
    _slot: OwnedSemaphorePermit,
}

impl OpenConnection {
    fn new(slot: OwnedSemaphorePermit) -> Self {
        ::metrics::gauge!(metrics::HTTP_CONNECTIONS).increment(1.0);
        Self { _slot: slot }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        ::metrics::gauge!(metrics::HTTP_CONNECTIONS).decrement(1.0);
    }
}

/// The whole answer to a connection over the cap, written without waiting.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n\
content-length: 86\r\n\r\n{\"error\":{\"code\":\"too_many_connections\",\"message\":\"too many open connections, retry\"}}";

/// Closes a connection over the cap, after one non-blocking attempt to say why when `answer`
/// (plaintext).
fn refuse(stream: TcpStream, answer: bool) {
    ::metrics::counter!(metrics::HTTP_CONNECTIONS_REFUSED).increment(1);
    if !answer {
        return;
    }
    // A fresh socket's send buffer takes the few bytes; if not, the client sees the close alone.
    if let Ok(mut socket) = stream.into_std() {
        let _ = socket.write(REFUSAL);
    }
}

/// An accept that failed: a connection reset before it was accepted is the client's; anything
/// else (out of file descriptors) is logged and waited out a little, as accepting again at once
/// would fail again at once.
pub(crate) async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    error!("accepting a connection failed, retrying in 1s: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// The routes under the request deadline.
#[derive(Clone)]
struct RequestDeadline<D> {
    routes: D,
    limit: Duration,
    /// The client's address, for the admin routes' audit trail.
    peer: SocketAddr,
    idle: Arc<IdleWatch>,
}

impl<D: Dispatch> hyper::service::Service<hyper::Request<Incoming>> for RequestDeadline<D> {
    type Response = Response;
    type Error = Infallible;
    type Future = Deadline;

    fn call(&self, request: hyper::Request<Incoming>) -> Deadline {
        self.idle.heads.fetch_add(1, Ordering::Relaxed);
        let answer = self.routes.call(request, self.peer);
        Deadline { answer: tokio::time::timeout(self.limit, answer), limit: self.limit, idle: Arc::clone(&self.idle) }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer, or 408 when it is not ready by the deadline.
    struct Deadline {
        #[pin]
        answer: tokio::time::Timeout<Answer>,
        limit: Duration,
        idle: Arc<IdleWatch>,
    }
}

impl Future for Deadline {
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = ready!(this.answer.poll(cx));
        this.idle.answers.fetch_add(1, Ordering::Relaxed);
        match answer {
            Ok(answer) => Poll::Ready(Ok(answer)),
            Err(_) => Poll::Ready(Ok(request_timed_out(*this.limit))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_one_whole_json_answer() {
        let text = std::str::from_utf8(REFUSAL).expect("ASCII");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(v["error"]["code"], "too_many_connections");
    }

    #[test]
    fn limits_out_of_range_name_their_setting() {
        assert_eq!(HttpLimits::default().validate(), Ok(()));
        let zero = HttpLimits { max_connections: 0, ..HttpLimits::default() };
        assert!(zero.validate().is_err_and(|e| e.field == HttpLimit::MaxConnections));
        let slow = HttpLimits { request_timeout: Duration::from_secs(7200), ..HttpLimits::default() };
        assert!(slow.validate().is_err_and(|e| e.field == HttpLimit::RequestTimeout));
        let fast = HttpLimits { header_read_timeout: Duration::from_millis(1), ..HttpLimits::default() };
        assert!(fast.validate().is_err_and(|e| e.to_string().starts_with("header_read_timeout: must be")));
    }
}
