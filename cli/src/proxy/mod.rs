//! `floodgate proxy`: a rate-limiting reverse proxy, the `floodgate::http`
//! layer in front of one upstream, served and forwarded by hyper.
//!
//! Each request is keyed (the TCP peer by default), decided once by the
//! limiter — in memory, or in Redis with `--backend` — and either answered
//! `429` by the layer or forwarded to the upstream. Admitted and rejected
//! answers carry the IETF `RateLimit` and `RateLimit-Policy` headers;
//! rejections `Retry-After`. Bodies are streamed both ways, frame by frame,
//! so a large upload or download costs a few buffers, not its size. An
//! upstream that cannot be reached is a `502` for that request only.
//!
//! When it listens it prints `listening on http://IP:PORT` on standard
//! output; every few seconds in which something happened it prints the
//! counts so far on standard error, and once more when it stops. With
//! `--metrics-listen` a second listener serves `GET /metrics`: the
//! limiter's stats and the proxy's own counts as Prometheus text
//! (`metrics.rs`). SIGINT or
//! SIGTERM stops it: it stops accepting, lets the requests in flight finish
//! (a connection kept alive is closed after its current response) and exits
//! 0. A second signal stops it at once, with status 1. With `--state` the
//! state is saved either way; a save that fails (after a few attempts) is
//! status 1 too.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use floodgate::http::{
    AsyncLimiter, ForwardedIp, Global, Header, Key, KeyExtractor, MissingKey, Parts, PeerIp,
    RateLimitLayer, DEFAULT_IPV6_PREFIX,
};
use floodgate::state::{Saver, StateKey};
use floodgate::tiers::Tiers;
use floodgate::{
    Bounds, Builder, Config, ConfigError, Decision, Overflow, PolicyKind, QuantaClock, RateLimiter,
    Rule, RuleSet, RuledDecision, MAX_RULES,
};
use floodgate_cli::args::{
    explain, parse_duration, parse_in, parse_limit, parse_max_clients, parse_overflow,
    parse_policy, parse_rule, usage, Checked, Span, Written,
};
use floodgate_cli::signals::Signals;
use floodgate_cli::stores;
use hyper::header::HeaderName;
use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};

mod metrics;
mod upstream;

use metrics::{Measured, Metrics, Scraped, Timed};
use upstream::{parse_upstream, Forward, Upstream};

/// How often the counts are printed (when they changed).
const STATS_EVERY: Duration = Duration::from_secs(5);

/// Options of `floodgate proxy`.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
// One of --policy (with --limit and --window) or --rule: a missing quota
// is refused naming both.
#[command(group = clap::ArgGroup::new("quota").args(["policy", "rule", "tier"]).required(true).multiple(false))]
pub struct Args {
    /// The address to listen on, IP:PORT (port 0: any free port, printed).
    #[arg(long, value_name = "ADDR", value_parser = Checked(parse_listen))]
    listen: SocketAddr,

    /// The service to protect: http://HOST:PORT[/PATH]. A request's path
    /// is appended to the upstream's.
    #[arg(long, value_name = "URL", value_parser = Checked(parse_upstream))]
    upstream: Upstream,

