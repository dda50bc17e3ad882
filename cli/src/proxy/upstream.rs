//! The proxy's inner service: each admitted request forwarded to the
//! upstream, bodies streamed both ways, a 502 when the upstream cannot be
//! reached.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::Stats;

/// A response body: the upstream's, streamed, or the proxy's own 502.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// How long the proxy waits for a TCP connection to the upstream.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The upstream, from `--upstream http://HOST:PORT[/PATH]`: where every
/// request goes, its path appended to the upstream's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    authority: String,
    /// The upstream's path without its trailing `/` (empty for `/`).
    prefix: String,
}

impl Upstream {
    /// The URI a request for `path_and_query` is sent to.
    fn uri(&self, path_and_query: &str) -> Result<Uri, hyper::http::Error> {
        Uri::builder()
            .scheme("http")
            .authority(self.authority.as_str())
            .path_and_query(format!("{}{path_and_query}", self.prefix))
            .build()
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.prefix)
    }
}

/// Parses `--upstream`: an `http://` URL with a host, and a path but no
/// query. TLS to the upstream is not supported: a proxy in front of a
/// service usually reaches it over a local network or loopback.
pub fn parse_upstream(text: &str) -> Result<Upstream, String> {
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("not a URL ({e}); expected http://HOST:PORT[/PATH]"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "the scheme {other:?} is not supported; expected http://HOST:PORT[/PATH]"
            ))
        }
        None => return Err("no scheme; expected http://HOST:PORT[/PATH]".to_owned()),
    }
    let authority = uri
        .authority()
        .ok_or("no host; expected http://HOST:PORT[/PATH]")?;
    if authority.as_str().contains('@') {
        return Err("credentials in the URL are not supported".to_owned());
    }
    if uri.query().is_some() {
        return Err("a query in the upstream URL is not supported".to_owned());
    }
    Ok(Upstream {
        authority: authority.as_str().to_owned(),
        prefix: uri.path().trim_end_matches('/').to_owned(),
    })
}

/// Forwards requests to the upstream over a pool of HTTP/1.1 connections.
///
/// Always ready: the pool opens connections as requests need them.
#[derive(Clone)]
pub struct Forward {
    client: Client<HttpConnector, Incoming>,
    upstream: Arc<Upstream>,
    stats: Arc<Stats>,
    /// The last upstream failure, for the next statistics line (one line
    /// per interval, however many requests failed).
    last_error: Arc<Mutex<Option<String>>>,
}

impl Forward {
    /// Forwarding to `upstream`, counting failures in `stats`.
    pub fn new(upstream: Upstream, stats: Arc<Stats>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            upstream: Arc::new(upstream),
            stats,
            last_error: Arc::default(),
        }
    }

    /// The last upstream failure since the previous call.
    pub fn take_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    fn failed(&self, error: String) -> Response<Body> {
        self.stats.failed();
        let message = format!(
            "Bad Gateway: the upstream {} failed: {error}\n",
            self.upstream
        );
        *self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error);
        let mut response = Response::new(Full::new(Bytes::from(message)).map_err(never).boxed());
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

fn never(never: Infallible) -> hyper::Error {
    match never {}
}

impl tower::Service<Request<Incoming>> for Forward {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            parts.uri = match this.upstream.uri(path) {
                Ok(uri) => uri,
                Err(error) => return Ok(this.failed(format!("cannot address it: {error}"))),
            };
            // Each hop speaks its own version: hyper answers the client in
            // the client's, and this is the upstream connection's.
            parts.version = Version::HTTP_11;
            strip_hop_by_hop(&mut parts.headers);
            // The upstream's own name, as nginx sends by default; the client's
            // is a name of the proxy.
            parts.headers.remove(header::HOST);
            if let Some(peer) = parts.extensions.get::<SocketAddr>() {
                append_forwarded_for(&mut parts.headers, peer);
            }
            match this.client.request(Request::from_parts(parts, body)).await {
                Ok(response) => {
                    let (mut parts, body) = response.into_parts();
                    parts.version = Version::HTTP_11;
                    strip_hop_by_hop(&mut parts.headers);
                    Ok(Response::from_parts(parts, body.boxed()))
                }
                Err(error) => Ok(this.failed(describe(&error))),
            }
        })
    }
}

/// The error and its causes, on one line.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The headers that describe one connection, not the message (RFC 9110,
/// section 7.6.1): never forwarded. hyper frames each side's body itself.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // The headers `Connection` names are the connection's too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// Appends the peer to `X-Forwarded-For`, so the upstream sees the client.
fn append_forwarded_for(headers: &mut HeaderMap, peer: &SocketAddr) {
    static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    let ip = peer.ip().to_canonical();
    let chain = match headers.get(&X_FORWARDED_FOR).map(|v| v.to_str()) {
        Some(Ok(earlier)) if !earlier.trim().is_empty() => format!("{earlier}, {ip}"),
        _ => ip.to_string(),
    };
    if let Ok(value) = HeaderValue::from_str(&chain) {
        headers.insert(&X_FORWARDED_FOR, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let upstream = parse_upstream("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            upstream.uri("/a?b=1").unwrap(),
            "http://127.0.0.1:8080/a?b=1"
        );
        let upstream = parse_upstream("http://backend:8080/api/").unwrap();
        assert_eq!(upstream.to_string(), "http://backend:8080/api");
        assert_eq!(upstream.uri("/v1").unwrap(), "http://backend:8080/api/v1");
        assert!(parse_upstream("https://backend")
            .unwrap_err()
            .contains("\"https\""));
        assert!(parse_upstream("backend:8080").is_err());
        assert!(parse_upstream("http://backend/?q").is_err());
    }

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-hop"),
        );
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert("x-end", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.keys().collect::<Vec<_>>(), ["x-end"]);
    }

    #[test]
    fn forwarded_for_is_appended() {
        let peer: SocketAddr = "[::ffff:192.0.2.1]:5000".parse().unwrap();
        let mut headers = HeaderMap::new();
        append_forwarded_for(&mut headers, &peer);
        assert_eq!(headers["x-forwarded-for"], "192.0.2.1");
        append_forwarded_for(&mut headers, &"[2001:db8::1]:1".parse().unwrap());
        assert_eq!(headers["x-forwarded-for"], "192.0.2.1, 2001:db8::1");
    }
}
