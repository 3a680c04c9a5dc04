//! The metric of the trace export: spans that never reached the collector, by why.
//! Both series exist from the start, so an alert on `increase()` sees the first drop.

use prometheus::{IntCounter, Registry};

use super::family::counters;

/// Why spans were dropped: the `reason` label of `tollgate_trace_spans_dropped_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanDrop {
    /// The export queue was full (the collector slower than the traffic, or down).
    QueueFull,
    /// Their export failed (refused, timed out, or the collector unreachable).
    ExportFailed,
}

impl SpanDrop {
    const ALL: [SpanDrop; 2] = [SpanDrop::QueueFull, SpanDrop::ExportFailed];

    pub fn as_str(self) -> &'static str {
        match self {
            SpanDrop::QueueFull => "queue-full",
            SpanDrop::ExportFailed => "export-failed",
        }
    }
}

/// The handles, resolved at start; cloned into the export queue.
#[derive(Clone)]
pub struct TraceDrops([IntCounter; 2]);

impl TraceDrops {
    pub(super) fn new(r: &Registry) -> Self {
        let family = counters(
            r,
            "tollgate_trace_spans_dropped_total",
            "Spans not exported: queue-full (more waiting than [tracing] queue), \
             export-failed (the collector refused them, did not answer within [tracing] \
             timeout, or could not be reached).",
            &["reason"],
        );
        TraceDrops(SpanDrop::ALL.map(|d| family.with_label_values(&[d.as_str()])))
    }

    pub fn dropped(&self, why: SpanDrop, spans: usize) {
        self.0[why as usize].inc_by(spans as u64);
    }

    pub fn get(&self, why: SpanDrop) -> u64 {
        self.0[why as usize].get()
    }
}