    /// The policy: token-bucket, leaky-bucket, fixed-window,
    /// sliding-window, sliding-window-counter or gcra. leaky-bucket delays
    /// requests within its tolerance instead of rejecting them.
    #[arg(long, value_name = "NAME", value_parser = Checked(parse_policy),
          required_unless_present_any = ["rule", "tier"])]
    policy: Option<PolicyKind>,

    /// Requests admitted per window, per client.
    #[arg(long, value_name = "L", value_parser = Checked(parse_limit),
          required_unless_present_any = ["rule", "tier"])]
    limit: Option<u64>,

    /// The window: a whole number and a unit, such as 1s, 500ms or 2m
    /// (units ns, us, ms, s, m, h, d).
    #[arg(long, value_name = "DURATION", value_parser = Checked(parse_duration),
          required_unless_present_any = ["rule", "tier"])]
    window: Option<Span>,

    /// A rule, POLICY:LIMIT/WINDOW (gcra:10/1s), instead of --policy,
    /// --limit and --window. Repeat it for several limits on each client,
    /// such as a burst and a daily quota: a request is admitted only if
    /// every rule admits it, and counts in every rule then. The headers
    /// give one item per rule, named NAME-1, NAME-2... after
    /// --policy-name. At most 8 rules. in-flight:N (no window) bounds the
    /// requests a client has running at once: each holds its slot until
    /// the upstream's response body ends or the client goes away, and a
    /// refusal is a 429 without Retry-After.
    #[arg(long = "rule", value_name = "POLICY:LIMIT/WINDOW", value_parser = Checked(parse_rule),
          conflicts_with_all = ["policy", "limit", "window"])]
    rule: Vec<Rule>,

    /// A tier of clients and its rules, NAME=RULE[,RULE...]
    /// (premium=gcra:100/1s,fixed-window:100000/1d), instead of --rule:
    /// repeat it for each tier; the first is the default tier. Which tier
    /// a request is in is --tier-header's value (the default tier without
    /// it). A name no --tier gave is answered by the default tier and
    /// named once on standard error. The headers name each answer's tier.
    #[arg(long = "tier", value_name = "NAME=RULES", value_parser = Checked(parse_tier),
          conflicts_with_all = ["policy", "limit", "window", "rule", "backend"])]
    tier: Vec<TierArg>,

    /// The header that names each request's tier (--tier). Set it only
    /// from a gateway in front of the proxy that overwrites it (after
    /// authenticating the client): a client that may send it picks its
    /// own tier.
    #[arg(long, value_name = "HEADER", value_parser = Checked(parse_header_name))]
    tier_header: Option<HeaderName>,

    /// What a client is: its address (behind --trusted-proxy, the
    /// forwarded one), one global limit, or the value of a header (an API
    /// key; a request without it is answered 400).
    #[arg(long, value_name = "ip|global|header:NAME", default_value = "ip", value_parser = Checked(parse_key))]
    key: KeyKind,

    /// A reverse proxy in front of this one, as a CIDR or an address:
    /// from it, the client is read from Forwarded, X-Forwarded-For or
    /// X-Real-IP (the rightmost address that is not a trusted proxy).
    /// Repeat for several. From any other peer those headers are ignored.
    #[arg(long = "trusted-proxy", value_name = "CIDR", value_parser = Checked(parse_cidr))]
    trusted_proxy: Vec<String>,

    /// IPv6 clients are grouped by this many leading bits, 56 by default
    /// (128: each address on its own).
    #[arg(long, value_name = "BITS", value_parser = Checked(parse_in::<u8>(0, 128)))]
    ipv6_prefix: Option<u8>,

    /// Give a request's units back when the upstream's answer has this
    /// status: a class (5xx) or one status (503, or 429 from a limiter
    /// behind); repeat for several. A request that failed upstream then
    /// does not count against its client (the proxy's own 502 for an
    /// upstream it cannot reach is a 5xx too).
    #[arg(long = "refund-on", value_name = "STATUS", value_parser = Checked(parse_refund_status))]
    refund_on: Vec<StatusMatch>,

    /// The policy's name in the RateLimit and RateLimit-Policy headers
    /// (with several --rule, NAME-1, NAME-2... one per rule).
    #[arg(long, value_name = "NAME", default_value = "default")]
    policy_name: String,

    /// Keep the limits in Redis, shared by every proxy that uses it:
    /// redis://HOST:PORT[/DB], or a Redis Cluster:
    /// redis-cluster://HOST:PORT[,HOST:PORT...]. Decisions use Redis's
    /// clock; when Redis does not answer within 100 ms the request is
    /// rejected. A client Redis rejected is rejected locally until its
    /// Retry-After, without asking Redis again.
    /// (Needs the CLI's `redis` feature.)
    #[arg(long = "backend", value_name = "URL",
          conflicts_with_all = ["evict_idle", "max_clients"])]
    backend: Option<String>,

    /// With --backend: spend the shared limit from leases, taken out of
    /// Redis a batch of units at a time, so that most requests are decided
    /// here with no round trip, never over the limit summed over every
    /// proxy (see docs/leases.md). Rules with in-flight or leaky-bucket
    /// ask Redis for every request.
    #[arg(long, requires = "backend")]
    lease: bool,

    /// The term of a lease of a drip rule (gcra, token-bucket) and how
    /// much later a sliding-window lease's units enter the log, such as
    /// 500ms: over any span D those rules admit at most what one limiter
    /// would over D plus this. Windows' leases end with their window.
    #[arg(long, value_name = "DURATION", requires = "lease",
          value_parser = Checked(parse_duration))]
    lease_term: Option<Span>,

    /// Forget idle clients, swept as new clients arrive (in memory; Redis
    /// forgets them by itself).
    #[arg(long)]
    evict_idle: bool,

    /// Track at most N clients in memory; a new client that finds no room
    /// gets the --overflow rule.
    #[arg(long, value_name = "N", value_parser = Checked(parse_max_clients))]
    max_clients: Option<usize>,

    /// What a new client gets at --max-clients when nobody is idle: reject
    /// (fail closed), admit (fail open, untracked) or shared (one state for
    /// all of them).
    #[arg(long, value_name = "RULE", default_value_t = Overflow::Reject, requires = "max_clients",
          value_parser = Checked(parse_overflow))]
    overflow: Overflow,

    /// Also send X-RateLimit-Limit, X-RateLimit-Remaining and
    /// X-RateLimit-Reset. With several --rule they describe one: the rule
    /// that refused the request, else the one with the fewest left.
    #[arg(long)]
    legacy_headers: bool,

    /// Keep every client's state in FILE across restarts (in memory):
    /// loaded at start when FILE exists, under the same rules (a first
    /// start without it is fine; any other file that cannot be read whole,
    /// or a FILE whose directory does not take a file, stops the start,
    /// exit status 2), and saved when SIGINT or SIGTERM stops the proxy,
    /// once the requests in flight are answered, and every --state-every.
    /// A client refused before a restart is still refused after it; the
    /// time the proxy was down counts as time passed.
    #[arg(long, value_name = "FILE", conflicts_with = "backend")]
    state: Option<PathBuf>,

    /// Load a --state file saved under other rules or tiers' rules (a
    /// deploy that changed a limit): each client is carried over to the
    /// new rules rule by rule, what it spent kept, as a tier's reload
    /// carries it over. Without it such a file stops the start.
    #[arg(long, requires = "state")]
    state_carry_over: bool,

    /// Also save --state this often while running, such as 1m: a crash
    /// loses at most that much of what clients spent. A save that fails is
    /// logged, counted in /metrics and tried again at the next.
    #[arg(long, value_name = "DURATION", requires = "state",
          value_parser = Checked(parse_duration))]
    state_every: Option<Span>,

    /// Serve GET /metrics on this address, IP:PORT (port 0: any free port,
    /// printed): Prometheus text with the limiter's counts (in memory) and
    /// the proxy's responses by status, upstream errors and added time.
    #[arg(long, value_name = "ADDR", value_parser = Checked(parse_listen))]
    metrics_listen: Option<SocketAddr>,
}

