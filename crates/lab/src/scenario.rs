//! The lab's scenarios and the two tollgate configurations every scenario runs.
//!
//! Both chains are the same tollgate code; the difference is only config:
//!
//! - **naive**: every hop makes three blind attempts with a fixed 50 ms backoff, no
//!   budget, ignores the caller's deadline (`accept = []`), ignores Retry-After and
//!   retries failures another layer already gave up on (`ownership = "ignore"`, and
//!   `app_retries = "ignore"`: the layer above's retries are new requests to it). Each
//!   hop has a per-attempt timeout of its own choosing (600 ms at the edge, 200 ms
//!   below it), numbers that look sensible one at a time. This is what a stack of
//!   well-meaning client libraries does.
//! - **owned**: what we recommend. Full-jitter backoff, the caller's deadline propagated,
//!   a per-upstream budget (20 % of requests plus 10 retries a second, the share the
//!   published budgeted chain used), and the ownership rule, so the layer nearest the
//!   failure owns the retry and the edge passes its verdict back.
//! - **adaptive**: owned, with the budget's share adapting between 20 % and 60 %
//!   (`max_ratio = 0.6`) from what the backend shows.
//! - **throttled**: adaptive, with client-side throttling of first attempts
//!   (`[throttle]`, `k = 2`, 5 s window) at both hops.
//!
//! In the retry-storm scenarios (storm, brownout, dip, down, dead) the four chains run
//! side by side, against backends of their own.
//!
//! Two scenarios are about the endpoints rather than retry storms, and compare the
//! owned chain with and without one feature: `hedge` (a slow tail, without and with
//! `[hedge]`) and `blackhole` (one of three endpoints silent, without and with
//! `[outlier]`, beside a run where all three answer).

use std::net::SocketAddr;
use std::time::Duration;

use super::backend::{Condition, Schedule};
use super::load::{LoadSpec, Urls};

/// Figures a scenario is compared against.
#[derive(Clone, Copy, Debug)]
pub struct Published {
    pub source: &'static str,
    pub requests: u64,
    pub succeeded: u64,
    pub backend_calls: u64,
    pub amplification: f64,
    pub p50: Duration,
    pub p99: Duration,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: &'static str,
    pub about: String,
    pub load: LoadSpec,
    pub backend: Schedule,
    /// When the trouble ends, for scenarios that report recovery.
    pub recovery_from: Option<Duration>,
    pub published: Option<Published>,
    /// The chains run side by side, each with a backend of its own.
    pub columns: Vec<Column>,
    /// Latency is also reported for the requests sent after this (the first seconds,
    /// while the proxy learns, left out).
    pub settled_after: Option<Duration>,
}

/// One chain of a scenario, and the backend it runs against.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub chain: Chain,
    /// Its name in `--json` and in the progress line.
    pub key: &'static str,
    /// Its heading in the table.
    pub title: &'static str,
    /// Endpoints of the backend that answer.
    pub endpoints: usize,
    /// Endpoints that accept connections and never answer ([`super::backend::Silent`]).
    pub silent: usize,
}

/// The columns of the retry-storm scenarios: one per chain of [`Chain::STORM`].
fn storm_columns() -> Vec<Column> {
    Chain::STORM
        .into_iter()
        .map(|chain| Column {
            chain,
            key: chain.as_str(),
            title: chain.title(),
            endpoints: 1,
            silent: 0,
        })
        .collect()
}

/// Flags that override a scenario's parameters.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub duration: Option<Duration>,
    pub rps: Option<f64>,
    pub error_rate: Option<f64>,
}

