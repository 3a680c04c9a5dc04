//! The retry budget: over a sliding window, retries may add at most `ratio` of the
//! requests received, plus `min_per_sec` a second so that a quiet upstream can still
//! retry its rare failure.
//!
//! # Why a budget and not only `max_attempts`
//!
//! A per-request cap of three attempts means the load offered to an upstream is between
//! one and three times the traffic, and which one is decided by the upstream's health:
//! the sicker it is, the harder it is hit. A budget makes the offered load independent of
//! that health. Below a failure rate of `ratio` every failure gets its retry; above it,
//! the retries the budget cannot afford return their failure at once. That is the right
//! trade: at a high failure rate a retry is a coin toss that costs the upstream another
//! request, and that load is part of why it fails.
//!
//! # The rule and the guarantee
//!
//! Before every retry: grant it only if, counting it, the retries sent in the window stay
//! below `ratio * requests_received + min_per_sec * window_seconds` (strictly: a bound of
//! exactly 10 grants 9). Time is cut into `SLOTS` slots per window. Retries are counted
//! over one slot *more* than the window and requests over the slots that lie wholly
//! inside it, so the decision is never more
//! generous than the exact sliding window: whenever a retry is granted at instant `t`,
//! the retries granted in `(t - window, t]` stay below the bound computed from the
//! requests received in that same interval (a property test checks this).
//!
//! # Pacing
//!
//! The rule alone lets a whole window's allowance go in one instant: when a dependency
//! fails hard, every retry the window affords is granted at once, and when those grants
//! leave the window together the next batch goes at once again, in waves one window
//! apart. So a slot (`window / SLOTS`) may grant at most twice its even share of the
//! allowance: the same retries in total, spread over at least half a window.
//!
//! # An adaptive share
//!
//! With `max_ratio`, `ratio` in the rule is replaced by a share that moves between
//! `ratio / 10` and `max_ratio` as the upstream shows how well retries go, and the floor
//! may be suspended while they keep failing ([`crate::retry::learn::adaptive`]). The share never
//! leaves that range, so the rule with `max_ratio` in place of `ratio` is never
//! exceeded.
//!
//! # Cost on the request path
//!
//! Recording a request is two relaxed atomic adds; granting a retry is a compare-and-swap
//! loop on one counter. A lock is taken only when the clock enters a new slot (at most
//! `SLOTS` times a window), to retire the slot that falls out. Time comes from the caller
//! (`tokio::time::Instant`), so tests and the simulator can drive it.

use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::BudgetConfig;
use crate::retry::decide::slots::SlotClock;
use crate::retry::learn::adaptive::AdaptiveShare;

/// Slots per window: the window's resolution is `window / SLOTS`.
const SLOTS: u64 = 20;
/// The ring holds one slot more than the window, for the retry count's extra slot.
const RING: u64 = SLOTS + 1;

/// A slot may grant at most this many times its even share (`bound / SLOTS`).
const PACE: f64 = 2.0;

/// The window an upstream without a budget still keeps, for the amplification gauge.
const UNBUDGETED_WINDOW: Duration = Duration::from_secs(10);

/// While an adaptive share's floor is suspended, it still allows this many retries a
/// window (never more than `min_per_sec` would), so one can succeed and end it.
const PROBES: f64 = 1.0;

#[derive(Default)]
struct Slot {
    requests: AtomicU64,
    retries: AtomicU64,
    attempts: AtomicU64,
}

pub struct RetryBudget {
    limit: Option<BudgetConfig>,
    window: Duration,
    clock: SlotClock,
    ring: Box<[Slot]>,
    /// Requests in slots `head - SLOTS + 1 ..= head`.
    requests: AtomicU64,
    /// Attempts over the same slots as `requests`.
    attempts: AtomicU64,
    /// Retries in slots `head - SLOTS ..= head`.
    retries: AtomicU64,
    /// The share that replaces `ratio` when the budget has a `max_ratio`.
    adaptive: Option<AdaptiveShare>,
    rule: Rule,
}

