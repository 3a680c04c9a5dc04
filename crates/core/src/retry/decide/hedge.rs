//! Hedging: when an attempt has not answered by the time most attempts have (`after`,
//! a percentile of the recent attempt latency or a fixed time), a second attempt goes
//! to another endpoint beside it, and the first answer that is not a failure wins.
//! A tail caused by one slow endpoint, a garbage collection or a cold cache costs the
//! hedge's time instead of the slow attempt's.
//!
//! Hedges add load by design, so they have a budget of their own: over a sliding
//! window, hedges sent stay within `max_extra` of the requests received, with no floor
//! (a quiet upstream gets no free hedges). It is the retry budget's machinery
//! ([`RetryBudget::at_most`]) with `ratio = max_extra` and `min_per_sec = 0`, on the retry
//! budget's window, save that hedges may reach their bound ("at most" `max_extra`, where
//! retries stay strictly below theirs); a hedge is charged there only, never to the
//! retry budget.
//!
//! This file decides *when* and *whether*; the attempt loop ([`forward`](mod@crate::retry::forward)) runs
//! the two attempts side by side and picks the winner.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::{BudgetConfig, HedgeAfter, HedgeConfig};
use crate::retry::decide::budget::RetryBudget;
use crate::retry::learn::quantile::RecentQuantile;

/// The window of the hedge budget when the upstream has no retry budget.
const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// One upstream's hedging: its rule, its budget and its latency estimate.
#[derive(Debug)]
pub struct Hedging {
    config: HedgeConfig,
    budget: RetryBudget,
    /// The percentile `after` names, when it names one.
    latency: Option<RecentQuantile>,
}

impl Hedging {
    /// Hedging by `config`, its budget over `window` (the retry budget's, when there is
    /// one).
    pub fn new(config: &HedgeConfig, window: Option<Duration>, now: Instant) -> Self {
        let limit = BudgetConfig {
            ratio: config.max_extra,
            min_per_sec: 0.0,
            window: window.unwrap_or(DEFAULT_WINDOW),
            max_ratio: None,
        };
        Hedging {
            budget: RetryBudget::at_most(&limit, now),
            latency: match config.after {
                HedgeAfter::Percentile(q) => Some(RecentQuantile::new(q)),
                HedgeAfter::Fixed(_) => None,
            },
            config: config.clone(),
        }
    }

    /// Whether `Hedging::new(config, window, _)` would build the same rule and budget
    /// (so a reload keeps this one, its window and its estimate).
    pub fn built_from(&self, config: &HedgeConfig, window: Option<Duration>) -> bool {
        self.config == *config && self.budget.window() == window.unwrap_or(DEFAULT_WINDOW)
    }

    /// A request arrived: it earns `max_extra` of a hedge.
    pub fn record_request(&self, now: Instant) {
        self.budget.record_request(now);
    }

    /// How long after its start an attempt that has not answered gets its hedge;
    /// `None` while the percentile is not known yet.
    pub fn delay(&self) -> Option<Duration> {
        match (&self.config.after, &self.latency) {
            (HedgeAfter::Fixed(d), _) => Some(*d),
            (HedgeAfter::Percentile(_), Some(q)) => q.get(),
            (HedgeAfter::Percentile(_), None) => None,
        }
    }

    /// Asks for one hedge; a granted one is counted at once.
    pub fn try_hedge(&self, now: Instant) -> bool {
        self.budget.try_retry(now)
    }

    /// An attempt answered (or failed with an answer) after `took`.
    pub fn observe(&self, took: Duration) {
        if let Some(q) = &self.latency {
            q.observe(took);
        }
    }

    /// An attempt was cut off after `took` without an answer.
    pub fn observe_at_least(&self, took: Duration) {
        if let Some(q) = &self.latency {
            q.observe_at_least(took);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hedging(after: HedgeAfter, max_extra: f64, window: Duration) -> (Hedging, Instant) {
        let now = Instant::now();
        let config = HedgeConfig { after, max_extra };
        (Hedging::new(&config, Some(window), now), now)
    }

    #[test]
    fn a_fixed_delay_is_known_at_once_and_a_percentile_after_warm_up() {
        let (fixed, _) = hedging(
            HedgeAfter::Fixed(Duration::from_millis(50)),
            0.05,
            DEFAULT_WINDOW,
        );
        assert_eq!(fixed.delay(), Some(Duration::from_millis(50)));
        let (p95, _) = hedging(HedgeAfter::Percentile(0.95), 0.05, DEFAULT_WINDOW);
        assert_eq!(p95.delay(), None);
        for _ in 0..crate::retry::learn::quantile::WARM_UP {
            p95.observe(Duration::from_millis(20));
        }
        assert_eq!(p95.delay(), Some(Duration::from_millis(20)));
    }

    #[test]
    fn no_floor_no_traffic_no_hedge() {
        let (h, t0) = hedging(HedgeAfter::Percentile(0.95), 0.05, DEFAULT_WINDOW);
        assert!(!h.try_hedge(t0), "a quiet upstream gets no free hedge");
        for _ in 0..100 {
            h.record_request(t0);
        }
        let granted = (0..100)
            .filter(|i| h.try_hedge(t0 + Duration::from_millis(600 * i)))
            .count();
        assert_eq!(granted, 5, "5% of 100 requests");
    }

    proptest! {
        /// Whatever the arrivals and the hedges asked for, the hedges granted in any
        /// window never exceed max_extra of the requests received in it.
        #[test]
        fn hedges_never_exceed_max_extra_over_the_window(
            max_extra in 0.0f64..0.5,
            window_ms in 200u64..5_000,
            events in prop::collection::vec((0u64..400, any::<bool>()), 1..800),
        ) {
            let window = Duration::from_millis(window_ms);
            let (h, t0) = hedging(HedgeAfter::Fixed(Duration::from_millis(1)), max_extra, window);
            let mut at = Duration::ZERO;
            let (mut requests, mut hedges) = (Vec::new(), Vec::new());
            for (gap_ms, is_request) in events {
                at += Duration::from_millis(gap_ms);
                if is_request {
                    h.record_request(t0 + at);
                    requests.push(at);
                } else if h.try_hedge(t0 + at) {
                    hedges.push(at);
                    let from = at.saturating_sub(window);
                    let inside = |t: &&Duration| **t > from || (at < window && **t >= from);
                    let r = requests.iter().filter(inside).count() as f64;
                    let g = hedges.iter().filter(inside).count() as f64;
                    prop_assert!(g <= max_extra * r + 1e-9, "{g} hedges in a window of {r} requests");
                }
            }
        }
    }
}
