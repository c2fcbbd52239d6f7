//! The client's IP address behind proxies: which networks' forwarding headers are believed, how
//! a forwarding header's hops are read, and the key a client's address is counted as (IPv6 by
//! its network). Shared by the HTTP surfaces — the tower layer and the service's forward-auth
//! endpoints — so that both count a client the same way; it reads header values as bytes.

use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ipnet::IpNet;

/// The longest forwarding header read, in bytes (all its field lines together). Proxies write
/// a few dozen bytes per hop; anything longer is refused before it is parsed.
pub const MAX_FORWARDED_LEN: usize = 4096;

/// The default prefix length IPv6 clients are counted by: one customer's network is commonly a
/// /64 (or wider), whose addresses its hosts pick at will — counting single addresses would hand
/// each of them 2^64 fresh limits.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The default prefix length IPv4 clients are counted by: the full address.
pub const DEFAULT_IPV4_PREFIX: u8 = 32;

/// How a forwarding header lists its hops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HopSyntax {
    /// Addresses separated by commas: `X-Forwarded-For: client, proxy1`, `X-Real-IP: client`.
    Addresses,
    /// RFC 7239 elements: `Forwarded: for=192.0.2.1, for="[2001:db8::1]:443"`.
    Forwarded,
}

/// A forwarding header longer than [`MAX_FORWARDED_LEN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the forwarding header is over {MAX_FORWARDED_LEN} bytes")]
pub struct ForwardedTooLong;

/// A trusted proxy that is neither an address nor a CIDR block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trusted proxy {0:?} is not an IP address or a CIDR block like 10.0.0.0/8")]
pub struct InvalidProxy(pub String);

/// Addresses and CIDR blocks of proxies whose forwarding header is believed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses `10.0.0.0/8`, `192.168.1.7`, `fd00::/8`, `::1`.
    pub fn parse<I, S>(blocks: I) -> Result<Self, InvalidProxy>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let parse = |s: &str| -> Option<IpNet> {
            let s = s.trim();
            s.parse::<IpNet>().ok().or_else(|| s.parse::<IpAddr>().ok().map(|ip| IpNet::from(canonical(ip))))
        };
        let blocks = blocks.into_iter().map(|b| parse(b.as_ref()).ok_or_else(|| InvalidProxy(b.as_ref().to_owned())));
        Ok(Self(blocks.collect::<Result<_, _>>()?))
    }

    /// Whether `ip` is one of these proxies.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// How many blocks there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// IPv4-mapped IPv6 as IPv4: the same client, whichever socket family accepted it.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client that the trusted `peer` forwards, read from the header's field `lines` (each
/// call gives them afresh) right to left: each hop was written by the proxy to its right, so
/// the first address that is not a trusted proxy is the client, and everything left of it is
/// the client's own claim. A hop that is not an address (`unknown`, `_hidden`, garbage) ends
/// the walk: the last trusted hop stands for the client.
pub fn forwarded_client<'a, I>(
    lines: impl Fn() -> I,
    syntax: HopSyntax,
    trusted: &TrustedProxies,
    peer: IpAddr,
) -> Result<IpAddr, ForwardedTooLong>
where
    I: DoubleEndedIterator<Item = &'a [u8]>,
{
    if lines().map(<[u8]>::len).sum::<usize>() > MAX_FORWARDED_LEN {
        return Err(ForwardedTooLong);
    }
    let mut client = canonical(peer);
    // The last field line first, each from its end. Commas are split without regard to
    // quotes: a trusted proxy's own hops never quote one, and a client's stray quote must not
    // be able to swallow them.
    let hops = lines().rev().flat_map(|line| line.rsplit(|&b| b == b','));
    for hop in hops {
        let ip = std::str::from_utf8(hop).ok().and_then(|h| match syntax {
            HopSyntax::Addresses => parse_node(h.trim()),
            HopSyntax::Forwarded => forwarded_for(h).and_then(parse_node),
        });
        let Some(ip) = ip.map(canonical) else { break };
        client = ip;
        if !trusted.contains(ip) {
            break;
        }
    }
    Ok(client)
}

/// Appends the key of `ip`: the address, or its network (`2001:db8:1:2::/64`) when the family's
/// prefix (`ipv4_bits`, `ipv6_bits`) is shorter than the address.
pub fn write_key(ip: IpAddr, ipv4_bits: u8, ipv6_bits: u8, out: &mut String) {
    let bits = if ip.is_ipv4() { ipv4_bits } else { ipv6_bits };
    let _ = match (IpNet::new(ip, bits), ip) {
        (Ok(net), _) if bits < net.max_prefix_len() => write!(out, "{}", net.trunc()),
        (_, IpAddr::V4(v4)) => {
            push_ipv4(out, v4);
            Ok(())
        }
        (_, IpAddr::V6(_)) => write!(out, "{ip}"),
    };
}

/// Appends `ip` as its `Display` writes it (`192.0.2.1`): the formatter's machinery costs
/// a forwarded question's key more than the rest of the key does.
fn push_ipv4(out: &mut String, ip: Ipv4Addr) {
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(itoa::Buffer::new().format(octet));
    }
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
        assert_eq!(TrustedProxies::parse(["10.0.0.0/33"]), Err(InvalidProxy("10.0.0.0/33".into())));
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

    #[test]
    fn hops_are_read_right_to_left_past_trusted_ones() {
        let trusted = TrustedProxies::parse(["10.0.0.0/8"]).expect("valid");
        let walk = |lines: &[&str], syntax| {
            forwarded_client(|| lines.iter().map(|l| l.as_bytes()), syntax, &trusted, ip("10.0.0.1"))
        };
        assert_eq!(walk(&["198.51.100.66, 203.0.113.9, 10.0.0.2"], HopSyntax::Addresses), Ok(ip("203.0.113.9")));
        assert_eq!(walk(&["198.51.100.66", "203.0.113.9"], HopSyntax::Addresses), Ok(ip("203.0.113.9")));
        assert_eq!(walk(&["unknown, 10.0.0.2"], HopSyntax::Addresses), Ok(ip("10.0.0.2")));
        assert_eq!(walk(&[r#"for="[2001:db8::1]:443""#], HopSyntax::Forwarded), Ok(ip("2001:db8::1")));
        assert_eq!(walk(&[], HopSyntax::Addresses), Ok(ip("10.0.0.1")), "no header: the peer");
        let long = "1.2.3.4,".repeat(MAX_FORWARDED_LEN / 8 + 1);
        assert_eq!(walk(&[&long], HopSyntax::Addresses), Err(ForwardedTooLong));
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_network() {
        let key = |s: &str| {
            let mut out = String::new();
            write_key(ip(s), DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX, &mut out);
            out
        };
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
    }

    #[test]
    fn ipv4_keys_are_the_address_as_displayed() {
        for s in ["0.0.0.0", "1.2.3.4", "10.0.100.9", "127.0.0.1", "192.168.255.1", "255.255.255.255"] {
            let mut out = String::from("rule:{");
            write_key(ip(s), DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX, &mut out);
            assert_eq!(out, format!("rule:{{{}", ip(s)), "appended, as displayed");
        }
        let mut out = String::new();
        write_key(ip("192.0.2.77"), 24, DEFAULT_IPV6_PREFIX, &mut out);
        assert_eq!(out, "192.0.2.0/24", "a shorter prefix keys the network");
    }
}
