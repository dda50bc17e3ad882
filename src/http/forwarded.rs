//! The forwarded client behind trusted proxies: `Forwarded` (RFC 7239),
//! `X-Forwarded-For`, `X-Real-IP`.

use std::fmt;
use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, FORWARDED};
use http::request::Parts;
use ipnet::IpNet;

use super::extract::{group, no_peer, peer, KeyExtractor, MissingKey, DEFAULT_IPV6_PREFIX};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The client a trusted reverse proxy forwarded the request for.
///
/// # What is trusted
///
/// Forwarding headers are text any client can send, so they are read
/// **only when the TCP peer is inside the trusted-proxy list**; from any
/// other peer they are ignored and the peer's own address is the key (a
/// client that spoofs `X-Forwarded-For: 1.2.3.4` gets no new limit by it).
///
/// From a trusted peer, the first of these headers that the request
/// carries is read, and only that one:
///
/// 1. `Forwarded` (RFC 7239): the `for=` of each element, in order;
/// 2. `X-Forwarded-For`: its comma-separated addresses;
/// 3. `X-Real-IP`: one address, the client as the proxy saw it.
///
/// Each proxy appends the address it received the request from, so the
/// chain reads, left to right, from the client to the proxy nearest to us.
/// The key is the **rightmost address that is not a trusted proxy**: the
/// first hop that a proxy we trust saw but did not vouch for. Addresses to
/// its left were written by that hop or beyond, and could say anything.
/// When a trusted proxy reports a node that is not an address (`unknown`,
/// an obfuscated `_hidden`, garbage), the key is that proxy's own address:
/// the nearest identity that can be trusted. When every address in the
/// chain is a trusted proxy, the key is the leftmost one. A trusted peer
/// that sends none of the headers, or none that parse, is its own key.
///
/// IPv6 keys are grouped by a prefix, /56 by default, as with
/// [`PeerIp`](super::PeerIp).
///
/// ```
/// use floodgate::http::ForwardedIp;
///
/// // A load balancer in 10.0.0.0/8 and a local sidecar.
/// let extractor = ForwardedIp::trusting(["10.0.0.0/8", "127.0.0.1"])?;
/// # let _ = extractor;
/// # Ok::<(), floodgate::http::InvalidCidr>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardedIp {
    trusted: Vec<IpNet>,
    ipv6_prefix: u8,
}

impl ForwardedIp {
    /// The forwarded client when the peer is in one of `trusted`.
    pub fn new(trusted: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            trusted: trusted.into_iter().map(|net| net.trunc()).collect(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// The forwarded client when the peer is in one of `trusted`, each a
    /// CIDR (`10.0.0.0/8`, `2001:db8::/32`) or a single address.
    ///
    /// # Errors
    ///
    /// [`InvalidCidr`], naming the first entry that is neither.
    pub fn trusting<I>(trusted: I) -> Result<Self, InvalidCidr>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let nets = trusted
            .into_iter()
            .map(|text| parse_cidr(text.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(nets))
    }

    /// Groups IPv6 clients by their first `bits` bits (128: no grouping).
    ///
    /// # Panics
    ///
    /// If `bits` is more than 128.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        assert!(bits <= 128, "an IPv6 prefix has at most 128 bits");
        self.ipv6_prefix = bits;
        self
    }

    /// The trusted proxies.
    pub fn trusted(&self) -> &[IpNet] {
        &self.trusted
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client, for a request whose TCP peer is the trusted `peer`.
    fn client(&self, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
        if headers.contains_key(FORWARDED) {
            let nodes = list(headers, &FORWARDED).map(forwarded_for);
            return self.walk(nodes, peer);
        }
        if headers.contains_key(&X_FORWARDED_FOR) {
            return self.walk(list(headers, &X_FORWARDED_FOR).map(node), peer);
        }
        let real = headers
            .get(&X_REAL_IP)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| node(text.trim()));
        real.unwrap_or(peer)
    }

    /// The rightmost untrusted address of `nodes` (left to right, each
    /// `None` where a node is not an address), seen from the trusted
    /// `peer`.
    fn walk(&self, nodes: impl DoubleEndedIterator<Item = Option<IpAddr>>, peer: IpAddr) -> IpAddr {
        let mut nearest_trusted = peer;
        for node in nodes.rev() {
            match node {
                Some(ip) if self.is_trusted(ip) => nearest_trusted = ip,
                Some(ip) => return ip,
                None => return nearest_trusted,
            }
        }
        nearest_trusted
    }
}

impl KeyExtractor for ForwardedIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, MissingKey> {
        let peer = peer(parts).ok_or_else(no_peer)?;
        let client = if self.is_trusted(peer) {
            self.client(&parts.headers, peer)
        } else {
            peer
        };
        Ok(group(client, self.ipv6_prefix))
    }
}

