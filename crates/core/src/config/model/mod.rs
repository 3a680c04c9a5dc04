//! The validated configuration: plain data, checked once. A `Config` that exists is a
//! valid one; turning it into running listeners, pools and budgets is the job of
//! `sides::Server` (and `upstream::Upstream::build` for each upstream), which reads it
//! and never writes it back.
//!
//! The types of the retry sections, of endpoint health and hedging, of TLS and of
//! discovery live in [`retry`], [`health`], [`tls`] and [`discovery`]; they are plain
//! data too, so that the layers above build their running parts from them without the
//! config depending on any of those layers.

mod dedupe;
mod discovery;
mod health;
mod inbound;
mod retry;
mod tls;
mod tracing;

pub use dedupe::*;
pub use discovery::*;
pub use health::*;
pub use inbound::*;
pub use retry::*;
pub use tls::*;
pub use tracing::*;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

#[derive(Clone, Debug)]
pub struct Config {
    /// The file this came from, as named in diagnostics.
    pub file: String,
    pub runtime: RuntimeConfig,
    pub listener: ListenerConfig,
    pub admin: AdminConfig,
    pub deadline: DeadlineConfig,
    pub access_log: AccessLogConfig,
    /// Sorted by name.
    pub upstreams: Vec<UpstreamConfig>,
    /// `[inbound]`: tollgate in front of its own app too.
    pub inbound: Option<InboundConfig>,
    /// `[tracing]`: spans exported over OTLP. `None`: nothing is traced.
    pub tracing: Option<TracingConfig>,
    /// `[kubernetes]`: where the API is, for upstreams with `discovery = "kubernetes"`.
    pub kubernetes: KubernetesConfig,
    /// Where each key was written (`line`, `column`), for lints that point at it.
    pub positions: Arc<BTreeMap<String, (usize, usize)>>,
    /// A digest of the text this was parsed from: a reload of identical text is skipped.
    pub source_hash: u64,
}

impl Config {
    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.iter().find(|u| u.name == name)
    }

    /// Whether this config gives tollgate something to serve. A config with no
    /// upstream and no inbound side owns no retry (it passes every request through, or
    /// answers each with `404 no-route`): it is refused by `run`, `check` and a reload,
    /// because it is far more often an empty or half-written file than an intent. A
    /// plain forward proxy is asked for by writing `unknown_authorities = "pass"`.
    pub fn serves_anything(&self) -> bool {
        !self.upstreams.is_empty() || self.inbound.is_some()
    }

    /// Where `key` (or the nearest enclosing table that was written) is in the file.
    pub fn position(&self, key: &str) -> (usize, usize) {
        let mut key = key;
        loop {
            if let Some(pos) = self.positions.get(key) {
                return *pos;
            }
            match key.rfind('.') {
                Some(i) => key = &key[..i],
                None => return (1, 1),
            }
        }
    }
}

/// `[access_log]`: one line per request on stderr, off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessLogConfig {
    pub enabled: bool,
    pub format: AccessLogFormat,
    /// Log the path's query too (off: a query often carries what must not be logged).
    pub query: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// `key=value` pairs (JSON lines anyway when the logs are, `--log-format json`).
    #[default]
    Text,
    Json,
}

impl AccessLogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            AccessLogFormat::Text => "text",
            AccessLogFormat::Json => "json",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// `None`: the CPUs this process may use.
    pub worker_threads: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerConfig {
    pub addr: SocketAddr,
    pub drain_timeout: Duration,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// A client connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Accepted client connections beyond this are closed at once.
    pub max_connections: usize,
    /// What a request for an authority no upstream lists becomes.
    pub unknown_authorities: UnknownAuthorities,
    /// How long the connect of a connection or request passed through may take.
    pub passthrough_connect_timeout: Duration,
}

/// The `upstream` label of the requests passed through (`unknown_authorities =
/// "pass"`): no upstream may be named so.
pub const PASSTHROUGH: &str = "passthrough";

/// `unknown_authorities`: what a request for an authority no upstream lists becomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownAuthorities {
    /// Forwarded as it is, once, as if tollgate were not there (and a `CONNECT`
    /// tunnelled).
    #[default]
    Pass,
    /// Answered `404 no-route`.
    Refuse,
}

impl UnknownAuthorities {
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownAuthorities::Pass => "pass",
            UnknownAuthorities::Refuse => "refuse",
        }
    }
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 15001)),
            drain_timeout: Duration::from_secs(20),
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            unknown_authorities: UnknownAuthorities::Pass,
            passthrough_connect_timeout: Duration::from_secs(1),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminConfig {
    pub addr: SocketAddr,
    /// The kubelet probes `GET /probe/PORT/PATH` may forward to the app (moved to the
    /// admin port by `tollgate inject`), each an exact port and path; empty: none.
    pub probes: Vec<Probe>,
}

