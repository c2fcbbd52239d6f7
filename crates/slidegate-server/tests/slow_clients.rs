//! Slow and many clients against the real binary: stalled request heads, a trickled body, more
//! connections than the cap. Each test is the attack, then the safe outcome.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::Slidegate;

/// `host:port` of `server`.
fn addr(server: &Slidegate) -> &str {
    server.base.strip_prefix("http://").expect("http base")
}

/// One inline check on a connection of its own: (status line, whole answer, time taken).
fn timed_check(addr: &str) -> (String, String, Duration) {
    let body = r#"{"key": "normal", "limit": 10000, "window": "1s"}"#;
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(
        s,
        "POST /v1/check HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("answer");
    let status = answer.lines().next().unwrap_or_default().to_owned();
    (status, answer, started.elapsed())
}

/// Reads `s` until the server closes it (EOF or reset) or `deadline` passes: what it sent, or
/// `None` when it was still open at the deadline.
fn read_until_closed(s: &mut TcpStream, deadline: Instant) -> Option<String> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
        s.set_read_timeout(Some(left)).expect("timeout");
        match s.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&seen).into_owned()),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return Some(String::from_utf8_lossy(&seen).into_owned()),
        }
    }
}

#[test]
fn two_hundred_stalled_heads_delay_no_check_and_are_closed_at_the_header_deadline() {
    let header_timeout = Duration::from_secs(2);
    let server = Slidegate::serve(&["--header-read-timeout", "2s"]);
    let addr = addr(&server);
    // The attack: 200 connections that send half a request line and stall.
    let first_opened = Instant::now();
    let mut stalled: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.write_all(b"POST /v1/che").expect("half a request line");
            s
        })
        .collect();
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let (status, answer, took) = timed_check(addr);
            assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");
            took
        })
        .collect();
    assert!(first_opened.elapsed() < header_timeout, "the checks ran after the stalled heads could have been closed");
    times.sort();
    // Not held until the stalled heads are closed (a loose bound: how fast a check is beside
    // them is a benchmark's figure).
    assert!(times[2] < header_timeout / 2, "median check beside 200 stalled heads: {times:?}");
    // Every stalled connection is closed by the server, within the deadline and a margin.
    let deadline = first_opened + header_timeout + Duration::from_secs(5);
    for (i, s) in stalled.iter_mut().enumerate() {
        assert!(read_until_closed(s, deadline).is_some(), "stalled connection {i} still open");
    }
}

