//! The upstream of `benches/proxy.sh`: a hyper server on 127.0.0.1 that
//! answers every request `hello`, for measuring `floodgate proxy` against
//! the same service reached directly. Prints `listening on http://IP:PORT`
//! and serves until killed.

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::Response;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let address = std::env::args().nth(1).unwrap_or("127.0.0.1:0".to_owned());
    let listener = TcpListener::bind(&address).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|_| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