pub const NAMES: [&str; 7] = [
    "storm",
    "brownout",
    "dip",
    "down",
    "dead",
    "hedge",
    "blackhole",
];

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The scenario called `name`, with `o` applied; `None` for an unknown name.
pub fn scenario(name: &str, o: &Overrides) -> Option<Scenario> {
    let mut s = match name {
        "storm" => storm(),
        "brownout" => brownout(),
        "dip" => dip(),
        "down" => down(),
        "dead" => dead(),
        "hedge" => hedge(),
        "blackhole" => blackhole(),
        _ => return None,
    };
    if let Some(d) = o.duration {
        // Shorten (or stretch) the whole timeline, episodes included.
        let k = d.as_secs_f64() / s.load.duration.as_secs_f64();
        s.load.duration = d;
        for (from, to, _) in &mut s.backend.episodes {
            *from = from.mul_f64(k);
            *to = to.mul_f64(k);
        }
        s.recovery_from = s.recovery_from.map(|r| r.mul_f64(k));
        s.settled_after = s.settled_after.map(|r| r.mul_f64(k));
    }
    if let Some(r) = o.rps {
        s.load.rps = r;
    }
    if let Some(e) = o.error_rate {
        s.backend.normal.error_rate = e;
        for (_, _, c) in &mut s.backend.episodes {
            c.error_rate = e;
        }
    }
    if o.duration.is_some() || o.rps.is_some() || o.error_rate.is_some() {
        s.published = None;
    }
    s.about = describe(&s);
    Some(s)
}

/// Load spread over a hundred URLs, with a user who waits twice the deadline.
fn zipf(rps: f64, duration: Duration, deadline: Duration) -> LoadSpec {
    LoadSpec {
        rps,
        duration,
        deadline,
        patience: deadline * 2,
        host: "api",
        urls: Urls::Zipf(100),
    }
}

/// A retry-storm scenario with one episode of trouble, whose end is where recovery is
/// measured from; the backend is healthy outside it.
struct Episode {
    name: &'static str,
    load: LoadSpec,
    workers: usize,
    /// The backend's median outside the episode.
    median: Duration,
    from: Duration,
    to: Duration,
    trouble: Condition,
}

impl Episode {
    fn scenario(self) -> Scenario {
        Scenario {
            name: self.name,
            about: String::new(),
            load: self.load,
            backend: Schedule {
                workers: self.workers,
                normal: Condition::healthy(self.median),
                episodes: vec![(self.from, self.to, self.trouble)],
            },
            recovery_from: Some(self.to),
            published: None,
            columns: storm_columns(),
            settled_after: None,
        }
    }
}

/// A scenario whose backend keeps its `normal` condition, for `columns` side by side.
fn steady(
    name: &'static str,
    load: LoadSpec,
    workers: usize,
    normal: Condition,
    columns: Vec<Column>,
) -> Scenario {
    Scenario {
        name,
        about: String::new(),
        load,
        backend: Schedule {
            workers,
            normal,
            episodes: vec![],
        },
        recovery_from: None,
        published: None,
        columns,
        settled_after: None,
    }
}

/// The published experiment: 60 requests/s for 20 s against a backend degraded to
/// 90 requests/s capacity with a 40% base error rate.
fn storm() -> Scenario {
    let load = LoadSpec {
        urls: Urls::One,
        ..zipf(60.0, secs(20), secs(1))
    };
    let normal = Condition {
        error_rate: 0.4,
        ..Condition::healthy(Duration::from_micros(33_333))
    };
    Scenario {
        published: Some(Published {
            source: "published budgeted chain (2026-07-08)",
            requests: 1200,
            succeeded: 921,
            backend_calls: 1899,
            amplification: 1.58,
            p50: ms(10),
            p99: ms(1103),
        }),
        ..steady("storm", load, 3, normal, storm_columns())
    }
}

/// A payment dependency whose median goes from 150 ms to 900 ms for 30 s, behind a
/// pool of connections sized for the good days (Stagefront's on-sale, at a fifth
/// of its traffic: 100 charges/s and a pool of 20).
fn brownout() -> Scenario {
    Episode {
        name: "brownout",
        load: zipf(100.0, secs(60), secs(2)),
        workers: 20,
        median: ms(150),
        from: secs(10),
        to: secs(40),
        trouble: Condition::healthy(ms(900)),
    }
    .scenario()
}

