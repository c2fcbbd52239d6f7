//! The load generator's HTTP/1 client: one kept-alive connection per worker (hyper's own
//! connection, no pool to look up), driven by the worker's own task (no wake-up of another task
//! per request), requests built from bodies encoded once, and an answer read only as far as its
//! `"allowed":` field. What a request costs the generator is then small beside what it costs
//! the server, so the server, not the generator, is what a run measures.

use std::pin::Pin;

use anyhow::Context as _;
use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST, HeaderValue};
use hyper::http::{Method, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The path every decision is posted to.
const CHECK: &str = "/v1/check";

/// A running server's `/v1/check`, with a request body per key.
pub(super) struct HttpTarget {
    /// `host:port`.
    authority: String,
    host: HeaderValue,
    bodies: Vec<Bytes>,
}

impl HttpTarget {
    /// The server at `target` (`http://host:port`), to be sent `bodies[i]` for key `i`.
    pub(super) fn new(target: &str, bodies: Vec<String>) -> anyhow::Result<Self> {
        let authority = target.strip_prefix("http://").unwrap_or(target).trim_end_matches('/');
        anyhow::ensure!(
            !authority.is_empty() && !authority.contains('/'),
            "--target http://host:port takes no path, got {target:?}"
        );
        let host = HeaderValue::from_str(authority).context("--target: not a valid host")?;
        Ok(Self { authority: authority.to_owned(), host, bodies: bodies.into_iter().map(Bytes::from).collect() })
    }

    /// A worker's connection, opened at its first decision.
    pub(super) fn connection(&self) -> Connection<'_> {
        Connection { target: self, open: None }
    }
}

/// hyper's connection: the socket's reads and writes, polled while a request waits on it.
type Io = Pin<Box<http1::Connection<TokioIo<TcpStream>, Full<Bytes>>>>;

/// One worker's connection to an [`HttpTarget`]; after a failure the next decision opens a new
/// one.
pub(super) struct Connection<'a> {
    target: &'a HttpTarget,
    open: Option<(SendRequest<Full<Bytes>>, Io)>,
}

impl Connection<'_> {
    /// Posts key `key_index`'s body: `Ok(allowed)`.
    pub(super) async fn decide(&mut self, key_index: usize) -> anyhow::Result<bool> {
        let outcome = self.try_decide(key_index).await;
        if outcome.is_err() {
            // The connection's state is unknown (an answer half read): start afresh.
            self.open = None;
        }
        outcome
    }

    async fn try_decide(&mut self, key_index: usize) -> anyhow::Result<bool> {
        let (sender, io) = match self.open.take() {
            Some(open) if !open.0.is_closed() => self.open.insert(open),
            _ => self.open.insert(open(&self.target.authority).await?),
        };
        let mut request = Request::new(Full::new(self.target.bodies[key_index].clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from_static(CHECK);
        let headers = request.headers_mut();
        headers.insert(HOST, self.target.host.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let exchange = async {
            // Ready once the connection, polled below, has finished with the last answer.
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            anyhow::Ok((status, response.into_body().collect().await?.to_bytes()))
        };
        let (status, body) = tokio::select! {
            biased;
            answered = exchange => answered?,
            ended = io.as_mut() => anyhow::bail!("the server closed the connection ({ended:?})"),
        };
        anyhow::ensure!(status.is_success(), "HTTP {status}");
        allowed(&body).with_context(|| format!("no `allowed` in {:?}", String::from_utf8_lossy(&body)))
    }
}

/// A new HTTP/1 connection to `authority`.
async fn open(authority: &str) -> anyhow::Result<(SendRequest<Full<Bytes>>, Io)> {
    let stream = TcpStream::connect(authority).await.with_context(|| format!("connecting to {authority}"))?;
    stream.set_nodelay(true)?;
    let (sender, io) = http1::handshake(TokioIo::new(stream)).await?;
    Ok((sender, Box::pin(io)))
}

/// The `allowed` field of a decision as the service writes it (`{"rule":"…","allowed":true,…`):
/// the first `"allowed":` — a rule name cannot hold a quote — and the value after it.
fn allowed(body: &[u8]) -> Option<bool> {
    const FIELD: &[u8] = b"\"allowed\":";
    let at = body.windows(FIELD.len()).position(|w| w == FIELD)? + FIELD.len();
    match body.get(at) {
        Some(b't') => Some(true),
        Some(b'f') => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowed_field_is_read_and_anything_else_refused() {
        let admitted = br#"{"rule":"inline","allowed":true,"limit":100,"remaining":99}"#;
        let denied = br#"{"rule":"sms","allowed":false,"limit":5,"remaining":0}"#;
        assert_eq!(allowed(admitted), Some(true));
        assert_eq!(allowed(denied), Some(false));
        assert_eq!(allowed(br#"{"error":{"code":"invalid_json"}}"#), None);
        assert_eq!(allowed(br#"{"allowed":"#), None);
    }

    #[test]
    fn a_target_is_a_host_and_port_without_a_path() {
        assert_eq!(
            HttpTarget::new("http://127.0.0.1:8080/", Vec::new()).map(|t| t.authority).ok(),
            Some("127.0.0.1:8080".into())
        );
        assert!(HttpTarget::new("http://127.0.0.1:8080/prefix", Vec::new()).is_err());
        assert!(HttpTarget::new("http://", Vec::new()).is_err());
    }
}