const AFTER_HELP: &str = "\
Prints `listening on http://IP:PORT` on standard output when it is ready
(after `metrics on http://IP:PORT/metrics` with --metrics-listen), the admitted / shaped / rejected counts on standard error every few seconds,
and exits 0 on SIGINT or SIGTERM once the requests in flight are answered.

Examples:
  floodgate proxy --listen 127.0.0.1:8080 --upstream http://127.0.0.1:3000 \\
                  --policy gcra --limit 100 --window 1m
  floodgate proxy --listen 127.0.0.1:8080 --upstream http://127.0.0.1:3000 \\
                  --rule gcra:10/1s --rule fixed-window:10000/1d
  floodgate proxy --listen 127.0.0.1:8080 --upstream http://127.0.0.1:3000 \\
                  --key header:x-key --tier free=gcra:2/1h --tier premium=gcra:5/1h \\
                  --tier-header x-plan";

/// A `--tier`: its name and rules.
#[derive(Clone, Debug)]
struct TierArg {
    name: String,
    rules: RuleSet,
}

fn parse_tier(text: &str) -> Result<TierArg, String> {
    const FORM: &str = "expected NAME=RULE[,RULE...], such as premium=gcra:100/1s";
    let (name, rules) = text.split_once('=').ok_or(FORM)?;
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == ',') {
        return Err(format!(
            "the tier name {name:?} is empty or has a space or comma: {FORM}"
        ));
    }
    let mut parsed = Vec::new();
    for rule in rules.split(',') {
        parsed.push(parse_rule(rule).map_err(|why| format!("tier {name}: {rule:?}: {why}"))?);
    }
    let rules = RuleSet::new(parsed).map_err(|error| match error {
        ConfigError::RuleCount { count } => {
            format!("tier {name}: {count} rules: a tier applies at most {MAX_RULES}")
        }
        error => format!("tier {name}: {error}"),
    })?;
    Ok(TierArg {
        name: name.to_owned(),
        rules,
    })
}

fn parse_header_name(text: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(text.as_bytes()).map_err(|_| format!("{text:?} is not a header name"))
}

/// A `--refund-on`: a class of statuses (`5xx`) or one status (`503`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StatusMatch {
    /// The first digit of the class, 1 to 5.
    Class(u16),
    Exact(u16),
}

impl StatusMatch {
    fn matches(self, status: StatusCode) -> bool {
        match self {
            Self::Class(class) => status.as_u16() / 100 == class,
            Self::Exact(exact) => status.as_u16() == exact,
        }
    }
}

