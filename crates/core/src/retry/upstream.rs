//! An upstream as the retry engine drives it: its validated config, its endpoints, the
//! retry budget, the recent median attempt time, hedging, the in-flight count and the
//! metric handles; and what it learns from the upstream: the throttle of first attempts
//! and the failures owned recently (to see the app's own retries).
//!
//! Built from config on start and on every reload. What must survive a reload is carried
//! over from the previous build: its metric series (made at its first request) and the
//! in-flight count always, pools
//! and endpoint health while the endpoints and transport settings are unchanged, the
//! budget's window (and its adaptive share) while its settings are unchanged, hedging's
//! budget and latency estimate while the hedge section and the window are, the
//! throttle's window while its settings are, and the failures owned recently always.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use prometheus::IntCounter;

use tokio::time::Instant;

use crate::config::{DeadlineConfig, KubernetesConfig, UpstreamConfig};
use crate::metrics::{Ejections, Metrics, UpstreamMetrics, UpstreamSeries};
use crate::retry::decide::budget::RetryBudget;
use crate::retry::decide::hedge::Hedging;
use crate::retry::evidence::keys::Dedupes;
use crate::retry::evidence::recent::RecentFailures;
use crate::retry::forward::replay::{ReplayBody, RetriedBody};
use crate::retry::learn::quantile::RecentQuantile;
use crate::retry::learn::throttle::Throttle;
use crate::upstream::Endpoints;
use crate::upstream::tls::TlsClient;

/// One upstream, sending the app's bodies of type `A`. Its state is the retry engine's
/// (the files of `retry/` read it directly); the rest of tollgate asks for what it needs
/// through the methods below.
pub struct Upstream<A> {
    pub(super) config: UpstreamConfig,
    pub(super) deadline: DeadlineConfig,
    pub(super) endpoints: Endpoints<ReplayBody<A>>,
    pub(super) budget: Arc<RetryBudget>,
    /// The recent median attempt time (a [`RecentQuantile`] at 0.5).
    pub(super) median: Arc<RecentQuantile>,
    /// `None` without a `[hedge]` section.
    pub(super) hedge: Option<Arc<Hedging>>,
    inflight: Arc<AtomicUsize>,
    /// Open connections to every endpoint.
    connections: Arc<AtomicUsize>,
    /// Its metrics, made at its first request.
    series: Arc<UpstreamSeries>,
    /// The TLS client of `config.tls`.
    pub(super) tls: Option<Arc<TlsClient>>,
    /// The throttle of first attempts, with `config.throttle`.
    pub(super) throttle: Option<Arc<Throttle>>,
    /// The failures tollgate owned in the last 2 s, to see the app retrying them.
    recent: Arc<RecentFailures>,
    /// When its answers last said it deduplicates keyed requests.
    pub(super) dedupes: Arc<Dedupes>,
}

