//! The metrics listener of the servers (`proxy`, `rls`): HTTP/1.1 on its
//! own address, each request answered at once from what the server counts.

use std::convert::Infallible;
use std::time::Duration;

use floodgate::export::Prometheus;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// Serves every connection of `listener` with `answer` until the task is
/// dropped; `command` names the server in the log line of a failed accept.
pub async fn serve<A>(listener: TcpListener, command: &'static str, answer: A)
where
    A: Fn(&Request<Incoming>) -> Response<Full<Bytes>> + Clone + Send + Sync + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new());
    // Progress: a server's loop, ended only by dropping its task (the
    // server does at its stop). It waits on no other thread: each pass
    // awaits the next connection, and a failed accept (out of file
    // descriptors) is retried alone after 50 ms.
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                eprintln!("floodgate {command}: metrics accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let answer = answer.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let response = answer(&request);
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            // A scraper that goes away is its own business.
            let _ = connection.await;
        });
    }
}

/// Answers one request of the metrics listener: `GET` (or `HEAD`)
/// `/metrics` with `metrics()`, `GET /offenders` with `offenders()` (its
/// `Err` a 404 saying why there are none), anything else a 404 or 405
/// that says what is served.
pub fn answer(
    request: &Request<Incoming>,
    metrics: impl FnOnce() -> String,
    offenders: impl FnOnce() -> Result<String, &'static str>,
) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let (status, body, content_type) = match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            (StatusCode::OK, metrics(), Prometheus::CONTENT_TYPE)
        }
        (&Method::GET, "/offenders") => match offenders() {
            Ok(json) => (StatusCode::OK, json, "application/json"),
            Err(why) => (StatusCode::NOT_FOUND, format!("Not Found: {why}\n"), TEXT),
        },
        (_, "/offenders") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed: GET /offenders\n".to_owned(),
            TEXT,
        ),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed: GET /metrics\n".to_owned(),
            TEXT,
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "Not Found: the metrics are at /metrics, the clients refused most at /offenders\n"
                .to_owned(),
            TEXT,
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        // `/offenders` is a GET only: each one begins a new interval.
        let allow = if request.uri().path() == "/offenders" {
            "GET"
        } else {
            "GET, HEAD"
        };
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    response
}
