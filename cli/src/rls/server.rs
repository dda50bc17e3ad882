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
//!
//! Limits are counted in memory, or in Redis with `--backend` (each limit
//! under its own keys, shared by every server with the same configuration
//! on that Redis; [`super::store`]). In memory, `--state FILE` keeps every
//! limit's clients across restarts: loaded at start, saved at the stop
//! (once the calls under way are answered, a second signal
//! notwithstanding) and every `--state-every`; a save that fails at the
//! stop is status 1 ([`super::state`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use floodgate::state::Saver;
use floodgate::{Bounds, QuantaClock};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use super::config::Config;
use super::decide::Limits;
use super::metrics::{self, CallStats};
use super::service::RateLimitService;
use super::state::LimitSet;
use super::store::Backing;
use crate::args::{parse_duration, parse_max_clients, usage, Checked, Span};
use crate::signals::Signals;
use crate::stores;

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

    /// Keep each limit in Redis, shared by every `floodgate rls` with the
    /// same configuration on it: redis://HOST:PORT[/DB], or a Redis
    /// Cluster: redis-cluster://HOST:PORT[,HOST:PORT...]. Each limit's keys
    /// start with floodgate-rls: and its id. Decisions use Redis's clock;
    /// when Redis does not answer within 100 ms the descriptor is refused.
    /// (Needs the CLI's `redis` feature.)
    #[arg(long, value_name = "URL", conflicts_with = "max_clients")]
    pub backend: Option<String>,

    /// With --backend: spend each shared limit from leases, taken out of
    /// Redis a batch of units at a time, so that most descriptors are
    /// decided here with no round trip, never over the limit summed over
    /// every server (see docs/leases.md). Rules with leaky-bucket ask
    /// Redis for every descriptor.
    #[arg(long, requires = "backend")]
    pub lease: bool,

    /// The term of a lease of a drip rule (gcra, token-bucket) and how
    /// much later a sliding-window lease's units enter the log, such as
    /// 500ms (1s without it): over any span D those rules admit at most
    /// what one limiter would over D plus this. Windows' leases end with
    /// their window.
    #[arg(long, value_name = "DURATION", requires = "lease",
          value_parser = Checked(parse_duration))]
    pub lease_term: Option<Span>,

    /// Keep every limit's clients in FILE across restarts (in memory):
    /// loaded at start when FILE exists, under the same rules (a first
    /// start without it is fine; any other file that cannot be read whole,
    /// one saved under other rules, or a FILE whose directory does not
    /// take a file, stops the start, exit status 2), and saved when SIGINT
    /// or SIGTERM stops the server, once the calls under way are answered,
    /// and every --state-every. The time the server was down counts as
    /// time passed.
    #[arg(long, value_name = "FILE", conflicts_with = "backend")]
    pub state: Option<PathBuf>,

    /// Load a --state file saved under other rules (a deploy that changed
    /// or removed limits): a limit whose rules changed since the save
    /// starts afresh, and the others keep what their clients spent.
    /// Without it such a file stops the start.
    #[arg(long, requires = "state")]
    pub state_carry_over: bool,

    /// Also save --state this often while running, such as 1m: a crash
    /// loses at most that much of what clients spent. A save that fails is
    /// logged and tried again at the next.
    #[arg(long, value_name = "DURATION", requires = "state",
          value_parser = Checked(parse_duration))]
    pub state_every: Option<Span>,

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
    #[cfg(not(feature = "redis"))]
    if args.backend.is_some() {
        return usage(crate::args::left_out(
            "`floodgate rls --backend`",
            "rls,redis",
        ));
    }
    if args.reload_every.nanos == 0 {
        return usage("--reload-every: expected a duration longer than 0");
    }
    if let Err(error) = stores::check_state_every(args.state_every.as_ref()) {
        return usage(error);
    }
    let texts = match Config::read(&args.config) {
        Ok(texts) => texts,
        Err(error) => return usage(error),
    };
    let config = match Config::from_texts(texts.iter().map(|(f, t)| (f.as_path(), t.as_str()))) {
        Ok(config) => config,
        Err(error) => return usage(error),
    };
    let backing = backing(&args);
    if let Some(path) = &args.state {
        if let Err(error) = stores::check_state_path(path) {
            return usage(error);
        }
    }
    let saved = match args.state.as_deref().map(stores::saved_state) {
        None => None,
        Some(Ok(saved)) => saved,
        Some(Err(error)) => return usage(error),
    };
    let clock = stores::clock(saved.as_ref());
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
    // Redis's limiters start their tasks on the runtime they are built on.
    let limits = match runtime.block_on(Limits::new(config, backing.clone(), clock.clone())) {
        Ok(limits) if args.response_headers => Arc::new(ArcSwap::from_pointee(
            limits.with_response_headers(args.legacy_headers),
        )),
        Ok(limits) => Arc::new(ArcSwap::from_pointee(limits)),
        Err(error) => return usage(error),
    };
    if let (Some(path), Some(saved)) = (&args.state, saved) {
        let loaded = match super::state::load(&saved, path, &limits, &clock, args.state_carry_over)
        {
            Ok(loaded) => loaded,
            Err(error) => return usage(error),
        };
        let afresh = if loaded.afresh.is_empty() {
            String::new()
        } else {
            format!(
                "; started afresh, their rules changed or gone since the save: {}",
                loaded.afresh.join(", ")
            )
        };
        eprintln!(
            "floodgate rls: loaded {} from {}{afresh}",
            stores::clients(loaded.clients),
            path.display()
        );
    }
    let reload = Reload {
        path: args.config.clone(),
        every: args.reload_every.duration(),
        last: texts,
        unread: None,
        backing,
        clock,
    };
    runtime.block_on(serve(args, limits, reload))
}