impl<A: RetriedBody> Upstream<A> {
    /// Builds the running upstream, reusing what `previous` (the same name in the config
    /// being replaced) can hand over.
    pub fn build(
        config: UpstreamConfig,
        deadline: DeadlineConfig,
        kube: &KubernetesConfig,
        metrics: &Metrics,
        previous: Option<&Upstream<A>>,
        workers: usize,
    ) -> Self {
        let now = Instant::now();
        let same_transport = previous.is_some_and(|p| {
            p.config.endpoints == config.endpoints
                && p.config.discovery == config.discovery
                && p.config.protocol == config.protocol
                && p.config.tls == config.tls
                && p.config.max_connection_age == config.max_connection_age
        });
        let retry_on = config.retry.on.names();
        let mints = !config.retry.mint_idempotency_key.is_empty();
        let series = match previous {
            Some(p) if p.series.built_with(&retry_on, mints) => p.series.clone(),
            Some(p) => Arc::new(p.series.next(&retry_on, mints)),
            None => Arc::new(metrics.upstream(&config.name, &retry_on, mints)),
        };
        let connections =
            previous.map_or_else(|| Arc::new(AtomicUsize::new(0)), |p| p.connections.clone());
        let ejections = Ejections::of(&series);
        let endpoints = match previous {
            Some(p) if same_transport => p.endpoints.share(&config, ejections),
            _ => Endpoints::discovered(
                &config,
                kube,
                || metrics.discovery(&config.name),
                &connections,
                workers,
                ejections,
            ),
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
                .map(|t| Arc::new(TlsClient::new(t, config.protocol))),
        };
        let median = match previous {
            Some(p) if same_transport => p.median.clone(),
            _ => Arc::new(RecentQuantile::new(0.5)),
        };
        let window = config.budget.as_ref().map(|b| b.window);
        let hedge = config
            .hedge
            .as_ref()
            .map(|h| match previous.and_then(|p| p.hedge.as_ref()) {
                Some(p) if p.built_from(h, window) => p.clone(),
                _ => Arc::new(Hedging::new(h, window, now)),
            });
        let throttle = match previous {
            Some(p) if p.config.throttle == config.throttle => p.throttle.clone(),
            _ => config
                .throttle
                .as_ref()
                .map(|t| Arc::new(Throttle::new(t, now))),
        };
        let recent =
            previous.map_or_else(|| Arc::new(RecentFailures::new(now)), |p| p.recent.clone());
        let dedupes: Arc<Dedupes> = previous.map_or_else(Arc::default, |p| p.dedupes.clone());
        if mints {
            dedupes.want();
        }
        Upstream {
            dedupes,
            inflight: previous
                .map_or_else(|| Arc::new(AtomicUsize::new(0)), |p| p.inflight.clone()),
            connections,
            endpoints,
            budget,
            median,
            hedge,
            series,
            tls,
            throttle,
            recent,
            deadline,
            config,
        }
    }
}

impl<A> std::fmt::Debug for Upstream<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.config.name)
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl<A> Upstream<A> {
    #[inline]
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Its validated config, as built.
    #[inline]
    pub fn config(&self) -> &UpstreamConfig {
        &self.config
    }

    /// The deadline headers it accepts and sends (`[deadline]`).
    #[inline]
    pub fn deadline(&self) -> &DeadlineConfig {
        &self.deadline
    }

    /// Its metric handles, for a request: the first call makes its series.
    #[inline]
    pub fn metrics(&self) -> &UpstreamMetrics {
        self.series.get()
    }

    /// Its metrics, which a scrape reads and a reload that removes it drops.
    #[inline]
    pub fn series(&self) -> &UpstreamSeries {
        &self.series
    }

    /// Its endpoints, to sweep, list or re-admit.
    #[inline]
    pub fn endpoints(&self) -> &Endpoints<ReplayBody<A>> {
        &self.endpoints
    }

    /// The retry budget, which an app's own retry is charged to as well.
    #[inline]
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The throttle of first attempts, with `throttle` configured.
    #[inline]
    pub fn throttle(&self) -> Option<&Throttle> {
        self.throttle.as_deref()
    }

    /// The requests admitted and not yet answered with a head, against `max_inflight`:
    /// the proxy raises it on admission and lowers it when the head comes back.
    #[inline]
    pub fn inflight(&self) -> &AtomicUsize {
        &self.inflight
    }

    /// The connections open to all its endpoints.
    #[inline]
    pub fn connections_open(&self) -> usize {
        self.connections.load(Relaxed)
    }

    /// The failures tollgate owned in the last 2 s, to see the app retrying them.
    #[inline]
    pub fn recent_failures(&self) -> &RecentFailures {
        &self.recent
    }

    /// The count of idempotency keys minted for it, with `mint_idempotency_key`.
    #[inline]
    pub fn keys_minted(&self) -> Option<&IntCounter> {
        self.metrics().keys_minted()
    }
}
