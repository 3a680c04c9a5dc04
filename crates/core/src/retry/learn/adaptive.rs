//! The adaptive share of a retry budget (`max_ratio`): how much retrying the upstream
//! can take right now, learnt from what it shows.
//!
//! # Why adapt
//!
//! A fixed `ratio` is a compromise. Against an upstream that fails at random (a bad
//! replica, a flaky network) a retry is cheap and usually succeeds, and a larger share
//! serves more users. Against an overloaded upstream every retry is load on the one
//! component that has none to spare, and a smaller share is kinder. The upstream says
//! which it is: retries that succeed, or signs of overload and retries that fail.
//!
//! # The control law
//!
//! The share starts at `ratio` and moves between `min = ratio / 10` and `max_ratio`:
//!
//! - **additive increase**: a retry that succeeds adds `(max_ratio - ratio) / 20`,
//!   unless the upstream showed overload within the hold (`window / 10`); a retry that
//!   succeeds while the share is below `ratio` first lifts it back to `ratio`;
//! - **reset on overload**: a 503 `overloaded` or `retry-rejected`, a `Retry-After`, or
//!   a non-negative gRPC pushback brings the share down to `ratio` at once (never up)
//!   and holds increases (pushback `-1` means "do not retry", not overload);
//! - **latency**: an attempt that timed out means the upstream is slower than the
//!   caller can wait; the share's excess over `ratio` is halved (once a hold: the
//!   attempts that time out together are one signal) and increases held;
//! - **multiplicative decrease**: [`KEEP_FAILING`] retries failing with no retry
//!   succeeding in between (a dependency that is down) halve the share, down to `min`,
//!   and suspend the `min_per_sec` floor; the next retry that succeeds restores the
//!   floor. While suspended, the floor still lets one retry a window through (never
//!   more than `min_per_sec` would), so that a retry can succeed and end it.
//!
//! # The guarantee
//!
//! Every value the share takes is clamped to `[min, max_ratio]`, and the floor is
//! either `min_per_sec × window` or less, so the budget's bound is never above the
//! fixed rule with `max_ratio` in place of `ratio`: over any window,
//! `retries < max_ratio × requests + min_per_sec × window_seconds`, whatever the order
//! of events (a property test in `budget.rs` drives it with arbitrary sequences).
//!
//! # Cost
//!
//! The state is a few atomic words; every event is a load and at most a short
//! compare-and-swap loop. Time is the caller's `tokio::time::Instant`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::BudgetConfig;

/// Retries failing in a row (no retry succeeding between) that count as "keep failing".
pub const KEEP_FAILING: u32 = 8;
/// Additive increases from `ratio` to `max_ratio`.
const STEPS: f64 = 20.0;
/// The lowest share, as a fraction of `ratio`.
const MIN_FRACTION: f64 = 0.1;
/// Increases are held this share of the window after an overload or latency signal.
const HOLD_FRACTION: u32 = 10;

/// The share of one budget with `max_ratio`, and whether its floor is in force.
#[derive(Debug)]
pub struct AdaptiveShare {
    ratio: f64,
    max: f64,
    min: f64,
    step: f64,
    hold: Duration,
    origin: Instant,
    /// The share now, as `f64` bits.
    share: AtomicU64,
    floor_suspended: AtomicBool,
    /// Retries that failed since a retry last succeeded (or the share last fell).
    failing: AtomicU32,
    /// Nanoseconds since `origin` before which increases are held.
    calm_from: AtomicU64,
}

impl AdaptiveShare {
    /// `None` when the budget does not adapt (no `max_ratio`, or one not above `ratio`).
    pub fn new(limit: &BudgetConfig, now: Instant) -> Option<Self> {
        let max = limit.adaptive_max()?;
        Some(AdaptiveShare {
            ratio: limit.ratio,
            max,
            min: limit.ratio * MIN_FRACTION,
            step: (max - limit.ratio) / STEPS,
            hold: limit.window / HOLD_FRACTION,
            origin: now,
            share: AtomicU64::new(limit.ratio.to_bits()),
            floor_suspended: AtomicBool::new(false),
            failing: AtomicU32::new(0),
            calm_from: AtomicU64::new(0),
        })
    }