/// One probe the admin port forwards: `GET /probe/PORT/PATH` is a GET to the app's
/// `PORT` for exactly `PATH` (its query included), with `headers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub port: u16,
    /// Starts with `/`; compared as written, never normalised.
    pub path: String,
    /// The probe's own fields (its `httpHeaders`), sent as declared.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Probe {
    /// The admin target that asks for it: `/probe/PORT/PATH`.
    pub fn target(&self) -> String {
        format!("/probe/{}{}", self.port, self.path)
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 15090)),
            probes: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadlineConfig {
    /// The header written on every attempt.
    pub header: HeaderName,
    /// The headers read from the app, in order of preference; the smallest value wins.
    pub accept: Vec<HeaderName>,
}

impl Default for DeadlineConfig {
    fn default() -> Self {
        DeadlineConfig {
            header: HeaderName::from_static("x-timeout-ms"),
            accept: [
                "x-timeout-ms",
                "grpc-timeout",
                "x-envoy-expected-rq-timeout-ms",
            ]
            .into_iter()
            .map(HeaderName::from_static)
            .collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamConfig {
    pub name: String,
    /// Lower-case `host` or `host:port`.
    pub authorities: Vec<String>,
    pub listen: Option<SocketAddr>,
    /// Empty with `discovery = "kubernetes"`: the Service's pods are the endpoints.
    pub endpoints: Vec<EndpointAddr>,
    /// Where the endpoints come from: `endpoints` re-resolved, or a Service watched.
    pub discovery: Discovery,
    pub host: Option<HeaderValue>,
    pub protocol: Protocol,
    pub connect_timeout: Duration,
    /// The deadline when the caller sends none, and a cap on a longer one. `None`: a
    /// request waits as long as it would without tollgate.
    pub request_timeout: Option<Duration>,
    /// When an attempt without a response head gets a retry started beside it. `None`:
    /// an attempt runs to the deadline.
    pub attempt_timeout: Option<Duration>,
    /// Requests waiting for their response head at once; a streaming body holds no
    /// place.
    pub max_inflight: usize,
    pub retry: RetryConfig,
    /// `None`: no retry budget (retries are capped only by `max_attempts`).
    pub budget: Option<BudgetConfig>,
    pub tls: Option<TlsConfig>,
    /// A pooled connection older than this is closed after its response.
    pub max_connection_age: Option<Duration>,
    /// `None`: endpoints are never ejected for failing (a refused connection is still
    /// skipped for a moment).
    pub outlier: Option<OutlierConfig>,
    /// `None`: no hedged attempts.
    pub hedge: Option<HedgeConfig>,
    /// `None`: first attempts are never rejected locally.
    pub throttle: Option<ThrottleConfig>,
    /// What a request that is, on evidence, the app's own retry gets.
    pub app_retries: AppRetries,
}

/// What every key of an upstream not written stands at; the name and the keys that
/// must be written are empty.
impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            name: String::new(),
            authorities: Vec::new(),
            listen: None,
            endpoints: Vec::new(),
            discovery: Discovery::Dns,
            host: None,
            protocol: Protocol::Auto,
            connect_timeout: Duration::from_millis(200),
            request_timeout: None,
            attempt_timeout: None,
            max_inflight: 10_000,
            retry: RetryConfig::off(),
            budget: None,
            tls: None,
            max_connection_age: None,
            outlier: None,
            hedge: None,
            throttle: None,
            app_retries: AppRetries::Count,
        }
    }
}

impl UpstreamConfig {
    /// The longest a caller can wait on this upstream when every attempt times out and
    /// every backoff draws its maximum: attempts × attempt_timeout + the backoff caps.
    /// `None` without an attempt timeout: an attempt then waits to the deadline.
    pub fn total_patience(&self) -> Option<Duration> {
        let attempts = self.retry.max_attempts;
        let mut total = self.attempt_timeout? * attempts;
        for n in 0..attempts.saturating_sub(1) {
            total += self.retry.backoff.cap(n);
        }
        Some(total)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointAddr {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for EndpointAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl EndpointAddr {
    /// The socket address when the host is an IP literal (no resolution needed).
    pub fn ip(&self) -> Option<SocketAddr> {
        self.host
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, self.port))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    /// HTTP/2 with prior knowledge in cleartext; with TLS, HTTP/2 by ALPN.
    H2,
    /// Cleartext: the protocol the app used. TLS: whatever ALPN picks.
    Auto,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::H2 => "h2c",
            Protocol::Auto => "auto",
        }
    }
}

/// Where `run` and `check` look when neither `--config` nor `$TOLLGATE_CONFIG` names a file.
pub const DEFAULT_CONFIG_PATH: &str = "config/tollgate.toml";
