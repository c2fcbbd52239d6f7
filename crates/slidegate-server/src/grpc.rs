//! The gRPC listener (the Envoy rate limit service): the same deadlines and connection cap as
//! the HTTP listener ([`HttpLimits`]), so a client that opens connections and sends nothing, or
//! opens many streams and never finishes them, cannot starve Envoy.
//!
//! - At most [`HttpLimits::max_connections`] gRPC connections are open (a cap of its own, apart
//!   from the HTTP port's); one more is closed at once and counted in
//!   `slidegate_grpc_connections_refused_total`.
//! - A connection must send the whole HTTP/2 client preface (24 bytes) within
//!   [`HttpLimits::header_read_timeout`] of being accepted, or it is closed without ever
//!   reaching the HTTP/2 server; after the handshake, a peer that stops answering HTTP/2 pings
//!   for [`KEEPALIVE_TIMEOUT`] is closed.
//! - A connection carries at most [`MAX_STREAMS_PER_CONNECTION`] requests at once, a request's
//!   headers are at most [`crate::http::MAX_HEAD_BYTES`], its message at most
//!   [`crate::envoy::MAX_REQUEST_BYTES`], and it is answered within
//!   [`HttpLimits::request_timeout`] (`CANCELLED` past it).
//! - Over TLS ([`crate::tls`]), the handshake and then the preface must both arrive within
//!   [`HttpLimits::header_read_timeout`] of the accept, the connection holding its slot
//!   meanwhile: a client that never finishes its handshake is closed at that deadline.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer, SERVICE_NAME,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic_health::pb::health_server::{Health, HealthServer};

use crate::http::HttpLimits;
use crate::metrics;
use crate::tls::ListenerTls;

/// Concurrent requests (HTTP/2 streams) per connection: Envoy multiplexes its rate limit calls
/// over a few connections, each far below this; more streams queue in the client.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// How often an idle connection is pinged, and how long the peer has to answer before the
/// connection is closed: a vanished peer gives its slot back within a minute.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// See [`KEEPALIVE_INTERVAL`].
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The HTTP/2 client preface every gRPC client sends first.
const PREFACE_LEN: usize = 24;

/// Connections that sent their preface, waiting for the HTTP/2 server to take them. The
/// server takes each at once; the bound only keeps a stalled server from queuing without end
/// (the connection cap bounds it too).
const ACCEPTED_QUEUE: usize = 64;

/// The listener's routes: `health` under its service name, the rate limit service's one method
/// at its exact path, anything else `UNIMPLEMENTED`. `Routes::add_service` would route the rate
/// limit service by a `/<service>/{*rest}` pattern, whose capture costs every call an
/// allocation and a parameter map; an exact path captures nothing.
pub fn routes(
    rate_limit: RateLimitServiceServer<impl RateLimitService>,
    health: HealthServer<impl Health>,
) -> tonic::service::Routes {
    let router = tonic::service::Routes::new(health).into_axum_router();
    router.route_service(&format!("/{SERVICE_NAME}/ShouldRateLimit"), rate_limit).into()
}

/// Serves `routes` on `listener` within `limits`, over `tls` when given, until `shutdown`
/// completes.
pub async fn serve(
    listener: TcpListener,
    routes: tonic::service::Routes,
    limits: HttpLimits,
    tls: Option<Arc<ListenerTls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    match tls {
        None => {
            let open = |stream: TcpStream| async move { preface(&stream).await.then_some((stream, Vec::new())) };
            serve_opened(listener, routes, limits, open, shutdown).await
        }
        Some(tls) => {
            let open = move |stream: TcpStream| {
                // The acceptor of the configuration in force when the connection came.
                let acceptor = tls.grpc();
                async move {
                    let mut stream = acceptor.accept(stream).await.ok()?;
                    // A TLS stream cannot be peeked: the preface is read, and handed back.
                    let mut preface = vec![0; PREFACE_LEN];
                    stream.read_exact(&mut preface).await.ok()?;
                    Some((stream, preface))
                }
            };
            serve_opened(listener, routes, limits, open, shutdown).await
        }
    }
}

