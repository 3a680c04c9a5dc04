//! A high percentile of the upstream's recent attempt latency (p95 for `after = "p95"`),
//! kept in one atomic word: when a hedge is due.
//!
//! The same estimator at `q = 0.5` is the upstream's recent median attempt time: a retry
//! is not started when the time left could not cover a typical attempt.
//!
//! The estimator is frugal streaming (Ma, Muthukrishnan, Sandler), with asymmetric steps: an observation above the estimate moves it
//! up by `UP` (relative), one below moves it down by `UP * (1 - q) / q`. The estimate
//! settles where the two balance, `P(above) * up = P(below) * down`, which is where a
//! share `q` of the observations lies below it. No histogram, no lock, no allocation:
//! one compare-and-swap per attempt.
//!
//! It follows an upstream that slows down within tens of observations (up steps are
//! large) and one that speeds up within a few hundred to a few thousand (p95: about
//! 300 attempts per e-fold; p99.9: thousands). Erring high for a while costs hedges
//! that come late; erring low would cost hedges sent for nothing, and the `max_extra`
//! budget caps those.
//!
//! Only the direction of an observation matters, so an attempt cut off before it
//! answered (a hedge's loser, an attempt timed out) still tells something when it had
//! already taken longer than the estimate: it would have been above it.
//! [`RecentQuantile::observe_at_least`] takes such censored observations.
//!
//! The word holds the estimate in microseconds (low 48 bits) and how many observations
//! it has seen (high 16 bits, saturating): the estimate is trusted only after
//! [`WARM_UP`] of them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The relative step up: 1/16 (about 6%).
const UP: f64 = 1.0 / 16.0;
/// Observations before the estimate is used.
pub const WARM_UP: u64 = 20;

const MICROS_BITS: u32 = 48;
const MICROS_MASK: u64 = (1 << MICROS_BITS) - 1;
const COUNT_MAX: u64 = (1 << (64 - MICROS_BITS)) - 1;

#[derive(Debug)]
pub struct RecentQuantile {
    /// The relative step down, `UP * (1 - q) / q`.
    down: f64,
    word: AtomicU64,
}

impl RecentQuantile {
    /// An estimator of quantile `q` (0.5 ..= 0.999).
    pub fn new(q: f64) -> Self {
        let q = q.clamp(0.5, 0.999);
        RecentQuantile {
            down: UP * (1.0 - q) / q,
            word: AtomicU64::new(0),
        }
    }

    /// An attempt that took `d`.
    pub fn observe(&self, d: Duration) {
        let x = micros(d);
        self.update(|m| {
            if m == 0 {
                x
            } else if x > m {
                step_up(m).min(x)
            } else if x < m {
                m.saturating_sub(((m as f64 * self.down) as u64).max(1))
                    .max(x)
            } else {
                m
            }
        });
    }

    /// An attempt cut off after `d`, that had not answered: it would have taken longer.
    /// Moves the estimate up when `d` is above it, and tells nothing otherwise.
    pub fn observe_at_least(&self, d: Duration) {
        let x = micros(d);
        let m = self.word.load(Relaxed) & MICROS_MASK;
        if m != 0 && x > m {
            self.update(|m| if x > m { step_up(m) } else { m });
        }
    }

    /// The estimate, once it has seen [`WARM_UP`] observations.
    pub fn get(&self) -> Option<Duration> {
        let word = self.word.load(Relaxed);
        (word >> MICROS_BITS >= WARM_UP).then(|| Duration::from_micros(word & MICROS_MASK))
    }