/// 95 % utilisation; capacity drops to a fifth for 2 s.
fn dip() -> Scenario {
    Episode {
        name: "dip",
        load: zipf(95.0, secs(20), secs(1)),
        workers: 10,
        median: ms(100),
        from: secs(5),
        to: secs(7),
        trouble: Condition::healthy(ms(500)),
    }
    .scenario()
}

/// Hard down (connections refused) for 10 s, then healthy.
fn down() -> Scenario {
    Episode {
        name: "down",
        load: zipf(80.0, secs(25), secs(1)),
        workers: 10,
        median: ms(100),
        from: secs(5),
        to: secs(15),
        trouble: Condition {
            down: true,
            ..Condition::healthy(ms(100))
        },
    }
    .scenario()
}

/// A dependency with a slow tail: 2% of its answers take ten times the median
/// (20 ms, so 200 ms), at a tenth of its capacity. Without hedging that tail is the
/// p99; with hedging after the p95, the slow attempts get a second one.
fn hedge() -> Scenario {
    let endpoint = |chain, key, title| Column {
        chain,
        key,
        title,
        endpoints: 3,
        silent: 0,
    };
    let tail = Condition {
        slow_share: 0.02,
        ..Condition::healthy(ms(20))
    };
    let columns = vec![
        endpoint(Chain::Owned, "plain", "without hedging"),
        endpoint(Chain::Hedged, "hedged", "hedged (p95, max_extra 5%)"),
    ];
    let load = zipf(200.0, secs(30), secs(1));
    steady("hedge", load, 64, tail, columns)
}

/// Three endpoints, one of which accepts connections and never answers (a hung pod
/// that still passes its TCP check): side by side, a run where all three answer, the
/// silent one without outlier ejection, and with it.
fn blackhole() -> Scenario {
    let column = |chain, key, title, endpoints, silent| Column {
        chain,
        key,
        title,
        endpoints,
        silent,
    };
    let columns = vec![
        column(Chain::Ejecting, "healthy", "three answering", 3, 0),
        column(Chain::Owned, "silent", "one silent", 2, 1),
        column(Chain::Ejecting, "ejecting", "one silent, [outlier]", 2, 1),
    ];
    let load = zipf(100.0, secs(30), secs(1));
    Scenario {
        settled_after: Some(secs(3)),
        ..steady("blackhole", load, 30, Condition::healthy(ms(20)), columns)
    }
}

/// Dead for 10 s behind a load balancer that answers every request 503 at once (no
/// healthy endpoint), then healthy: every call is counted at the backend, so what the
/// chains send a dead dependency can be read.
fn dead() -> Scenario {
    let mut s = down();
    s.name = "dead";
    let answering_503 = Condition {
        error_rate: 1.0,
        ..Condition::healthy(ms(1))
    };
    s.backend.episodes = vec![(secs(5), secs(15), answering_503)];
    s
}

