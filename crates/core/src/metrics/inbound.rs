//! The inbound side's metrics: what tollgate did with the requests of every caller of
//! this app, as this dependency sees them.
//!
//! The families are registered when the config has an `[inbound]` section (the first
//! time [`Metrics::inbound`] is asked), so a tollgate without one exports none of
//! them. Handles are resolved once; the per-code counters, as for the upstreams, on
//! first use of each code.

use std::sync::OnceLock;

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts};

use super::{LATENCY_BUCKETS, Metrics, Outcome, counters, family};

/// Whether a request was a caller's first attempt or a retry: the `kind` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    First,
    Retry,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::First => "first",
            Kind::Retry => "retry",
        }
    }
}

/// Why a request never reached the app: the `reason` label of
/// `tollgate_inbound_denied_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InboundDenied {
    /// A retry beyond `[inbound.retries]`.
    RetryBudget,
    /// Over the concurrency limit.
    Overloaded,
    /// No time left on arrival.
    Deadline,
}

impl InboundDenied {
    const ALL: [InboundDenied; 3] = [
        InboundDenied::RetryBudget,
        InboundDenied::Overloaded,
        InboundDenied::Deadline,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            InboundDenied::RetryBudget => "retry-budget",
            InboundDenied::Overloaded => "overloaded",
            InboundDenied::Deadline => "deadline",
        }
    }
}

type ByCode = OnceLock<Box<[OnceLock<IntCounter>]>>;

/// The inbound side's handles.
pub struct InboundMetrics {
    requests: IntCounterVec,
    /// `[kind][outcome][status - 100]`, filled on first use.
    by_code: [[ByCode; Outcome::ALL.len()]; 2],
    denied: [IntCounter; 3],
    pub request_duration: Histogram,
    pub inflight: IntGauge,
    pub concurrency_limit: IntGauge,
    pub amplification: Gauge,
    pub budget_available: Gauge,
    /// Kubelet probes admitted without a place in the limit.
    pub probes_exempt: IntCounter,
    /// The app's failures marked `downstream-owned` (ownership through the app).
    pub owned_failures: IntCounter,
}

impl std::fmt::Debug for InboundMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboundMetrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// The inbound side's metrics, registered on first use.
    pub fn inbound(&self) -> &InboundMetrics {
        self.inbound.get_or_init(|| {
            let r = &self.registry;
            let gauge = |name: &str, help: &str| family(r, Gauge::with_opts(Opts::new(name, help)));
            let int_gauge =
                |name: &str, help: &str| family(r, IntGauge::with_opts(Opts::new(name, help)));
            let denied = counters(
                r,
                "tollgate_inbound_denied_total",
                "Requests from callers that never reached the app, by why.",
                &["reason"],
            );
            let m = InboundMetrics {
                requests: counters(
                    r,
                    "tollgate_inbound_requests_total",
                    "Requests from callers answered, by status, outcome and whether the caller \
                     was retrying.",
                    &["code", "outcome", "kind"],
                ),
                by_code: Default::default(),
                denied: InboundDenied::ALL.map(|d| denied.with_label_values(&[d.as_str()])),
                request_duration: family(
                    r,
                    Histogram::with_opts(
                        HistogramOpts::new(
                            "tollgate_inbound_request_duration_seconds",
                            "From a caller's request head to the end of the response.",
                        )
                        .buckets(LATENCY_BUCKETS.to_vec()),
                    ),
                ),
                inflight: int_gauge(
                    "tollgate_inbound_inflight",
                    "Requests the app is serving now through the inbound side.",
                ),
                concurrency_limit: int_gauge(
                    "tollgate_inbound_concurrency_limit",
                    "Requests the app is given at once: max_inflight, or the adaptive limit now.",
                ),
                amplification: gauge(
                    "tollgate_inbound_amplification",
                    "Requests received per first attempt over the window: the fleet's \
                     amplification as this app sees it (NaN without traffic).",
                ),
                budget_available: gauge(
                    "tollgate_inbound_retry_budget_available",
                    "Callers' retries the fleet budget would admit now (+Inf without \
                     [inbound.retries]).",
                ),
                probes_exempt: family(
                    r,
                    IntCounter::with_opts(Opts::new(
                        "tollgate_inbound_probes_exempt_total",
                        "Kubelet probes admitted without a place in the concurrency limit \
                         (at most 8 at once; more go through normal admission).",
                    )),
                ),
                owned_failures: family(
                    r,
                    IntCounter::with_opts(Opts::new(
                        "tollgate_inbound_owned_failures_total",
                        "The app's 502/503/504 (or gRPC UNAVAILABLE) marked downstream-owned: \
                         this pod's outbound side had given up on a call made for the request.",
                    )),
                ),
            };
            // The common answers exist from the start, so dashboards show zeros.
            m.counter(Kind::First, 200, Outcome::Ok);
            m.counter(Kind::Retry, 200, Outcome::Ok);
            m
        })
    }
}

impl InboundMetrics {
    fn counter(&self, kind: Kind, status: u16, outcome: Outcome) -> &IntCounter {
        let status = status.clamp(100, 599);
        let table = self.by_code[kind as usize][outcome.index()]
            .get_or_init(|| (100..600).map(|_| OnceLock::new()).collect());
        table[usize::from(status - 100)].get_or_init(|| {
            let code = status.to_string();
            self.requests
                .with_label_values(&[&code, outcome.as_str(), kind.as_str()])
        })
    }

    /// A request answered.
    pub fn request(&self, kind: Kind, status: u16, outcome: Outcome) {
        self.counter(kind, status, outcome).inc();
    }

    pub fn denied(&self, why: InboundDenied) {
        self.denied[why as usize].inc();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_families_exist_only_once_asked_for_and_count_by_kind() {
        let m = Metrics::new();
        let text = String::from_utf8(m.encode()).unwrap();
        assert!(
            !text.contains("tollgate_inbound"),
            "no [inbound], no series"
        );
        let i = m.inbound();
        i.request(Kind::Retry, 503, Outcome::RetryRejected);
        i.denied(InboundDenied::RetryBudget);
        i.amplification.set(f64::NAN);
        let text = String::from_utf8(m.encode()).unwrap();
        for name in [
            "tollgate_inbound_requests_total",
            "tollgate_inbound_denied_total",
            "tollgate_inbound_inflight",
            "tollgate_inbound_concurrency_limit",
            "tollgate_inbound_request_duration_seconds",
            "tollgate_inbound_amplification",
            "tollgate_inbound_retry_budget_available",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(text.contains(
            "tollgate_inbound_requests_total{code=\"503\",kind=\"retry\",outcome=\"retry-rejected\"} 1\n"
        ));
        assert!(text.contains("tollgate_inbound_denied_total{reason=\"retry-budget\"} 1\n"));
        assert!(text.contains("tollgate_inbound_denied_total{reason=\"deadline\"} 0\n"));
        assert!(text.contains("tollgate_inbound_amplification NaN\n"));
        // Asked again (a reload): the same families, nothing registered twice.
        m.inbound().request(Kind::First, 200, Outcome::Ok);
    }
}