#[test]
fn an_idle_kept_alive_connection_is_closed_at_the_header_deadline() {
    let server = Slidegate::serve(&["--header-read-timeout", "1s"]);
    let addr = addr(&server);
    // The attack: one complete request on a kept-alive connection, then silence.
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(s, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send");
    let answer = read_until_closed(&mut s, Instant::now() + Duration::from_secs(6)).expect("closed while idle");
    assert!(answer.starts_with("HTTP/1.1 200"), "the request was answered first: {answer}");
}

#[test]
fn a_head_trickled_a_byte_at_a_time_is_closed_at_the_header_deadline_not_before() {
    let header_timeout = Duration::from_secs(1);
    let server = Slidegate::serve(&["--header-read-timeout", "1s"]);
    let addr = addr(&server);
    // The attack: a request head that never ends, a byte every 50 ms, each byte arriving well
    // within any per-read timeout.
    let mut s = TcpStream::connect(addr).expect("connect");
    let opened = Instant::now();
    let head = format!("POST /v1/check HTTP/1.1\r\nHost: {addr}\r\nX-Trickle: {}", "a".repeat(200));
    let mut closed_after = None;
    for byte in head.bytes().take(200) {
        if s.write_all(&[byte]).is_err() {
            closed_after = Some(opened.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Closed by the server (the writes fail, or the socket reads its end) within the deadline
    // and a quarter, plus a margin for a loaded machine; and not before the deadline.
    let closed_after =
        closed_after.or_else(|| read_until_closed(&mut s, opened + Duration::from_secs(6)).map(|_| opened.elapsed()));
    let took = closed_after.expect("the trickled head's connection is still open");
    assert!(took >= header_timeout, "closed after {took:?}, before the header deadline");
    assert!(took < header_timeout * 5 / 4 + Duration::from_secs(3), "closed after {took:?}");
}

#[test]
fn a_kept_alive_connection_that_keeps_asking_stays_open_past_the_header_deadline() {
    let server = Slidegate::serve(&["--header-read-timeout", "1s"]);
    let addr = addr(&server);
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    // Ten requests 400 ms apart on one connection: four header deadlines' worth, never idle
    // for one.
    for i in 0..10 {
        write!(s, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send");
        let mut answer = [0u8; 512];
        let n = s.read(&mut answer).expect("answer");
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 200"), "request {i} on the kept-alive connection: {answer}");
        std::thread::sleep(Duration::from_millis(400));
    }
}

#[test]
fn a_connection_answered_after_a_slow_request_stays_open_for_the_whole_header_deadline() {
    let server = Slidegate::serve(&["--header-read-timeout", "1s"]);
    let addr = addr(&server);
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let body = r#"{"key": "slow", "limit": 10, "window": "10s"}"#;
    for i in 0..3 {
        // A request whose body comes 400 ms after its head (it spans a tick of the watch), then
        // 850 ms of quiet: under the header deadline counted from the answer.
        write!(s, "POST /v1/check HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n", body.len()).expect("head");
        std::thread::sleep(Duration::from_millis(400));
        s.write_all(body.as_bytes()).expect("body");
        let mut answer = [0u8; 1024];
        let n = s.read(&mut answer).expect("answer");
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 200"), "request {i}: {answer}");
        std::thread::sleep(Duration::from_millis(850));
    }
}

/// A kept-alive connection that has been answered once, tried up to 50 times 50 ms apart.
fn answered_holder(addr: &str, i: usize) -> TcpStream {
    for _ in 0..50 {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut answer = [0u8; 512];
        let sent = write!(s, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        if sent.is_ok() && s.read(&mut answer).is_ok_and(|n| answer[..n].starts_with(b"HTTP/1.1 200")) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("holder {i} was never answered");
}

#[test]
fn connections_over_the_cap_are_refused_at_once_and_a_check_works_when_they_go() {
    let server = Slidegate::serve(&["--max-connections", "20"]);
    let addr = addr(&server);
    // The attack: fill the cap with idle connections, then open 5 more.
    // Each holder is answered once and stays open (kept alive): the server holds all 20. A
    // holder refused while the start-up's health check still held its slot tries again.
    let mut held: Vec<TcpStream> = (0..20).map(|i| answered_holder(addr, i)).collect();
    let refused_by = Instant::now() + Duration::from_secs(5);
    for i in 0..5 {
        let mut extra = TcpStream::connect(addr).expect("the kernel accepts the connection");
        let answer = read_until_closed(&mut extra, refused_by).unwrap_or_else(|| panic!("extra {i} left open"));
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("\"code\":\"too_many_connections\""), "{answer}");
    }
    // The connections within the cap are still served.
    let mut first = held.swap_remove(0);
    write!(first, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("send");
    let answer = read_until_closed(&mut first, Instant::now() + Duration::from_secs(5)).expect("answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // When the holders go, their slots come back.
    drop(held);
    let started = Instant::now();
    loop {
        let (status, _, _) = timed_check(addr);
        if status == "HTTP/1.1 200 OK" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "slots never came back: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = blocking_metrics(addr);
    let refused = metrics
        .lines()
        .find_map(|l| l.strip_prefix("slidegate_http_connections_refused_total "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(refused.is_some_and(|n| n >= 5.0), "the 5 extra connections are counted: {metrics}");
}

#[test]
fn a_body_trickled_a_byte_at_a_time_meets_the_request_deadline() {
    let request_timeout = Duration::from_secs(1);
    let server = Slidegate::serve(&["--request-timeout", "1s"]);
    let addr = addr(&server);
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/check HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    .expect("head");
    // The attack: a valid head, then one byte of body every 100 ms, never finishing in time.
    let mut writer = s.try_clone().expect("clone");
    let trickle = std::thread::spawn(move || {
        for _ in 0..100 {
            if writer.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let sent = Instant::now();
    let answer = read_until_closed(&mut s, sent + request_timeout + Duration::from_secs(5)).expect("closed in time");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    trickle.join().expect("trickle");
    let (status, answer, _) = timed_check(addr);
    assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");
}

#[test]
fn a_request_head_over_16_kib_is_refused_and_the_server_keeps_serving() {
    let server = Slidegate::serve(&[]);
    let addr = addr(&server);
    // The attack: a head of 64 KiB (hyper alone would buffer ~400 KiB per connection).
    let mut s = TcpStream::connect(addr).expect("connect");
    let padding = "a".repeat(64 * 1024);
    // The server may close while the head is still being sent: only its answer matters.
    let _ = write!(s, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nX-Padding: {padding}\r\n\r\n");
    let answer = read_until_closed(&mut s, Instant::now() + Duration::from_secs(5)).expect("closed");
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(!answer.contains("200 OK"), "{answer}");
    let (status, answer, _) = timed_check(addr);
    assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");
}

fn blocking_metrics(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("send");
    read_until_closed(&mut s, Instant::now() + Duration::from_secs(5)).expect("metrics")
}