fn parse_refund_status(text: &str) -> Result<StatusMatch, String> {
    let expected = || {
        format!("{text:?} is not a status: expected a class, 1xx to 5xx, or a status, 100 to 599")
    };
    let bytes = text.as_bytes();
    match bytes {
        [class @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
            Ok(StatusMatch::Class(u16::from(class - b'0')))
        }
        [b'1'..=b'5', b'0'..=b'9', b'0'..=b'9'] => {
            text.parse().map(StatusMatch::Exact).map_err(|_| expected())
        }
        _ => Err(expected()),
    }
}

/// What `--key` names.
#[derive(Clone, Debug, PartialEq, Eq)]
enum KeyKind {
    Ip,
    Global,
    Header(HeaderName),
}

fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| "expected IP:PORT, such as 127.0.0.1:8080 (port 0: any free port)".to_owned())
}

fn parse_key(text: &str) -> Result<KeyKind, String> {
    match text {
        "ip" => Ok(KeyKind::Ip),
        "global" => Ok(KeyKind::Global),
        _ => match text.strip_prefix("header:") {
            Some(name) => HeaderName::from_bytes(name.as_bytes())
                .map(KeyKind::Header)
                .map_err(|_| format!("{name:?} is not a header name")),
            None => Err("expected ip, global or header:NAME".to_owned()),
        },
    }
}

fn parse_cidr(text: &str) -> Result<String, String> {
    ForwardedIp::trusting([text])
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}

/// A client as the proxy keys it: an address, or text (a header's value,
/// the global key). One type for every `--key`, so one limiter type and
/// one server serve them all.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// An address (its IPv6 prefix).
    Ip(IpAddr),
    /// A header's value, or the global key.
    Text(String),
}

impl Key for Client {
    type Query = Client;

    fn query(&self) -> &Client {
        self
    }
}

/// A client in a `--state` file: a tag byte (0 an address, 1 a header's
/// value or the global key), then the address's or the text's bytes.
impl StateKey for Client {
    fn key_bytes(&self) -> Cow<'_, [u8]> {
        let (tag, bytes) = match self {
            Client::Ip(ip) => (0, ip.key_bytes()),
            Client::Text(text) => (1, Cow::Borrowed(text.as_bytes())),
        };
        let mut key = Vec::with_capacity(1 + bytes.len());
        key.push(tag);
        key.extend_from_slice(&bytes);
        Cow::Owned(key)
    }

    fn from_key_bytes(bytes: &[u8]) -> Option<Client> {
        match bytes.split_first()? {
            (0, ip) => IpAddr::from_key_bytes(ip).map(Client::Ip),
            (1, text) => String::from_key_bytes(text).map(Client::Text),
            _ => None,
        }
    }
}

/// The extractor `--key` and `--trusted-proxy` ask for.
enum Extract {
    Peer(PeerIp),
    Forwarded(ForwardedIp),
    Header(Header),
    Global(Global),
}

impl KeyExtractor for Extract {
    type Key = Client;

    fn extract(&self, parts: &Parts) -> Result<Client, MissingKey> {
        match self {
            Extract::Peer(peer) => peer.extract(parts).map(Client::Ip),
            Extract::Forwarded(forwarded) => forwarded.extract(parts).map(Client::Ip),
            Extract::Header(header) => header.extract(parts).map(Client::Text),
            Extract::Global(global) => global
                .extract(parts)
                .map(|key| Client::Text(key.to_owned())),
        }
    }
}

/// What the proxy counts, for the statistics line. Relaxed: each is a
/// counter on its own, read only to be printed.
#[derive(Debug, Default)]
pub struct Stats {
    admitted: AtomicU64,
    shaped: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    /// Units given back (`--refund-on`).
    refunded: AtomicU64,
    /// Units released at the end of a response body (`--rule in-flight:N`).
    released: AtomicU64,
}