/// How the flags say each limit's store is made.
fn backing(args: &Args) -> Backing {
    #[cfg(feature = "redis")]
    if let Some(url) = &args.backend {
        return Backing::Redis {
            url: url.clone(),
            options: stores::redis_options(args.lease, args.lease_term.as_ref()),
        };
    }
    // A client whose state is as good as new is forgotten when room is
    // needed: exact (it would be answered the same), and what keeps
    // --max-clients from refusing new clients for good once reached.
    let mut bounds = Bounds::new().evict_idle();
    if let Some(max_clients) = args.max_clients {
        bounds = bounds.max_clients(max_clients);
    }
    Backing::Memory(bounds)
}

async fn serve(args: Args, limits: Arc<ArcSwap<Limits>>, reload: Reload) -> ExitCode {
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
    // Made once nothing can stop the start: a saver dropped saves.
    let saver = args.state.as_ref().map(|path| {
        let set = Arc::new(LimitSet::new(Arc::clone(&limits), reload.clock.clone()));
        Arc::new(match &args.state_every {
            Some(every) => Saver::spawn(set, path, every.duration()),
            None => Saver::new(set, path),
        })
    });
    #[cfg(feature = "redis")]
    if let (Some(url), Some(redis)) = (&args.backend, limits.load().any_redis()) {
        stores::warn_if_unreachable(redis, url, "rls").await;
    }
    let (domains, limit_count) = counts(&limits.load());
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<RateLimitService>().await;
    let calls = Arc::new(CallStats::default());
    let service = RateLimitService::new(Arc::clone(&limits), Arc::clone(&calls));
    let metrics_server = metrics_listener.map(|(listener, local)| {
        let server = tokio::spawn(metrics::serve(listener, Arc::clone(&limits), calls));
        (local, server)
    });
    let reloader = tokio::spawn(reload.run(Arc::clone(&limits)));
    let held = stores::held(
        args.backend.as_deref(),
        args.lease,
        args.lease_term.as_ref().map(|term| term.text.as_str()),
    );
    eprintln!(
        "floodgate rls: {} from {}, in {held}",
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
        result = &mut server => return saved(ended(result), saver).await,
        () = signals.recv() => {}
    }
    reloader.abort();
    if let Some((_, server)) = &metrics_server {
        server.abort();
    }
    eprintln!("floodgate rls: stopping; answering the calls under way");
    let _ = stop_tx.send(());
    // A second signal stops the wait for the calls under way, not the
    // save: what clients spent is kept either way.
    let code = tokio::select! {
        result = &mut server => ended(result),
        () = signals.recv() => {
            eprintln!("floodgate rls: second signal, stopping now");
            ExitCode::FAILURE
        }
    };
    saved(code, saver).await
}

/// `code`, once the stop's save is made; status 1 if it could not be.
async fn saved(code: ExitCode, saver: Option<Arc<Saver>>) -> ExitCode {
    let Some(saver) = saver else {
        return code;
    };
    if stores::save_at_stop(saver, "rls").await {
        code
    } else {
        ExitCode::FAILURE
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
    backing: Backing,
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
            let reloaded = match parsed {
                Ok(config) => {
                    // The limits in use, held over the build: a Redis
                    // store's is awaited.
                    let current = limits.load_full();
                    current
                        .reloaded(config, &self.backing, self.clock.clone())
                        .await
                }
                Err(error) => Err(error.to_string()),
            };
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
