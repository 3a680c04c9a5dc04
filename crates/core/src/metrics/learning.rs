//! The metrics of a caller that learns from its upstream: the retry budget's share as it
//! adapts (`tollgate_retry_budget_ratio`), the chance that the client-side throttle
//! rejects a request now (`tollgate_throttle_probability`), and the app's own retries
//! that tollgate recognised (`tollgate_app_retries_total`).
//!
//! The two gauges are read from live state at scrape time, like the budget's other
//! gauges; the handles are resolved with the upstream's other series.

use prometheus::{Gauge, GaugeVec, IntCounter, IntCounterVec, Registry};

use super::Evidence;
use super::family::{counters, gauges};

/// The families, registered once per process.
pub(super) struct Learning {
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

    /// The handles of one upstream, every evidence among them.
    pub(super) fn upstream(&self, name: &str) -> Handles {
        Handles {
            budget_ratio: self.budget_ratio.with_label_values(&[name]),
            throttle_probability: self.throttle_probability.with_label_values(&[name]),
            app_retries: Evidence::ALL
                .map(|e| self.app_retries.with_label_values(&[name, e.as_str()])),
        }
    }

    /// Removes the series of an upstream a reload removed.
    pub(super) fn remove(&self, name: &str) {
        let _ = self.budget_ratio.remove_label_values(&[name]);
        let _ = self.throttle_probability.remove_label_values(&[name]);
        for e in Evidence::ALL {
            let _ = self.app_retries.remove_label_values(&[name, e.as_str()]);
        }
    }
}

/// One upstream's handles.
pub(super) struct Handles {
    budget_ratio: Gauge,
    throttle_probability: Gauge,
    /// `tollgate_app_retries_total`, by [`Evidence`].
    app_retries: [IntCounter; Evidence::ALL.len()],
}

impl Handles {
    /// Sets the gauges just before a scrape.
    pub(super) fn set(&self, budget_ratio: f64, throttle_probability: f64) {
        self.budget_ratio.set(budget_ratio);
        self.throttle_probability.set(throttle_probability);
    }

    pub(super) fn app_retry(&self, evidence: Evidence) {
        self.app_retries[evidence as usize].inc();
    }
}
