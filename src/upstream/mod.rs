//! An upstream as it runs: its validated config, endpoints with their connection pools,
//! the retry budget, the recent median attempt time, the in-flight count and the metric
//! handles.
//!
//! Built from config on start and on every reload. What must survive a reload is carried
//! over from the previous build: metric handles and the in-flight count always, pools
//! while the endpoints and transport settings are unchanged, the budget's window while
//! its settings are unchanged.

pub mod connect;
pub mod h1;
pub mod pool;
pub mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use http::Version;
use tokio::time::Instant;

use crate::config::{DeadlineConfig, Protocol, UpstreamConfig};
use crate::metrics::{Metrics, UpstreamMetrics};
use crate::retry::budget::RetryBudget;
use crate::retry::median::RecentMedian;
use pool::{Endpoint, Want};

#[derive(Debug)]
pub struct Upstream {
    pub config: UpstreamConfig,
    pub deadline: DeadlineConfig,
    pub endpoints: Box<[Arc<Endpoint>]>,
    next: AtomicUsize,
    pub budget: Arc<RetryBudget>,
    pub median: Arc<RecentMedian>,
    pub inflight: Arc<AtomicUsize>,
    pub connections: Arc<AtomicUsize>,
    pub metrics: Arc<UpstreamMetrics>,
    /// The TLS client of `config.tls`.
    pub tls: Option<Arc<tls::TlsClient>>,
}

impl Upstream {
    /// Builds the running upstream, reusing what `previous` (the same name in the config
    /// being replaced) can hand over.
    pub fn build(
        config: UpstreamConfig,
        deadline: DeadlineConfig,
        metrics: &Metrics,
        previous: Option<&Upstream>,
        workers: usize,
    ) -> Self {
        let now = Instant::now();
        let same_transport = previous.is_some_and(|p| {
            p.config.endpoints == config.endpoints
                && p.config.protocol == config.protocol
                && p.config.tls == config.tls
        });
        let connections =
            previous.map_or_else(|| Arc::new(AtomicUsize::new(0)), |p| p.connections.clone());
        let endpoints = match previous {
            Some(p) if same_transport => p.endpoints.clone(),
            _ => config
                .endpoints
                .iter()
                .map(|a| Arc::new(Endpoint::new(a.clone(), connections.clone(), workers)))
                .collect(),
        };
        let budget = match previous {
            Some(p) if p.budget.limit() == config.budget.as_ref() => p.budget.clone(),
            _ => Arc::new(RetryBudget::new(config.budget.as_ref(), now)),
        };
        let tls = match previous {
            Some(p) if same_transport => p.tls.clone(),
            _ => config
                .tls
                .as_ref()
                .map(|t| Arc::new(tls::TlsClient::new(t, config.protocol))),
        };
        let median = match previous {
            Some(p) if same_transport => p.median.clone(),
            _ => Arc::new(RecentMedian::new()),
        };
        let metrics = match previous {
            Some(p) if p.config.retry.on == config.retry.on => p.metrics.clone(),
            _ => Arc::new(metrics.upstream(&config.name, &config.retry.on.names())),
        };
        Upstream {
            inflight: previous
                .map_or_else(|| Arc::new(AtomicUsize::new(0)), |p| p.inflight.clone()),
            connections,
            endpoints,
            next: AtomicUsize::new(0),
            budget,
            median,
            metrics,
            tls,
            deadline,
            config,
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Round-robin over the endpoints, skipping `avoid` (the one that just failed) and
    /// endpoints that refused a connection a moment ago, when there is another.
    ///
    /// Round-robin rather than least-loaded on purpose: an endpoint that fails fast has
    /// the fewest requests in flight, so a least-loaded balancer sends retries straight
    /// back to the broken one.
    pub fn pick(&self, avoid: Option<usize>) -> usize {
        let n = self.endpoints.len();
        if n <= 1 {
            return 0;
        }
        let start = self.next.fetch_add(1, Relaxed) % n;
        let now = pool::clock_ms();
        for k in 0..n {
            let i = (start + k) % n;
            if Some(i) != avoid && !self.endpoints[i].skipped(now) {
                return i;
            }
        }
        // Every other endpoint is failing too: keep trying them in turn.
        if Some(start) == avoid {
            (start + 1) % n
        } else {
            start
        }
    }

    /// Which HTTP to speak to the endpoints for a request that arrived as `version`.
    pub fn want(&self, version: Version) -> Want {
        match (self.config.protocol, self.config.tls.is_some()) {
            (Protocol::Http1, _) => Want::Http1,
            (Protocol::H2, _) => Want::Http2,
            (Protocol::Auto, true) => Want::Negotiate,
            (Protocol::Auto, false) if version == Version::HTTP_2 => Want::Http2,
            (Protocol::Auto, false) => Want::Http1,
        }
    }
}