/// A trusted-proxy entry that is neither a CIDR nor an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidCidr {
    /// The entry.
    pub text: String,
}

impl fmt::Display for InvalidCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid trusted proxy {:?}: expected a CIDR (10.0.0.0/8, 2001:db8::/32) or an address",
            self.text
        )
    }
}

impl std::error::Error for InvalidCidr {}

fn parse_cidr(text: &str) -> Result<IpNet, InvalidCidr> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| InvalidCidr { text: text.into() })
}

/// An IPv4-mapped IPv6 address as its IPv4 address, so `::ffff:10.0.0.1`
/// is inside `10.0.0.0/8`.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// The comma-separated members of every line of the header `name`, in
/// order (several lines are one list, RFC 9110 §5.3), commas inside quoted
/// strings kept. A line that is not visible ASCII stands for one member
/// that is not an address.
fn list<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> impl DoubleEndedIterator<Item = &'a str> + 'a {
    let members: Vec<&str> = headers
        .get_all(name)
        .iter()
        .flat_map(|value| match value.to_str() {
            Ok(text) => split_outside_quotes(text),
            Err(_) => vec!["unknown"],
        })
        .map(str::trim)
        .filter(|member| !member.is_empty())
        .collect();
    members.into_iter()
}

fn split_outside_quotes(text: &str) -> Vec<&str> {
    let mut members = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (at, byte) in text.bytes().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                members.push(&text[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    members.push(&text[start..]);
    members
}

/// The `for=` node of one `Forwarded` element (`for=192.0.2.60;proto=http`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("for") {
            return None;
        }
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|inner| inner.strip_suffix('"'))
            .unwrap_or(value);
        Some(node(value))
    })?
}

/// One node: `192.0.2.60`, `192.0.2.60:4711`, `[2001:db8::17]`,
/// `[2001:db8::17]:4711` or a bare IPv6 address; `None` for anything else
/// (`unknown`, `_hidden`).
fn node(text: &str) -> Option<IpAddr> {
    if let Some(rest) = text.strip_prefix('[') {
        let (address, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.starts_with(':')) {
            return None;
        }
        return address.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let (address, port) = text.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    address.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn nodes_parse_as_rfc_7239_writes_them() {
        assert_eq!(node("192.0.2.60"), Some(ip("192.0.2.60")));
        assert_eq!(node("192.0.2.60:4711"), Some(ip("192.0.2.60")));
        assert_eq!(node("[2001:db8:cafe::17]"), Some(ip("2001:db8:cafe::17")));
        assert_eq!(
            node("[2001:db8:cafe::17]:4711"),
            Some(ip("2001:db8:cafe::17"))
        );
        assert_eq!(node("2001:db8::1"), Some(ip("2001:db8::1")));
        assert_eq!(node("unknown"), None);
        assert_eq!(node("_hidden"), None);
        assert_eq!(node("[2001:db8::1]x"), None);
        assert_eq!(
            forwarded_for(r#"For="[2001:db8:cafe::17]:4711";proto=https"#),
            Some(ip("2001:db8:cafe::17"))
        );
        assert_eq!(forwarded_for("proto=http;by=203.0.113.43"), None);
        assert_eq!(
            split_outside_quotes(r#"for="a,b", for=c"#),
            vec![r#"for="a,b""#, " for=c"]
        );
    }

    #[test]
    fn the_rightmost_untrusted_address_is_the_client() {
        let extractor = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
        let peer = ip("10.0.0.1");
        let walk =
            |nodes: &[Option<&str>]| extractor.walk(nodes.iter().map(|node| node.map(ip)), peer);
        assert_eq!(
            walk(&[Some("198.51.100.1"), Some("203.0.113.9"), Some("10.1.1.1")]),
            ip("203.0.113.9")
        );
        assert_eq!(walk(&[Some("10.2.2.2"), Some("10.1.1.1")]), ip("10.2.2.2"));
        assert_eq!(
            walk(&[Some("203.0.113.9"), None, Some("10.1.1.1")]),
            ip("10.1.1.1")
        );
        assert_eq!(walk(&[]), peer);
        assert!(extractor.is_trusted(ip("::ffff:10.9.9.9")));
        assert_eq!(
            ForwardedIp::trusting(["10.0.0.0/8", "nope"]),
            Err(InvalidCidr {
                text: "nope".into()
            })
        );
    }
}