fn describe(s: &Scenario) -> String {
    let cap = s.backend.capacity(&s.backend.normal);
    let base = format!(
        "{:.0} requests/s for {:.0} s, user deadline {} ms, against a backend of {:.0} requests/s capacity",
        s.load.rps,
        s.load.duration.as_secs_f64(),
        s.load.deadline.as_millis(),
        cap
    );
    let mut errors = if s.backend.normal.error_rate > 0.0 {
        format!(
            " with a {:.0}% base error rate",
            s.backend.normal.error_rate * 100.0
        )
    } else {
        String::new()
    };
    if s.backend.normal.slow_share > 0.0 {
        errors.push_str(&format!(
            ", {:.0}% of answers ten times slower than the median {} ms",
            s.backend.normal.slow_share * 100.0,
            s.backend.normal.service.as_millis()
        ));
    }
    if let Some(c) = s.columns.iter().find(|c| c.silent > 0) {
        errors.push_str(&format!(
            ", {} of its {} endpoints silent (accepting and never answering)",
            c.silent,
            c.endpoints + c.silent
        ));
    }
    let episodes: Vec<String> = s
        .backend
        .episodes
        .iter()
        .map(|(from, to, c)| {
            let what = if c.down {
                "hard down".to_string()
            } else if c.error_rate >= 1.0 {
                "dead behind its load balancer (every request answered 503 at once)".to_string()
            } else if c.service != s.backend.normal.service {
                format!(
                    "median {} ms -> {} ms ({:.0} requests/s capacity)",
                    s.backend.normal.service.as_millis(),
                    c.service.as_millis(),
                    s.backend.capacity(c)
                )
            } else {
                "degraded".to_string()
            };
            format!(
                "{what} from {:.0} s to {:.0} s",
                from.as_secs_f64(),
                to.as_secs_f64()
            )
        })
        .collect();
    if episodes.is_empty() {
        format!("{base}{errors}")
    } else {
        format!("{base}{errors}; {}", episodes.join(", "))
    }
}

/// How a chain's tollgates are configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chain {
    Naive,
    Owned,
    /// Owned, with `max_ratio`.
    Adaptive,
    /// Adaptive, with `[throttle]`.
    Throttled,
    /// Owned, with `[hedge]` after the p95 and `max_extra = 0.05` at the api hop.
    Hedged,
    /// Owned, with `[outlier]` (its defaults) at the api hop.
    Ejecting,
}

impl Chain {
    /// The chains of the retry-storm scenarios.
    pub const STORM: [Chain; 4] = [
        Chain::Naive,
        Chain::Owned,
        Chain::Adaptive,
        Chain::Throttled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Chain::Naive => "naive",
            Chain::Owned => "owned",
            Chain::Adaptive => "adaptive",
            Chain::Throttled => "throttled",
            Chain::Hedged => "hedged",
            Chain::Ejecting => "ejecting",
        }
    }

    /// What the chain is, for a table's head.
    pub fn title(self) -> &'static str {
        match self {
            Chain::Naive => "naive (blind retries)",
            Chain::Owned => "owned (tollgate)",
            Chain::Adaptive => "adaptive (max_ratio)",
            Chain::Throttled => "throttled (+throttle)",
            Chain::Hedged => "hedged",
            Chain::Ejecting => "ejecting",
        }
    }
}

fn listener() -> &'static str {
    "[listener]\naddr = \"127.0.0.1:0\"\nmax_connections = 5000\n[admin]\naddr = \"127.0.0.1:0\"\n"
}

/// The edge tollgate's config: it forwards `Host: api` to the api tollgate at `next`.
/// Hedging and ejection are the api hop's, nearest the endpoints.
pub fn edge_config(chain: Chain, next: SocketAddr, s: &Scenario) -> String {
    let chain = match chain {
        Chain::Hedged | Chain::Ejecting => Chain::Owned,
        c => c,
    };
    hop(chain, "api", "backend", &[next], s, true)
}

/// The api tollgate's config: it forwards `Host: backend` to the backend's endpoints.
pub fn api_config(chain: Chain, endpoints: &[SocketAddr], s: &Scenario) -> String {
    hop(chain, "backend", "backend", endpoints, s, false)
}