/// How the retries sent (the one asked for among them) stand against the window's bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// SPEC's retry budget: `retries_sent < bound` (a bound of exactly 10 grants 9).
    Below,
    /// A hedge's `max_extra`: hedges "may add at most this share", `hedges <= bound`.
    AtMost,
}

/// How far from a whole number a bound may be and still count as that number: `0.1 *
/// 30` is `3.0000000000000004` in binary fractions, and a rule strictly below 3 grants 2
/// however the product rounds.
const WHOLE: f64 = 1e-9;

impl Rule {
    /// The most retries it grants in all under `bound`.
    fn most(self, bound: f64) -> f64 {
        match self {
            Rule::Below => (bound - WHOLE).ceil() - 1.0,
            Rule::AtMost => (bound + WHOLE).floor(),
        }
    }

    fn grants(self, sent: u64, bound: f64) -> bool {
        sent as f64 <= self.most(bound)
    }

    /// How many more it grants after `sent`.
    fn left(self, bound: f64, sent: u64) -> f64 {
        (self.most(bound) - sent as f64).max(0.0)
    }
}

impl std::fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryBudget")
            .field("limit", &self.limit)
            .field("requests", &self.requests.load(Relaxed))
            .field("retries", &self.retries.load(Relaxed))
            .finish()
    }
}

/// What the window holds right now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowStats {
    pub requests: u64,
    pub attempts: u64,
    pub retries: u64,
}

impl RetryBudget {
    /// `None`: retries are not limited, but the window is still kept for the gauges.
    pub fn new(limit: Option<&BudgetConfig>, now: Instant) -> Self {
        Self::with_rule(limit, now, Rule::Below)
    }

    /// A budget that may reach its bound: a hedge's `max_extra` (at most that share).
    pub fn at_most(limit: &BudgetConfig, now: Instant) -> Self {
        Self::with_rule(Some(limit), now, Rule::AtMost)
    }

    fn with_rule(limit: Option<&BudgetConfig>, now: Instant, rule: Rule) -> Self {
        let window = limit.map_or(UNBUDGETED_WINDOW, |b| b.window);
        RetryBudget {
            limit: limit.cloned(),
            window,
            clock: SlotClock::new(window, SLOTS, now),
            ring: (0..RING).map(|_| Slot::default()).collect(),
            requests: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            adaptive: limit.and_then(|l| AdaptiveShare::new(l, now)),
            rule,
        }
    }

    /// The adaptive share, when the budget has a `max_ratio` above its `ratio`.
    pub fn adaptive(&self) -> Option<&AdaptiveShare> {
        self.adaptive.as_ref()
    }

    /// The share of requests retries may add now: `ratio`, the adaptive share, or
    /// `f64::INFINITY` without a budget. The `tollgate_retry_budget_ratio` gauge.
    pub fn share(&self) -> f64 {
        match (&self.limit, &self.adaptive) {
            (None, _) => f64::INFINITY,
            (Some(_), Some(a)) => a.share(),
            (Some(l), None) => l.ratio,
        }
    }

