//! One consistent view of the config and the upstreams built from it: what a request
//! reads, once, when it starts. A reload builds a new one, carrying state over from the
//! old, and swaps it in.

use std::sync::Arc;

use super::Upstream;
use super::destinations::Destinations;
use super::route::{NameMap, Routes};
use crate::config::Config;
use crate::config::cluster::ClusterNames;
use crate::metrics::Metrics;
use crate::trace::Tracer;

/// One consistent view of the config and the upstreams built from it.
#[derive(Debug)]
pub struct Snapshot {
    pub config: Arc<Config>,
    pub upstreams: Box<[Arc<Upstream>]>,
    pub routes: Routes,
    /// The addresses a captured connection may be for, by upstream.
    pub destinations: Destinations,
    by_name: NameMap<usize>,
    /// Settings the file changed that take effect only after a restart.
    pub pending_restart: Vec<String>,
    /// Upstreams whose own `listen` port could not be bound, with why.
    pub listeners_down: Vec<(String, String)>,
    /// `[tracing]`, running: kept from `previous` while the section is unchanged.
    pub tracer: Option<Arc<Tracer>>,
}

impl Snapshot {
    /// Builds the upstreams of `config`, carrying state over from `previous`; pools
    /// are kept per worker.
    pub fn build(
        config: Config,
        metrics: &Metrics,
        previous: Option<&Snapshot>,
        workers: usize,
    ) -> Self {
        let upstreams: Box<[Arc<Upstream>]> = config
            .upstreams
            .iter()
            .map(|u| {
                let prev = previous.and_then(|p| p.by_name(&u.name));
                Arc::new(Upstream::build(
                    u.clone(),
                    config.deadline.clone(),
                    &config.kubernetes,
                    metrics,
                    prev.map(|p| p.as_ref()),
                    workers,
                ))
            })
            .collect();
        let routes = Routes::new(
            config
                .upstreams
                .iter()
                .enumerate()
                .map(|(i, u)| (i, u.authorities.as_slice())),
            ClusterNames::from_env(),
        );
        let destinations = Destinations::new(&config);
        let by_name = config
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| (u.name.clone(), i))
            .collect();
        let tracer = config.tracing.as_ref().and_then(|t| {
            match previous.and_then(|p| p.tracer.as_ref()) {
                Some(p) if p.config() == t => Some(p.clone()),
                _ => Tracer::new(t, metrics.trace_drops().clone())
                    .inspect_err(|e| {
                        tracing::warn!(error = %e, "the trace exporter could not start: nothing is traced");
                    })
                    .ok(),
            }
        });
        Snapshot {
            tracer,
            config: Arc::new(config),
            upstreams,
            routes,
            destinations,
            by_name,
            pending_restart: Vec::new(),
            listeners_down: Vec::new(),
        }
    }

    pub fn by_name(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.by_name.get(name).map(|i| &self.upstreams[*i])
    }
}