    fn update(&self, next: impl Fn(u64) -> u64) {
        let _ = self.word.fetch_update(Relaxed, Relaxed, |word| {
            let count = (word >> MICROS_BITS).saturating_add(1).min(COUNT_MAX);
            let m = next(word & MICROS_MASK).clamp(1, MICROS_MASK);
            Some(count << MICROS_BITS | m)
        });
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .clamp(1, MICROS_MASK)
}

fn step_up(m: u64) -> u64 {
    m.saturating_add(((m as f64 * UP) as u64).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log-normal draw around `median_ms` (sigma 0.3), with `slow` of them ten times
    /// slower: the lab's slow-tail upstream.
    fn draw(rng: &mut fastrand::Rng, median_ms: f64, slow: f64) -> f64 {
        let (u1, u2) = (rng.f64().max(1e-12), rng.f64());
        let normal = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let x = median_ms * (0.3 * normal).exp();
        if rng.f64() < slow { x * 10.0 } else { x }
    }

    /// The true quantile of `samples`.
    fn quantile(samples: &mut [f64], q: f64) -> f64 {
        samples.sort_by(f64::total_cmp);
        samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]
    }

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    #[test]
    fn unknown_until_warmed_up() {
        let e = RecentQuantile::new(0.95);
        for _ in 0..WARM_UP - 1 {
            e.observe(Duration::from_millis(10));
        }
        assert_eq!(e.get(), None);
        e.observe(Duration::from_millis(10));
        assert_eq!(e.get(), Some(Duration::from_millis(10)));
    }

    #[test]
    fn converges_on_the_quantile_it_is_asked_for() {
        for (q, slow) in [(0.95, 0.02), (0.99, 0.02), (0.9, 0.0), (0.5, 0.0)] {
            let e = RecentQuantile::new(q);
            let mut rng = fastrand::Rng::with_seed(7);
            let mut samples = Vec::new();
            for _ in 0..20_000 {
                let x = draw(&mut rng, 20.0, slow);
                samples.push(x);
                e.observe(ms(x));
            }
            let truth = quantile(&mut samples[10_000..], q);
            let got = e.get().unwrap().as_secs_f64() * 1000.0;
            assert!(
                (got / truth - 1.0).abs() < 0.2,
                "q {q}: estimate {got:.1} ms, true {truth:.1} ms"
            );
        }
    }

    #[test]
    fn follows_an_upstream_that_slows_down_and_recovers() {
        let e = RecentQuantile::new(0.95);
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..2000 {
            e.observe(ms(draw(&mut rng, 10.0, 0.0)));
        }
        for _ in 0..100 {
            e.observe(ms(draw(&mut rng, 100.0, 0.0)));
        }
        let slow = e.get().unwrap().as_millis();
        assert!(slow >= 100, "still at {slow} ms after 100 slow attempts");
        for _ in 0..3000 {
            e.observe(ms(draw(&mut rng, 10.0, 0.0)));
        }
        let back = e.get().unwrap().as_millis();
        assert!(
            (12..=25).contains(&back),
            "{back} ms after 3000 fast attempts again"
        );
    }

    #[test]
    fn a_cut_off_attempt_only_ever_pushes_up() {
        let e = RecentQuantile::new(0.95);
        for _ in 0..WARM_UP {
            e.observe(Duration::from_millis(40));
        }
        e.observe_at_least(Duration::from_millis(5));
        assert_eq!(e.get(), Some(Duration::from_millis(40)), "tells nothing");
        e.observe_at_least(Duration::from_millis(400));
        let up = e.get().unwrap();
        assert!(up > Duration::from_millis(40) && up < Duration::from_millis(50));
        let fresh = RecentQuantile::new(0.95);
        fresh.observe_at_least(Duration::from_millis(400));
        assert_eq!(
            fresh.word.load(Relaxed),
            0,
            "nothing to push before a first answer"
        );
    }

    #[test]
    fn the_estimate_never_reaches_zero_or_overflows() {
        let e = RecentQuantile::new(0.999);
        for _ in 0..10_000 {
            e.observe(Duration::ZERO);
        }
        assert!(e.get().unwrap() >= Duration::from_micros(1));
        for _ in 0..1000 {
            e.observe(Duration::MAX);
        }
        assert_eq!(e.get().unwrap(), Duration::from_micros(MICROS_MASK));
    }
}