    pub fn limit(&self) -> Option<&BudgetConfig> {
        self.limit.as_ref()
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// Moves the ring forward to `now`; returns the current slot number.
    fn advance(&self, now: Instant) -> u64 {
        self.clock
            .advance(now, |head, slot| self.retire(head, slot))
    }

    /// Empties what the slots `head + 1 ..= slot` push out of the windows.
    fn retire(&self, head: u64, slot: u64) {
        if slot - head >= RING {
            for s in self.ring.iter() {
                s.requests.store(0, Relaxed);
                s.attempts.store(0, Relaxed);
                s.retries.store(0, Relaxed);
            }
            self.requests.store(0, Relaxed);
            self.attempts.store(0, Relaxed);
            self.retries.store(0, Relaxed);
            return;
        }
        for k in head + 1..=slot {
            // Period k - SLOTS leaves the request window; its slot is kept for the
            // retry window one slot longer.
            if let Some(p) = k.checked_sub(SLOTS) {
                let s = &self.ring[(p % RING) as usize];
                self.requests
                    .fetch_sub(s.requests.swap(0, Relaxed), Relaxed);
                self.attempts
                    .fetch_sub(s.attempts.swap(0, Relaxed), Relaxed);
            }
            // Period k - RING leaves the retry window; its slot becomes period k.
            let s = &self.ring[(k % RING) as usize];
            self.retries.fetch_sub(s.retries.swap(0, Relaxed), Relaxed);
            s.requests.store(0, Relaxed);
            s.attempts.store(0, Relaxed);
        }
    }

    /// A request arrived that will be sent upstream.
    pub fn record_request(&self, now: Instant) {
        let slot = self.advance(now);
        self.ring[(slot % RING) as usize]
            .requests
            .fetch_add(1, Relaxed);
        self.requests.fetch_add(1, Relaxed);
    }

    /// A request's first attempt was sent upstream: the request and the attempt, with
    /// one look at the clock's slot.
    pub fn record_first_attempt(&self, now: Instant) {
        let slot = &self.ring[(self.advance(now) % RING) as usize];
        slot.requests.fetch_add(1, Relaxed);
        slot.attempts.fetch_add(1, Relaxed);
        self.requests.fetch_add(1, Relaxed);
        self.attempts.fetch_add(1, Relaxed);
    }

    /// An attempt (first try or retry) was sent upstream.
    pub fn record_attempt(&self, now: Instant) {
        let slot = self.advance(now);
        self.ring[(slot % RING) as usize]
            .attempts
            .fetch_add(1, Relaxed);
        self.attempts.fetch_add(1, Relaxed);
    }

    fn bound(&self, limit: &BudgetConfig, requests: u64) -> f64 {
        let floor = limit.min_per_sec * self.window.as_secs_f64();
        match &self.adaptive {
            None => limit.ratio * requests as f64 + floor,
            Some(a) if a.floor_on() => a.share() * requests as f64 + floor,
            Some(a) => a.share() * requests as f64 + floor.min(PROBES),
        }
    }

    /// The most retries the current slot may still grant, by the pacing rule: no slot
    /// takes more than [`PACE`] times its even share of the window's allowance.
    fn slot_allowance(&self, slot: u64, bound: f64) -> u64 {
        let per_slot = (PACE * bound / SLOTS as f64).ceil().max(1.0) as u64;
        let this_slot = self.ring[(slot % RING) as usize].retries.load(Acquire);
        per_slot.saturating_sub(this_slot)
    }

    /// Asks for one retry; a granted retry is counted at once.
    pub fn try_retry(&self, now: Instant) -> bool {
        let slot = self.advance(now);
        if let Some(limit) = &self.limit {
            // Pacing: a budget that refills is spent as a trickle, not a wave.
            let bound = self.bound(limit, self.requests.load(Acquire));
            if self.slot_allowance(slot, bound) == 0 {
                return false;
            }
            let granted = self.retries.fetch_update(AcqRel, Acquire, |sent| {
                let bound = self.bound(limit, self.requests.load(Acquire));
                self.rule.grants(sent + 1, bound).then_some(sent + 1)
            });
            if granted.is_err() {
                return false;
            }
        } else {
            self.retries.fetch_add(1, Relaxed);
        }
        self.ring[(slot % RING) as usize]
            .retries
            .fetch_add(1, Relaxed);
        true
    }

    /// How many retries the budget would grant if asked now, one after another: what is
    /// left of the window's allowance, and no more than the current slot's pacing lets
    /// through (`f64::INFINITY` without a budget). This is the
    /// `tollgate_retry_budget_available` gauge.
    pub fn available(&self, now: Instant) -> f64 {
        let slot = self.advance(now);
        match &self.limit {
            None => f64::INFINITY,
            Some(limit) => {
                let bound = self.bound(limit, self.requests.load(Acquire));
                let left = self.rule.left(bound, self.retries.load(Acquire));
                left.min(self.slot_allowance(slot, bound) as f64)
            }
        }
    }

    /// What is left of the window's allowance, pacing aside (`f64::INFINITY` without a
    /// budget).
    pub fn window_left(&self, now: Instant) -> f64 {
        self.advance(now);
        match &self.limit {
            None => f64::INFINITY,
            Some(limit) => {
                let bound = self.bound(limit, self.requests.load(Acquire));
                self.rule.left(bound, self.retries.load(Acquire))
            }
        }
    }

    pub fn stats(&self, now: Instant) -> WindowStats {
        self.advance(now);
        WindowStats {
            requests: self.requests.load(Acquire),
            attempts: self.attempts.load(Acquire),
            retries: self.retries.load(Acquire),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn budget(ratio: f64, min_per_sec: f64, window_s: u64) -> (RetryBudget, Instant) {
        let now = Instant::now();
        let cfg = BudgetConfig {
            ratio,
            min_per_sec,
            window: Duration::from_secs(window_s),
            max_ratio: None,
        };
        (RetryBudget::new(Some(&cfg), now), now)
    }

    /// Asks for `n` retries at each of the instants `from, from + step, ...` until
    /// `until`; returns how many were granted.
    fn ask(b: &RetryBudget, from: Instant, until: Instant, step: Duration, n: usize) -> usize {
        let mut granted = 0;
        let mut t = from;
        while t < until {
            granted += (0..n).filter(|_| b.try_retry(t)).count();
            t += step;
        }
        granted
    }

    #[test]
    fn ten_percent_of_requests_may_be_retried() {
        let (b, t0) = budget(0.1, 0.0, 10);
        for _ in 0..100 {
            b.record_request(t0);
        }
        // 0.1 * 100 = 10, and the rule is strict: nine retries stay below it, a
        // tenth would reach it.
        let t9 = t0 + Duration::from_secs(9);
        assert_eq!(ask(&b, t0, t9, Duration::from_millis(100), 5), 9);
        assert_eq!(b.available(t9), 0.0);
    }

    #[test]
    fn a_bound_binary_fractions_put_past_a_whole_number_counts_as_that_number() {
        // 0.1 * 30 is 3.0000000000000004 in f64: strictly below 3 is 2 retries, and a
        // hedge's "at most" 3 is 3.
        let (b, t0) = budget(0.1, 0.0, 10);
        let limit = BudgetConfig {
            ratio: 0.1,
            min_per_sec: 0.0,
            window: Duration::from_secs(10),
            max_ratio: None,
        };
        let hedges = RetryBudget::at_most(&limit, t0);
        for _ in 0..30 {
            b.record_request(t0);
            hedges.record_request(t0);
        }
        assert_eq!(b.available(t0), 1.0, "a slot's pacing: one now");
        assert_eq!(b.window_left(t0), 2.0);
        assert_eq!(hedges.window_left(t0), 3.0);
        let t9 = t0 + Duration::from_secs(9);
        assert_eq!(ask(&b, t0, t9, Duration::from_millis(100), 5), 2);
        assert_eq!(ask(&hedges, t0, t9, Duration::from_millis(100), 5), 3);
    }

    #[test]
    fn the_floor_lets_a_quiet_upstream_retry() {
        let (b, t0) = budget(0.1, 1.0, 10);
        b.record_request(t0);
        // 0.1 * 1 + 1/s * 10 s = 10.1: ten retries stay below it, the eleventh would not.
        let t9 = t0 + Duration::from_secs(9);
        assert_eq!(ask(&b, t0, t9, Duration::from_millis(100), 5), 10);
    }

    #[test]
    fn the_gauge_says_what_the_next_retries_would_get() {
        // ratio 0.1, floor 1/s over 10 s, 40 requests: the bound is
        // 0.1 * 40 + 1 * 10 = 14 (13 below it), a slot (0.5 s) at most ceil(2 * 14 / 20) = 2.
        let (b, t0) = budget(0.1, 1.0, 10);
        for _ in 0..40 {
            b.record_request(t0);
        }
        let mut t = t0;
        for _ in 0..30 {
            let said = b.available(t);
            let got = (0..100).filter(|_| b.try_retry(t)).count();
            assert_eq!(said, got as f64, "at {:?}", t - t0);
            t += Duration::from_millis(250);
        }
    }

    #[test]
    fn a_burst_is_paced_over_the_window() {
        let (b, t0) = budget(0.0, 10.0, 10);
        // 99 retries allowed in the window (strictly below 100), but at most
        // 2 x 100 / 20 = 10 per slot.
        assert_eq!((0..100).filter(|_| b.try_retry(t0)).count(), 10);
        let later = t0 + Duration::from_millis(500);
        assert_eq!((0..100).filter(|_| b.try_retry(later)).count(), 10);
        let t9 = t0 + Duration::from_secs(9);
        assert_eq!(
            ask(&b, t0, t9, Duration::from_millis(100), 100),
            79,
            "the rest of the window's 99"
        );
    }

    #[test]
    fn spent_retries_come_back_when_they_leave_the_window() {
        let (b, t0) = budget(0.0, 1.0, 10);
        assert_eq!(
            ask(
                &b,
                t0,
                t0 + Duration::from_secs(5),
                Duration::from_millis(500),
                5
            ),
            9
        );
        assert!(!b.try_retry(t0 + Duration::from_secs(9)));
        // Retries are counted one slot (0.5 s) beyond the window, to stay conservative:
        // the first grants (at 0 s) leave it only after 10.5 s.
        assert!(!b.try_retry(t0 + Duration::from_millis(10_400)));
        assert!(b.try_retry(t0 + Duration::from_millis(10_600)));
    }

    #[test]
    fn requests_leave_the_window_and_take_their_allowance_with_them() {
        let (b, t0) = budget(0.5, 0.0, 10);
        for _ in 0..10 {
            b.record_request(t0);
        }
        assert_eq!(b.window_left(t0), 4.0, "strictly below 0.5 * 10");
        assert_eq!(b.window_left(t0 + Duration::from_secs(11)), 0.0);
        assert_eq!(b.stats(t0 + Duration::from_secs(11)).requests, 0);
    }

    #[test]
    fn the_window_counts_attempts_and_requests() {
        let (b, t0) = budget(0.1, 10.0, 10);
        for _ in 0..4 {
            b.record_request(t0);
            b.record_attempt(t0);
        }
        b.record_attempt(t0);
        b.record_attempt(t0);
        let w = b.stats(t0);
        assert_eq!(crate::metrics::amplification(w.attempts, w.requests), 1.5);
    }

    #[test]
    fn without_a_budget_every_retry_is_granted_and_counted() {
        let t0 = Instant::now();
        let b = RetryBudget::new(None, t0);
        assert!((0..1000).all(|_| b.try_retry(t0)));
        assert_eq!(b.stats(t0).retries, 1000);
        assert!(b.available(t0).is_infinite());
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_slides_on_the_runtime_clock() {
        let cfg = BudgetConfig {
            ratio: 0.5,
            min_per_sec: 0.0,
            window: Duration::from_secs(10),
            max_ratio: None,
        };
        let b = RetryBudget::new(Some(&cfg), Instant::now());
        for _ in 0..20 {
            b.record_request(Instant::now());
        }
        assert_eq!(
            b.window_left(Instant::now()),
            9.0,
            "strictly below 0.5 * 20"
        );
        assert!(b.try_retry(Instant::now()));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            b.window_left(Instant::now()),
            8.0,
            "still inside the window"
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(
            b.window_left(Instant::now()),
            0.0,
            "the requests have left the window"
        );
        assert_eq!(b.stats(Instant::now()).requests, 0);
    }

    #[derive(Clone, Debug)]
    enum Event {
        Request,
        Retry,
        /// What an adaptive share learns from (a fixed budget ignores these).
        RetrySucceeded,
        RetryFailed,
        Overloaded,
        Slow,
    }

    fn events(adaptive: bool) -> impl Strategy<Value = Vec<(u64, Event)>> {
        let learn = if adaptive { 1 } else { 0 };
        prop::collection::vec(
            (
                0u64..2_000,
                prop_oneof![
                    3 => Just(Event::Request),
                    2 => Just(Event::Retry),
                    2 * learn => Just(Event::RetrySucceeded),
                    2 * learn => Just(Event::RetryFailed),
                    learn => Just(Event::Overloaded),
                    learn => Just(Event::Slow),
                ],
            ),
            1..600,
        )
    }

    /// Drives `b` with `events`; whenever a retry is granted at t, checks that the
    /// retries granted in (t - window, t] stay below
    /// `ratio * (requests in that interval) + min_per_sec * window`.
    fn never_above_the_rule(
        b: &RetryBudget,
        t0: Instant,
        events: Vec<(u64, Event)>,
        ratio: f64,
        min_per_sec: f64,
        window: Duration,
    ) -> Result<(), TestCaseError> {
        let window_ms = window.as_millis() as u64;
        let mut at = Duration::ZERO;
        let mut requests: Vec<Duration> = Vec::new();
        let mut grants: Vec<Duration> = Vec::new();
        for (gap_ms, event) in events {
            at += Duration::from_millis(gap_ms % (window_ms * 2));
            let now = t0 + at;
            let adaptive = b.adaptive();
            match event {
                Event::Request => {
                    b.record_request(now);
                    requests.push(at);
                }
                Event::Retry => {
                    if b.try_retry(now) {
                        grants.push(at);
                        let from = at.saturating_sub(window);
                        let inside = |t: &&Duration| **t > from || (at < window && **t >= from);
                        let r = requests.iter().filter(inside).count() as f64;
                        let g = grants.iter().filter(inside).count() as f64;
                        let bound = ratio * r + min_per_sec * window.as_secs_f64();
                        prop_assert!(
                            g < bound,
                            "{g} retries granted in a window whose bound is {bound}"
                        );
                    }
                }
                Event::RetrySucceeded => adaptive.iter().for_each(|a| a.retry_succeeded(now)),
                Event::RetryFailed => adaptive.iter().for_each(|a| a.retry_failed()),
                Event::Overloaded => adaptive.iter().for_each(|a| a.overloaded(now)),
                Event::Slow => adaptive.iter().for_each(|a| a.slow(now)),
            }
            prop_assert!(
                b.share() <= ratio + 1e-12,
                "share {} above {ratio}",
                b.share()
            );
        }
        Ok(())
    }

    proptest! {
        /// For any sequence of requests and retry attempts at any instants, whenever a
        /// retry is granted at t, the retries granted in (t - window, t] stay below
        /// ratio * (requests in that interval) + min_per_sec * window.
        #[test]
        fn granted_retries_never_exceed_the_bound(
            ratio in 0.0f64..1.0,
            min_per_sec in 0u32..5,
            window_ms in 100u64..5_000,
            events in events(false),
        ) {
            let t0 = Instant::now();
            let window = Duration::from_millis(window_ms);
            let min_per_sec = f64::from(min_per_sec);
            let cfg = BudgetConfig { ratio, min_per_sec, window, max_ratio: None };
            let b = RetryBudget::new(Some(&cfg), t0);
            never_above_the_rule(&b, t0, events, ratio, min_per_sec, window)?;
        }

        /// The same with an adaptive share, whatever it learns in whatever order: never
        /// above the fixed rule with max_ratio in place of ratio.
        #[test]
        fn an_adaptive_share_never_exceeds_the_rule_with_max_ratio(
            ratio in 0.0f64..0.5,
            above in 0.01f64..1.0,
            min_per_sec in 0u32..5,
            window_ms in 100u64..5_000,
            events in events(true),
        ) {
            let t0 = Instant::now();
            let window = Duration::from_millis(window_ms);
            let min_per_sec = f64::from(min_per_sec);
            let max_ratio = ratio + above;
            let cfg = BudgetConfig { ratio, min_per_sec, window, max_ratio: Some(max_ratio) };
            let b = RetryBudget::new(Some(&cfg), t0);
            prop_assert!(b.adaptive().is_some());
            never_above_the_rule(&b, t0, events, max_ratio, min_per_sec, window)?;
        }
    }
}
