//! The inbound side: tollgate in front of its own app, so that the dependency's side
//! enforces ownership for all its callers together.
//!
//! Each caller's tollgate keeps its own retry budget, and each budget has a floor
//! (`min_per_sec`) so that a quiet caller can still retry. Fifty callers of a failing
//! app are fifty floors: the app's load multiplies with the size of the fleet, however
//! well each caller behaves. The inbound side counts the retries of every caller
//! against one budget (`[inbound.retries]`), and answers a retry beyond it with
//! `503 retry-rejected`, which never reaches the app. It also refuses work nobody will
//! wait for (a deadline already spent), and keeps the app's queue short with a
//! concurrency limit, fixed or learned from the app's latency.
//!
//! It is a [`Service`](crate::server::Service) beside the outbound one, handed
//! to the same app-facing server (HTTP/1.1 and h2c, head limits, slowloris, drain), and
//! it talks to the app through the endpoint layer with one endpoint, sending the
//! caller's body as it streams: it never retries, so it never keeps one.
//!
//! - [`attempts`]: which requests are retries, and which are the kubelet's probes;
//! - [`dedupe`]: keyed requests run once (`[inbound.dedupe]`);
//! - [`fair`]: each caller's share of the fleet budget;
//! - [`samples`], [`gradient`] and [`limit`]: the concurrency limit;
//! - [`app`]: one request to the app; [`answer`]: the answers made in its place;
//! - [`owned`]: ownership through the app (the app's failure after this pod's own
//!   call for the request was given up on is marked `downstream-owned`);
//! - [`service`]: one request from a caller, start to finish.
//!
//! What a reload can change (the app's address, the limit, `request_timeout`, the
//! budget) is rebuilt into a new [`State`] and swapped in; requests in flight finish on
//! the one they started with. The in-flight count, the budget's window (while its
//! settings stay) and what the adaptive limit learned carry over.

pub mod answer;
pub mod app;
pub mod attempts;
pub mod dedupe;
pub mod fair;
pub mod gradient;
mod keyed;
pub mod limit;
pub mod owned;
pub mod samples;
pub mod service;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use crate::answer::OutboundAnswers;
use crate::config::{AccessLogConfig, DeadlineConfig, InboundConfig, OwnedFailures, PerCaller};
use crate::metrics::{Metrics, Outcome, amplification};
use crate::retry::decide::budget::RetryBudget;
use crate::server::AppBody;
use crate::trace::Tracer;
use crate::upstream::OutgoingBody;
use app::App;
use dedupe::{Dedupe, Hashed};
use fair::FairShare;
use limit::Limit;
pub use service::InboundService;

/// The inbound side as it runs.
pub struct Inbound {
    state: ArcSwap<State>,
    /// Kubelet probes exempt from shedding now (outlives a reload).
    probes: Arc<attempts::ProbeSlots>,
    metrics: Arc<Metrics>,
    workers: usize,
    /// Open connections to the app.
    connections: Arc<AtomicUsize>,
    /// The calls this pod's outbound side gave up on, owned (outlives a reload).
    owned: Arc<owned::OwnedCalls>,
    /// Keyed first arrivals' exchanges with the app still running (outlives a reload).
    exchanges: Arc<keyed::Exchanges>,
}

/// What a request reads once, when it starts: the settings and what was built from them.
pub struct State {
    pub config: InboundConfig,
    /// `[access_log]`, which covers the inbound side too.
    pub access_log: AccessLogConfig,
    pub deadline: DeadlineConfig,
    pub app: Arc<App<AppBody>>,
    pub budget: Arc<RetryBudget>,
    /// The callers' shares of the budget (`per_caller = "fair"` with a budget).
    pub fair: Option<Arc<FairShare>>,
    pub limit: Arc<Limit>,
    /// `[inbound.dedupe]`, and the connections its first arrivals reach the app on (a
    /// keyed body is hashed on its way).
    pub dedupe: Option<(Arc<Dedupe>, Arc<KeyedApp>)>,
    /// `[tracing]`, running (the outbound side's: one exporter for both).
    pub tracer: Option<Arc<Tracer>>,
}

/// The app, as keyed first arrivals reach it: their bodies hashed on the way.
pub type KeyedApp = App<Hashed<AppBody>>;

/// What the inbound side shares with the rest of the config: `[deadline]`,
/// `[access_log]` and the running `[tracing]`.
pub type Settings<'a> = (&'a DeadlineConfig, AccessLogConfig, Option<Arc<Tracer>>);

impl std::fmt::Debug for Inbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.load();
        f.debug_struct("Inbound")
            .field("app", &s.config.app)
            .field("limit", &s.limit)
            .finish_non_exhaustive()
    }
}

