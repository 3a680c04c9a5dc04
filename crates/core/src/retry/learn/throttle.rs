//! Client-side adaptive throttling of first attempts (`[upstreams.NAME.throttle]`), as
//! in the SRE book's "Handling Overload".
//!
//! # Why
//!
//! A retry budget caps the retries; it does nothing about first attempts. An upstream
//! that rejects most of what it is sent still spends something on every rejection
//! (a connection, a parse, a log line), and at a high enough rate the rejections
//! alone keep it down. The caller knows how much of what it sends is accepted, and can
//! stop sending what would be rejected anyway.
//!
//! # The rule
//!
//! Over a sliding `window`: `requests` is every request the app sent (those rejected
//! here included), `accepts` the attempts not rejected for overload (what counts as
//! that is [`crate::retry::learn`]'s: a `429` or `503`, Retry-After, a refused connect, a
//! timeout; a `500` is an answer).
//! A first attempt is rejected locally (503, outcome `throttled`, no upstream call)
//! with probability `p = max(0, (requests - k × accepts) / (requests + 1))`. While the
//! upstream accepts at least one request in `k`, `p` stays at 0.
//!
//! Three choices make the rule work on a window of seconds rather than the book's
//! minutes:
//!
//! - a request is counted in `requests` when it has its answer (a local rejection at
//!   once), not when it starts: requests still in flight have had no chance to be
//!   accepted, and counting them would throttle a healthy upstream at every burst;
//! - `p` never exceeds [`MAX_PROBABILITY`]: the requests that still go are how the
//!   throttle learns that the upstream is back;
//! - [`BACK_AFTER`] attempts accepted in a row while the throttle rejects mean the
//!   upstream is back: the window starts afresh, so full traffic returns at once
//!   instead of a window later.
//!
//! # Cost
//!
//! Counting and deciding are atomic adds and loads; a lock is taken only when the clock
//! enters a new slot (`window / 20`), to retire the slot that falls out, as the retry
//! budget does. The random draw is made only when `p > 0`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use tokio::time::Instant;

use crate::config::ThrottleConfig;
use crate::retry::decide::slots::SlotClock;

/// Slots per window.
const SLOTS: u64 = 20;
/// The most the throttle rejects: a tenth of the requests always goes, to see the
/// upstream come back.
pub const MAX_PROBABILITY: f64 = 0.9;
/// Attempts accepted in a row that mean the upstream is back.
pub const BACK_AFTER: u32 = 5;

#[derive(Default)]
struct Slot {
    requests: AtomicU64,
    accepts: AtomicU64,
}

/// The throttle of one upstream.
pub struct Throttle {
    k: f64,
    clock: SlotClock,
    ring: Box<[Slot]>,
    /// Over the slots of the window, the current one included.
    requests: AtomicU64,
    accepts: AtomicU64,
    /// Attempts accepted since the last one rejected.
    streak: AtomicU32,
}

impl std::fmt::Debug for Throttle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle")
            .field("k", &self.k)
            .field("requests", &self.requests.load(Relaxed))
            .field("accepts", &self.accepts.load(Relaxed))
            .finish()
    }
}

/// `max(0, (requests - k × accepts) / (requests + 1))`, at most [`MAX_PROBABILITY`].
pub fn probability(requests: u64, accepts: u64, k: f64) -> f64 {
    let r = requests as f64;
    ((r - k * accepts as f64) / (r + 1.0)).clamp(0.0, MAX_PROBABILITY)
}

impl Throttle {
    pub fn new(config: &ThrottleConfig, now: Instant) -> Self {
        Throttle {
            k: config.k,
            clock: SlotClock::new(config.window, SLOTS, now),
            ring: (0..SLOTS).map(|_| Slot::default()).collect(),
            requests: AtomicU64::new(0),
            accepts: AtomicU64::new(0),
            streak: AtomicU32::new(0),
        }
    }

    /// Moves the ring forward to `now`; returns the current slot number. Each slot
    /// entered is the one that leaves the window, emptied.
    fn advance(&self, now: Instant) -> u64 {
        self.clock.advance(now, |head, slot| {
            for k in (head + 1)..=slot.min(head + SLOTS) {
                self.empty(&self.ring[(k % SLOTS) as usize]);
            }
        })
    }

    fn empty(&self, s: &Slot) {
        self.requests
            .fetch_sub(s.requests.swap(0, Relaxed), Relaxed);
        self.accepts.fetch_sub(s.accepts.swap(0, Relaxed), Relaxed);
    }

    fn slot(&self, now: Instant) -> &Slot {
        &self.ring[(self.advance(now) % SLOTS) as usize]
    }

    /// The probability that a first attempt is rejected now: the
    /// `tollgate_throttle_probability` gauge.
    pub fn probability(&self, now: Instant) -> f64 {
        self.advance(now);
        probability(
            self.requests.load(Acquire),
            self.accepts.load(Acquire),
            self.k,
        )
    }

    /// Whether a first attempt may go now; a rejection is counted as a request at once.
    pub fn admit(&self, now: Instant, rng: &mut fastrand::Rng) -> bool {
        let p = self.probability(now);
        if p > 0.0 && rng.f64() < p {
            self.answered(now);
            return false;
        }
        true
    }

    /// A request the app sent has its answer (or was rejected here).
    pub fn answered(&self, now: Instant) {
        self.slot(now).requests.fetch_add(1, Relaxed);
        self.requests.fetch_add(1, Relaxed);
    }

    /// An attempt was not rejected for overload.
    pub fn accepted(&self, now: Instant) {
        self.slot(now).accepts.fetch_add(1, Relaxed);
        self.accepts.fetch_add(1, Relaxed);
        let streak = self.streak.fetch_add(1, Relaxed) + 1;
        if streak >= BACK_AFTER && self.probability(now) > 0.0 {
            self.forget(now);
        }
    }

