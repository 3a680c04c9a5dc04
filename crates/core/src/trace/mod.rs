//! Traces: what the retries did for one request, as OpenTelemetry spans exported over
//! OTLP (docs/tracing.md).
//!
//! A request that is traced gets a SERVER span (the request tollgate received, on
//! either side) and a CLIENT span per attempt it sent, hedges included, with the
//! decision after each failure (retried and why, or refused and by what, with the
//! budget and the deadline left) and the backoff sleeps as events. Each attempt carries
//! its own span id upstream in `traceparent`, so the upstream's spans (a callee's
//! inbound side, the app behind it) hang under the attempt that reached them.
//!
//! The request path's whole contract with this module:
//!
//! - Without `[tracing]` there is no [`Tracer`]: the path checks one `Option` and does
//!   nothing else, and `traceparent` passes as it came.
//! - With it, [`Tracer::request`] decides ([`sampling`]) and returns a
//!   [`RequestTrace`] only for a request that is traced. Every later call is a method
//!   of that handle, filling a small struct in place ([`span`]); dropping it hands the
//!   spans to a bounded queue ([`queue`]) in one push, which drops and counts rather
//!   than wait.
//! - The exporter ([`export`]) runs on a thread of its own, encodes ([`encode`], with
//!   [`protobuf`]'s writer) and POSTs; its failures are counted and logged there and
//!   reach no request.
//!
//! [`context`] reads and writes `traceparent`.

pub mod context;
mod encode;
mod export;
mod protobuf;
mod queue;
pub mod sampling;
pub mod span;

pub use context::{SpanId, TRACEPARENT, TRACESTATE, TraceId, TraceParent};
pub use export::INTERVAL;
pub use sampling::{Decision, Sampler};
pub use span::{
    AfterFailure, Arrival, AttemptEnd, AttemptId, AttemptStart, Dedupe, Fleet, RequestTrace, Side,
};

#[cfg(test)]
mod tests;

use std::io;
use std::sync::Arc;

use tokio::time::Instant;

use crate::config::TracingConfig;
use crate::metrics::trace::TraceDrops;

/// The running `[tracing]`: the sampling decision and the export queue, with the
/// exporter's thread behind it. Built once per config that has the section and kept
/// across reloads that leave the section as it was; when the last handle (this, and
/// every trace in flight) is gone, the exporter sends what is left and ends.
pub struct Tracer {
    config: TracingConfig,
    sampler: Sampler,
    queue: Arc<queue::Queue<span::Spans>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("config", &self.config)
            .finish()
    }
}

impl Tracer {
    /// Starts the exporter's thread for `config`; `drops` counts what never reaches the
    /// collector (`Metrics::trace_drops`).
    pub fn new(config: &TracingConfig, drops: TraceDrops) -> io::Result<Arc<Tracer>> {
        let (queue, taker) = queue::queue(config.queue, config.batch, drops.clone());
        let settings = export::Settings {
            authority: config.otlp.authority().to_string(),
            path: config.otlp.traces_path(),
            batch: config.batch,
            timeout: config.timeout,
        };
        // Detached: it ends by itself once the queue's last handle is gone.
        export::spawn(taker, settings, encode::Resource::from_env(), drops)?;
        Ok(Arc::new(Tracer {
            config: config.clone(),
            sampler: Sampler::new(config.sample),
            queue,
        }))
    }

    /// The settings it runs with: a reload whose `[tracing]` is equal keeps this tracer.
    pub fn config(&self) -> &TracingConfig {
        &self.config
    }

    /// A request arrived `now`: its trace when it is traced (parent-based, see
    /// [`sampling`]), else `None` and nothing is recorded or sent for it.
    #[inline]
    pub fn request(&self, arrival: &Arrival<'_>, now: Instant) -> Option<RequestTrace> {
        let context = self.sampler.decide(arrival.headers).context()?;
        Some(RequestTrace::new(self.queue.clone(), context, arrival, now))
    }

    /// Spans handed over and not yet taken by the exporter.
    pub fn waiting(&self) -> usize {
        self.queue.waiting()
    }
}
