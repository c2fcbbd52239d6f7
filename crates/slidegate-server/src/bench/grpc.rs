//! The load generator's gRPC client for the Envoy rate limit service, on the `h2` crate alone:
//! one HTTP/2 connection whose streams carry every worker's calls, driven in one task together
//! with those workers ([`drive`]), each key's request encoded once, and an answer read only as
//! far as its `overall_code`. tonic's client on a `Channel` costs about as many instructions per
//! call as the server it loads (a tower buffer task, protobuf encoding, one write per request),
//! so every server measured through it landed at the generator's own ceiling.

use anyhow::Context as _;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use h2::client::SendRequest;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderMap, TE};
use hyper::http::{Method, Request, StatusCode, Version};
use prost::Message as _;
use tokio::net::TcpStream;

use super::GRPC_DOMAIN;
use super::worker::{self, Load, Tally};

/// The method every call asks.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The trailer (or, in a "trailers-only" answer, the header) that says whether a call failed.
const GRPC_STATUS: &str = "grpc-status";

/// The most of an answer read: a `RateLimitResponse` of one descriptor is tens of bytes, and a
/// server that sends more is not one this generator measures.
const MAX_ANSWER: usize = 64 * 1024;

/// A connection's reads and writes: polled by [`drive`], in the task of the workers whose
/// streams it carries.
pub(super) type Connection = h2::client::Connection<TcpStream, Bytes>;

/// A running server's Envoy rate limit service, with a request per key.
pub(super) struct GrpcTarget {
    /// Connection `c`'s handle: worker `w` calls on connection `w % senders.len()`.
    senders: Vec<SendRequest<Bytes>>,
    /// POST, the path, `content-type` and `te`: built once, cloned per call.
    head: Request<()>,
    /// Key `i`'s `RateLimitRequest` (domain [`GRPC_DOMAIN`], one descriptor `key` = the key) in
    /// its gRPC frame.
    bodies: Vec<Bytes>,
}

impl GrpcTarget {
    /// Opens `connections` connections to `authority` (`host:port`), to be asked about `keys`.
    pub(super) async fn connect(
        authority: &str,
        keys: &[String],
        connections: u64,
    ) -> anyhow::Result<(Self, Vec<Connection>)> {
        let authority = authority.trim_end_matches('/');
        anyhow::ensure!(
            !authority.is_empty() && !authority.contains('/'),
            "--target grpc://host:port takes no path, got {authority:?}"
        );
        let head = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{authority}{PATH}"))
            .version(Version::HTTP_2)
            .header(CONTENT_TYPE, "application/grpc")
            .header(TE, "trailers")
            .body(())
            .context("--target: not a valid host")?;
        let bodies = keys.iter().map(|key| request(key)).collect::<anyhow::Result<_>>()?;
        let (mut senders, mut opened) = (Vec::new(), Vec::new());
        for _ in 0..connections {
            let stream = TcpStream::connect(authority).await.with_context(|| format!("connecting to {authority}"))?;
            stream.set_nodelay(true)?;
            let (sender, connection) = h2::client::handshake(stream).await.context("the HTTP/2 handshake")?;
            senders.push(sender);
            opened.push(connection);
        }
        Ok((Self { senders, head, bodies }, opened))
    }

    /// Worker `w`'s stream of calls, on connection `w % connections`.
    pub(super) fn stream(&self, w: u64) -> Stream<'_> {
        let sender = self.senders[(w % self.senders.len() as u64) as usize].clone();
        Stream { target: self, sender, answer: Vec::new() }
    }
}

