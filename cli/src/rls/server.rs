//! `floodgate rls`'s command: the configuration read, the limiters built,
//! the gRPC server started on tonic with the rate-limit service and gRPC
//! health (`grpc.health.v1`, SERVING for `""` and the service's name), and
//! stopped gracefully on SIGINT or SIGTERM.
//!
//! It speaks plaintext HTTP/2, which Envoy's `rate_limit_service` cluster
//! speaks with `http2_protocol_options`. When it listens it prints
//! `listening on http://IP:PORT` on standard output, after `metrics on
//! http://IP:PORT/metrics` with `--metrics-listen`. A file that does not read, an
//! unknown unit, a duplicate domain: status 2 at start, naming the file and
//! the line. The files are read again every `--reload-every` (1 s): a
//! change is applied whole between two calls, and a limit whose rules did
//! not change keeps its limiter and what its clients spent; a change that
//! does not read is said on standard error, once, and the configuration in
//! use is kept. The first signal stops accepting, answers the calls under
//! way and exits 0; a second exits at once with status 1.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use floodgate::{Bounds, QuantaClock};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use super::config::Config;
use super::decide::Limits;
use super::metrics::{self, CallStats};
use super::service::RateLimitService;
use crate::args::{parse_duration, parse_max_clients, usage, Checked, Span};
use crate::signals::Signals;

/// Options of `floodgate rls`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// envoyproxy/ratelimit's configuration: a YAML file, or a directory
    /// whose *.yaml and *.yml files (in subdirectories too) are read, one
    /// domain each.
    #[arg(long, value_name = "FILE|DIR")]
    pub config: PathBuf,

    /// The address to listen on, IP:PORT (port 0: any free port, printed).
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,

    /// The most clients each limit keeps in memory (a client is a
    /// descriptor's values). A new client past it takes the place of an
    /// idle one (whose state is as good as new), and is refused while
    /// there is none. Unbounded without it.
    #[arg(long, value_name = "N", value_parser = Checked(parse_max_clients))]
    pub max_clients: Option<usize>,

    /// Serve GET /metrics on this address too, IP:PORT (port 0: any,
    /// printed): each limit's hits as envoyproxy/ratelimit counts them,
    /// the calls by answer, each limiter's clients, as Prometheus text;
    /// and GET /offenders: the clients refused most since the last GET of
    /// it, with their limits, as JSON.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// How often --config is read again: a change is applied (limits whose
    /// rules did not change keep what their clients spent); a file that
    /// does not read is logged and the configuration in use is kept.
    #[arg(long, value_name = "DURATION", default_value = "1s",
          value_parser = Checked(parse_duration))]
    pub reload_every: Span,

    /// Fill each answer's response_headers_to_add with the RateLimit
    /// headers, for Envoy to send to the client: RateLimit-Policy and
    /// RateLimit (one member per limited descriptor, named by its limit's
    /// name, else its id; one per rule for several rules), and
    /// Retry-After for a refusal (the longest wait). Off by default, as
    /// envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED is.
    #[arg(long)]
    pub response_headers: bool,

    /// With --response-headers, also X-RateLimit-Limit,
    /// X-RateLimit-Remaining and X-RateLimit-Reset, of one descriptor: the
    /// refusal with the longest wait, else the one with the fewest left
    /// (with several rules, its refusing rule, else its rule with the
    /// fewest left).
    #[arg(long, requires = "response_headers")]
    pub legacy_headers: bool,
}