    /// The share now: between `ratio / 10` and `max_ratio`.
    pub fn share(&self) -> f64 {
        f64::from_bits(self.share.load(Relaxed))
    }

    /// Whether the `min_per_sec` floor is in force (it is not while retries keep
    /// failing).
    pub fn floor_on(&self) -> bool {
        !self.floor_suspended.load(Relaxed)
    }

    fn nanos(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Moves the share by `f`, kept within `[min, max]`.
    fn update(&self, f: impl Fn(f64) -> f64) {
        let _ = self.share.fetch_update(Relaxed, Relaxed, |bits| {
            let next = f(f64::from_bits(bits)).clamp(self.min, self.max);
            Some(next.to_bits())
        });
    }

    /// Increases wait until `hold` from now.
    fn hold_increases(&self, now: Instant) {
        let until = self.nanos(now).saturating_add(self.hold.as_nanos() as u64);
        self.calm_from.fetch_max(until, Relaxed);
    }

    /// A retry got an answer that is not a failure `retry.on` lists.
    pub fn retry_succeeded(&self, now: Instant) {
        self.failing.store(0, Relaxed);
        self.floor_suspended.store(false, Relaxed);
        let calm = self.nanos(now) >= self.calm_from.load(Relaxed);
        self.update(|s| {
            let s = s.max(self.ratio);
            if calm { s + self.step } else { s }
        });
    }

    /// A first attempt got an answer that is not a failure `retry.on` lists: the
    /// upstream serves again, so a share that sank below `ratio` while retries kept
    /// failing is back at `ratio`, and the floor is on again (else a dependency that
    /// recovered, and now needs no retry, would keep the share it had while dead). One
    /// load on the path of every success; a store only after a dead spell.
    pub fn first_succeeded(&self) {
        if self.floor_suspended.load(Relaxed) || self.share() < self.ratio {
            self.failing.store(0, Relaxed);
            self.floor_suspended.store(false, Relaxed);
            self.update(|s| s.max(self.ratio));
        }
    }

    /// A retry failed (a listed failure, or no answer at all).
    pub fn retry_failed(&self) {
        let n = self.failing.fetch_add(1, Relaxed) + 1;
        if n >= KEEP_FAILING
            && self
                .failing
                .compare_exchange(n, 0, Relaxed, Relaxed)
                .is_ok()
        {
            self.floor_suspended.store(true, Relaxed);
            self.update(|s| s / 2.0);
        }
    }

    /// The upstream showed overload: back to `ratio` at once (or stay below it).
    pub fn overloaded(&self, now: Instant) {
        self.hold_increases(now);
        self.update(|s| s.min(self.ratio));
    }

    /// An attempt ran out of time: the excess over `ratio` is halved, once a hold: the
    /// attempts in flight when the upstream slowed down all time out together, and are
    /// one signal, not many.
    pub fn slow(&self, now: Instant) {
        let fresh = self.nanos(now) >= self.calm_from.load(Relaxed);
        self.hold_increases(now);
        if !fresh {
            return;
        }
        self.update(|s| {
            if s > self.ratio {
                self.ratio + (s - self.ratio) / 2.0
            } else {
                s
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(ratio: f64, max_ratio: f64) -> AdaptiveShare {
        let cfg = BudgetConfig {
            ratio,
            max_ratio: Some(max_ratio),
            ..BudgetConfig::default()
        };
        AdaptiveShare::new(&cfg, Instant::now()).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn no_adaptation_without_a_max_ratio_above_ratio() {
        let mut cfg = BudgetConfig::default();
        assert!(AdaptiveShare::new(&cfg, Instant::now()).is_none());
        cfg.max_ratio = Some(cfg.ratio);
        assert!(AdaptiveShare::new(&cfg, Instant::now()).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn retries_that_succeed_raise_the_share_step_by_step_to_max_ratio() {
        let a = share(0.2, 0.6);
        assert_eq!(a.share(), 0.2);
        a.retry_succeeded(Instant::now());
        assert!(close(a.share(), 0.22), "{}", a.share());
        for _ in 0..100 {
            a.retry_succeeded(Instant::now());
        }
        assert_eq!(a.share(), 0.6, "never above max_ratio");
    }

    #[tokio::test(start_paused = true)]
    async fn an_overload_signal_resets_to_ratio_at_once_and_holds_increases() {
        let a = share(0.2, 0.6);
        for _ in 0..10 {
            a.retry_succeeded(Instant::now());
        }
        assert!(close(a.share(), 0.4));
        a.overloaded(Instant::now());
        assert_eq!(a.share(), 0.2);
        // Held for window / 10 (1 s of the default 10 s).
        tokio::time::advance(Duration::from_millis(900)).await;
        a.retry_succeeded(Instant::now());
        assert_eq!(a.share(), 0.2, "still held");
        tokio::time::advance(Duration::from_millis(200)).await;
        a.retry_succeeded(Instant::now());
        assert!(close(a.share(), 0.22), "{}", a.share());
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_halves_the_excess_over_ratio() {
        let a = share(0.2, 0.6);
        for _ in 0..20 {
            a.retry_succeeded(Instant::now());
        }
        assert_eq!(a.share(), 0.6);
        a.slow(Instant::now());
        assert!(close(a.share(), 0.4));
        a.slow(Instant::now());
        assert!(close(a.share(), 0.4), "timeouts together are one signal");
        tokio::time::advance(Duration::from_millis(1_100)).await;
        a.slow(Instant::now());
        assert!(close(a.share(), 0.3));
        tokio::time::advance(Duration::from_millis(1_100)).await;
        a.overloaded(Instant::now());
        tokio::time::advance(Duration::from_millis(1_100)).await;
        a.slow(Instant::now());
        assert_eq!(a.share(), 0.2, "never below ratio for slowness alone");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_that_keep_failing_sink_the_share_and_suspend_the_floor() {
        let a = share(0.2, 0.6);
        for _ in 0..KEEP_FAILING - 1 {
            a.retry_failed();
        }
        assert_eq!(a.share(), 0.2);
        assert!(a.floor_on(), "a few failures are not a dead dependency");
        a.retry_failed();
        assert!(close(a.share(), 0.1));
        assert!(!a.floor_on());
        for _ in 0..10 * KEEP_FAILING {
            a.retry_failed();
        }
        assert!(close(a.share(), 0.02), "down to ratio / 10: {}", a.share());
        // An overload signal does not lift a share already below ratio.
        a.overloaded(Instant::now());
        assert!(close(a.share(), 0.02));
        tokio::time::advance(Duration::from_secs(2)).await;
        a.retry_succeeded(Instant::now());
        assert!(a.floor_on(), "a retry that succeeds restores the floor");
        assert!(close(a.share(), 0.22), "{}", a.share());
    }

    #[test]
    fn a_first_attempt_that_succeeds_lifts_a_sunk_share_back_to_ratio() {
        let a = share(0.2, 0.6);
        a.first_succeeded();
        assert_eq!(a.share(), 0.2, "a healthy upstream's share is not moved");
        for _ in 0..10 * KEEP_FAILING {
            a.retry_failed();
        }
        assert!(!a.floor_on());
        assert!(a.share() < 0.05, "{}", a.share());
        a.first_succeeded();
        assert!(a.floor_on(), "the dependency serves again");
        assert_eq!(a.share(), 0.2);
        for _ in 0..5 {
            a.retry_succeeded(Instant::now());
        }
        let grown = a.share();
        a.first_succeeded();
        assert_eq!(a.share(), grown, "a share above ratio is not moved");
    }

    #[test]
    fn a_success_between_failures_starts_the_count_again() {
        let a = share(0.2, 0.6);
        for _ in 0..5 {
            for _ in 0..KEEP_FAILING - 1 {
                a.retry_failed();
            }
            a.retry_succeeded(Instant::now());
        }
        assert!(a.floor_on());
        assert!(a.share() >= 0.2);
    }
}
