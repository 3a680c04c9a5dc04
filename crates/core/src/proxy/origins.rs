//! The places requests for unknown authorities are passed through to
//! (`unknown_authorities = "pass"`), each an endpoint of its own: its name looked up
//! as an upstream's is (cached, one lookup at a time) and its HTTP/1.1 connections
//! kept for the next request, as the app's own client would keep them.
//!
//! An app behind `http_proxy` may call thousands of hosts, each a few times. So the
//! table is bounded ([`MAX_ORIGINS`]): a place with no request in flight and no idle
//! connection is forgotten at the next sweep, and when the table is full the places
//! no request uses are forgotten first (closing their idle connections); a request
//! that still finds it full is served by a place of its own, not kept. Their names
//! are looked up with places apart from the upstreams' ([`Lookups::system_apart`]),
//! so an app calling many unknown hosts never holds up an upstream's lookup.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use super::route::NameMap;
use crate::config::{EndpointAddr, PASSTHROUGH};
use crate::server::AppBody;
use crate::upstream::dns::{Lookups, Resolver};
use crate::upstream::pool::Endpoint;

/// The most places kept at once.
pub const MAX_ORIGINS: usize = 512;
/// Lookups of unknown names in flight at once.
const LOOKUPS: usize = 2;

/// One place requests are passed through to.
pub type Origin = Endpoint<AppBody>;

/// The places requests were passed through to lately.
pub struct Origins {
    /// By `host:port`, the host in lower case.
    known: Mutex<NameMap<Arc<Origin>>>,
    lookups: Lookups,
    /// Open connections to every place (`tollgate_upstream_connections`).
    pub open: Arc<AtomicUsize>,
    workers: usize,
    max: usize,
}

impl std::fmt::Debug for Origins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Origins")
            .field("known", &self.len())
            .finish_non_exhaustive()
    }
}

impl Origins {
    pub fn new(workers: usize) -> Self {
        Self::bounded(workers, MAX_ORIGINS)
    }

    fn bounded(workers: usize, max: usize) -> Self {
        Origins {
            known: Mutex::default(),
            lookups: Lookups::system_apart(LOOKUPS),
            open: Arc::default(),
            workers,
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, NameMap<Arc<Origin>>> {
        // Nothing is left half done under the lock: a poisoned one is taken as it is.
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The place `addr` (host in lower case), kept or new.
    pub fn get(&self, addr: &EndpointAddr) -> Arc<Origin> {
        let key = addr.to_string();
        let mut known = self.lock();
        if let Some(o) = known.get(&key) {
            return o.clone();
        }
        if known.len() >= self.max {
            known.retain(|_, o| Arc::strong_count(o) > 1);
        }
        let origin = Arc::new(self.origin(addr));
        if known.len() < self.max {
            known.insert(key, origin.clone());
        }
        origin
    }

    fn origin(&self, addr: &EndpointAddr) -> Origin {
        let resolver = Resolver::with_lookups(addr.clone(), self.lookups.clone());
        Endpoint::with_resolver(
            PASSTHROUGH.into(),
            resolver,
            self.open.clone(),
            self.workers,
            None,
        )
    }

    /// Closes the idle connections their places closed or that sat too long, and
    /// forgets the places left with neither a request nor a connection.
    pub fn sweep(&self) {
        let mut known = self.lock();
        known.retain(|_, o| {
            o.sweep();
            Arc::strong_count(o) > 1 || o.idle_count() > 0
        });
    }

    /// Places kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(host: &str) -> EndpointAddr {
        EndpointAddr {
            host: host.to_string(),
            port: 80,
        }
    }

    #[tokio::test]
    async fn a_place_is_kept_while_used_and_forgotten_when_not() {
        let origins = Origins::bounded(1, 4);
        let a = origins.get(&addr("a.example"));
        assert!(Arc::ptr_eq(&a, &origins.get(&addr("a.example"))));
        origins.get(&addr("b.example"));
        origins.sweep();
        assert_eq!(origins.len(), 1, "b has neither a request nor a connection");
        drop(a);
        origins.sweep();
        assert!(origins.is_empty());
    }

    #[tokio::test]
    async fn the_table_never_grows_past_its_bound() {
        let origins = Origins::bounded(1, 4);
        let held: Vec<_> = (0..4)
            .map(|i| origins.get(&addr(&format!("h{i}.example"))))
            .collect();
        // Full of places in use: the next one is served, not kept.
        let extra = origins.get(&addr("extra.example"));
        assert_eq!(origins.len(), 4);
        assert!(!Arc::ptr_eq(&extra, &origins.get(&addr("extra.example"))));
        drop(held);
        // Full of places nobody uses: they make room.
        origins.get(&addr("next.example"));
        assert_eq!(origins.len(), 1);
    }
}
