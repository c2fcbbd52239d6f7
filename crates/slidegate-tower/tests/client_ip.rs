//! Client identity under attack: each test is a client trying to choose its own key (or to
//! crash the parser) through forwarding headers, followed by the key the layer actually charged
//! — read back from the limiter — which is never one the client chose.

mod support;

use slidegate::{Limiter, MemoryBackend};
use slidegate_tower::peer::{DEFAULT_IPV6_PREFIX, MAX_FORWARDED_LEN};
use slidegate_tower::{Error, ForwardedHeader, PeerIp, RateLimitLayer};
use support::{App, charged, error_code, rule};

const LIMIT: u64 = 100;
/// An address the attacker would like to be counted as.
const CHOSEN: &str = "198.51.100.66";

fn app(key: PeerIp) -> (App, Limiter<MemoryBackend>) {
    let limiter = Limiter::in_memory();
    let layer = RateLimitLayer::new(limiter.clone()).rule(rule("ip", LIMIT).key(key)).expect("layer");
    (App::new(layer), limiter)
}

/// Proxies on 10.0.0.0/8 that write `header`.
fn behind(header: ForwardedHeader) -> PeerIp {
    PeerIp::behind(["10.0.0.0/8"]).expect("valid").forwarded_by(header)
}

/// Sends one request and asserts it was admitted and counted as `expected` — and not as the
/// attacker's `CHOSEN` address.
async fn assert_keyed(key: PeerIp, peer: &str, headers: &[(&str, &[u8])], expected: &str) {
    let (app, limiter) = app(key);
    let answer = app.send("/", peer, headers).await;
    let shown: Vec<(&str, String)> =
        headers.iter().map(|(k, v)| (*k, String::from_utf8_lossy(v).into_owned())).collect();
    assert_eq!(answer.status, 200, "{shown:?}: {answer:?}");
    assert_eq!(charged(&limiter, &format!("ip:{{{expected}}}"), LIMIT).await, 1, "{shown:?} counted as {expected}");
    assert_eq!(charged(&limiter, &format!("ip:{{{CHOSEN}}}"), LIMIT).await, 0, "{shown:?}: not the client's choice");
}

#[tokio::test]
async fn client_sent_x_forwarded_for_without_a_trusted_proxy_is_ignored() {
    let spoof: &[(&str, &[u8])] = &[("x-forwarded-for", CHOSEN.as_bytes()), ("forwarded", b"for=198.51.100.66")];
    // No proxies named: forwarding headers are never read.
    assert_keyed(PeerIp::new(), "203.0.113.9:5000", spoof, "203.0.113.9").await;
    // Proxies named, but this peer is not one of them.
    assert_keyed(behind(ForwardedHeader::XForwardedFor), "203.0.113.9:5000", spoof, "203.0.113.9").await;
    assert_keyed(behind(ForwardedHeader::Forwarded), "203.0.113.9:5000", spoof, "203.0.113.9").await;
}

#[tokio::test]
async fn client_sent_forwarded_behind_an_x_forwarded_for_proxy_is_ignored() {
    // The proxy appends the client's address to X-Forwarded-For and passes `Forwarded` on as
    // the client wrote it.
    let headers: &[(&str, &[u8])] = &[("forwarded", b"for=198.51.100.66"), ("x-forwarded-for", b"203.0.113.9")];
    assert_keyed(behind(ForwardedHeader::XForwardedFor), "10.0.0.2:5000", headers, "203.0.113.9").await;
    // Without the proxy's header, the proxy itself is the client, not the `Forwarded` claim.
    let only_forwarded: &[(&str, &[u8])] = &[("forwarded", b"for=198.51.100.66")];
    assert_keyed(behind(ForwardedHeader::XForwardedFor), "10.0.0.2:5000", only_forwarded, "10.0.0.2").await;
}

#[tokio::test]
async fn client_sent_x_forwarded_for_behind_a_forwarded_proxy_is_ignored() {
    let headers: &[(&str, &[u8])] = &[("x-forwarded-for", CHOSEN.as_bytes()), ("forwarded", b"for=203.0.113.9")];
    assert_keyed(behind(ForwardedHeader::Forwarded), "10.0.0.2:5000", headers, "203.0.113.9").await;
}

