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
use axum::{Extension, Router};
use floodgate::http::{from_fn, KeyExtractor, Parts, PeerIp, RateLimitLayer};
use floodgate::tiers::Tiers;
use floodgate::Decision;

/// Says how many more requests the client may send right now: the
/// layer's decision, handed on in the request's extensions.
async fn hello(Extension(decision): Extension<Decision>) -> String {
    format!("hello; {} more right now\n", decision.remaining())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // What the layer and the registry log once (a server without peer
    // addresses, a tier the registry lacks) goes to standard error.
    tracing_subscriber::fmt().init();

    // The keys you issued, and each one's plan.
    let plans: Arc<HashMap<String, &'static str>> = Arc::new(
        [("alpha".to_owned(), "pro"), ("beta".to_owned(), "team")]
            .into_iter()
            .collect(),
    );
    let issued = |parts: &Parts, plans: &HashMap<String, &'static str>| {
        let key = parts.headers.get("x-api-key")?.to_str().ok()?;
        plans
            .get_key_value(key)
            .map(|(key, plan)| (key.clone(), *plan))
    };

    // One tier per plan; a request's tier is its key's plan (below), and
    // anonymous for everyone else.
    let tiers = Tiers::new("anonymous", "sliding-window:10/1m".parse()?, |_: &str| {
        "anonymous"
    })
    .with_tier("team", "gcra:50/1m".parse()?)?
    .with_tier("pro", "gcra:100/1m".parse()?)?;

    // A key we issued identifies its client; anyone else is their address
    // (so inventing keys earns no fresh limit).
    let key_plans = Arc::clone(&plans);
    let extractor = from_fn(move |parts: &Parts| match issued(parts, &key_plans) {
        Some((key, _)) => Some(format!("key:{key}")),
        None => PeerIp::new()
            .extract(parts)
            .ok()
            .map(|ip| format!("ip:{ip}")),
    });

    let app = Router::new()
        .route("/", get(hello))
        .route("/health", get(|| async { "ok\n" }))
        .layer(
            RateLimitLayer::new(tiers, extractor)
                .tier_from(move |parts| issued(parts, &plans).map(|(_, plan)| plan.to_owned()))
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