    /// An attempt was rejected for overload.
    pub fn rejected(&self) {
        self.streak.store(0, Relaxed);
    }

    /// The upstream is back: the window starts afresh, with the accepts that showed it
    /// (the requests they answer are still to be counted).
    fn forget(&self, now: Instant) {
        self.advance(now);
        self.clock.exclusive(|slot| {
            self.ring.iter().for_each(|s| self.empty(s));
            let seed = u64::from(self.streak.swap(0, Relaxed));
            self.ring[(slot % SLOTS) as usize]
                .accepts
                .fetch_add(seed, Relaxed);
            self.accepts.fetch_add(seed, Relaxed);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn throttle() -> Throttle {
        Throttle::new(&ThrottleConfig::default(), Instant::now())
    }

    #[test]
    fn the_formula_of_the_sre_book() {
        assert_eq!(probability(0, 0, 2.0), 0.0);
        assert_eq!(
            probability(100, 50, 2.0),
            0.0,
            "one in k accepted: no throttling"
        );
        assert_eq!(probability(100, 100, 2.0), 0.0);
        assert!((probability(100, 25, 2.0) - 50.0 / 101.0).abs() < 1e-12);
        assert_eq!(probability(100, 0, 2.0), MAX_PROBABILITY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_upstream_is_never_throttled() {
        let t = throttle();
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..10_000 {
            let now = Instant::now();
            assert!(t.admit(now, &mut rng));
            t.accepted(now);
            t.answered(now);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        assert_eq!(t.probability(Instant::now()), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_in_flight_do_not_count_against_the_upstream() {
        let t = throttle();
        let mut rng = fastrand::Rng::with_seed(1);
        // A burst of 1000 requests starts before any is answered.
        assert!((0..1000).all(|_| t.admit(Instant::now(), &mut rng)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_upstream_is_throttled_and_its_return_seen_at_once() {
        let t = throttle();
        let mut rng = fastrand::Rng::with_seed(7);
        // 100 requests a second, all failing, for 5 s: p climbs to its ceiling.
        let mut sent = 0;
        for _ in 0..500 {
            let now = Instant::now();
            if t.admit(now, &mut rng) {
                sent += 1;
                t.rejected();
                t.answered(now);
            }
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(t.probability(Instant::now()), MAX_PROBABILITY);
        assert!(sent < 300, "{sent} of 500 sent to a dead upstream");
        // It comes back: the first few accepted attempts end the throttling.
        let mut accepted = 0;
        while t.probability(Instant::now()) > 0.0 {
            let now = Instant::now();
            if t.admit(now, &mut rng) {
                t.accepted(now);
                t.answered(now);
                accepted += 1;
            }
            tokio::time::advance(Duration::from_millis(10)).await;
            assert!(accepted <= BACK_AFTER, "still throttled after {accepted}");
        }
        assert_eq!(accepted, BACK_AFTER);
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_forgets() {
        let t = throttle();
        for _ in 0..100 {
            t.answered(Instant::now());
        }
        assert_eq!(t.probability(Instant::now()), MAX_PROBABILITY);
        tokio::time::advance(Duration::from_millis(5_300)).await;
        assert_eq!(t.probability(Instant::now()), 0.0);
    }

    proptest! {
        /// p is the formula of the SRE book, within [0, MAX_PROBABILITY]; it is 0
        /// exactly when k × accepts covers the requests, and grows with the requests
        /// not accepted.
        #[test]
        fn the_formula_holds(requests in 0u64..100_000, accepts in 0u64..100_000, k in 1.0f64..10.0) {
            let p = probability(requests, accepts, k);
            prop_assert!((0.0..=MAX_PROBABILITY).contains(&p));
            let r = requests as f64;
            let raw = (r - k * accepts as f64) / (r + 1.0);
            if raw <= 0.0 {
                prop_assert_eq!(p, 0.0);
            } else {
                prop_assert!((p - raw.min(MAX_PROBABILITY)).abs() < 1e-12);
                prop_assert!(probability(requests + 1, accepts, k) >= p);
            }
            prop_assert!(probability(requests, accepts + 1, k) <= p);
        }

        /// Whatever happens, the counts the throttle decides with are those of the
        /// window: the requests and accepts of the last `window`, to a slot.
        #[test]
        fn the_counts_are_those_of_the_window(
            events in prop::collection::vec((0u64..400, any::<bool>()), 1..400),
        ) {
            let t0 = Instant::now();
            let t = Throttle::new(&ThrottleConfig { k: 2.0, window: Duration::from_secs(5) }, t0);
            let mut at = Duration::ZERO;
            let mut log: Vec<(Duration, bool)> = Vec::new();
            for (gap, accept) in events {
                at += Duration::from_millis(gap);
                if accept {
                    t.slot(t0 + at).accepts.fetch_add(1, Relaxed);
                    t.accepts.fetch_add(1, Relaxed);
                } else {
                    t.answered(t0 + at);
                }
                log.push((at, accept));
                // Counted: everything since the start of the slot `window` ago.
                let slot = Duration::from_millis(250);
                let from = (at.as_millis() / 250).saturating_sub(19) as u32 * slot;
                let (r, a) = log.iter().filter(|(t, _)| *t >= from).fold((0, 0), |(r, a), (_, acc)| {
                    if *acc { (r, a + 1) } else { (r + 1, a) }
                });
                prop_assert_eq!(t.requests.load(Relaxed), r);
                prop_assert_eq!(t.accepts.load(Relaxed), a);
            }
        }
    }
}