#[tokio::test]
async fn a_forged_left_most_entry_loses_to_the_right_most_untrusted_one() {
    let xff = behind(ForwardedHeader::XForwardedFor);
    // The client wrote the first entry; the proxy appended the address it saw.
    let forged = format!("{CHOSEN}, 203.0.113.9");
    assert_keyed(xff.clone(), "10.0.0.2:5000", &[("x-forwarded-for", forged.as_bytes())], "203.0.113.9").await;
    // Through two trusted proxies, and with the forged entry on a field line of its own.
    let two_hops = format!("{CHOSEN}, 10.1.2.3, 203.0.113.9, 10.0.0.7");
    assert_keyed(xff.clone(), "10.0.0.2:5000", &[("x-forwarded-for", two_hops.as_bytes())], "203.0.113.9").await;
    let lines: &[(&str, &[u8])] = &[("x-forwarded-for", CHOSEN.as_bytes()), ("x-forwarded-for", b"203.0.113.9")];
    assert_keyed(xff, "10.0.0.2:5000", lines, "203.0.113.9").await;
    let forwarded = format!(r#"for={CHOSEN};proto=https, for="[2001:db8:1:2::5]:4711";proto=https, for=10.0.0.7"#);
    let rfc: &[(&str, &[u8])] = &[("forwarded", forwarded.as_bytes())];
    assert_keyed(behind(ForwardedHeader::Forwarded), "10.0.0.2:5000", rfc, "2001:db8:1:2::/64").await;
}

#[tokio::test]
async fn a_chain_of_only_trusted_proxies_is_keyed_by_its_left_most_hop() {
    // An internal caller inside the trusted network: the first proxy saw 10.0.0.5.
    let chain: &[(&str, &[u8])] = &[("x-forwarded-for", b"10.0.0.5, 10.0.0.7")];
    assert_keyed(behind(ForwardedHeader::XForwardedFor), "10.0.0.2:5000", chain, "10.0.0.5").await;
}

#[tokio::test]
async fn malformed_entries_yield_the_last_trusted_hop_never_the_claim_beyond() {
    // Each malformed entry sits between the client's claim (left) and a trusted proxy (right):
    // the claim must not be reached by skipping it, and nothing may panic.
    let malformed: [&[u8]; 14] = [
        b"not-an-ip",
        b"unknown",
        b"_hidden",
        b"",
        b"198.51.100.66:99999",
        b"[198.51.100.66]",
        b"[2001:db8::1",
        b"2001:db8::1]",
        b"[[2001:db8::1]]:80",
        b"1.2.3.4.5",
        b"999.1.1.1",
        b"\xff\xfe",
        b"\"198.51.100.66\"",
        b"198.51.100.66 203.0.113.1",
    ];
    for entry in malformed {
        let mut xff = format!("{CHOSEN}, ").into_bytes();
        xff.extend_from_slice(entry);
        xff.extend_from_slice(b", 10.0.0.7");
        let key = behind(ForwardedHeader::XForwardedFor);
        assert_keyed(key.clone(), "10.0.0.2:5000", &[("x-forwarded-for", &xff)], "10.0.0.7").await;
        // Written as the last entry, the peer itself stands for the client.
        let mut last = format!("{CHOSEN}, ").into_bytes();
        last.extend_from_slice(entry);
        assert_keyed(key, "10.0.0.2:5000", &[("x-forwarded-for", &last)], "10.0.0.2").await;
    }
    let forwarded: [&[u8]; 7] = [
        b"for=unknown",
        b"for=_hidden",
        b"for=\"_hidden:_port\"",
        b"proto=https",
        b"for=203.0.113.1;for=203.0.113.2",
        b"for=\"[2001:db8::1]",
        b"for=\"198.51.100.66",
    ];
    for element in forwarded {
        let mut header = format!("for={CHOSEN}, ").into_bytes();
        header.extend_from_slice(element);
        header.extend_from_slice(b", for=10.0.0.7");
        let key = behind(ForwardedHeader::Forwarded);
        assert_keyed(key, "10.0.0.2:5000", &[("forwarded", &header)], "10.0.0.7").await;
    }
    // Ports and brackets a proxy may legitimately write are read, not refused.
    let ported: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.66, 203.0.113.9:4711")];
    assert_keyed(behind(ForwardedHeader::XForwardedFor), "10.0.0.2:5000", ported, "203.0.113.9").await;
    let bracketed: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.66, [2001:db8:1:2::7]:443")];
    assert_keyed(behind(ForwardedHeader::XForwardedFor), "10.0.0.2:5000", bracketed, "2001:db8:1:2::/64").await;
}

#[tokio::test]
async fn two_ipv6_addresses_in_one_64_share_a_key() {
    assert_eq!(DEFAULT_IPV6_PREFIX, 64);
    let limiter = Limiter::in_memory();
    let layer = RateLimitLayer::new(limiter.clone()).rule(rule("ip", 2)).expect("layer");
    let app = App::new(layer);
    // One host rotating through its /64's addresses gets one limit.
    let mut statuses = Vec::new();
    for peer in ["[2001:db8:1:2::1]:5000", "[2001:db8:1:2:aaaa::9]:5000", "[2001:db8:1:2:ffff:ffff:ffff:ffff]:5000"] {
        statuses.push(app.send("/", peer, &[]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(charged(&limiter, "ip:{2001:db8:1:2::/64}", 2).await, 2);
    // The next /64 is someone else.
    assert_eq!(app.send("/", "[2001:db8:1:3::1]:5000", &[]).await.status, 200);
    // IPv4 clients of a dual-stack listener are counted by their IPv4 address, not lumped
    // together in `::ffff:0:0`'s /64.
    assert_eq!(app.send("/", "[::ffff:203.0.113.9]:5000", &[]).await.status, 200);
    assert_eq!(app.send("/", "[::ffff:203.0.113.10]:5000", &[]).await.status, 200);
    assert_eq!(charged(&limiter, "ip:{203.0.113.9}", 2).await, 1);
}

#[tokio::test]
async fn prefixes_are_configurable_and_checked() {
    let wide = PeerIp::new().ipv6_prefix(48).and_then(|p| p.ipv4_prefix(24)).expect("valid prefixes");
    assert_keyed(wide.clone(), "[2001:db8:1:2::1]:5000", &[], "2001:db8:1::/48").await;
    assert_keyed(wide, "203.0.113.9:5000", &[], "203.0.113.0/24").await;
    assert_keyed(PeerIp::new().ipv6_prefix(128).expect("valid"), "[2001:db8::1]:5000", &[], "2001:db8::1").await;
    for bad in [PeerIp::new().ipv6_prefix(0), PeerIp::new().ipv6_prefix(129), PeerIp::new().ipv4_prefix(33)] {
        assert!(matches!(bad, Err(Error::InvalidPrefix { .. })), "{bad:?}");
    }
    for bad in ["10.0.0.0/33", "proxy.local", "10.0.0.0/8/8", ""] {
        assert!(matches!(PeerIp::behind([bad]), Err(Error::InvalidProxy(_))), "{bad:?}");
    }
}

#[tokio::test]
async fn an_over_long_forwarding_header_is_431_not_a_pass() {
    let (app, limiter) = app(behind(ForwardedHeader::XForwardedFor));
    let mut long = "198.51.100.66, ".repeat(MAX_FORWARDED_LEN / 15);
    long.push_str("203.0.113.9");
    assert!(long.len() > MAX_FORWARDED_LEN);
    let answer = app.send("/", "10.0.0.2:5000", &[("x-forwarded-for", long.as_bytes())]).await;
    assert_eq!(answer.status, 431, "{answer:?}");
    assert_eq!(error_code(&answer), "header_too_long");
    assert_eq!(app.reached(), 0, "the service never saw it");
    assert_eq!(charged(&limiter, "ip:{203.0.113.9}", LIMIT).await, 0);
    assert_eq!(charged(&limiter, "ip:{10.0.0.2}", LIMIT).await, 0);
    // Split over many field lines, the same.
    let lines: Vec<(&str, &[u8])> =
        (0..=MAX_FORWARDED_LEN / 11).map(|_| ("x-forwarded-for", &b"203.0.113.9"[..])).collect();
    assert_eq!(app.send("/", "10.0.0.2:5000", &lines).await.status, 431);
    // From a peer that is not a trusted proxy the header is not read at all: the peer counts.
    let answer = app.send("/", "203.0.113.50:5000", &[("x-forwarded-for", long.as_bytes())]).await;
    assert_eq!(answer.status, 200);
    assert_eq!(charged(&limiter, "ip:{203.0.113.50}", LIMIT).await, 1);
}
