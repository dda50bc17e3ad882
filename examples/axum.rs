//! An axum service behind floodgate's layer: anonymous clients limited per
//! IP address, clients with an API key by their plan's tier.
//!
//! ```sh
//! cargo run --example axum --features http
//! curl -i http://127.0.0.1:3000/                       # 10 a minute per IP
//! curl -i -H 'x-api-key: alpha' http://127.0.0.1:3000/ # the pro tier: 100 a minute
//! curl -i http://127.0.0.1:3000/health                 # never limited
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use floodgate::http::{from_fn, KeyExtractor, Parts, PeerIp, RateLimitLayer};
use floodgate::tiers::Tiers;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The keys you issued, and each one's plan.
    let plans: Arc<HashMap<String, &'static str>> = Arc::new(
        [("alpha".to_owned(), "pro"), ("beta".to_owned(), "team")]
            .into_iter()
            .collect(),
    );

    // One tier per plan; the resolver reads the plan from the key.
    let resolver_plans = Arc::clone(&plans);
    let tiers = Tiers::new(
        "anonymous",
        "sliding-window:10/1m".parse()?,
        move |client: &str| match client.strip_prefix("key:") {
            Some(key) => resolver_plans.get(key).copied().unwrap_or("anonymous"),
            None => "anonymous",
        },
    )
    .with_tier("team", "gcra:50/1m".parse()?)?
    .with_tier("pro", "gcra:100/1m".parse()?)?;

    // A key we issued identifies its client; anyone else is their address
    // (so inventing keys earns no fresh limit).
    let extractor = from_fn(move |parts: &Parts| {
        let issued = parts
            .headers
            .get("x-api-key")
            .and_then(|value| value.to_str().ok())
            .filter(|key| plans.contains_key(*key));
        match issued {
            Some(key) => Some(format!("key:{key}")),
            None => PeerIp::new()
                .extract(parts)
                .ok()
                .map(|ip| format!("ip:{ip}")),
        }
    });

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(
            RateLimitLayer::new(tiers, extractor)
                .bypass(|parts| parts.uri.path() == "/health")
                .problem_json(),
        );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
