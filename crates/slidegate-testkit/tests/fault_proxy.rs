//! The fault proxy does what each fault says, against a real redis-server spoken to over a
//! plain socket: delays measured, held bytes delivered in order once healed, a half-open
//! connection forwarding one way only, resets seen as resets, and a drop that ends every thread.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use slidegate_testkit::{Direction, Fault, FaultProxy, RedisServer, TICK};

/// Scheduling delay a loaded 2-core machine may add to a measured delay.
const SLACK: Duration = Duration::from_millis(100);

fn client(proxy: &FaultProxy) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect to the proxy");
    s.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    s
}

/// Sends `ECHO word` as RESP and returns when it was sent.
fn echo(s: &mut TcpStream, word: &str) -> Instant {
    let cmd = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{word}\r\n", word.len());
    s.write_all(cmd.as_bytes()).expect("write");
    Instant::now()
}

/// Reads until `expected` bytes came, or the read timeout.
fn read_exactly(s: &mut TcpStream, expected: usize) -> std::io::Result<String> {
    let mut buf = vec![0; expected];
    s.read_exact(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn reply(word: &str) -> String {
    format!("${}\r\n{word}\r\n", word.len())
}

#[test]
fn latency_delays_each_way_and_keeps_order_under_jitter() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::to_port(redis.port());
    let mut s = client(&proxy);
    let sent = echo(&mut s, "fast");
    assert_eq!(read_exactly(&mut s, reply("fast").len()).expect("reply"), reply("fast"));
    let fast = sent.elapsed();
    proxy.set(Fault::Latency { delay: Duration::from_millis(40), jitter: Duration::ZERO });
    let sent = echo(&mut s, "slow");
    assert_eq!(read_exactly(&mut s, reply("slow").len()).expect("reply"), reply("slow"));
    let slow = sent.elapsed();
    assert!(slow >= Duration::from_millis(80) && slow <= Duration::from_millis(80) + SLACK, "{fast:?} then {slow:?}");
    // Jitter as large as the delay: 20 commands written apart still come back in order.
    proxy.set(Fault::Latency { delay: Duration::from_millis(20), jitter: Duration::from_millis(20) });
    let words: Vec<String> = (0..20).map(|i| format!("w{i:02}")).collect();
    for w in &words {
        echo(&mut s, w);
        std::thread::sleep(Duration::from_millis(2));
    }
    let all: String = words.iter().map(|w| reply(w)).collect();
    assert_eq!(read_exactly(&mut s, all.len()).expect("replies"), all);
}

#[test]
fn a_lost_chunk_arrives_after_the_retransmit_delay() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::to_port(redis.port());
    let mut s = client(&proxy);
    proxy.set(Fault::Loss { ratio: 1.0, retransmit: Duration::from_millis(100) });
    let sent = echo(&mut s, "lost");
    assert_eq!(read_exactly(&mut s, reply("lost").len()).expect("reply"), reply("lost"));
    let took = sent.elapsed();
    // Lost both ways, sent again both ways.
    assert!(took >= Duration::from_millis(200) && took <= Duration::from_millis(200) + SLACK, "{took:?}");
}

#[test]
fn a_blackhole_holds_everything_and_delivers_it_in_order_once_healed() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::to_port(redis.port());
    let mut s = client(&proxy);
    proxy.set(Fault::Blackhole);
    echo(&mut s, "one");
    echo(&mut s, "two");
    s.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    let silent = read_exactly(&mut s, 1).expect_err("nothing passes a blackhole");
    assert!(matches!(silent.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{silent}");
    assert_eq!(redis.query::<String>(&["CLIENT", "LIST"]).lines().filter(|l| l.contains("cmd=echo")).count(), 0);
    proxy.set(Fault::Pass);
    s.set_read_timeout(Some(Duration::from_secs(3))).expect("timeout");
    let both = reply("one") + &reply("two");
    assert_eq!(read_exactly(&mut s, both.len()).expect("held replies"), both);
    assert_eq!(proxy.accepted(), 1, "the same connection, kept open");
}

#[test]
fn a_half_open_connection_forwards_one_way_only() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::to_port(redis.port());
    let mut s = client(&proxy);
    s.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    let set = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
    // Requests pass, replies do not: Redis ran the command, the client never hears.
    proxy.set(Fault::HalfOpen(Direction::ToServer));
    s.write_all(set).expect("write");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(redis.query::<Option<String>>(&["GET", "k"]).as_deref(), Some("v"));
    assert!(read_exactly(&mut s, 1).is_err(), "no reply comes back");
    proxy.set(Fault::Pass);
    assert_eq!(read_exactly(&mut s, 5).expect("the held reply"), "+OK\r\n");
    // Replies pass, requests do not: nothing runs until healed.
    proxy.set(Fault::HalfOpen(Direction::ToClient));
    s.write_all(b"*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n").expect("write");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(redis.query::<Option<String>>(&["GET", "k"]).as_deref(), Some("v"), "DEL held");
    proxy.set(Fault::Pass);
    assert_eq!(read_exactly(&mut s, 4).expect("the reply"), ":1\r\n");
}

#[test]
fn reset_resets_open_and_new_connections_and_pass_lets_new_ones_through() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::to_port(redis.port());
    let mut open = client(&proxy);
    echo(&mut open, "hi");
    assert_eq!(read_exactly(&mut open, reply("hi").len()).expect("reply"), reply("hi"));
    proxy.set(Fault::Reset);
    let e = read_exactly(&mut open, 1).expect_err("reset");
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "an RST, not an orderly close: {e}");
    let mut new = client(&proxy);
    let e = read_exactly(&mut new, 1).expect_err("reset");
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    proxy.set(Fault::Pass);
    let mut after = client(&proxy);
    echo(&mut after, "back");
    assert_eq!(read_exactly(&mut after, reply("back").len()).expect("reply"), reply("back"));
    assert_eq!(proxy.accepted(), 3);
}

#[test]
fn dropping_the_proxy_ends_its_threads_even_with_bytes_held() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::to_port(redis.port());
    let mut s = client(&proxy);
    proxy.set(Fault::Blackhole);
    echo(&mut s, "held");
    let t = Instant::now();
    drop(proxy);
    assert!(t.elapsed() <= 4 * TICK + SLACK, "dropped in {:?}", t.elapsed());
    // The client's connection ends with the proxy.
    assert!(read_exactly(&mut s, 1).is_err());
}
