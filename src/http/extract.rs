//! Key extractors: what identifies the client of a request.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::header::HeaderName;
use http::request::Parts;

/// A client's key, owned by the request's future, and the form the limiter
/// is asked by: a `String` asks a `str`-keyed limiter, an `IpAddr` an
/// `IpAddr`-keyed one.
pub trait Key: Send + Sync + 'static {
    /// What the limiter is keyed by.
    type Query: ?Sized + Sync;

    /// The key as the limiter is asked by it.
    fn query(&self) -> &Self::Query;
}

macro_rules! key_is_itself {
    ($($key:ty),*) => {$(
        impl Key for $key {
            type Query = $key;
            #[inline]
            fn query(&self) -> &$key {
                self
            }
        }
    )*};
}

key_is_itself!(IpAddr, SocketAddr, u64, u128, i64, ());

macro_rules! key_is_str {
    ($($key:ty),*) => {$(
        impl Key for $key {
            type Query = str;
            #[inline]
            fn query(&self) -> &str {
                self
            }
        }
    )*};
}

key_is_str!(String, &'static str, Box<str>, Arc<str>);

/// Why a request has no key: the layer answers it with `400 Bad Request`
/// (or the layer's [`on_missing_key`](super::RateLimitLayer::on_missing_key)
/// handler), never with a 500 or a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingKey {
    reason: Cow<'static, str>,
    server: bool,
}

impl MissingKey {
    /// A request that lacks its key, for `reason` (said to the client in
    /// the `400`'s body): the client's to mend.
    pub fn new(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            reason: reason.into(),
            server: false,
        }
    }

    /// A key the server failed to give (the peer's address of a server not
    /// set up to pass it): the layer answers `500`, since no request could
    /// mend it, and logs `reason` once, for the operator.
    pub fn server_side(reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            reason: reason.into(),
            server: true,
        }
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether the server, not the request, is at fault
    /// ([`server_side`](Self::server_side)).
    pub fn is_server_side(&self) -> bool {
        self.server
    }
}

impl fmt::Display for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for MissingKey {}

/// What the layer calls to key a request: from its head only (method, URI,
/// headers, extensions), so the body is never touched.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key.
    type Key: Key;

    /// The key of the request whose head is `parts`.
    ///
    /// # Errors
    ///
    /// [`MissingKey`] when the request carries none.
    fn extract(&self, parts: &Parts) -> Result<Self::Key, MissingKey>;
}

/// The default IPv6 grouping: a /56, what an ISP commonly gives one
/// customer, so one subscriber cannot get a fresh limit per address of its
/// own prefix (a /64 alone holds 2⁶⁴ of them).
pub const DEFAULT_IPV6_PREFIX: u8 = 56;

/// The peer's address: the TCP peer of the connection, as the server put it
/// in the request's extensions. IPv4 addresses are keys as they are (an
/// IPv4-mapped IPv6 address counts as its IPv4 address); IPv6 addresses are
/// grouped by their first [`ipv6_prefix`](Self::ipv6_prefix) bits, /56 by
/// default.
///
/// Where the address comes from: a [`SocketAddr`] in the extensions (put
/// there by a hyper server of your own, as `floodgate proxy` does), or
/// axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`). A server that
/// gives neither is misconfigured, not its clients: the layer answers
/// `500` and logs the fix once ([`MissingKey::server_side`]).
///
/// Behind a reverse proxy the peer is the proxy: use
/// [`ForwardedIp`](super::ForwardedIp), which reads the forwarded client
/// only from proxies you trust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// The peer's address, IPv6 grouped by /56.
    pub const fn new() -> Self {
        Self {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 peers by their first `bits` bits (128: no grouping).
    ///
    /// # Panics
    ///
    /// If `bits` is more than 128.
    pub const fn ipv6_prefix(mut self, bits: u8) -> Self {
        assert!(bits <= 128, "an IPv6 prefix has at most 128 bits");
        self.ipv6_prefix = bits;
        self
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpAddr;

    fn extract(&self, parts: &Parts) -> Result<IpAddr, MissingKey> {
        peer(parts)
            .map(|ip| group(ip, self.ipv6_prefix))
            .ok_or_else(no_peer)
    }
}

/// The TCP peer's address, from the request's extensions.
pub(crate) fn peer(parts: &Parts) -> Option<IpAddr> {
    if let Some(address) = parts.extensions.get::<SocketAddr>() {
        return Some(address.ip());
    }
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0.ip());
    }
    None
}