impl Stats {
    fn count(&self, decision: &Decision) {
        let counter = match (decision.allowed(), decision.delay_ticks() > 0) {
            (false, _) => &self.rejected,
            (true, false) => &self.admitted,
            (true, true) => &self.shaped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// One request the upstream did not answer.
    fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> [u64; 6] {
        [
            &self.admitted,
            &self.shaped,
            &self.rejected,
            &self.failed,
            &self.refunded,
            &self.released,
        ]
        .map(|counter| counter.load(Ordering::Relaxed))
    }
}

fn stats_line(counts: [u64; 6]) -> String {
    let [admitted, shaped, rejected, failed, refunded, released] = counts;
    format!(
        "floodgate proxy: admitted {admitted}, shaped {shaped}, rejected {rejected}, \
         units given back {refunded}, units released {released}, upstream errors {failed}"
    )
}

/// The entries of the in-memory limiter's offenders' summary: a client
/// with 1 % of the rejections is always among them, its count within about
/// 0.1 % of them (`floodgate::offenders`).
const OFFENDERS: usize = 1_024;

/// Where the limits live.
enum Store {
    Memory(Arc<dyn RateLimiter<Client>>),
    #[cfg(feature = "redis")]
    Redis(floodgate::redis::AsyncRedisLimiter),
}

/// The store, counting its decisions.
struct Counted {
    store: Store,
    stats: Arc<Stats>,
}

impl AsyncLimiter<Client> for Counted {
    /// In memory only: `--tier` goes without `--backend`.
    async fn check_ruled_in_n(&self, tier: &str, key: &Client, cost: u64) -> RuledDecision<'_> {
        let ruled = match &self.store {
            Store::Memory(limiter) => limiter.check_ruled_in_n_at(tier, key, limiter.now(), cost),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => match key {
                Client::Ip(ip) => {
                    AsyncLimiter::<IpAddr>::check_ruled_in_n(redis, tier, ip, cost).await
                }
                Client::Text(text) => {
                    AsyncLimiter::<str>::check_ruled_in_n(redis, tier, text, cost).await
                }
            },
        };
        self.stats.count(&ruled.decision);
        ruled
    }

    async fn check_ruled_n(&self, key: &Client, cost: u64) -> RuledDecision<'_> {
        let ruled = match &self.store {
            Store::Memory(limiter) => limiter.check_ruled_n_at(key, limiter.now(), cost),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => match key {
                Client::Ip(ip) => AsyncLimiter::<IpAddr>::check_ruled_n(redis, ip, cost).await,
                Client::Text(text) => AsyncLimiter::<str>::check_ruled_n(redis, text, cost).await,
            },
        };
        self.stats.count(&ruled.decision);
        ruled
    }

    async fn refund_in(
        &self,
        tier: Option<&str>,
        key: &Client,
        admitted: &Decision,
        cost: u64,
    ) -> u64 {
        let given = match &self.store {
            Store::Memory(limiter) => {
                AsyncLimiter::refund_in(&**limiter, tier, key, admitted, cost).await
            }
            #[cfg(feature = "redis")]
            Store::Redis(redis) => match key {
                Client::Ip(ip) => {
                    AsyncLimiter::<IpAddr>::refund_in(redis, tier, ip, admitted, cost).await
                }
                Client::Text(text) => {
                    AsyncLimiter::<str>::refund_in(redis, tier, text, admitted, cost).await
                }
            },
        };
        self.stats.refunded.fetch_add(given, Ordering::Relaxed);
        given
    }

    fn holds(&self, ruled: &RuledDecision<'_>) -> bool {
        match &self.store {
            Store::Memory(_) => ruled.holds(),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => AsyncLimiter::<str>::holds(redis, ruled),
        }
    }

    fn refused_in_flight(&self, ruled: &RuledDecision<'_>) -> Option<floodgate::Rule> {
        match &self.store {
            Store::Memory(_) => ruled.refused_in_flight(),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => AsyncLimiter::<str>::refused_in_flight(redis, ruled),
        }
    }

    async fn release_in(&self, tier: Option<&str>, key: &Client, cost: u64) -> u64 {
        let released = match &self.store {
            Store::Memory(limiter) => AsyncLimiter::release_in(&**limiter, tier, key, cost).await,
            #[cfg(feature = "redis")]
            Store::Redis(redis) => match key {
                Client::Ip(ip) => AsyncLimiter::<IpAddr>::release_in(redis, tier, ip, cost).await,
                Client::Text(text) => {
                    AsyncLimiter::<str>::release_in(redis, tier, text, cost).await
                }
            },
        };
        self.stats.released.fetch_add(released, Ordering::Relaxed);
        released
    }
}

/// A refusal of the library's in the words of the flags given: those of
/// --policy, --limit and --window, or --rule's (each of which was checked
/// as it was parsed).
fn explained(error: &ConfigError, args: &Args) -> String {
    match (args.limit, &args.window) {
        (Some(limit), Some(window)) => explain(
            error,
            &Written {
                limit,
                window_flag: "--window",
                window_text: &window.text,
                tick_nanos: 1,
            },
        ),
        _ => match error {
            ConfigError::RuleCount { count } => {
                format!("{count} --rule flags: a limiter applies at most {MAX_RULES}")
            }
            // The refusal of --max-clients 0 names no quota: the flags'
            // words whatever the rules.
            ConfigError::RefusesEveryone => explain(
                error,
                &Written {
                    limit: 0,
                    window_flag: "--rule",
                    window_text: "",
                    tick_nanos: 1,
                },
            ),
            _ => format!("--rule: {error}"),
        },
    }
}

