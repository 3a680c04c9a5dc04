//! The validated configuration: plain data, checked once. A `Config` that exists is a
//! valid one; turning it into running listeners, pools and budgets is the job of
//! `proxy::Runtime`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};

use crate::retry::backoff::Backoff;

#[derive(Clone, Debug)]
pub struct Config {
    /// The file this came from, as named in diagnostics.
    pub file: String,
    pub runtime: RuntimeConfig,
    pub listener: ListenerConfig,
    pub admin: AdminConfig,
    pub deadline: DeadlineConfig,
    /// Sorted by name.
    pub upstreams: Vec<UpstreamConfig>,
    /// Where each key was written (`line`, `column`), for lints that point at it.
    pub positions: Arc<BTreeMap<String, (usize, usize)>>,
    /// A digest of the text this was parsed from: a reload of identical text is skipped.
    pub source_hash: u64,
}

impl Config {
    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.iter().find(|u| u.name == name)
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

#[derive(Clone, Debug, PartialEq, Eq)]
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminConfig {
    pub addr: SocketAddr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadlineConfig {
    /// The header written on every attempt.
    pub header: HeaderName,
    /// The headers read from the app, in order of preference; the smallest value wins.
    pub accept: Vec<HeaderName>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamConfig {
    pub name: String,
    /// Lower-case `host` or `host:port`.
    pub authorities: Vec<String>,
    pub listen: Option<SocketAddr>,
    pub endpoints: Vec<EndpointAddr>,
    pub host: Option<HeaderValue>,
    pub protocol: Protocol,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub attempt_timeout: Duration,
    pub max_inflight: usize,
    pub retry: RetryConfig,
    /// `None`: no retry budget (retries are capped only by `max_attempts`).
    pub budget: Option<BudgetConfig>,
    pub tls: Option<TlsConfig>,
}

impl UpstreamConfig {
    /// The longest a caller can wait on this upstream when every attempt times out and
    /// every backoff draws its maximum: attempts × attempt_timeout + the backoff caps.
    pub fn total_patience(&self) -> Duration {
        let attempts = self.retry.max_attempts;
        let mut total = self.attempt_timeout * attempts;
        for n in 0..attempts.saturating_sub(1) {
            total += self.retry.backoff.cap(n);
        }
        total
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

#[derive(Clone, Debug, PartialEq)]
pub struct RetryConfig {
    /// First try included; 1 turns retries off.
    pub max_attempts: u32,
    pub on: RetryOn,
    pub methods: Vec<Method>,
    pub idempotency_header: Option<HeaderName>,
    pub backoff: Backoff,
    pub retry_after: RetryAfterMode,
    pub max_retry_after: Duration,
    pub max_body: usize,
    /// Whether a response another tollgate already gave up on is passed straight back.
    pub ownership: Ownership,
}

impl RetryConfig {
    /// What an upstream without a `[retry]` section does: one attempt, nothing retried.
    pub fn off() -> Self {
        RetryConfig {
            max_attempts: 1,
            ..RetryConfig::default()
        }
    }

    pub fn method_allowed(&self, method: &Method) -> bool {
        self.methods.iter().any(|m| m == method)
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 3,
            on: RetryOn::default(),
            methods: ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]
                .iter()
                .filter_map(|m| Method::from_bytes(m.as_bytes()).ok())
                .collect(),
            idempotency_header: Some(HeaderName::from_static("idempotency-key")),
            backoff: Backoff::default(),
            retry_after: RetryAfterMode::Honor,
            max_retry_after: Duration::from_secs(5),
            max_body: 64 * 1024,
            ownership: Ownership::Honor,
        }
    }
}

/// What to do with a response that already carries `x-tollgate-outcome`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Pass it straight back: the tollgate nearest the failure owned it.
    Honor,
    /// Retry it like any other failure. Only for demonstrating retry storms.
    Ignore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAfterMode {
    Honor,
    Ignore,
}

/// The failure conditions a retry may fire on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryOn {
    pub connect_failure: bool,
    pub reset: bool,
    pub timeout: bool,
    /// gRPC status 14 in a trailers-only response.
    pub unavailable: bool,
    /// Bit `code - 100` set for each listed status code.
    statuses: [u64; 8],
}

impl RetryOn {
    pub fn none() -> Self {
        RetryOn {
            connect_failure: false,
            reset: false,
            timeout: false,
            unavailable: false,
            statuses: [0; 8],
        }
    }

    pub fn add_status(&mut self, code: u16) {
        if (100..600).contains(&code) {
            let bit = usize::from(code - 100);
            self.statuses[bit / 64] |= 1 << (bit % 64);
        }
    }

    pub fn status(&self, code: u16) -> bool {
        if !(100..600).contains(&code) {
            return false;
        }
        let bit = usize::from(code - 100);
        self.statuses[bit / 64] & (1 << (bit % 64)) != 0
    }

    pub fn statuses(&self) -> impl Iterator<Item = u16> + '_ {
        (100u16..600).filter(|c| self.status(*c))
    }

    /// The words as written in the config, in a stable order.
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.connect_failure {
            out.push("connect-failure".to_string());
        }
        if self.reset {
            out.push("reset".to_string());
        }
        if self.timeout {
            out.push("timeout".to_string());
        }
        out.extend(self.statuses().map(|c| c.to_string()));
        if self.unavailable {
            out.push("unavailable".to_string());
        }
        out
    }
}

impl Default for RetryOn {
    fn default() -> Self {
        let mut on = RetryOn {
            connect_failure: true,
            reset: true,
            timeout: true,
            unavailable: true,
            statuses: [0; 8],
        };
        for code in [502, 503, 504] {
            on.add_status(code);
        }
        on
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct BudgetConfig {
    /// Retries may add at most this share of the window's requests.
    pub ratio: f64,
    /// Retries per second allowed whatever the traffic, so quiet upstreams can retry.
    pub min_per_sec: f64,
    pub window: Duration,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            ratio: 0.1,
            min_per_sec: 10.0,
            window: Duration::from_secs(10),
        }
    }
}

#[derive(Clone, Debug)]
pub struct TlsConfig {
    pub server_name: String,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// Built from the files above when the config was loaded.
    pub client: Arc<rustls::ClientConfig>,
    /// A digest of the files' contents, so a reload notices a rotated certificate.
    pub fingerprint: u64,
}

impl PartialEq for TlsConfig {
    fn eq(&self, other: &Self) -> bool {
        self.server_name == other.server_name
            && self.ca_file == other.ca_file
            && self.client_cert == other.client_cert
            && self.client_key == other.client_key
            && self.fingerprint == other.fingerprint
    }
}

/// The knobs `run` and tests need that do not come from the file.
pub const DEFAULT_CONFIG_PATH: &str = "config/tollgate.toml";
