//! The upstream's recent median attempt duration, kept in one atomic word.
//!
//! A retry is not started when the time left could not cover a typical attempt: it
//! would only add load and then be cut off by the deadline. "Typical" needs a median
//! that follows the upstream as it slows down and recovers, costs nothing per attempt
//! and takes no lock, so this is the frugal streaming estimator (Ma, Muthukrishnan,
//! Sandler): each observation nudges the estimate up or down by a small relative step.
//! It converges on the median of the recent stream and tracks a 10x shift within a
//! few dozen to a couple of hundred observations.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Relative step per observation: 1/16 (about 6%).
const STEP_SHIFT: u32 = 4;

#[derive(Debug, Default)]
pub struct RecentMedian {
    /// Microseconds; 0 means nothing observed yet.
    micros: AtomicU64,
}

impl RecentMedian {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn observe(&self, d: Duration) {
        let x = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        let _ = self.micros.fetch_update(Relaxed, Relaxed, |m| {
            Some(if m == 0 {
                x
            } else if x > m {
                (m + (m >> STEP_SHIFT).max(1)).min(x)
            } else if x < m {
                (m - (m >> STEP_SHIFT).max(1)).max(x)
            } else {
                m
            })
        });
    }

    /// `None` until the first observation.
    pub fn get(&self) -> Option<Duration> {
        match self.micros.load(Relaxed) {
            0 => None,
            m => Some(Duration::from_micros(m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_observed() {
        assert_eq!(RecentMedian::new().get(), None);
    }

    #[test]
    fn converges_on_the_median_of_a_skewed_stream() {
        let m = RecentMedian::new();
        let mut rng = fastrand::Rng::with_seed(3);
        // 70% of attempts take ~20 ms, 30% take ~2 s: the median is ~20 ms, the mean ~600 ms.
        for _ in 0..2000 {
            let ms = if rng.u8(0..10) < 7 {
                rng.u64(15..25)
            } else {
                rng.u64(1500..2500)
            };
            m.observe(Duration::from_millis(ms));
        }
        let got = m.get().unwrap().as_millis();
        assert!((12..=40).contains(&got), "median estimate {got} ms");
    }

    #[test]
    fn follows_an_upstream_that_slows_down() {
        let m = RecentMedian::new();
        for _ in 0..500 {
            m.observe(Duration::from_millis(10));
        }
        for _ in 0..200 {
            m.observe(Duration::from_millis(900));
        }
        let got = m.get().unwrap().as_millis();
        assert!(got >= 800, "still at {got} ms after 200 slow attempts");
    }
}