/// The rules the flags give: each --rule, or the one of --policy, --limit
/// and --window (clap lets through either set, never both nor neither).
fn rules(args: &Args) -> Result<RuleSet, String> {
    if let Some(default) = args.tier.first() {
        return Ok(default.rules.clone());
    }
    let rules = match (args.policy, args.limit, &args.window) {
        (Some(policy), Some(limit), Some(window)) => vec![Config::per(limit, window.duration())
            .and_then(|config| Rule::new(policy, config))
            .map_err(|error| explained(&error, args))?],
        _ => args.rule.clone(),
    };
    RuleSet::new(rules).map_err(|error| explained(&error, args))
}

/// The bounds of the in-memory store the flags give.
fn bounds(args: &Args) -> Result<Bounds, String> {
    let mut bounds = Bounds::new().on_overflow(args.overflow);
    if args.evict_idle {
        bounds = bounds.evict_idle();
    }
    if let Some(max_clients) = args.max_clients {
        bounds = bounds.max_clients(max_clients);
    }
    bounds.validate().map_err(|error| explained(&error, args))
}

/// The extractor the flags give.
fn extractor(args: &Args) -> Result<Extract, String> {
    let ipv6_prefix = args.ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX);
    match &args.key {
        KeyKind::Ip if args.trusted_proxy.is_empty() => {
            Ok(Extract::Peer(PeerIp::new().ipv6_prefix(ipv6_prefix)))
        }
        KeyKind::Ip => ForwardedIp::trusting(&args.trusted_proxy)
            .map(|forwarded| Extract::Forwarded(forwarded.ipv6_prefix(ipv6_prefix)))
            .map_err(|e| format!("--trusted-proxy: {e}")),
        _ if !args.trusted_proxy.is_empty() => {
            Err("--trusted-proxy goes with --key ip only".to_owned())
        }
        _ if args.ipv6_prefix.is_some() => Err("--ipv6-prefix goes with --key ip only".to_owned()),
        KeyKind::Global => Ok(Extract::Global(Global::new())),
        KeyKind::Header(name) => Ok(Extract::Header(Header::from_name(name.clone()))),
    }
}