/// Key `key`'s request, in its gRPC frame: a flag byte (0: not compressed), the message's
/// length in 4 big-endian bytes, the message.
fn request(key: &str) -> anyhow::Result<Bytes> {
    let request = RateLimitRequest {
        domain: GRPC_DOMAIN.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry { key: "key".to_owned(), value: key.to_owned() }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    let mut frame = vec![0];
    frame.extend_from_slice(&u32::try_from(request.encoded_len())?.to_be_bytes());
    request.encode(&mut frame)?;
    Ok(Bytes::from(frame))
}

/// Runs the workers of connection `c` of `n` (workers `c`, `c + n`…), each calling on a stream
/// of it, in this one task together with the connection, until they end. Each time the task runs, the workers whose
/// answers came send their next calls, then the connection writes the frames of all of them in
/// one write and reads every answer that arrived; the answers wake this same task, never one on
/// another thread. A task per worker would cost a write and a cross-thread wake-up per call.
///
/// A connection that ends (an error, the server's GOAWAY) is not reopened: its streams fail,
/// and so then does every call, each counted as an error.
pub(super) async fn drive(connection: Connection, load: std::sync::Arc<Load>, c: usize, n: usize) -> Tally {
    let mut workers: FuturesUnordered<_> =
        (c as u64..load.workers).step_by(n).map(|w| worker::work(&load, w)).collect();
    let mut connection = std::pin::pin!(connection);
    let mut open = true;
    let mut tally = Tally::new();
    loop {
        tokio::select! {
            // The workers first, so that the connection's poll writes what they queued.
            biased;
            ended = workers.next() => match ended {
                Some(worker) => tally.merge(&worker),
                None => return tally,
            },
            _ = &mut connection, if open => open = false,
        }
    }
}

/// One worker's calls on the [`GrpcTarget`]'s connection, a stream each.
pub(super) struct Stream<'a> {
    target: &'a GrpcTarget,
    sender: SendRequest<Bytes>,
    /// The answer's DATA frames, gathered: kept from call to call so as to be allocated once.
    answer: Vec<u8>,
}

impl Stream<'_> {
    /// Calls with key `key_index`'s request: `Ok(allowed)`; a `grpc-status` other than 0 is an
    /// error.
    pub(super) async fn decide(&mut self, key_index: usize) -> anyhow::Result<bool> {
        std::future::poll_fn(|cx| self.sender.poll_ready(cx)).await?;
        let (response, mut request) = self.sender.send_request(self.target.head.clone(), false)?;
        request.send_data(self.target.bodies[key_index].clone(), true)?;
        let (head, mut body) = response.await?.into_parts();
        self.answer.clear();
        while let Some(data) = body.data().await {
            let data = data?;
            // The server may send more only once this is released.
            body.flow_control().release_capacity(data.len())?;
            anyhow::ensure!(self.answer.len() + data.len() <= MAX_ANSWER, "an answer over {MAX_ANSWER} bytes");
            self.answer.extend_from_slice(&data);
        }
        // A call that fails before its answer is "trailers-only": the status is in the head.
        let trailers = body.trailers().await?;
        outcome(head.status, trailers.as_ref().unwrap_or(&head.headers), &self.answer)
    }
}

/// What an answer says, from its HTTP `status`, the headers that hold its `grpc-status` and its
/// `body`: `Ok(allowed)`, or an error for a failed call.
fn outcome(status: StatusCode, grpc: &HeaderMap, body: &[u8]) -> anyhow::Result<bool> {
    anyhow::ensure!(status == StatusCode::OK, "HTTP {status}");
    let code = grpc.get(GRPC_STATUS);
    anyhow::ensure!(code.is_some_and(|c| c.as_bytes() == b"0"), "grpc-status {code:?}");
    allowed(body).with_context(|| format!("not a RateLimitResponse: {body:?}"))
}

/// Whether a `RateLimitResponse` in its gRPC frame admits: its `overall_code` (field 1, a
/// varint) is OK. The fields are read only as far as field 1, which encoders that write fields
/// in order (prost, Go's) write first, skipping any before it by their wire type; without a
/// field 1 the code is its default, UNKNOWN: not admitted. `None` for anything else than one
/// uncompressed, well-formed message.
fn allowed(frame: &[u8]) -> Option<bool> {
    let ([0, length @ ..], mut message) = frame.split_first_chunk::<5>()? else { return None };
    if message.len() != usize::try_from(u32::from_be_bytes(*length)).ok()? {
        return None;
    }
    // Each turn consumes at least a byte.
    while !message.is_empty() {
        let tag = varint(&mut message)?;
        match (tag >> 3, tag & 7) {
            (1, 0) => return Some(varint(&mut message)? == Code::Ok as u64),
            (1, _) => return None,
            (_, 0) => {
                varint(&mut message)?;
            }
            (_, 1) => message = message.get(8..)?,
            (_, 2) => {
                let length = usize::try_from(varint(&mut message)?).ok()?;
                message = message.get(length..)?;
            }
            (_, 5) => message = message.get(4..)?,
            _ => return None,
        }
    }
    Some(false)
}

