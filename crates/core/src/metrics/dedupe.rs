//! The metrics of `[inbound.dedupe]`: what became of each keyed request, how long the
//! store took to answer, and how many keys the memory store holds.
//!
//! Registered the first time [`Metrics::dedupe`] is asked, which the dedupe core does
//! when it is built: a tollgate without `[inbound.dedupe]` exports none of them.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Opts};

use super::{Metrics, counters, family};

/// What became of a keyed request: the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupeResult {
    /// The first arrival: it ran.
    First,
    /// A duplicate after completion got the kept answer.
    Replayed,
    /// A duplicate waited for the first and got its answer.
    Joined,
    /// A duplicate whose deadline came while the first still ran (`409`).
    InProgress,
    /// The same key with another body (`422`).
    Mismatch,
    /// A duplicate of a request whose answer was not kept (`500 not-replayable`).
    NotKept,
    /// The store failed (at a request's start, or while ending a claim).
    StoreError,
}

impl DedupeResult {
    pub const ALL: [DedupeResult; 7] = [
        DedupeResult::First,
        DedupeResult::Replayed,
        DedupeResult::Joined,
        DedupeResult::InProgress,
        DedupeResult::Mismatch,
        DedupeResult::NotKept,
        DedupeResult::StoreError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DedupeResult::First => "first",
            DedupeResult::Replayed => "replayed",
            DedupeResult::Joined => "joined",
            DedupeResult::InProgress => "in-progress",
            DedupeResult::Mismatch => "mismatch",
            DedupeResult::NotKept => "not-kept",
            DedupeResult::StoreError => "store-error",
        }
    }
}

/// Seconds; from a memory store's microseconds to a Redis past `store_timeout`.
const STORE_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The handles of `[inbound.dedupe]`.
pub struct DedupeMetrics {
    results: [IntCounter; 7],
    pub store_seconds: Histogram,
    pub entries: IntGauge,
}

impl std::fmt::Debug for DedupeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DedupeMetrics").finish_non_exhaustive()
    }
}

impl DedupeMetrics {
    pub fn count(&self, result: DedupeResult) {
        self.results[result as usize].inc();
    }

    /// The count of `result` so far (for tests and the lab).
    pub fn counted(&self, result: DedupeResult) -> u64 {
        self.results[result as usize].get()
    }
}

impl Metrics {
    /// The dedupe metrics, registered on first use.
    pub fn dedupe(&self) -> &DedupeMetrics {
        self.dedupe.get_or_init(|| {
            let r = &self.registry;
            let results = counters(
                r,
                "tollgate_inbound_dedupe_total",
                "Keyed requests under [inbound.dedupe], by what became of them.",
                &["result"],
            );
            DedupeMetrics {
                results: DedupeResult::ALL.map(|d| results.with_label_values(&[d.as_str()])),
                store_seconds: family(
                    r,
                    Histogram::with_opts(
                        HistogramOpts::new(
                            "tollgate_inbound_dedupe_store_seconds",
                            "How long one operation of the dedupe store took (a failed one \
                             included).",
                        )
                        .buckets(STORE_BUCKETS.to_vec()),
                    ),
                ),
                entries: family(
                    r,
                    IntGauge::with_opts(Opts::new(
                        "tollgate_inbound_dedupe_entries",
                        "Keys the memory store holds now, in flight or completed.",
                    )),
                ),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_families_exist_only_once_asked_for() {
        let m = Metrics::new();
        let text = String::from_utf8(m.encode()).unwrap();
        assert!(
            !text.contains("tollgate_inbound_dedupe"),
            "no [inbound.dedupe], no series"
        );
        m.dedupe().count(DedupeResult::Joined);
        m.dedupe().store_seconds.observe(0.001);
        let text = String::from_utf8(m.encode()).unwrap();
        for name in [
            "tollgate_inbound_dedupe_total",
            "tollgate_inbound_dedupe_store_seconds",
            "tollgate_inbound_dedupe_entries",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(text.contains("tollgate_inbound_dedupe_total{result=\"joined\"} 1\n"));
        assert!(text.contains("tollgate_inbound_dedupe_total{result=\"store-error\"} 0\n"));
        // Asked again (a reload): the same families, nothing registered twice.
        m.dedupe().count(DedupeResult::First);
    }
}