fn hop(
    chain: Chain,
    name: &str,
    host_out: &str,
    endpoints: &[SocketAddr],
    s: &Scenario,
    edge: bool,
) -> String {
    let authority = if edge { "api" } else { "backend" };
    let next = endpoints
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let feature = match chain {
        Chain::Hedged => format!("[upstreams.{name}.hedge]\nafter = \"p95\"\nmax_extra = 0.05\n"),
        Chain::Ejecting => format!("[upstreams.{name}.outlier]\n"),
        _ => String::new(),
    };
    match chain {
        Chain::Naive => format!(
            "{}[deadline]\naccept = []\n\
             [upstreams.{name}]\nauthorities = [\"{authority}\"]\nendpoints = [{next}]\nhost = \"{host_out}\"\n\
             connect_timeout = \"1s\"\nrequest_timeout = \"1h\"\nattempt_timeout = \"{}\"\nmax_inflight = 100000\n\
             app_retries = \"ignore\"\n\
             [upstreams.{name}.retry]\nmax_attempts = 3\nbackoff_base = \"50ms\"\nbackoff_max = \"50ms\"\n\
             backoff_jitter = \"none\"\nretry_after = \"ignore\"\nownership = \"ignore\"\n",
            listener(),
            if edge { "600ms" } else { "200ms" }
        ),
        Chain::Owned | Chain::Adaptive | Chain::Throttled | Chain::Hedged | Chain::Ejecting => {
            // The edge's attempt may take the whole deadline; the api's attempts are a
            // fraction of it so a retry still fits. Patience shrinks with depth.
            let deadline = s.load.deadline.as_millis();
            let attempt = if edge {
                deadline
            } else {
                (deadline / 2).max(50)
            };
            format!(
                "{}[upstreams.{name}]\nauthorities = [\"{authority}\"]\nendpoints = [{next}]\nhost = \"{host_out}\"\n\
                 connect_timeout = \"200ms\"\nrequest_timeout = \"{deadline}ms\"\nattempt_timeout = \"{attempt}ms\"\nmax_inflight = 100000\n\
                 [upstreams.{name}.retry]\nmax_attempts = 3\nbackoff_base = \"25ms\"\nbackoff_max = \"1s\"\n\
                 [upstreams.{name}.budget]\nratio = 0.2\nmin_per_sec = 10\nwindow = \"10s\"\n{}{feature}",
                listener(),
                learning(chain, name)
            )
        }
    }
}

/// What the adaptive and throttled chains add to the owned one.
fn learning(chain: Chain, name: &str) -> String {
    let adaptive = "max_ratio = 0.6\n";
    match chain {
        Chain::Adaptive => adaptive.to_string(),
        Chain::Throttled => {
            format!("{adaptive}[upstreams.{name}.throttle]\nk = 2.0\nwindow = \"5s\"\n")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_exists_and_every_config_is_valid() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        for name in NAMES {
            let s = scenario(name, &Overrides::default()).unwrap();
            for chain in s.columns.iter().map(|c| c.chain) {
                let endpoints = [addr, "127.0.0.1:2".parse().unwrap()];
                for text in [
                    edge_config(chain, addr, &s),
                    api_config(chain, &endpoints, &s),
                ] {
                    tollgate_core::config::parse("lab.toml", &text, std::path::Path::new("."))
                        .unwrap_or_else(|e| panic!("{name} {chain:?}: {e}\n{text}"));
                }
            }
        }
        assert!(scenario("nope", &Overrides::default()).is_none());
    }

    #[test]
    fn storm_matches_the_published_setup() {
        let s = scenario("storm", &Overrides::default()).unwrap();
        assert_eq!(s.load.rps, 60.0);
        assert_eq!(s.load.duration, secs(20));
        assert!((s.backend.capacity(&s.backend.normal) - 90.0).abs() < 0.01);
        assert_eq!(s.backend.normal.error_rate, 0.4);
        // As the published load: every user asks for the same URL.
        assert_eq!(s.load.urls, Urls::One);
    }

    #[test]
    fn shortening_scales_the_episodes() {
        let o = Overrides {
            duration: Some(secs(6)),
            ..Overrides::default()
        };
        let s = scenario("dip", &o).unwrap();
        assert_eq!(s.backend.episodes[0].0, Duration::from_millis(1500));
        assert_eq!(s.recovery_from, Some(Duration::from_millis(2100)));
        assert!(s.published.is_none());
    }
}
