//! The load generator's HTTP/1 client: one kept-alive connection per worker (hyper's own
//! connection, no pool to look up), requests built from bodies encoded once, and an answer read
//! only as far as its `"allowed":` field. What a request costs the generator is then small
//! beside what it costs the server, so the server, not the generator, is what a run measures.

use anyhow::Context as _;
use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
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
        Connection { target: self, sender: None }
    }
}

/// One worker's connection to an [`HttpTarget`]; after a failure the next decision opens a new
/// one.
pub(super) struct Connection<'a> {
    target: &'a HttpTarget,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection<'_> {
    /// Posts key `key_index`'s body: `Ok(allowed)`.
    pub(super) async fn decide(&mut self, key_index: usize) -> anyhow::Result<bool> {
        let outcome = self.try_decide(key_index).await;
        if outcome.is_err() {
            // The connection's state is unknown (an answer half read): start afresh.
            self.sender = None;
        }
        outcome
    }

    async fn try_decide(&mut self, key_index: usize) -> anyhow::Result<bool> {
        let sender = match &mut self.sender {
            Some(sender) if !sender.is_closed() => sender,
            _ => self.sender.insert(open(&self.target.authority).await?),
        };
        let mut request = Request::new(Full::new(self.target.bodies[key_index].clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from_static(CHECK);
        let headers = request.headers_mut();
        headers.insert(HOST, self.target.host.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::ensure!(status.is_success(), "HTTP {status}");
        allowed(&body).with_context(|| format!("no `allowed` in {:?}", String::from_utf8_lossy(&body)))
    }
}

/// A new HTTP/1 connection to `authority`, its I/O driven by a task of its own.
async fn open(authority: &str) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(authority).await.with_context(|| format!("connecting to {authority}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Ends when the sender is dropped or the server closes the connection.
    tokio::spawn(connection);
    Ok(sender)
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
        assert_eq!(HttpTarget::new("http://127.0.0.1:8080/", Vec::new()).map(|t| t.authority).ok(), Some("127.0.0.1:8080".into()));
        assert!(HttpTarget::new("http://127.0.0.1:8080/prefix", Vec::new()).is_err());
        assert!(HttpTarget::new("http://", Vec::new()).is_err());
    }
}