/// Serves `routes` on the connections of `listener` that `open` makes ready (a transport, and
/// the bytes it read off it already) within the preface deadline.
async fn serve_opened<S: Transport, F: Future<Output = Option<(S, Vec<u8>)>> + Send + 'static>(
    listener: TcpListener,
    routes: tonic::service::Routes,
    limits: HttpLimits,
    open: impl Fn(TcpStream) -> F + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (ready, incoming) = mpsc::channel(ACCEPTED_QUEUE);
    let accepting = tokio::spawn(accept(listener, ready, limits, open));
    let served = tonic::transport::Server::builder()
        .timeout(limits.request_timeout)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(u32::try_from(crate::http::MAX_HEAD_BYTES).unwrap_or(u32::MAX))
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_routes(routes)
        .serve_with_incoming_shutdown(ReceiverStream::new(incoming), shutdown)
        .await;
    accepting.abort();
    served
}

/// Accepts connections while the server runs, each given a slot, then opened by `open` within
/// the preface deadline.
async fn accept<S: Transport, F: Future<Output = Option<(S, Vec<u8>)>> + Send + 'static>(
    listener: TcpListener,
    ready: mpsc::Sender<io::Result<Slotted<S>>>,
    limits: HttpLimits,
    open: impl Fn(TcpStream) -> F,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                crate::http::accept_failed(e).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            ::metrics::counter!(metrics::GRPC_CONNECTIONS_REFUSED).increment(1);
            continue;
        };
        // Answers are small and Envoy waits for each: no Nagle delay before sending one.
        let _ = stream.set_nodelay(true);
        let (ready, opening) = (ready.clone(), open(stream));
        tokio::spawn(async move {
            if let Ok(Some((stream, replay))) = tokio::time::timeout(limits.header_read_timeout, opening).await {
                let _ = ready.send(Ok(Slotted { stream, replay, _slot: slot, yielded: false })).await;
            }
        });
    }
}

/// Waits until the first [`PREFACE_LEN`] bytes have arrived (without reading them); false when
/// the peer closes or fails first.
async fn preface(stream: &TcpStream) -> bool {
    let mut buf = [0; PREFACE_LEN];
    loop {
        match stream.peek(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) if n == PREFACE_LEN => return true,
            // Part of it: peek answers at once while those bytes wait, so wait for more.
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// What a gRPC connection runs over: TCP, or TLS over TCP.
trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn tcp(&self) -> &TcpStream;
}

impl Transport for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Transport for TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// A connection and its slot under the cap, released when the server drops the connection.
///
/// Its writes are batched: the HTTP/2 connection task writes whatever answers are ready each
/// time it runs, and each stream's task, on finishing, wakes it to run next (tokio's LIFO slot),
/// so without a pause it would write each answer alone — a `writev` per call. Before a write it
/// yields once (its task goes to the back of the run queue), so the answers of the other streams
/// ready by then go out in the same write.
struct Slotted<S> {
    stream: S,
    /// Bytes read off the stream before the server took it, for its first reads.
    replay: Vec<u8>,
    _slot: OwnedSemaphorePermit,
    /// Whether the connection yielded before this write already.
    yielded: bool,
}

impl<S: Transport> Slotted<S> {
    /// `Pending` once before each write (the task woken at once, to run after the others
    /// ready), then the write.
    fn batched<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        if !self.yielded {
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.yielded = false;
        write(Pin::new(&mut self.stream), cx)
    }
}

impl<S: Transport> Connected for Slotted<S> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.tcp().connect_info()
    }
}

impl<S: Transport> AsyncRead for Slotted<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.replay.is_empty() {
            let n = self.replay.len().min(buf.remaining());
            buf.put_slice(&self.replay[..n]);
            self.replay.drain(..n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: Transport> AsyncWrite for Slotted<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.batched(cx, |stream, cx| stream.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.batched(cx, |stream, cx| stream.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
