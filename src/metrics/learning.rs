//! The metrics of a caller that learns from its upstream: the retry budget's share as it
//! adapts (`tollgate_retry_budget_ratio`), the chance that the client-side throttle
//! rejects a request now (`tollgate_throttle_probability`), and the app's own retries
//! that tollgate recognised (`tollgate_app_retries_total`).
//!
//! The two gauges are read from live state at scrape time, like the budget's other
//! gauges; the counter's handle is resolved once per upstream.

use prometheus::{GaugeVec, IntCounter, IntCounterVec, Registry};

use super::Evidence;
use super::family::{counters, gauges};

/// The families, registered once per process.
pub struct Learning {
    budget_ratio: GaugeVec,
    throttle_probability: GaugeVec,
    app_retries: IntCounterVec,
}

impl Learning {
    pub(super) fn new(r: &Registry) -> Self {
        let up = &["upstream"];
        Learning {
            budget_ratio: gauges(
                r,
                "tollgate_retry_budget_ratio",
                "The retry budget's share of requests now: ratio, or between ratio and \
                 max_ratio as it adapts (+Inf without a budget).",
                up,
            ),
            throttle_probability: gauges(
                r,
                "tollgate_throttle_probability",
                "The probability that the client-side throttle rejects a first attempt now \
                 (0 without [throttle]).",
                up,
            ),
            app_retries: counters(
                r,
                "tollgate_app_retries_total",
                "Requests taken for the app's own retries, by evidence: a retry count its \
                 client set (marker), the per-call identity of a failure tollgate answered \
                 in the last 2 s (key), or only the same trace id (trace, counted only).",
                &["upstream", "evidence"],
            ),
        }
    }

    /// The series of one upstream exist from its first build, so dashboards show
    /// values, not gaps; returns its app-retry counters, by [`Evidence`].
    pub(super) fn upstream(&self, name: &str) -> [IntCounter; 3] {
        self.budget_ratio.with_label_values(&[name]);
        self.throttle_probability.with_label_values(&[name]);
        Evidence::ALL.map(|e| self.app_retries.with_label_values(&[name, e.as_str()]))
    }

    /// Sets the gauges of `name` just before a scrape.
    pub fn set(&self, name: &str, budget_ratio: f64, throttle_probability: f64) {
        self.budget_ratio
            .with_label_values(&[name])
            .set(budget_ratio);
        self.throttle_probability
            .with_label_values(&[name])
            .set(throttle_probability);
    }

    /// Drops the gauges of an upstream that no longer exists.
    pub(super) fn forget(&self, name: &str) {
        let _ = self.budget_ratio.remove_label_values(&[name]);
        let _ = self.throttle_probability.remove_label_values(&[name]);
    }
}
