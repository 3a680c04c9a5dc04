//! Full-jitter exponential backoff: `sleep = random(0, min(max, base * 2^n))`, `n` the
//! retries already made.
//!
//! Why full jitter: callers that failed together would, with a fixed or purely
//! exponential schedule, also retry together, in synchronised waves. Drawing the whole
//! sleep uniformly spreads them over the interval; of the variants compared in the AWS
//! analysis it does the least total work. The cost, an occasional near-immediate retry,
//! matters little: what the upstream feels is the aggregate arrival rate.
//!
//! `Jitter::None` exists so the lab can show what a fixed schedule does; it is never
//! the default.
//!
//! The schedule itself is config data ([`BackoffConfig`]); this is the part that draws.

use std::time::Duration;

pub use crate::config::{BackoffConfig, InvalidBackoff, Jitter};

/// A backoff schedule that draws sleeps. One that exists is valid: it is built from a
/// validated [`BackoffConfig`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff(BackoffConfig);

impl From<&BackoffConfig> for Backoff {
    fn from(config: &BackoffConfig) -> Self {
        Backoff(*config)
    }
}

impl Backoff {
    pub fn try_new(base: Duration, max: Duration) -> Result<Self, InvalidBackoff> {
        BackoffConfig::try_new(base, max).map(Backoff)
    }

    pub fn with_jitter(self, jitter: Jitter) -> Self {
        Backoff(self.0.with_jitter(jitter))
    }

    pub fn base(&self) -> Duration {
        self.0.base()
    }

    pub fn max(&self) -> Duration {
        self.0.max()
    }

    pub fn jitter(&self) -> Jitter {
        self.0.jitter()
    }

    /// The longest sleep before retry number `retries_so_far + 1`: `min(max, base * 2^n)`.
    pub fn cap(&self, retries_so_far: u32) -> Duration {
        self.0.cap(retries_so_far)
    }

    /// The sleep before the next retry.
    pub fn draw(&self, retries_so_far: u32, rng: &mut fastrand::Rng) -> Duration {
        let cap = self.cap(retries_so_far);
        match self.jitter() {
            Jitter::None => cap,
            Jitter::Full => {
                let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(rng.u64(0..=nanos))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn cap_doubles_from_base_up_to_max() {
        let b = Backoff::try_new(ms(25), ms(1000)).unwrap();
        let caps: Vec<u64> = (0..8).map(|n| b.cap(n).as_millis() as u64).collect();
        assert_eq!(caps, vec![25, 50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(
            b.cap(1000),
            ms(1000),
            "huge exponents saturate, never overflow"
        );
    }

    #[test]
    fn base_above_max_is_refused() {
        assert!(Backoff::try_new(ms(2000), ms(1000)).is_err());
    }

    #[test]
    fn full_jitter_draws_cover_zero_to_cap_uniformly() {
        let b = Backoff::try_new(ms(100), ms(1000)).unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        for n in 0..6 {
            let cap = b.cap(n);
            let draws: Vec<Duration> = (0..4000).map(|_| b.draw(n, &mut rng)).collect();
            assert!(draws.iter().all(|d| *d <= cap), "a draw exceeded the cap");
            let mean = draws.iter().map(|d| d.as_secs_f64()).sum::<f64>() / draws.len() as f64;
            let expected = cap.as_secs_f64() / 2.0;
            assert!(
                (mean - expected).abs() < expected * 0.05,
                "mean {mean} far from {expected} at n={n}"
            );
            // A quarter of the draws land in each quarter of the interval.
            let low = draws.iter().filter(|d| **d < cap / 4).count();
            assert!(
                (800..1200).contains(&low),
                "{low} draws in the lowest quarter"
            );
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_sleeps() {
        let b = Backoff::default();
        let a: Vec<_> = {
            let mut r = fastrand::Rng::with_seed(42);
            (0..10).map(|n| b.draw(n, &mut r)).collect()
        };
        let c: Vec<_> = {
            let mut r = fastrand::Rng::with_seed(42);
            (0..10).map(|n| b.draw(n, &mut r)).collect()
        };
        assert_eq!(a, c);
    }

    #[test]
    fn no_jitter_sleeps_exactly_the_cap() {
        let b = Backoff::try_new(ms(50), ms(50))
            .unwrap()
            .with_jitter(Jitter::None);
        let mut rng = fastrand::Rng::with_seed(1);
        assert!((0..5).all(|n| b.draw(n, &mut rng) == ms(50)));
    }
}
