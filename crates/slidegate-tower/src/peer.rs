//! The client's IP address as a key: the TCP peer's, or — behind proxies the operator names,
//! from the one forwarding header those proxies write — the forwarded client's; IPv6 clients
//! counted by their network prefix.

use std::fmt::Write;
use std::net::{IpAddr, SocketAddr};

use http::HeaderName;
use http::request::Parts;
use ipnet::IpNet;

use crate::key::KeyExtractor;
use crate::{Error, Rejection};

/// The longest forwarding header read, in bytes (all its field lines together). Proxies
/// write a few dozen bytes per hop; anything longer is refused with `431 header_too_long`
/// before it is parsed.
pub const MAX_FORWARDED_LEN: usize = 4096;

/// The default prefix length IPv6 clients are counted by: one customer's network is commonly
/// a /64 (or wider), whose addresses its hosts pick at will — counting single addresses would
/// hand each of them 2^64 fresh limits.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The default prefix length IPv4 clients are counted by: the full address.
pub const DEFAULT_IPV4_PREFIX: u8 = 32;

/// The one header the trusted proxies write the client's address into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// RFC 7239 `Forwarded: for=…` (`for=192.0.2.1`, `for="[2001:db8::1]:443"`).
    Forwarded,
    /// `X-Forwarded-For: client, proxy1, …`.
    XForwardedFor,
}

impl ForwardedHeader {
    fn name(self) -> HeaderName {
        // A constant: `from_static` validates its argument each time it runs.
        const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
        match self {
            Self::Forwarded => http::header::FORWARDED,
            Self::XForwardedFor => X_FORWARDED_FOR,
        }
    }
}

/// The client's IP address (the default key of a [`crate::Rule`]). By default the TCP peer's:
/// `X-Forwarded-For` and `Forwarded` are ignored, since any client can send them. Behind
/// proxies you run, name them and the one header they write:
/// `PeerIp::behind(["10.0.0.0/8"])?.forwarded_by(ForwardedHeader::XForwardedFor)`. When the
/// peer is one of them, that header is read from the right: the first address that is not a
/// trusted proxy is the client; the other header is never read.
///
/// IPv6 clients are counted by their /64 ([`DEFAULT_IPV6_PREFIX`], see
/// [`PeerIp::ipv6_prefix`]), IPv4 clients by their address; IPv4-mapped IPv6 addresses
/// (`::ffff:192.0.2.1`, from a dual-stack listener) count as IPv4.
///
/// The peer comes from axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or a `SocketAddr` request extension;
/// without either the request has no key.
#[derive(Debug, Clone)]
pub struct PeerIp {
    proxies: Option<(TrustedProxies, ForwardedHeader)>,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self { proxies: None, ipv4_prefix: DEFAULT_IPV4_PREFIX, ipv6_prefix: DEFAULT_IPV6_PREFIX }
    }
}

/// Trusted proxies whose forwarding header is not named yet: name it with
/// [`PeerIpBehind::forwarded_by`] to get the [`PeerIp`] key. (A proxy that writes
/// `X-Forwarded-For` passes on a client's own `Forwarded` untouched, and vice versa, so
/// reading the wrong one would let clients choose their key.)
#[derive(Debug, Clone)]
#[must_use = "name the header the proxies write with .forwarded_by(..)"]
pub struct PeerIpBehind(TrustedProxies);

impl PeerIpBehind {
    /// The client as `header` names it, read when the peer is a trusted proxy.
    pub fn forwarded_by(self, header: ForwardedHeader) -> PeerIp {
        PeerIp { proxies: Some((self.0, header)), ..PeerIp::default() }
    }
}

impl PeerIp {
    /// The TCP peer's address; forwarding headers are never read.
    pub fn new() -> Self {
        Self::default()
    }

    /// The client behind `trusted` proxies (addresses or CIDR blocks: `10.0.0.0/8`, `::1`);
    /// then [`PeerIpBehind::forwarded_by`] names the header they write.
    pub fn behind<I, S>(trusted: I) -> Result<PeerIpBehind, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(PeerIpBehind(TrustedProxies::parse(trusted)?))
    }

    /// Counts IPv6 clients by their first `bits` (1 to 128; default [`DEFAULT_IPV6_PREFIX`]).
    pub fn ipv6_prefix(self, bits: u8) -> Result<Self, Error> {
        check_prefix("IPv6", bits, 128)?;
        Ok(Self { ipv6_prefix: bits, ..self })
    }

    /// Counts IPv4 clients by their first `bits` (1 to 32; default [`DEFAULT_IPV4_PREFIX`]).
    pub fn ipv4_prefix(self, bits: u8) -> Result<Self, Error> {
        check_prefix("IPv4", bits, 32)?;
        Ok(Self { ipv4_prefix: bits, ..self })
    }

    /// The client's address: `Ok(None)` when the peer is unknown, `Err` when the forwarding
    /// header is longer than [`MAX_FORWARDED_LEN`].
    pub fn client_ip(&self, request: &Parts) -> Result<Option<IpAddr>, Rejection> {
        let Some(peer) = peer_addr(request) else { return Ok(None) };
        let peer = canonical(peer.ip());
        match &self.proxies {
            Some((trusted, header)) if trusted.contains(peer) => {
                forwarded_client(request, trusted, *header, peer).map(Some)
            }
            _ => Ok(Some(peer)),
        }
    }

    /// The key of `ip`: the address, or its network (`2001:db8:1:2::/64`) under a prefix.
    fn write_key(&self, ip: IpAddr, out: &mut String) {
        let bits = if ip.is_ipv4() { self.ipv4_prefix } else { self.ipv6_prefix };
        let _ = match IpNet::new(ip, bits) {
            Ok(net) if bits < net.max_prefix_len() => write!(out, "{}", net.trunc()),
            _ => write!(out, "{ip}"),
        };
    }
}