/// Runs `floodgate proxy`.
pub fn run(args: Args) -> ExitCode {
    #[cfg(not(feature = "redis"))]
    if args.backend.is_some() {
        return usage(floodgate_cli::args::left_out(
            "`floodgate proxy --backend`",
            "proxy,redis",
        ));
    }
    if let Err(error) = stores::check_state_every(args.state_every.as_ref()) {
        return usage(error);
    }
    if args.tier_header.is_some() && args.tier.is_empty() {
        return usage("--tier-header names a tier of --tier: give the tiers with --tier");
    }
    let rules = match rules(&args) {
        Ok(rules) => rules,
        Err(message) => return usage(message),
    };
    let extractor = match extractor(&args) {
        Ok(extractor) => extractor,
        Err(message) => return usage(message),
    };
    let bounds = match bounds(&args) {
        Ok(bounds) => bounds,
        Err(message) => return usage(message),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("floodgate proxy: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(args, rules, bounds, extractor))
}

async fn store(args: &Args, rules: &RuleSet, bounds: Bounds) -> Result<Store, ExitCode> {
    #[cfg(feature = "redis")]
    if let Some(url) = &args.backend {
        let options = stores::redis_options(args.lease, args.lease_term.as_ref());
        let redis = stores::open_redis(url, rules, options)
            .await
            .map_err(|e| usage(format!("--backend {url}: {e}")))?;
        stores::warn_if_unreachable(&redis, url, "proxy").await;
        return Ok(Store::Redis(redis));
    }
    if let Some(path) = &args.state {
        stores::check_state_path(path).map_err(usage)?;
    }
    let saved = match &args.state {
        Some(path) => stores::saved_state(path).map_err(usage)?,
        None => None,
    };
    let clock = stores::clock(saved.as_ref());
    let limiter = if let Some((default, others)) = args.tier.split_first() {
        tiers(default, others, bounds, clock).map_err(usage)?
    } else {
        // Counting decisions is an atomic add per check on the thread's own
        // cache line: the price of `/metrics` and nothing beside a forward.
        Builder::from_rules(rules)
            .bounds(bounds)
            .counting(true)
            // The clients refused most, for `/offenders`: fed by rejections
            // only, 1,024 entries (about 70 KB) whatever the flood.
            .offenders(OFFENDERS)
            .clock(clock)
            .build::<Client>()
            .map_err(|error| usage(explained(&error, args)))?
    };
    if let Some(saved) = saved {
        let loaded = if args.state_carry_over {
            saved.load_carried_into(&*limiter)
        } else {
            saved.load_into(&*limiter)
        }
        .map_err(|error| {
            if error.is_other_rules() {
                usage(format!("{error}; {}", stores::OTHER_RULES_HINT))
            } else {
                usage(error)
            }
        })?;
        eprintln!(
            "floodgate proxy: loaded {} from {}",
            stores::clients(loaded),
            saved_path(args)
        );
    }
    Ok(Store::Memory(limiter))
}

/// `--state`'s path, as messages show it.
fn saved_path(args: &Args) -> String {
    args.state
        .as_deref()
        .map(|path| path.display().to_string())
        .unwrap_or_default()
}

/// The registry of `--tier`: `default` first, the tier of every request
/// that names none.
fn tiers(
    default: &TierArg,
    others: &[TierArg],
    bounds: Bounds,
    clock: QuantaClock,
) -> Result<Arc<dyn RateLimiter<Client>>, String> {
    // The process's whole life: one name, never freed, so the resolver
    // answers it without an allocation per request.
    let name: &'static str = Box::leak(default.name.clone().into_boxed_str());
    let tier_error = |tier: &TierArg, error: ConfigError| match error {
        ConfigError::DuplicateTier { name } => format!("--tier {name} is given twice"),
        error => format!("--tier {}: {error}", tier.name),
    };
    let mut tiers =
        Tiers::with_clock_rules(name, default.rules.clone(), move |_: &Client| name, clock)
            .map_err(|error| tier_error(default, error))?
            .with_bounds(bounds)
            .map_err(|error| tier_error(default, error))?
            .counting(true);
    for tier in others {
        tiers = tiers
            .with_tier_rules(&tier.name, tier.rules.clone())
            .map_err(|error| tier_error(tier, error))?;
    }
    Ok(Arc::new(tiers))
}

async fn serve(args: Args, rules: RuleSet, bounds: Bounds, extractor: Extract) -> ExitCode {
    // What the library says once to an operator (the cap reached, Redis
    // unreachable and back) goes to standard error, beside the totals.
    // Another subscriber already installed (a test's) is kept.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false)
        .try_init();
    let store = match store(&args, &rules, bounds).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let stats = Arc::new(Stats::default());
    let in_memory = match &store {
        Store::Memory(limiter) => Some(Arc::clone(limiter)),
        #[cfg(feature = "redis")]
        Store::Redis(_) => None,
    };
    let in_memory_limiter = in_memory.clone();
    #[cfg(feature = "redis")]
    let redis = match &store {
        Store::Redis(redis) => Some(redis.clone()),
        Store::Memory(_) => None,
    };
    let limiter = Counted {
        store,
        stats: Arc::clone(&stats),
    };
    let mut layer = RateLimitLayer::new(limiter, extractor).policy_name(&args.policy_name);
    if args.legacy_headers {
        layer = layer.legacy_headers();
    }
    if let Some(header) = &args.tier_header {
        layer = layer.tier_header(header.as_str());
    }
    if !args.refund_on.is_empty() {
        let statuses = args.refund_on.clone();
        layer = layer.refund_on(move |status| statuses.iter().any(|s| s.matches(status)));
    }
    let forward = Forward::new(args.upstream.clone(), Arc::clone(&stats));
    let measured = Arc::new(Metrics::default());
    let service = Measured::new(layer.layer(Timed(forward.clone())), Arc::clone(&measured));

    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(error) => {
            eprintln!("floodgate proxy: cannot catch SIGINT and SIGTERM: {error}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("floodgate proxy: cannot listen on {}: {error}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let local = match listener.local_addr() {
        Ok(local) => local,
        Err(error) => {
            eprintln!("floodgate proxy: cannot read the listening address: {error}");
            return ExitCode::FAILURE;
        }
    };
    let metrics_listener = match args.metrics_listen {
        None => None,
        Some(address) => {
            let listener = match TcpListener::bind(address).await {
                Ok(listener) => listener,
                Err(error) => {
                    eprintln!("floodgate proxy: cannot listen on {address} for metrics: {error}");
                    return ExitCode::FAILURE;
                }
            };
            match listener.local_addr() {
                Ok(local) => Some((listener, local)),
                Err(error) => {
                    eprintln!("floodgate proxy: cannot read the metrics address: {error}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    // Made once nothing can stop the start: a saver dropped saves.
    let saver = match (&args.state, in_memory_limiter) {
        (Some(path), Some(limiter)) => Some(Arc::new(match &args.state_every {
            Some(every) => Saver::spawn(limiter, path, every.duration()),
            None => Saver::new(limiter, path),
        })),
        _ => None,
    };
    let metrics_server = metrics_listener.map(|(listener, local)| {
        let scraped = Scraped {
            limiter: in_memory,
            #[cfg(feature = "redis")]
            redis,
            name: args.policy_name.clone(),
            stats: Arc::clone(&stats),
            metrics: Arc::clone(&measured),
            saver: saver.clone(),
        };
        (
            local,
            tokio::spawn(metrics::serve(listener, Arc::new(scraped))),
        )
    });
    // `println!` flushes at its newline only on a terminal: a test or a
    // supervisor reading a pipe waits for these lines; `listening on`
    // comes last, once both listeners are bound.
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if let Some((metrics, _)) = &metrics_server {
            let _ = writeln!(out, "metrics on http://{metrics}/metrics");
        }
        let _ = writeln!(out, "listening on http://{local}");
        let _ = out.flush();
    }
    let held = stores::held(
        args.backend.as_deref(),
        args.lease,
        args.lease_term.as_ref().map(|term| term.text.as_str()),
    );
    eprintln!(
        "floodgate proxy: {} per client ({}) in {held}, to {}",
        describe_limits(&args, &rules),
        describe_key(&args),
        args.upstream
    );

    let printer = tokio::spawn(print_stats(Arc::clone(&stats), forward.clone()));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new());
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, most likely: wait for some
                    // connections to close rather than spin.
                    eprintln!("floodgate proxy: accept failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = signals.recv() => break,
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        // The layer's `PeerIp` and `ForwardedIp` read the peer here.
        let service = TowerToHyperService::new(service.map_request(
            move |mut request: hyper::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(peer);
                request
            },
        ));
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A client that goes away mid-request is its own business.
            let _ = connection.await;
        });
    }
    drop(listener);
    eprintln!("floodgate proxy: stopping; finishing the requests in flight");
    // A second signal stops the wait for the requests in flight, not the
    // save: what clients spent is kept either way.
    let finished = tokio::select! {
        () = graceful.shutdown() => true,
        () = signals.recv() => {
            eprintln!("floodgate proxy: second signal, stopping now");
            false
        }
    };
    printer.abort();
    if let Some((_, server)) = metrics_server {
        server.abort();
    }
    eprintln!("{}", stats_line(stats.snapshot()));
    let saved = match saver {
        Some(saver) => stores::save_at_stop(saver, "proxy").await,
        None => true,
    };
    if finished && saved {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The limits, as the banner says them: the rules, or every tier's and
/// how a request's tier is chosen.
fn describe_limits(args: &Args, rules: &RuleSet) -> String {
    let Some(default) = args.tier.first() else {
        return rules.to_string();
    };
    let tiers: Vec<String> = args
        .tier
        .iter()
        .map(|tier| format!("{}={}", tier.name, tier.rules))
        .collect();
    let chosen = match &args.tier_header {
        Some(header) => format!(
            "each request's tier named by header {header}; {} when it names none or no tier",
            default.name
        ),
        None => format!(
            "no --tier-header: every request in the default tier, {}",
            default.name
        ),
    };
    format!("tiers {} ({chosen})", tiers.join(", "))
}

fn describe_key(args: &Args) -> String {
    match &args.key {
        KeyKind::Ip if args.trusted_proxy.is_empty() => "by peer address".to_owned(),
        KeyKind::Ip => format!(
            "by forwarded address behind {}",
            args.trusted_proxy.join(", ")
        ),
        KeyKind::Global => "one global limit".to_owned(),
        KeyKind::Header(name) => format!("by header {name}"),
    }
}

/// Prints the counts every [`STATS_EVERY`] in which they changed, with the
/// last upstream failure if there was one.
async fn print_stats(stats: Arc<Stats>, forward: Forward) {
    let mut printed = [0; 6];
    let start = tokio::time::Instant::now() + STATS_EVERY;
    let mut ticks = tokio::time::interval_at(start, STATS_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let counts = stats.snapshot();
        if counts != printed {
            eprintln!("{}", stats_line(counts));
            printed = counts;
        }
        if let Some(error) = forward.take_error() {
            eprintln!("floodgate proxy: last upstream error: {error}");
        }
    }
}
