//! `[forward_auth]`: the proxies whose word on the client's address is believed, and the one
//! header they write it in.

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use slidegate::client_ip::{self, ForwardedTooLong, HopSyntax, TrustedProxies};

/// The most entries `trusted_proxies` may have: each request's every forwarded hop is held to
/// each of them, so this bounds that walk; a deployment's proxies fit in a few CIDR blocks.
pub const MAX_TRUSTED_PROXIES: usize = 64;

/// The header trusted proxies write the client's address in (`client_header`). One only: a
/// proxy that writes `X-Forwarded-For` passes a client's own `X-Real-IP` or `Forwarded` on
/// untouched, so believing another header than the one it writes would let clients choose
/// their address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientHeader {
    /// `X-Forwarded-For: client, proxy1, …` (the default: nginx, Caddy, Traefik and HAProxy
    /// all write it).
    #[default]
    XForwardedFor,
    /// `X-Real-IP: client`.
    XRealIp,
    /// RFC 7239 `Forwarded: for=client`.
    Forwarded,
}

impl ClientHeader {
    /// Every header `client_header` may name.
    pub const ALL: [Self; 3] = [Self::XForwardedFor, Self::XRealIp, Self::Forwarded];

    /// The header `name` (case-insensitive) names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| name.eq_ignore_ascii_case(h.name().as_str()))
    }

    /// The header's name.
    pub fn name(self) -> HeaderName {
        // Evaluated at compile time: `from_static` at run time checks its text on every question.
        match self {
            Self::XForwardedFor => const { HeaderName::from_static("x-forwarded-for") },
            Self::XRealIp => const { HeaderName::from_static("x-real-ip") },
            Self::Forwarded => const { HeaderName::from_static("forwarded") },
        }
    }

    fn syntax(self) -> HopSyntax {
        match self {
            Self::Forwarded => HopSyntax::Forwarded,
            Self::XForwardedFor | Self::XRealIp => HopSyntax::Addresses,
        }
    }
}

/// The `[forward_auth]` table. Nothing is trusted by default: the TCP peer is the client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardAuthConfig {
    /// The proxies whose forwarding header is believed.
    pub trusted_proxies: TrustedProxies,
    /// The header they write the client in.
    pub client_header: ClientHeader,
}

impl ForwardAuthConfig {
    /// The client a request from `peer` with `headers` comes from: the peer, unless it is a
    /// trusted proxy; then the client its header names, read right to left past trusted hops.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Result<IpAddr, ForwardedTooLong> {
        let peer = client_ip::canonical(peer);
        if !self.trusted_proxies.contains(peer) {
            return Ok(peer);
        }
        let name = self.client_header.name();
        let lines = || headers.get_all(&name).into_iter().map(HeaderValue::as_bytes);
        client_ip::forwarded_client(lines, self.client_header.syntax(), &self.trusted_proxies, peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v))).collect()
    }

    #[test]
    fn only_a_trusted_peer_s_own_header_names_the_client() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let forged = headers(&[("x-forwarded-for", "198.51.100.66"), ("x-real-ip", "198.51.100.67")]);
        let nothing = ForwardAuthConfig::default();
        assert_eq!(nothing.client(ip("127.0.0.1"), &forged), Ok(ip("127.0.0.1")), "nothing trusted by default");
        let trusted = TrustedProxies::parse(["127.0.0.1/32"]).expect("valid");
        let xff = ForwardAuthConfig { trusted_proxies: trusted.clone(), ..ForwardAuthConfig::default() };
        assert_eq!(xff.client(ip("127.0.0.1"), &forged), Ok(ip("198.51.100.66")));
        assert_eq!(xff.client(ip("192.0.2.9"), &forged), Ok(ip("192.0.2.9")), "an untrusted peer");
        let real = ForwardAuthConfig { trusted_proxies: trusted, client_header: ClientHeader::XRealIp };
        assert_eq!(real.client(ip("::ffff:127.0.0.1"), &forged), Ok(ip("198.51.100.67")));
        assert_eq!(ClientHeader::parse("X-Real-IP"), Some(ClientHeader::XRealIp));
        assert_eq!(ClientHeader::parse("x-client-ip"), None);
    }
}
