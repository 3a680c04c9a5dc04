//! What the `[inbound]` section says: tollgate in front of its own app, so the
//! dependency's side enforces ownership for all its callers together. Plain data: the
//! inbound service builds its running parts (the app's endpoint, the fleet retry
//! budget, the concurrency limit) from it.

use std::net::SocketAddr;
use std::time::Duration;

use super::{BudgetConfig, DedupeConfig, EndpointAddr};

/// `[inbound]`.
#[derive(Clone, Debug, PartialEq)]
pub struct InboundConfig {
    /// Where callers reach the app through tollgate (a restart is needed to move it).
    pub addr: SocketAddr,
    /// The local app.
    pub app: EndpointAddr,
    pub max_inflight: InflightLimit,
    /// Bounds the wait for the app's response head when the caller sent no deadline,
    /// and caps a longer one. `None`: only the caller's deadline, if it sent one.
    pub request_timeout: Option<Duration>,
    /// `[inbound.retries]`: one budget for the retries of every caller. `None`: retries
    /// are admitted as they come (counted, not limited).
    pub retries: Option<BudgetConfig>,
    /// `[inbound.retries] per_caller`: how that budget is shared among the callers.
    pub per_caller: PerCaller,
    /// The only paths a kubelet probe may ask for; empty: any path.
    pub probe_paths: Vec<String>,
    /// `[inbound.dedupe]`: keyed requests run once. `None`: keys pass through untouched.
    pub dedupe: Option<DedupeConfig>,
    /// Whether the app's 502/503/504 is marked `downstream-owned` when this pod's
    /// outbound side gave up, with an owned outcome, on a call made for it.
    pub owned_failures: OwnedFailures,
}

/// `owned_failures`: ownership through the app.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OwnedFailures {
    #[default]
    Mark,
    Off,
}

impl OwnedFailures {
    pub fn as_str(self) -> &'static str {
        match self {
            OwnedFailures::Mark => "mark",
            OwnedFailures::Off => "off",
        }
    }
}

/// How the fleet's retry budget is shared among the callers asking for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PerCaller {
    /// None gets more than an equal share while others ask (max-min fairness, by the
    /// caller's source address).
    #[default]
    Fair,
    /// First come, first served.
    Off,
}

impl PerCaller {
    pub fn as_str(self) -> &'static str {
        match self {
            PerCaller::Fair => "fair",
            PerCaller::Off => "off",
        }
    }
}

/// What every key of `[inbound]` not written stands at; `app`, which must be written,
/// is empty.
impl Default for InboundConfig {
    fn default() -> Self {
        InboundConfig {
            addr: SocketAddr::from(([0, 0, 0, 0], 15006)),
            app: EndpointAddr {
                host: String::new(),
                port: 0,
            },
            // A fixed limit, as an upstream's: the adaptive one is asked for by name
            // (it learns from latency measured through tollgate, so when tollgate's own
            // CPU is the bottleneck it limits that too).
            max_inflight: InflightLimit::Fixed(10_000),
            request_timeout: None,
            retries: None,
            per_caller: PerCaller::Fair,
            probe_paths: Vec::new(),
            dedupe: None,
            owned_failures: OwnedFailures::Mark,
        }
    }
}

/// How many requests the app is given at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InflightLimit {
    /// At most this many; the rest get `503 overloaded` at once.
    Fixed(usize),
    /// A limit learned from the app's latency.
    Adaptive,
}

impl InflightLimit {
    /// As the file writes it.
    pub fn describe(self) -> String {
        match self {
            InflightLimit::Fixed(n) => n.to_string(),
            InflightLimit::Adaptive => "\"adaptive\"".to_string(),
        }
    }
}
