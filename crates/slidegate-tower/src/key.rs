//! What a request is counted as: its client IP, a header, the authenticated user, the route, or
//! anything a closure computes — alone or combined.

use std::fmt::Display;
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};

use http::HeaderName;
use http::request::Parts;

use crate::Error;

/// Computes a request's key for a rule. Built-in: [`PeerIp`], [`Header`], [`Extension`],
/// [`Route`]; any `Fn(&Parts) -> Option<String>` is one too; a pair `(A, B)` combines two
/// (`a|b`).
pub trait KeyExtractor: Send + Sync + 'static {
    /// Appends this request's key to `out`; `false` when the request has none (then the rule
    /// does not apply to it: an anonymous request is not limited by a per-user rule).
    fn extract(&self, request: &Parts, out: &mut String) -> bool;
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract(&self, request: &Parts, out: &mut String) -> bool {
        self(request).map(|k| out.push_str(&k)).is_some()
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for (A, B) {
    fn extract(&self, request: &Parts, out: &mut String) -> bool {
        if !self.0.extract(request, out) {
            return false;
        }
        out.push('|');
        self.1.extract(request, out)
    }
}

/// The client's IP address. By default the TCP peer's address — `X-Forwarded-For` and
/// `Forwarded` are ignored, since any client can send them. Behind proxies you run, list them
/// ([`PeerIp::behind`]): when the peer is a trusted proxy, the forwarded chain is read from the
/// right and the first address that is not a trusted proxy is the client.
///
/// The peer comes from axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or a `SocketAddr` request extension.
#[derive(Debug, Clone, Default)]
pub struct PeerIp {
    trusted: TrustedProxies,
}

impl PeerIp {
    /// The TCP peer's address; forwarding headers are never trusted.
    pub fn new() -> Self {
        Self::default()
    }

    /// The client behind `trusted` proxies (addresses or CIDR blocks: `10.0.0.0/8`, `::1`).
    pub fn behind<I, S>(trusted: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self { trusted: TrustedProxies::parse(trusted)? })
    }

    /// The client's address, or `None` when the peer is unknown.
    pub fn client_ip(&self, request: &Parts) -> Option<IpAddr> {
        let peer = peer_addr(request)?.ip();
        if !self.trusted.contains(peer) {
            return Some(peer);
        }
        let chain = forwarded_chain(request);
        // Right to left: each hop was appended by the proxy before it; the first address that
        // is not one of ours is the client. Addresses further left are the client's own claims.
        Some(
            chain
                .iter()
                .rev()
                .copied()
                .find(|ip| !self.trusted.contains(*ip))
                .or(chain.first().copied())
                .unwrap_or(peer),
        )
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, request: &Parts, out: &mut String) -> bool {
        use std::fmt::Write;
        self.client_ip(request).is_some_and(|ip| write!(out, "{ip}").is_ok())
    }
}

fn peer_addr(request: &Parts) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = request.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(*addr);
    }
    request.extensions.get::<SocketAddr>().copied()
}

