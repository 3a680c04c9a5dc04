//! The outbound side: the app's calls to its upstreams, and the config snapshot every
//! one of them reads. The listeners it is served on, their connections and their drain
//! are [`crate::listen`]'s; what runs the process hands them [`handler::Outbound`].
//!
//! - [`handler`]: the outbound service: route, admit, deadline, retry, answer;
//! - [`route`], [`snapshot`]: what the handler works with;
//! - [`unrouted`], [`origins`]: a request for an authority no upstream lists, passed
//!   through;
//! - [`destinations`]: which upstream a redirected connection is for (its
//!   [`crate::listen::Captures`]).
//!
//! The snapshot is an `ArcSwap`: a request loads it once, clones the `Arc` of the one
//! upstream it needs and keeps it to the end, so a reload never changes a request
//! midway and never makes one wait.

mod app_retries;
mod connect;
pub mod destinations;
pub mod handler;
pub mod origins;
pub mod route;
pub mod snapshot;
pub mod unrouted;

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::answer::OutboundAnswers;
use crate::listen::{Listeners, Own};
use crate::metrics::Metrics;
use crate::server::AppBody;
use handler::Outbound;
pub use snapshot::Snapshot;

/// An upstream as the proxy runs it: the retry engine's, sending the app's bodies.
pub type Upstream = crate::retry::Upstream<AppBody>;

/// State every request of the outbound side shares.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub metrics: Arc<Metrics>,
    /// Requests no upstream claimed (plain HTTP, and gRPC calls).
    pub unrouted: [prometheus::IntCounter; 2],
    /// Requests for unknown authorities passed through, and where to.
    pub passing: Arc<unrouted::Passing>,
    /// Told of the answers that are not `ok` (the inbound side, when the config has
    /// one: fixed at start, it is a listener).
    pub answers: Option<Arc<dyn OutboundAnswers>>,
    /// Where the outbound and inbound listeners are bound: a redirected connection is
    /// never passed through to them.
    own: Box<[SocketAddr]>,
    /// Where the admin endpoint is bound, once it is (its configured port may be 0).
    pub admin_bound: std::sync::OnceLock<SocketAddr>,
    /// The client connections, and the drain a tunnel is told of.
    pub listeners: Arc<Listeners>,
}

impl Shared {
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The outbound side of `snapshot`; `own` are the addresses of the listeners (the
    /// outbound and inbound ones), never passed through to; `answers` is told of the
    /// answers that are not `ok`.
    pub fn new(
        snapshot: Snapshot,
        metrics: Arc<Metrics>,
        workers: usize,
        own: Box<[SocketAddr]>,
        listeners: Arc<Listeners>,
        answers: Option<Arc<dyn OutboundAnswers>>,
    ) -> Arc<Self> {
        Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snapshot),
            unrouted: [metrics.unrouted(false), metrics.unrouted(true)],
            passing: unrouted::Passing::new(&metrics, workers),
            answers,
            metrics,
            own,
            admin_bound: std::sync::OnceLock::new(),
            listeners,
        })
    }

    /// Closes the idle upstream connections their endpoint has closed, and re-admits
    /// the ejected endpoints whose time is up.
    pub fn sweep(&self) {
        for up in self.snapshot.load().upstreams.iter() {
            for ep in up.endpoints().now().iter() {
                ep.sweep();
            }
            up.endpoints().readmit_due();
        }
        self.passing.origins.sweep();
    }

    /// The outbound service: routed by authority, or on a dedicated port to its
    /// upstream.
    pub fn outbound(self: &Arc<Self>, dedicated: Option<Arc<str>>) -> Outbound {
        Outbound {
            shared: self.clone(),
            dedicated,
            captured: None,
            wire: handler::Endpoints,
        }
    }

    /// Whether `dst` is one of tollgate's own listeners: the outbound and inbound ones,
    /// the admin endpoint, an upstream's own `listen` port.
    pub(crate) fn is_own(&self, dst: SocketAddr) -> bool {
        let snap = self.snapshot.load();
        let config = &snap.config;
        let mut own = self
            .own
            .iter()
            .copied()
            .chain([config.admin.addr])
            .chain(self.admin_bound.get().copied())
            .chain(config.upstreams.iter().filter_map(|u| u.listen));
        let ip = dst.ip().to_canonical();
        own.any(|l| {
            l.port() == dst.port()
                // A connection to 0.0.0.0 reaches this host, at whichever address listens.
                && (ip.is_unspecified()
                    || l.ip().to_canonical() == ip
                    || (l.ip().is_unspecified() && is_local(ip)))
        })
    }
}

impl Own for Shared {
    fn is_own(&self, dst: SocketAddr) -> bool {
        Shared::is_own(self, dst)
    }
}

/// Whether a local socket may be bound to `ip`: whether it is one of this host's (this
/// network namespace's) addresses.
fn is_local(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests;