/// Runs `floodgate rls` until a signal stops it.
pub fn run(args: Args) -> ExitCode {
    if args.reload_every.nanos == 0 {
        return usage("--reload-every: expected a duration longer than 0");
    }
    let texts = match Config::read(&args.config) {
        Ok(texts) => texts,
        Err(error) => return usage(error),
    };
    let config = match Config::from_texts(texts.iter().map(|(f, t)| (f.as_path(), t.as_str()))) {
        Ok(config) => config,
        Err(error) => return usage(error),
    };
    // A client whose state is as good as new is forgotten when room is
    // needed: exact (it would be answered the same), and what keeps
    // --max-clients from refusing new clients for good once reached.
    let mut bounds = Bounds::new().evict_idle();
    if let Some(max_clients) = args.max_clients {
        bounds = bounds.max_clients(max_clients);
    }
    let clock = QuantaClock::new();
    let mut limits = match Limits::new(config, bounds, clock.clone()) {
        Ok(limits) => limits,
        Err(error) => return usage(error),
    };
    if args.response_headers {
        limits = limits.with_response_headers(args.legacy_headers);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("floodgate rls: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let reload = Reload {
        path: args.config.clone(),
        every: args.reload_every.duration(),
        last: texts,
        unread: None,
        bounds,
        clock,
    };
    runtime.block_on(serve(args, limits, reload))
}

async fn serve(args: Args, limits: Limits, reload: Reload) -> ExitCode {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("floodgate rls: cannot catch SIGINT and SIGTERM: {error}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("floodgate rls: cannot listen on {}: {error}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let local = match listener.local_addr() {
        Ok(local) => local,
        Err(error) => {
            eprintln!("floodgate rls: cannot read the listening address: {error}");
            return ExitCode::FAILURE;
        }
    };
    let metrics_listener = match args.metrics_listen {
        None => None,
        Some(address) => match TcpListener::bind(address).await {
            Ok(listener) => match listener.local_addr() {
                Ok(local) => Some((listener, local)),
                Err(error) => {
                    eprintln!("floodgate rls: cannot read the metrics address: {error}");
                    return ExitCode::FAILURE;
                }
            },
            Err(error) => {
                eprintln!("floodgate rls: cannot listen on {address} for metrics: {error}");
                return ExitCode::FAILURE;
            }
        },
    };
    let (domains, limit_count) = counts(&limits);
    let limits = Arc::new(ArcSwap::from_pointee(limits));
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RateLimitService>().await;
    let calls = Arc::new(CallStats::default());
    let service = RateLimitService::new(Arc::clone(&limits), Arc::clone(&calls));
    let metrics_server = metrics_listener.map(|(listener, local)| {
        let server = tokio::spawn(metrics::serve(listener, Arc::clone(&limits), calls));
        (local, server)
    });
    let reloader = tokio::spawn(reload.run(Arc::clone(&limits)));
    eprintln!(
        "floodgate rls: {} from {}",
        described(domains, limit_count),
        args.config.display()
    );
    // `println!` flushes at its newline only on a terminal: a test or a
    // supervisor reading a pipe waits for this line.
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if let Some((metrics, _)) = &metrics_server {
            let _ = writeln!(out, "metrics on http://{metrics}/metrics");
        }
        let _ = writeln!(out, "listening on http://{local}");
        let _ = out.flush();
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder()
        .add_service(health_service)
        .add_service(service)
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = stop_rx.await;
            },
        );
    tokio::pin!(server);
    // The first signal stops accepting and lets the calls under way be
    // answered; a second (or the server failing) ends the wait.
    tokio::select! {
        result = &mut server => return ended(result),
        () = signals.recv() => {}
    }
    reloader.abort();
    if let Some((_, server)) = &metrics_server {
        server.abort();
    }
    eprintln!("floodgate rls: stopping; answering the calls under way");
    let _ = stop_tx.send(());
    tokio::select! {
        result = &mut server => ended(result),
        () = signals.recv() => {
            eprintln!("floodgate rls: second signal, stopping now");
            ExitCode::FAILURE
        }
    }
}

/// The exit status of a server that returned.
fn ended(result: Result<(), tonic::transport::Error>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("floodgate rls: the server failed: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `--config` read again every `every`, and applied when its text changed.
struct Reload {
    path: PathBuf,
    every: Duration,
    /// The texts last read, applied or refused: a file refused is said
    /// once, not at every read until it changes.
    last: Vec<(PathBuf, String)>,
    /// The last failure to read them, said once likewise.
    unread: Option<String>,
    bounds: Bounds,
    clock: QuantaClock,
}

impl Reload {
    /// Reads, compares and applies until aborted. The limits are swapped
    /// whole: a call decides on the old ones or the new, never a mix.
    async fn run(mut self, limits: Arc<ArcSwap<Limits>>) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // Ended only by the stop, which aborts this task. Each pass waits
        // on the interval and on its own read, never on another thread.
        loop {
            tick.tick().await;
            // The reading and parsing touch files: off the runtime's
            // workers, which answer calls.
            let path = self.path.clone();
            let Ok(read) = tokio::task::spawn_blocking(move || Config::read(&path)).await else {
                continue;
            };
            let texts = match read {
                Ok(texts) => texts,
                Err(error) => {
                    let error = error.to_string();
                    if self.unread.as_ref() != Some(&error) {
                        eprintln!(
                            "floodgate rls: cannot read the configuration, keeping the one in \
                             use: {error}"
                        );
                        self.unread = Some(error);
                    }
                    continue;
                }
            };
            self.unread = None;
            if texts == self.last {
                continue;
            }
            let parsed = Config::from_texts(texts.iter().map(|(f, t)| (f.as_path(), t.as_str())));
            self.last = texts;
            let reloaded = parsed
                .map_err(|error| error.to_string())
                .and_then(|config| {
                    limits
                        .load()
                        .reloaded(config, self.bounds, self.clock.clone())
                });
            match reloaded {
                Ok((next, kept)) => {
                    let (domains, count) = counts(&next);
                    limits.store(Arc::new(next));
                    eprintln!(
                        "floodgate rls: reloaded {}: {}, {kept} unchanged with what their \
                         clients spent",
                        self.path.display(),
                        described(domains, count)
                    );
                }
                Err(error) => eprintln!(
                    "floodgate rls: reload refused, keeping the configuration in use: {error}"
                ),
            }
        }
    }
}

/// The domains and the limits of `limits`' configuration.
fn counts(limits: &Limits) -> (usize, usize) {
    let domains = limits.config().domains().count();
    let count = limits
        .config()
        .domains()
        .map(|domain| domain.limits().len())
        .sum();
    (domains, count)
}

/// `N limits in M domains`, each in the singular for one.
fn described(domains: usize, limits: usize) -> String {
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    format!(
        "{limits} limit{} in {domains} domain{}",
        plural(limits),
        plural(domains)
    )
}