impl Inbound {
    /// The inbound side of `config`, with `workers` connection pools to the app.
    pub fn new(
        config: &InboundConfig,
        settings: Settings<'_>,
        metrics: Arc<Metrics>,
        workers: usize,
    ) -> Arc<Self> {
        let connections = Arc::new(AtomicUsize::new(0));
        let state = State::build(config, settings, &metrics, None, &connections, workers);
        Arc::new(Inbound {
            state: ArcSwap::from_pointee(state),
            probes: Arc::default(),
            metrics,
            workers,
            connections,
            owned: Arc::default(),
            exchanges: Arc::default(),
        })
    }

    /// Swaps in the settings of a reload (`config.addr` is the one bound).
    pub fn apply(&self, config: &InboundConfig, settings: Settings<'_>) {
        let old = self.state.load_full();
        let next = State::build(
            config,
            settings,
            &self.metrics,
            Some(&old),
            &self.connections,
            self.workers,
        );
        self.state.store(Arc::new(next));
    }

    /// The service that answers the callers, reaching the app on its own connections.
    pub fn service(self: &Arc<Self>) -> InboundService {
        self.service_on(app::Connections)
    }

    /// The service that answers the callers, reaching the app by `wire`.
    pub fn service_on<W: app::AppWire>(self: &Arc<Self>, wire: W) -> InboundService<W> {
        InboundService {
            inbound: self.clone(),
            wire,
        }
    }

    /// The settings in force.
    pub fn state(&self) -> Arc<State> {
        self.state.load_full()
    }

    /// Waits, for at most `limit`, until every keyed first arrival's exchange with the
    /// app has ended and its key is completed (a drain: whether or not its caller still
    /// listens); whether they all have.
    pub async fn keyed_finished_within(&self, limit: std::time::Duration) -> bool {
        self.exchanges.finished_within(limit).await
    }

    /// Closes the idle connections to the app that it has closed.
    pub fn sweep(&self) {
        let s = self.state.load();
        s.app.sweep();
        if let Some((dedupe, keyed)) = &s.dedupe {
            keyed.sweep();
            dedupe.sweep();
        }
    }

    /// Sets the gauges from live state, just before a scrape.
    pub fn refresh_gauges(&self) {
        let s = self.state.load();
        let m = self.metrics.inbound();
        let now = Instant::now();
        let window = s.budget.stats(now);
        m.amplification
            .set(amplification(window.attempts, window.requests));
        m.budget_available.set(s.budget.available(now));
        m.inflight.set(s.limit.inflight() as i64);
        m.concurrency_limit.set(s.limit.current() as i64);
    }
}

impl OutboundAnswers for Inbound {
    /// The outbound side answered its app with `outcome` on a call with these header
    /// fields: an owned give-up is remembered for the request the app is serving, when
    /// `owned_failures = "mark"`.
    fn outbound_answered(&self, outcome: Outcome, headers: &http::HeaderMap) {
        if owned::owned(outcome) && self.state.load().config.owned_failures == OwnedFailures::Mark {
            self.owned.gave_up(headers, Instant::now());
        }
    }
}

/// New connections to the app, counted in `open`.
fn to_app<B: OutgoingBody>(
    config: &InboundConfig,
    open: &Arc<AtomicUsize>,
    workers: usize,
) -> Arc<App<B>> {
    Arc::new(App::new(config.app.clone(), app::pod_ip(), open, workers))
}

impl State {
    fn build(
        config: &InboundConfig,
        (deadline, access_log, tracer): Settings<'_>,
        metrics: &Arc<Metrics>,
        previous: Option<&State>,
        connections: &Arc<AtomicUsize>,
        workers: usize,
    ) -> Self {
        let now = Instant::now();
        // The connections to the app are kept while it is the same app.
        let same_app = previous.filter(|p| p.config.app == config.app);
        let app = match same_app {
            Some(p) => p.app.clone(),
            None => to_app(config, connections, workers),
        };
        let (budget, fair) = match previous {
            Some(p)
                if p.budget.limit() == config.retries.as_ref()
                    && p.config.per_caller == config.per_caller =>
            {
                (p.budget.clone(), p.fair.clone())
            }
            _ => {
                let fair = config
                    .retries
                    .as_ref()
                    .filter(|_| config.per_caller == PerCaller::Fair)
                    .map(|b| Arc::new(FairShare::new(b.window, now)));
                (
                    Arc::new(RetryBudget::new(config.retries.as_ref(), now)),
                    fair,
                )
            }
        };
        let duration = metrics.inbound().request_duration.clone();
        let limit = Limit::build(
            config.max_inflight,
            previous.map(|p| &p.limit),
            duration,
            now,
        );
        let dedupe = config.dedupe.as_ref().map(|d| {
            let old = previous.and_then(|p| p.dedupe.as_ref());
            let keyed = match old {
                Some((_, keyed)) if same_app.is_some() => keyed.clone(),
                _ => to_app(config, connections, workers),
            };
            let dedupe = Dedupe::new(d, metrics.clone(), old.map(|(d, _)| &**d));
            (Arc::new(dedupe), keyed)
        });
        State {
            dedupe,
            config: config.clone(),
            access_log,
            deadline: deadline.clone(),
            app,
            budget,
            fair,
            limit,
            tracer,
        }
    }
}