pub(crate) fn no_peer() -> MissingKey {
    MissingKey::server_side(
        "the server did not give the peer's address: with axum, serve \
         `app.into_make_service_with_connect_info::<SocketAddr>()`; with \
         hyper, insert the connection's `SocketAddr` in each request's \
         extensions",
    )
}

/// `ip` as a key: an IPv4-mapped address as its IPv4 address, an IPv6
/// address cut to its first `prefix` bits.
pub(crate) fn group(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        },
    }
}

/// A header's value: an API key, a tenant id. A request without the header,
/// with an empty value or with one that is not visible ASCII has no key.
///
/// The value is the key as it is, so the limiter sees every key a client
/// invents: pair it with [`Bounds`](crate::Bounds) (a cap, idle eviction),
/// or resolve keys you issued to a tier and send unknown ones elsewhere
/// ([`from_fn`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    name: HeaderName,
}

impl Header {
    /// The value of the header `name` (lower case, as `"x-api-key"`).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid lower-case header name (see
    /// [`HeaderName::from_static`]); [`from_name`](Self::from_name) takes
    /// one built at run time.
    pub fn new(name: &'static str) -> Self {
        Self::from_name(HeaderName::from_static(name))
    }

    /// The value of the header `name`.
    pub fn from_name(name: HeaderName) -> Self {
        Self { name }
    }
}

impl KeyExtractor for Header {
    type Key = String;

    fn extract(&self, parts: &Parts) -> Result<String, MissingKey> {
        match parts.headers.get(&self.name).map(|value| value.to_str()) {
            Some(Ok(value)) if !value.is_empty() => Ok(value.to_owned()),
            Some(_) => Err(MissingKey::new(format!(
                "the header {} is empty or not visible ASCII",
                self.name
            ))),
            None => Err(MissingKey::new(format!("no header {}", self.name))),
        }
    }
}

/// One key for every request: a limit on the whole service. Its key is the
/// text `"global"` (or [`named`](Self::named)), for a `str`-keyed limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Global {
    name: &'static str,
}

impl Default for Global {
    fn default() -> Self {
        Self::new()
    }
}

impl Global {
    /// Every request under the key `"global"`.
    pub const fn new() -> Self {
        Self { name: "global" }
    }

    /// Every request under the key `name` (to share a store with other
    /// keys).
    pub const fn named(name: &'static str) -> Self {
        Self { name }
    }
}

impl KeyExtractor for Global {
    type Key = &'static str;

    fn extract(&self, _: &Parts) -> Result<&'static str, MissingKey> {
        Ok(self.name)
    }
}

/// A key computed by a closure from the request's head: `None` for a
/// request without one. See [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F> {
    f: F,
}

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}

/// A key computed by `f` from the request's head; `None` is a missing key.
///
/// ```
/// use floodgate::http::{from_fn, KeyExtractor, PeerIp};
///
/// // The API key when there is one, the peer's address otherwise.
/// let extractor = from_fn(|parts: &http::request::Parts| {
///     match parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
///         Some(key) => Some(format!("key:{key}")),
///         None => PeerIp::new().extract(parts).ok().map(|ip| format!("ip:{ip}")),
///     }
/// });
/// # let _ = extractor;
/// ```
pub fn from_fn<F, K>(f: F) -> FromFn<F>
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: Key,
{
    FromFn { f }
}

impl<F, K> KeyExtractor for FromFn<F>
where
    F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    K: Key,
{
    type Key = K;

    fn extract(&self, parts: &Parts) -> Result<K, MissingKey> {
        (self.f)(parts).ok_or_else(|| MissingKey::new("the request carries no client key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_is_grouped_and_mapped_ipv4_is_ipv4() {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        assert_eq!(group(ip("2001:db8:1:2ff:1::1"), 56), ip("2001:db8:1:200::"));
        assert_eq!(group(ip("2001:db8:1:2ff:1::1"), 64), ip("2001:db8:1:2ff::"));
        assert_eq!(group(ip("2001:db8::1"), 128), ip("2001:db8::1"));
        assert_eq!(group(ip("2001:db8::1"), 0), ip("::"));
        assert_eq!(group(ip("::ffff:192.0.2.1"), 56), ip("192.0.2.1"));
        assert_eq!(group(ip("192.0.2.1"), 56), ip("192.0.2.1"));
    }
}
