//! Registering a metric family, one helper per kind, so each family is declared in one
//! call with its name, help and labels.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

pub(super) fn family<T: Clone + prometheus::core::Collector + 'static>(
    registry: &Registry,
    metric: prometheus::Result<T>,
) -> T {
    // Names and labels are constants of the metrics files: a failure is a bug caught by
    // tests.
    let metric = metric.expect("metric definition");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric registration");
    metric
}

/// A labelled counter family, registered.
pub(super) fn counters(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    family(r, IntCounterVec::new(Opts::new(name, help), labels))
}

/// A labelled gauge family, registered.
pub(super) fn gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    family(r, GaugeVec::new(Opts::new(name, help), labels))
}

/// A labelled integer gauge family, registered.
pub(super) fn int_gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    family(r, IntGaugeVec::new(Opts::new(name, help), labels))
}

/// A labelled histogram family with these buckets, registered.
pub(super) fn histograms(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    family(
        r,
        HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels),
    )
}
