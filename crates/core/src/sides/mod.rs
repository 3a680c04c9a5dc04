//! tollgate as it runs: both sides on their listeners, wired together. The outbound side
//! ([`crate::proxy`]) and the inbound side ([`crate::inbound`]) are peers that never
//! name each other; this is where they meet: each listener is bound
//! ([`crate::listen`]) and handed its side's service, the inbound side is told of the
//! outbound side's owned give-ups (through [`crate::answer::OutboundAnswers`]), a
//! reload reaches both ([`apply`]), and a drain closes every listener at once.
//!
//! The main listener gets the outbound service, each upstream's own `listen` port the
//! outbound service of that upstream, and the `[inbound]` listener the inbound service.

mod apply;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::config::Config;
use crate::inbound::Inbound;
use crate::listen::{self, Accepting, BindError, Listeners, Serving};
use crate::metrics::Metrics;
use crate::metrics::passthrough::Direction;
use crate::proxy::{self, Snapshot};
use crate::worker::Workers;
pub use apply::Applied;

/// State every connection and request of the process shares: each side's, and the
/// process's own.
pub struct Shared {
    /// The outbound side: the config snapshot, the metrics.
    pub outbound: Arc<proxy::Shared>,
    /// The inbound side, when the config has one (fixed at start: it is a listener).
    pub inbound: Option<Arc<Inbound>>,
    /// Listeners bound and config loaded (and not draining): `/readyz` says 200.
    pub ready: AtomicBool,
}

impl Shared {
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.outbound.snapshot()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.outbound.metrics
    }

    /// The client connections open, on every listener.
    pub fn connections(&self) -> usize {
        self.outbound.listeners.connections()
    }
}

/// A running tollgate's listeners, and the handles to reload and stop it.
pub struct Server {
    shared: Arc<Shared>,
    /// What every listener's connections reach.
    serving: Arc<Serving>,
    workers: Workers,
    main_addr: SocketAddr,
    /// Dedicated `listen` ports, by upstream name.
    dedicated: std::sync::Mutex<HashMap<String, Accepting>>,
    main: std::sync::Mutex<Option<Accepting>>,
    /// The inbound side's listener, and where it is bound.
    inbound: std::sync::Mutex<Option<Accepting>>,
    inbound_addr: Option<SocketAddr>,
    sweeper: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

/// How often idle upstream connections are looked at for ones the endpoint closed.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Closes, every [`SWEEP_EVERY`], the idle upstream connections their endpoint has
/// closed, so a quiet upstream does not leave sockets half-closed until its next
/// request; and re-admits the ejected endpoints whose time is up, so the log says so
/// when it happens, not at the next request.
fn sweeper(shared: &Arc<Shared>) -> JoinHandle<()> {
    let shared = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            shared.outbound.sweep();
            if let Some(inbound) = &shared.inbound {
                inbound.sweep();
            }
        }
    })
}

impl Server {
    /// Binds every listener of `config` and starts serving on `workers`.
    pub async fn start(
        config: Config,
        metrics: Arc<Metrics>,
        workers: Workers,
    ) -> Result<Self, BindError> {
        let main_listener = listen::bind(config.listener.addr, "listener.addr", &workers).await?;
        let main_addr = main_listener.addr();
        let mut dedicated_listeners = Vec::new();
        for u in &config.upstreams {
            if let Some(addr) = u.listen {
                let what = format!("upstreams.{}.listen", u.name);
                dedicated_listeners
                    .push((u.name.clone(), listen::bind(addr, &what, &workers).await?));
            }
        }
        let inbound_listener = match &config.inbound {
            Some(i) => Some(listen::bind(i.addr, "inbound.addr", &workers).await?),
            None => None,
        };
        let settings = config.listener;
        let listeners = Listeners::new(&settings);
        let snapshot = Snapshot::build(config, &metrics, None, workers.count());
        let config = &snapshot.config;
        let inbound = config.inbound.as_ref().map(|i| {
            let settings = (&config.deadline, config.access_log, snapshot.tracer.clone());
            Inbound::new(i, settings, metrics.clone(), workers.count())
        });
        metrics.mark_loaded();
        let inbound_addr = inbound_listener.as_ref().map(|l| l.addr());
        let own = [Some(main_addr), inbound_addr]
            .into_iter()
            .flatten()
            .collect();
        let answers = inbound.clone().map(|i| i as _);
        let outbound = proxy::Shared::new(
            snapshot,
            metrics.clone(),
            workers.count(),
            own,
            listeners.clone(),
            answers,
        );
        let serving = Arc::new(Serving {
            listeners,
            metrics,
            own: outbound.clone(),
        });
        let shared = Arc::new(Shared {
            outbound,
            inbound,
            ready: AtomicBool::new(false),
        });
        let main = listen::accept(
            main_listener,
            &serving,
            shared.outbound.outbound(None),
            Some(Direction::Outbound),
            settings,
        );
        let inbound = match (inbound_listener, &shared.inbound) {
            (Some(l), Some(i)) => Some(listen::accept(
                l,
                &serving,
                i.service(),
                Some(Direction::Inbound),
                settings,
            )),
            _ => None,
        };
        let mut dedicated = HashMap::new();
        for (name, l) in dedicated_listeners {
            let service = shared.outbound.outbound(Some(name.clone().into()));
            let a = listen::accept(l, &serving, service, None, settings);
            serving.metrics.listener_up(&name, true);
            dedicated.insert(name, a);
        }
        shared.ready.store(true, Release);
        Ok(Server {
            sweeper: sweeper(&shared),
            shared,
            serving,
            workers,
            main_addr,
            dedicated: std::sync::Mutex::new(dedicated),
            main: std::sync::Mutex::new(Some(main)),
            inbound: std::sync::Mutex::new(inbound),
            inbound_addr,
        })
    }

    /// Where the inbound side listens, when the config has one.
    pub fn inbound_addr(&self) -> Option<SocketAddr> {
        self.inbound_addr
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The address the main listener is bound to (useful when configured with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.main_addr
    }

    /// Where an upstream's dedicated listener is bound.
    pub fn listen_addr(&self, upstream: &str) -> Option<SocketAddr> {
        self.dedicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(upstream)
            .map(|a| a.addr())
    }

    fn take_dedicated(&self, name: &str) -> Option<Accepting> {
        self.dedicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
    }

    /// Stops accepting, asks every connection to finish, and waits for them up to
    /// `drain_timeout`. Returns the connections still open when it gave up.
    pub async fn shutdown(&self, drain_timeout: Duration) -> usize {
        let start = tokio::time::Instant::now();
        self.shared.ready.store(false, Release);
        let mut listeners: Vec<Accepting> = self
            .dedicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, a)| a)
            .collect();
        listeners.extend(self.main.lock().unwrap_or_else(|p| p.into_inner()).take());
        listeners.extend(
            self.inbound
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let left = self.serving.listeners.drain(listeners, drain_timeout).await;
        // Keyed exchanges whose callers have gone hold no connection, and still have a
        // key to complete: they get what is left of the drain too.
        if let Some(inbound) = &self.shared.inbound {
            let rest = drain_timeout.saturating_sub(start.elapsed());
            if !inbound.keyed_finished_within(rest).await {
                tracing::warn!("drain timeout reached with keyed requests still running");
            }
        }
        left
    }
}
