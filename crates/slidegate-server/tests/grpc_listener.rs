//! The gRPC listener against slow and many clients, on the real binary: connections that never
//! send the HTTP/2 preface, more connections than the cap. Each test is the attack, then the
//! safe outcome: Envoy's own calls are answered.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::{Slidegate, closed_before};

const CONFIG: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

/// A server with `CONFIG` on a gRPC port of its own, started with `extra` flags; its gRPC
/// address and the config directory (removed by the caller).
fn serve(extra: &[&str]) -> (Slidegate, String, std::path::PathBuf) {
    let port = slidegate_testkit::free_port();
    let dir = std::env::temp_dir().join(format!("slidegate-grpc-listener-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("edge.yaml"), CONFIG).expect("write");
    let grpc = format!("127.0.0.1:{port}");
    let mut args = vec!["--grpc", &grpc, "--envoy-config", dir.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    let server = Slidegate::serve(&args);
    (server, grpc, dir)
}

/// One `ShouldRateLimit` call on a new connection, with a deadline: its overall code, or the
/// error that ended it.
async fn call(grpc: &str) -> Result<i32, String> {
    let ask = async {
        let mut client =
            RateLimitServiceClient::connect(format!("http://{grpc}")).await.map_err(|e| format!("connect: {e}"))?;
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: "user".into(), value: "alice".into() }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await.map_err(|e| format!("call: {e}"))?;
        Ok(answer.into_inner().overall_code)
    };
    tokio::time::timeout(Duration::from_secs(10), ask).await.map_err(|_| "no answer within 10 s".to_owned())?
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_that_never_send_the_preface_are_closed_and_give_their_slots_back() {
    let (server, grpc, dir) = serve(&["--header-read-timeout", "1s", "--max-connections", "4"]);
    assert_eq!(call(&grpc).await, Ok(Code::Ok as i32), "before the attack");
    // That call's connection is closed; let the server see it go before taking every slot.
    std::thread::sleep(Duration::from_millis(500));
    // The attack: every slot taken by a connection that sends half the preface and stalls.
    let opened = Instant::now();
    let mut stalled: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(&grpc).expect("connect");
            s.write_all(b"PRI * HTTP/2.0\r\n").expect("half the preface");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // Meanwhile a fifth connection is over the cap: closed at once.
    let mut fifth = TcpStream::connect(&grpc).expect("connect");
    assert!(closed_before(&mut fifth, Instant::now() + Duration::from_millis(900)), "the fifth connection was kept");
    // The stalled ones are closed at the preface deadline (1 s), with a margin for a loaded machine.
    for s in &mut stalled {
        assert!(closed_before(s, opened + Duration::from_secs(6)), "a stalled connection outlived its deadline");
    }
    // The safe outcome: the slots are back and Envoy's calls are answered.
    assert_eq!(call(&grpc).await, Ok(Code::Ok as i32), "after the stalled connections were closed");
    let metrics = reqwest::get(server.url("/metrics")).await.expect("metrics").text().await.expect("text");
    assert!(
        metrics.lines().any(|l| l.starts_with("slidegate_grpc_connections_refused_total ") && !l.ends_with(" 0")),
        "the refusal is counted:\n{metrics}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_sends_the_preface_in_pieces_is_served() {
    let (server, grpc, dir) = serve(&["--header-read-timeout", "2s"]);
    // A client on a slow link: the preface arrives in three writes (the listener waits for all
    // of it without reading, so nothing may be lost).
    let mut slow = TcpStream::connect(&grpc).expect("connect");
    for piece in [&b"PRI * HTTP/2"[..], b".0\r\n\r\n", b"SM\r\n\r\n"] {
        slow.write_all(piece).expect("piece");
        std::thread::sleep(Duration::from_millis(100));
    }
    // An empty SETTINGS frame: the server answers with its own SETTINGS (frame type 4).
    slow.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).expect("settings");
    slow.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut head = [0u8; 9];
    slow.read_exact(&mut head).expect("the server's first frame");
    assert_eq!(head[3], 4, "a SETTINGS frame: {head:?}");
    assert_eq!(call(&grpc).await, Ok(Code::Ok as i32));
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// The `grpc-status` a POST of an empty gRPC message to `path` is answered with, on a new
/// HTTP/2 connection (with a deadline).
async fn grpc_status(grpc: &str, path: &str) -> Option<String> {
    let ask = async {
        let stream = tokio::net::TcpStream::connect(grpc).await.expect("connect");
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut send, connection) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await.expect("handshake");
        tokio::spawn(connection);
        let request = hyper::Request::post(format!("http://{grpc}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            // One message: not compressed, 0 bytes long.
            .body(String::from("\0\0\0\0\0"))
            .expect("request");
        let answer = send.send_request(request).await.expect("answer");
        let status =
            |headers: &hyper::HeaderMap| headers.get("grpc-status").map(|v| v.to_str().expect("ascii").to_owned());
        // A trailers-only answer has the status in its headers, any other in its trailers.
        if let Some(code) = status(answer.headers()) {
            return Some(code);
        }
        let mut body = answer.into_body();
        while let Some(frame) =
            std::future::poll_fn(|cx| hyper::body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)).await
        {
            if let Ok(trailers) = frame.expect("frame").into_trailers() {
                return status(&trailers);
            }
        }
        None
    };
    tokio::time::timeout(Duration::from_secs(10), ask).await.expect("an answer within 10 s")
}

#[tokio::test(flavor = "multi_thread")]
async fn paths_the_listener_does_not_serve_are_unimplemented() {
    let (server, grpc, dir) = serve(&[]);
    let unimplemented = Some("12".to_owned());
    for path in [
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimitTwice",
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit/extra",
        "/envoy.service.ratelimit.v2.RateLimitService/ShouldRateLimit",
        "/",
    ] {
        assert_eq!(grpc_status(&grpc, path).await, unimplemented, "{path}");
    }
    // The served paths still answer: the method (an empty request is refused as upstream
    // refuses it, UNKNOWN) and the health service.
    assert_eq!(
        grpc_status(&grpc, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit").await,
        Some("2".to_owned())
    );
    assert_eq!(grpc_status(&grpc, "/grpc.health.v1.Health/Check").await, Some("0".to_owned()));
    assert_eq!(call(&grpc).await, Ok(Code::Ok as i32));
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