/// The addresses of `Forwarded` (RFC 7239 `for=`) or, when absent, `X-Forwarded-For`, oldest
/// first. An entry that is not an address (`unknown`, an obfuscated name, garbage) ends the
/// chain there: nothing to its left can be attributed.
fn forwarded_chain(request: &Parts) -> Vec<IpAddr> {
    let headers = &request.headers;
    let forwarded: Vec<&str> =
        headers.get_all(http::header::FORWARDED).iter().filter_map(|v| v.to_str().ok()).collect();
    let entries: Vec<String> = if forwarded.is_empty() {
        let xff = headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok());
        xff.flat_map(|v| v.split(',')).map(|s| s.trim().to_owned()).collect()
    } else {
        forwarded
            .iter()
            .flat_map(|v| v.split(','))
            .filter_map(|element| {
                element.split(';').find_map(|pair| {
                    let (k, v) = pair.trim().split_once('=')?;
                    k.eq_ignore_ascii_case("for").then(|| v.trim().trim_matches('"').to_owned())
                })
            })
            .collect()
    };
    let mut chain: Vec<IpAddr> = Vec::with_capacity(entries.len());
    for entry in entries.iter().rev() {
        match parse_hop(entry) {
            Some(ip) => chain.push(ip),
            None => break,
        }
    }
    chain.reverse();
    chain
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:443`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse() {
        return Some(ip);
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    hop.strip_prefix('[')?.split_once(']')?.0.parse().ok()
}

/// Addresses and CIDR blocks of proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<(IpAddr, u8)>);

impl TrustedProxies {
    /// Parses `10.0.0.0/8`, `192.168.1.7`, `fd00::/8`, `::1`.
    pub fn parse<I, S>(blocks: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let parse = |s: &str| -> Option<(IpAddr, u8)> {
            let (ip, bits) = match s.split_once('/') {
                Some((ip, bits)) => (ip.parse::<IpAddr>().ok()?, bits.parse::<u8>().ok()?),
                None => {
                    let ip: IpAddr = s.parse().ok()?;
                    (ip, if ip.is_ipv4() { 32 } else { 128 })
                }
            };
            (bits <= if ip.is_ipv4() { 32 } else { 128 }).then_some((ip, bits))
        };
        let blocks = blocks
            .into_iter()
            .map(|b| parse(b.as_ref().trim()).ok_or_else(|| Error::InvalidProxy(b.as_ref().to_owned())));
        Ok(Self(blocks.collect::<Result<_, _>>()?))
    }

    /// Whether `ip` is one of these proxies.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|&(net, bits)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(u128::from(n.to_bits()), u128::from(a.to_bits()), 32, bits),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(n.to_bits(), a.to_bits(), 128, bits),
            _ => false,
        })
    }
}

fn prefix_eq(net: u128, addr: u128, width: u32, bits: u8) -> bool {
    let shift = width - u32::from(bits);
    shift >= width || (net >> shift) == (addr >> shift)
}

/// The value of a request header (for example an API key, `x-api-key`).
#[derive(Debug, Clone)]
pub struct Header(HeaderName);

impl Header {
    /// The header called `name`.
    pub fn new(name: HeaderName) -> Self {
        Self(name)
    }
}

impl KeyExtractor for Header {
    fn extract(&self, request: &Parts, out: &mut String) -> bool {
        request
            .headers
            .get(&self.0)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(|v| out.push_str(v))
            .is_some()
    }
}

/// A value an earlier layer put in the request's extensions — typically the authenticated user
/// (`Extension::<UserId>::new()`), formatted with `Display`.
pub struct Extension<T>(PhantomData<fn() -> T>);

impl<T> Extension<T> {
    /// The extension of type `T`.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for Extension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for Extension<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(std::any::type_name::<Self>())
    }
}

impl<T: Display + Send + Sync + 'static> KeyExtractor for Extension<T> {
    fn extract(&self, request: &Parts, out: &mut String) -> bool {
        use std::fmt::Write;
        request.extensions.get::<T>().is_some_and(|v| write!(out, "{v}").is_ok())
    }
}

/// The request's path: one limit per endpoint, shared by every client.
#[derive(Debug, Clone, Copy, Default)]
pub struct Route;

impl KeyExtractor for Route {
    fn extract(&self, request: &Parts, out: &mut String) -> bool {
        out.push_str(request.uri.path());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder().uri("/login");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let (mut parts, ()) = b.body(()).expect("request").into_parts();
        parts.extensions.insert(peer.parse::<SocketAddr>().expect("addr"));
        parts
    }

    fn key(e: &impl KeyExtractor, p: &Parts) -> Option<String> {
        let mut out = String::new();
        e.extract(p, &mut out).then_some(out)
    }

    #[test]
    fn forwarding_headers_are_ignored_unless_the_peer_is_trusted() {
        let spoofed = request("203.0.113.9:5000", &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(key(&PeerIp::new(), &spoofed).as_deref(), Some("203.0.113.9"));
        let behind = PeerIp::behind(["10.0.0.0/8"]).expect("valid");
        assert_eq!(key(&behind, &spoofed).as_deref(), Some("203.0.113.9"), "the peer is not a proxy of ours");
        // Client-supplied entries on the left are not believed: the proxy appended the truth.
        let proxied = request("10.0.0.2:5000", &[("x-forwarded-for", "1.1.1.1, 198.51.100.4, 10.0.0.7")]);
        assert_eq!(key(&behind, &proxied).as_deref(), Some("198.51.100.4"));
        let rfc = request("10.0.0.2:5000", &[("forwarded", r#"for="[2001:db8::1]:443";proto=https, for=10.0.0.7"#)]);
        assert_eq!(key(&behind, &rfc).as_deref(), Some("2001:db8::1"));
        let garbage = request("10.0.0.2:5000", &[("x-forwarded-for", "1.1.1.1, not-an-ip, 10.0.0.7")]);
        assert_eq!(key(&behind, &garbage).as_deref(), Some("10.0.0.7"), "nothing left of garbage is believed");
        let no_peer = http::Request::builder().body(()).expect("request").into_parts().0;
        assert_eq!(key(&PeerIp::new(), &no_peer), None);
    }

    #[test]
    fn proxy_blocks_parse_and_match() {
        let t = TrustedProxies::parse(["10.0.0.0/8", "192.168.1.7", "fd00::/8", "0.0.0.0/0"]).expect("valid");
        assert!(t.contains("10.200.0.1".parse().expect("ip")) && t.contains("fd12::1".parse().expect("ip")));
        let t = TrustedProxies::parse(["10.0.0.0/8", "::1"]).expect("valid");
        assert!(!t.contains("11.0.0.1".parse().expect("ip")) && t.contains("::1".parse().expect("ip")));
        assert!(t.contains("::ffff:10.1.2.3".parse().expect("ip")), "IPv4-mapped IPv6");
        assert!(TrustedProxies::parse(["10.0.0.0/33"]).is_err() && TrustedProxies::parse(["proxy.local"]).is_err());
    }

    #[test]
    fn extractors_combine() {
        #[derive(Clone)]
        struct User(u32);
        impl Display for User {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "u{}", self.0)
            }
        }
        let mut p = request("203.0.113.9:1", &[("x-api-key", "k1")]);
        assert_eq!(key(&Extension::<User>::new(), &p), None, "anonymous");
        p.extensions.insert(User(42));
        let both = (Extension::<User>::new(), (Header::new(HeaderName::from_static("x-api-key")), Route));
        assert_eq!(key(&both, &p).as_deref(), Some("u42|k1|/login"));
        let closure = |p: &Parts| p.uri.query().map(str::to_owned);
        assert_eq!(key(&closure, &p), None);
    }
}
