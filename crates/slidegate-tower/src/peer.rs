//! The client's IP address as a key: the TCP peer's, or — behind proxies the operator names,
//! from the one forwarding header those proxies write — the forwarded client's; IPv6 clients
//! counted by their network prefix.

use std::net::{IpAddr, SocketAddr};

use http::HeaderName;
use http::request::Parts;
use slidegate::client_ip::{self, HopSyntax, canonical};

use crate::key::KeyExtractor;
use crate::{Error, Rejection};

/// The longest forwarding header read (all its field lines together); anything longer is
/// refused with `431 header_too_long` before it is parsed.
pub use slidegate::client_ip::MAX_FORWARDED_LEN;
pub use slidegate::client_ip::{DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX, TrustedProxies};

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

    fn syntax(self) -> HopSyntax {
        match self {
            Self::Forwarded => HopSyntax::Forwarded,
            Self::XForwardedFor => HopSyntax::Addresses,
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
        Ok(PeerIpBehind(TrustedProxies::parse(trusted).map_err(|e| Error::InvalidProxy(e.0))?))
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
                let lines = || request.headers.get_all(header.name()).into_iter().map(http::HeaderValue::as_bytes);
                let client = client_ip::forwarded_client(lines, header.syntax(), trusted, peer);
                client.map(Some).map_err(|_| Rejection::HeaderTooLong)
            }
            _ => Ok(Some(peer)),
        }
    }
}

fn check_prefix(family: &'static str, bits: u8, max: u8) -> Result<(), Error> {
    if (1..=max).contains(&bits) { Ok(()) } else { Err(Error::InvalidPrefix { family, bits, max }) }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, request: &Parts, out: &mut String) -> Result<bool, Rejection> {
        let Some(ip) = self.client_ip(request)? else { return Ok(false) };
        client_ip::write_key(ip, self.ipv4_prefix, self.ipv6_prefix, out);
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