/// A protobuf varint (at most 10 bytes) off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0;
    for shift in (0..70).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
    use hyper::header::HeaderValue;

    use super::*;

    /// `message` in its gRPC frame.
    fn framed(message: &[u8]) -> Vec<u8> {
        let mut frame = vec![0];
        frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
        frame.extend_from_slice(message);
        frame
    }

    fn answer(code: Code) -> Vec<u8> {
        let status = DescriptorStatus { code: code as i32, limit_remaining: 7, ..DescriptorStatus::default() };
        let response =
            RateLimitResponse { overall_code: code as i32, statuses: vec![status], ..RateLimitResponse::default() };
        framed(&response.encode_to_vec())
    }

    #[test]
    fn the_overall_code_of_an_answer_is_read() {
        assert_eq!(allowed(&answer(Code::Ok)), Some(true));
        assert_eq!(allowed(&answer(Code::OverLimit)), Some(false));
        // UNKNOWN is the default: prost writes no field 1 at all.
        assert_eq!(allowed(&answer(Code::Unknown)), Some(false));
        assert_eq!(allowed(&framed(&[])), Some(false));
        // Fields before field 1, of each wire type, are skipped.
        let mut before = vec![0x10, 0x96, 0x01, 0x19, 1, 2, 3, 4, 5, 6, 7, 8, 0x22, 2, 0x08, 0x02, 0x2d, 1, 2, 3, 4];
        before.extend_from_slice(&[0x08, 0x01]);
        assert_eq!(allowed(&framed(&before)), Some(true));
    }

    #[test]
    fn anything_but_one_uncompressed_well_formed_message_is_refused() {
        let ok = answer(Code::Ok);
        assert_eq!(allowed(&[]), None, "no frame");
        assert_eq!(allowed(&ok[..4]), None, "a cut header");
        assert_eq!(allowed(&ok[..ok.len() - 1]), None, "a message shorter than its length");
        assert_eq!(allowed(&[ok.as_slice(), &[0]].concat()), None, "bytes after the message");
        let mut compressed = ok;
        compressed[0] = 1;
        assert_eq!(allowed(&compressed), None, "compressed");
        assert_eq!(allowed(&framed(&[0x08])), None, "field 1 without its value");
        assert_eq!(allowed(&framed(&[0x0a, 0x00])), None, "field 1 not a varint");
        assert_eq!(allowed(&framed(&[0x12, 0x05, 0x01])), None, "a field longer than the message");
        let eleven = [0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(allowed(&framed(&eleven)), None, "a varint over 10 bytes");
        assert_eq!(allowed(&framed(&[0x13])), None, "a group: no wire type of proto3");
    }

    #[test]
    fn a_failed_call_is_an_error_whatever_its_body() {
        let grpc = |status: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(GRPC_STATUS, HeaderValue::from_static(status));
            headers
        };
        let ok = answer(Code::Ok);
        assert!(outcome(StatusCode::OK, &grpc("0"), &ok).is_ok_and(|allowed| allowed));
        assert!(outcome(StatusCode::OK, &grpc("0"), &answer(Code::OverLimit)).is_ok_and(|allowed| !allowed));
        assert!(outcome(StatusCode::OK, &grpc("14"), &ok).is_err(), "UNAVAILABLE");
        assert!(outcome(StatusCode::OK, &grpc("3"), &[]).is_err(), "a trailers-only INVALID_ARGUMENT");
        assert!(outcome(StatusCode::OK, &HeaderMap::new(), &ok).is_err(), "no grpc-status");
        assert!(outcome(StatusCode::SERVICE_UNAVAILABLE, &grpc("0"), &ok).is_err());
        assert!(outcome(StatusCode::OK, &grpc("0"), &ok[..3]).is_err(), "malformed");
    }

    #[test]
    fn a_request_is_the_message_tonic_sends_in_its_frame() {
        let body = request("bench:7").expect("encodes");
        let decoded = RateLimitRequest::decode(&body[5..]).expect("a RateLimitRequest");
        assert_eq!(body[..5], [0, 0, 0, 0, (body.len() - 5) as u8]);
        assert_eq!(decoded.domain, GRPC_DOMAIN);
        assert_eq!(decoded.descriptors[0].entries[0].value, "bench:7");
    }
}
