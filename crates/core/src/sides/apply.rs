//! Applying a new config to the running server: the upstreams are rebuilt (carrying
//! their state over) and swapped in at once, and the inbound side's settings beside
//! them; each upstream's own `listen` port is bound before the swap, so it answers as
//! soon as the upstream exists, and closed after the swap when it is gone. A port that cannot be bound leaves the rest applied: the
//! reload is partial, and says which.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use super::Server;
use crate::config::Config;
use crate::listen::{accept, bind};
use crate::proxy::Snapshot;

/// What applying a config could not do.
#[derive(Debug, Default)]
pub struct Applied {
    /// Upstreams whose own `listen` port could not be bound, with why.
    pub unbound: Vec<(String, String)>,
}

impl Server {
    /// Swaps in a validated config (with the settings that need a restart as they run:
    /// see [`crate::config::diff::reconcile`]). Requests in flight finish on the
    /// snapshot they started with. `pending_restart` is kept to be shown.
    pub async fn apply(&self, mut config: Config, pending_restart: Vec<String>) -> Applied {
        let outbound = &self.shared.outbound;
        let old = outbound.snapshot();
        let settings = old.config.listener;
        let mut applied = Applied::default();
        // New dedicated ports are bound before the swap, so the new upstream answers
        // on them as soon as it exists; removed ones are closed after it.
        let mut to_start = Vec::new();
        let mut wanted: HashMap<String, SocketAddr> = HashMap::new();
        {
            let current = self.dedicated.lock().unwrap_or_else(|p| p.into_inner());
            for u in &config.upstreams {
                if let Some(addr) = u.listen {
                    wanted.insert(u.name.clone(), addr);
                    let same = current.get(&u.name).is_some_and(|a| {
                        a.addr() == addr || (addr.port() == 0 && a.addr().ip() == addr.ip())
                    });
                    if !same {
                        to_start.push((u.name.clone(), addr));
                    }
                }
            }
        }
        let mut started = Vec::new();
        for (name, addr) in to_start {
            // A port moving between upstreams frees first.
            if let Some(old) = self.take_dedicated(&name) {
                old.stop_accepting().await;
            }
            match bind(addr, &format!("upstreams.{name}.listen"), &self.workers).await {
                Ok(l) => started.push((name, l)),
                Err(e) => {
                    wanted.remove(&name);
                    applied.unbound.push((name, e.to_string()));
                }
            }
        }
        // What is in effect: an upstream whose port could not be bound has none.
        for u in config.upstreams.iter_mut() {
            if applied.unbound.iter().any(|(n, _)| *n == u.name) {
                u.listen = None;
            }
        }
        let mut next = Snapshot::build(config, &outbound.metrics, Some(&old), self.workers.count());
        let config = &next.config;
        if let (Some(inbound), Some(c)) = (&self.shared.inbound, &config.inbound) {
            let settings = (&config.deadline, config.access_log, next.tracer.clone());
            inbound.apply(c, settings);
        }
        next.pending_restart = pending_restart;
        next.listeners_down = applied.unbound.clone();
        for u in old.upstreams.iter() {
            if next.by_name(u.name()).is_none() {
                outbound.metrics.forget_upstream(u.series());
            }
        }
        outbound.snapshot.store(Arc::new(next));
        for (name, l) in started {
            let service = outbound.outbound(Some(name.clone().into()));
            let a = accept(l, &self.serving, service, None, settings);
            outbound.metrics.listener_up(&name, true);
            self.dedicated
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name, a);
        }
        for (name, _) in &applied.unbound {
            outbound.metrics.listener_up(name, false);
        }
        let gone: Vec<String> = self
            .dedicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|n| !wanted.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(a) = self.take_dedicated(&name) {
                a.stop_accepting().await;
            }
            if !applied.unbound.iter().any(|(n, _)| *n == name) {
                outbound.metrics.forget_listener(&name);
            }
        }
        applied
    }
}