fn check_prefix(family: &'static str, bits: u8, max: u8) -> Result<(), Error> {
    if (1..=max).contains(&bits) { Ok(()) } else { Err(Error::InvalidPrefix { family, bits, max }) }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, request: &Parts, out: &mut String) -> Result<bool, Rejection> {
        let Some(ip) = self.client_ip(request)? else { return Ok(false) };
        self.write_key(ip, out);
        Ok(true)
    }
}

fn peer_addr(request: &Parts) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = request.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(*addr);
    }
    request.extensions.get::<SocketAddr>().copied()
}

/// IPv4-mapped IPv6 as IPv4: the same client, whichever socket family accepted it.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client that trusted `peer` forwards, read from `header` right to left: each hop was
/// written by the proxy to its right, so the first address that is not a trusted proxy is the
/// client, and everything left of it is the client's own claim. A hop that is not an address
/// (`unknown`, `_hidden`, garbage) ends the walk: the last trusted hop stands for the client.
fn forwarded_client(
    request: &Parts,
    trusted: &TrustedProxies,
    header: ForwardedHeader,
    peer: IpAddr,
) -> Result<IpAddr, Rejection> {
    let lines = request.headers.get_all(header.name());
    let len: usize = lines.iter().map(|v| v.len()).sum();
    if len > MAX_FORWARDED_LEN {
        return Err(Rejection::HeaderTooLong);
    }
    let mut client = peer;
    // The last field line first, each from its end. Commas are split without regard to
    // quotes: a trusted proxy's own hops never quote one, and a client's stray quote must not
    // be able to swallow them.
    let hops = lines.iter().rev().flat_map(|line| line.as_bytes().rsplit(|&b| b == b','));
    for hop in hops {
        let ip = std::str::from_utf8(hop).ok().and_then(|h| match header {
            ForwardedHeader::XForwardedFor => parse_node(h.trim()),
            ForwardedHeader::Forwarded => forwarded_for(h).and_then(parse_node),
        });
        let Some(ip) = ip.map(canonical) else { break };
        client = ip;
        if !trusted.contains(ip) {
            break;
        }
    }
    Ok(client)
}

/// The `for` parameter of one `Forwarded` element (`for=…;proto=…;by=…`), unquoted; `None`
/// when absent or given twice.
fn forwarded_for(element: &str) -> Option<&str> {
    let mut values = element.split(';').filter_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
    });
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    match value.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"'),
        None => Some(value),
    }
}

/// `192.0.2.1`, `192.0.2.1:80`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:443`; anything
/// else (`unknown`, `_hidden`, a name, a bad port or bracket) is `None`.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse() {
        return Some(ip);
    }
    if let Ok(addr) = node.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    node.strip_prefix('[')?.strip_suffix(']')?.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
}

/// Addresses and CIDR blocks of proxies whose forwarding header is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses `10.0.0.0/8`, `192.168.1.7`, `fd00::/8`, `::1`.
    pub fn parse<I, S>(blocks: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let parse = |s: &str| -> Option<IpNet> {
            let s = s.trim();
            s.parse::<IpNet>().ok().or_else(|| s.parse::<IpAddr>().ok().map(|ip| IpNet::from(canonical(ip))))
        };
        let blocks =
            blocks.into_iter().map(|b| parse(b.as_ref()).ok_or_else(|| Error::InvalidProxy(b.as_ref().to_owned())));
        Ok(Self(blocks.collect::<Result<_, _>>()?))
    }

    /// Whether `ip` is one of these proxies.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn proxy_blocks_parse_and_match() {
        let t = TrustedProxies::parse(["10.0.0.0/8", "192.168.1.7", "fd00::/8", " ::1 "]).expect("valid");
        assert!(t.contains(ip("10.200.0.1")) && t.contains(ip("192.168.1.7")) && t.contains(ip("fd12::1")));
        assert!(!t.contains(ip("11.0.0.1")) && !t.contains(ip("192.168.1.8")) && t.contains(ip("::1")));
        assert!(t.contains(ip("::ffff:10.1.2.3")), "IPv4-mapped IPv6 is the IPv4 address");
        let mapped = TrustedProxies::parse(["::ffff:10.9.9.9"]).expect("valid");
        assert!(mapped.contains(ip("10.9.9.9")));
    }

    #[test]
    fn nodes_parse_only_when_they_are_addresses() {
        assert_eq!(parse_node("192.0.2.1:80"), Some(ip("192.0.2.1")));
        assert_eq!(parse_node("[2001:db8::1]"), Some(ip("2001:db8::1")));
        assert_eq!(parse_node("[2001:db8::1]:443"), Some(ip("2001:db8::1")));
        for bad in ["unknown", "_hidden", "[192.0.2.1]", "192.0.2.1:", "[2001:db8::1]:", "host.example"] {
            assert_eq!(parse_node(bad), None, "{bad}");
        }
        assert_eq!(forwarded_for(r#" For="[2001:db8::1]:443" ;proto=https"#), Some("[2001:db8::1]:443"));
        assert_eq!(forwarded_for("for=1.2.3.4;for=5.6.7.8"), None, "given twice");
        assert_eq!(forwarded_for(r#"for="1.2.3.4"#), None, "unterminated quote");
    }
}
