//! The metrics listener of the servers (`proxy`, `rls`): HTTP/1.1 on its
//! own address, each request answered at once from what the server counts.

use std::convert::Infallible;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
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
