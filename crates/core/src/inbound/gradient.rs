//! The control law of the adaptive concurrency limit: how many requests the app is
//! given at once, learned from its latency. The ideas are those of TCP's slow start,
//! Netflix's concurrency-limits (gradient2) and Envoy's adaptive concurrency filter; the
//! code is tollgate's own.
//!
//! # The idea
//!
//! An app with `N` workers serves `N` requests at the latency it has unloaded; each
//! request beyond `N` waits in its queue, and the latency grows with the queue while the
//! throughput does not. An app whose latency is waiting (on a database, on another
//! service) takes any number at once at its usual latency. The limit must hold the first
//! near its workers and never stand in the way of the second, so it refuses only on
//! evidence: latency that rises with concurrency. Without that evidence it follows the
//! demand it sees.
//!
//! - **baseline**: the median latency with no queue, taken from the requests that had
//!   at most half the limit in flight from their admission to their answer (an app
//!   given that many has no queue of ours in front of them; a request admitted low in a
//!   burst that went higher does not count). Each time [`MIN_SAMPLES`] such answers
//!   have come, the baseline moves a quarter of the way to their median (the first
//!   four measurements are averaged): the noise of one window averages out, an app
//!   that got faster or slower is followed within a few windows.
//! - **gradient**: `baseline × (1 + TOLERANCE) / recent median`, clamped to `[0.5, 2]`.
//!   Below 1 there may be a queue. A recent median more than `QUEUE` (a quarter) above
//!   the baseline, well outside the noise of a window's median, is one.
//! - **slow start**: while the app shows no queue, the limit follows demand. An answer
//!   that came within `QUEUE` of the baseline proves the app served, without a queue,
//!   as many requests as were in flight when it was admitted; at every window the limit
//!   is at least twice the most it proved. And the first request of a window that finds
//!   the limit full doubles it at once instead of being refused, as long as the limit is
//!   at most twice what the app proved, or at most [`INITIAL_LIMIT`] (so that a quiet
//!   app can double at once): a doubling is taken only once answers show the previous
//!   one did no harm, so an overload that arrives at once is given at most four times
//!   what the app had shown it serves (or twice the initial limit). A step in the load
//!   meets a limit that doubles faster than the concurrency can build, and a healthy
//!   app is shed nothing. Slow
//!   start ends, as TCP's does, the first time a window in which the limit was reached
//!   shows a queue: the limit is cut at once to `limit × gradient + headroom` (at worst
//!   halved: the last doubling taken back).
//! - **the gradient law**, once the app has shown a queue: every window the limit moves a
//!   fifth of the way to `limit × gradient + headroom`, with a **headroom** of
//!   `√limit / 4` that keeps it probing upwards for capacity the app may have gained.
//!   Under overload it settles a little above the app's workers (`limit ≈ (1 +
//!   TOLERANCE) × N + √limit / 4`): throughput at capacity, with a short queue.
//!   Refusals while the app shows no queue grow it faster; a window in which nothing was
//!   refused and the latency was at its baseline starts slow start again.
//! - **a limit not in use**: when the app was given less than half of the limit and
//!   nothing was refused, the latency says nothing about the limit (an app that got
//!   slower on its own is not queueing behind it) and does not move it; it follows the
//!   demand down, towards twice the peak and never below [`INITIAL_LIMIT`], so a limit
//!   grown in a burst does not stay open for an overload that comes later.
//!
//! Every sampling window (twice the baseline, between 100 ms and 1 s, and at least
//! [`MIN_SAMPLES`] answers) the law runs once.
//!
//! # Probes, and why they are rare
//!
//! A baseline taken under load is the loaded latency, and a limit tuned to it lets the
//! queue grow a little more at every round; so the baseline comes only from requests that
//! met no queue of ours. An app shed all the time gives no such request: its in-flight
//! count is always at the limit. Then, and only then, the baseline may be stale (the app
//! got slower for good, and the limit holds it lower than its workers), and a **probe**
//! measures it: the limit is pinned to half its value until [`PROBE_SAMPLES`] requests
//! admitted under the pin have been answered, and their median becomes the baseline. A
//! probe runs only while requests are being refused with the latency above the baseline
//! and slow start over, when no baseline has been measured for 10 s (± 20%, so a fleet
//! of sidecars does not probe in step), or at once when there is none yet; and 1 s after
//! a probe that found the baseline lower than the one before (still coming down). At half
//! the limit of an overloaded app its workers stay busy, so a probe costs little; an app
//! that is not being shed, healthy or not, is never probed. This is the trade Envoy's
//! filter makes the other way (it pins the limit every interval, healthy app or not, and
//! documents the 503s it causes). The window after a probe is not judged: its answers
//! are of requests admitted while the in-flight count climbed back from the pin, too
//! early to show the queue at the restored limit.
//!
//! From a cold start nothing is known: the first window is served with at most
//! [`INITIAL_LIMIT`] requests at once, and slow start doubles only once a baseline has
//! been measured. When that window already refuses requests with no baseline measured
//! (more than 20 wanted at once, none of them at low concurrency), only an experiment
//! tells a queue from a wait, and a probe runs at once.

use std::time::Duration;

use tokio::time::Instant;

pub const MIN_LIMIT: f64 = 1.0;
pub const MAX_LIMIT: f64 = 10_000.0;
pub const INITIAL_LIMIT: f64 = 20.0;
/// Latency above the baseline tolerated before the gradient law shrinks the limit.
const TOLERANCE: f64 = 0.05;
/// Latency this much above the baseline, with the limit reached, is a queue.
const QUEUE: f64 = 0.25;
/// The share of the way to the new limit the gradient law takes each window.
const SMOOTHING: f64 = 0.2;
/// The share of the way to a new measurement the baseline takes.
const BASELINE_WEIGHT: f64 = 0.25;
const GRADIENT_MIN: f64 = 0.5;
const GRADIENT_MAX: f64 = 2.0;
/// Responses a window needs before it is judged, and low-concurrency responses a
/// measurement of the baseline needs.
pub const MIN_SAMPLES: u32 = 10;
/// Responses a probe measures.
pub const PROBE_SAMPLES: u32 = 20;
/// A probe that took this long ends with what it has, if it has this many; the first
/// baseline is taken from this many.
const PROBE_ENOUGH: u32 = 5;
const PROBE_EVERY: Duration = Duration::from_secs(10);
const PROBE_SOON: Duration = Duration::from_secs(1);
/// A baseline this much lower than the one before is still coming down.
const FELL: f64 = 0.1;
const WINDOW_MIN: Duration = Duration::from_millis(100);
const WINDOW_MAX: Duration = Duration::from_secs(1);
/// Growth of the gradient law while requests are being refused and the app shows no
/// queue: the limit, not the app, is what holds them back.
const REFUSED_GROWTH: f64 = 1.5;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// The limit is pinned to half of `saved` while the baseline is measured.
    Probing {
        saved: f64,
        since: Instant,
    },
    Tracking,
}

/// How the limit grows while it is tracking.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Growth {
    /// No queue seen since demand last fitted: the limit follows demand at once.
    SlowStart,
    /// The app has shown a queue at the limit: the gradient law.
    Gradient,
}

/// What a sampling window saw besides the latencies.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    /// Responses measured.
    pub count: u32,
    /// The most requests in flight at once.
    pub peak: usize,
    /// Whether any request was refused at the limit.
    pub refused: bool,
    /// Whether a request that found the limit full doubled it (slow start).
    pub grew: bool,
    /// The most requests in flight when one was admitted that was answered within
    /// `QUEUE` of the baseline: what the app has been seen to serve without a queue.
    pub proven: usize,
    /// Responses waiting to be measured of requests that had at most half the limit in
    /// flight all their life (they are kept across windows until there are enough).
    pub low: u32,
}

/// The adaptive limit's state, changed once per sampling window.
#[derive(Debug)]
pub struct Control {
    limit: f64,
    baseline: Option<Duration>,
    /// Measurements in the baseline: the first few are averaged with equal weights.
    measurements: u32,
    phase: Phase,
    growth: Growth,
    /// The last window showed no queue.
    clear: bool,
    /// The last window's `Seen::proven`.
    proven: usize,
    /// A probe just ended: the next window's answers are of requests admitted while
    /// the in-flight count was climbing back from the pin, too early to show a queue.
    settling: bool,
    /// A probe may start from this moment on, if the app is being shed.
    next_probe: Instant,
    rng: fastrand::Rng,
}

impl Control {
    pub fn new(now: Instant, rng: fastrand::Rng) -> Self {
        Control {
            limit: INITIAL_LIMIT,
            baseline: None,
            measurements: 0,
            phase: Phase::Tracking,
            growth: Growth::SlowStart,
            clear: false,
            proven: 0,
            settling: false,
            next_probe: now,
            rng,
        }
    }

    /// The limit in force: while probing, half of the limit.
    pub fn limit(&self) -> usize {
        let l = match self.phase {
            Phase::Probing { saved, .. } => (saved / 2.0).floor(),
            Phase::Tracking => self.limit.round(),
        };
        l.clamp(MIN_LIMIT, MAX_LIMIT) as usize
    }

    /// A request that had at most this many in flight (itself included) from its
    /// admission to its answer met no queue of ours: half the limit, the pinned value
    /// while probing.
    pub fn low_mark(&self) -> usize {
        let whole = match self.phase {
            Phase::Probing { saved, .. } => saved,
            Phase::Tracking => self.limit,
        };
        (whole / 2.0).floor().clamp(MIN_LIMIT, MAX_LIMIT) as usize
    }

    /// Whether a request that finds the limit full may double it instead of being
    /// refused: slow start, with a baseline measured, no queue in the last window, and
    /// a limit at most twice what the app was seen to serve without a queue, or at most
    /// the initial limit (so that a quiet app can double at once). A doubling is taken
    /// only once answers show the one before did no harm.
    pub fn may_grow(&self) -> bool {
        self.growth == Growth::SlowStart
            && self.clear
            && self.baseline.is_some()
            && self.phase == Phase::Tracking
            && self.limit <= (2.0 * self.proven as f64).max(INITIAL_LIMIT)
    }

    /// An answer that came this quickly met no queue: it counts toward `Seen::proven`.
    pub fn clear_below(&self) -> Option<Duration> {
        self.baseline.map(|b| b.mul_f64(1.0 + QUEUE))
    }

    /// A request that found the limit full raised it to `live` (slow start).
    pub fn grew_to(&mut self, live: usize) {
        if self.phase == Phase::Tracking {
            self.limit = self.limit.max(live as f64).min(MAX_LIMIT);
        }
    }

    pub fn probing(&self) -> bool {
        matches!(self.phase, Phase::Probing { .. })
    }

    pub fn baseline(&self) -> Option<Duration> {
        self.baseline
    }

    /// How long the next sampling window lasts.
    pub fn window(&self) -> Duration {
        self.baseline
            .map_or(WINDOW_MIN, |b| b * 2)
            .clamp(WINDOW_MIN, WINDOW_MAX)
    }

    /// How long a probe may take before it ends with what it has.
    fn probe_max(&self) -> Duration {
        self.baseline
            .map_or(Duration::from_secs(2), |b| b * 10)
            .max(Duration::from_secs(1))
    }

    /// A window closed having `seen` what it says; `median` reads the median latency
    /// of its responses and empties the window, `low` the median of the low-concurrency
    /// responses waiting (and empties them). Returns whether the window was used
    /// (`false`: it goes on collecting).
    pub fn close(
        &mut self,
        now: Instant,
        seen: Seen,
        median: impl FnOnce() -> Option<Duration>,
        low: impl FnOnce() -> Option<Duration>,
    ) -> bool {
        match self.phase {
            Phase::Probing { saved, since } => {
                let overdue = now.saturating_duration_since(since) >= self.probe_max();
                if seen.count < PROBE_SAMPLES && !overdue {
                    return false;
                }
                let measured = median().filter(|_| seen.count >= PROBE_ENOUGH);
                let soon = match (measured, self.baseline) {
                    (Some(new), Some(old)) => new.as_secs_f64() < old.as_secs_f64() * (1.0 - FELL),
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                if let Some(b) = measured {
                    self.baseline = Some(b);
                    self.measurements = 1;
                }
                self.limit = saved;
                self.phase = Phase::Tracking;
                self.settling = true;
                self.clear = false;
                self.next_probe = now + if soon { PROBE_SOON } else { self.jittered() };
                true
            }
            Phase::Tracking => {
                if seen.count < MIN_SAMPLES {
                    return false;
                }
                let Some(recent) = median() else {
                    return false;
                };
                if self.settling {
                    self.settling = false;
                    return true;
                }
                let enough = if self.baseline.is_some() {
                    MIN_SAMPLES
                } else {
                    PROBE_ENOUGH
                };
                if seen.low >= enough
                    && let Some(m) = low()
                {
                    self.measured(m, now);
                }
                let shed = match self.baseline {
                    // Nothing admitted at low concurrency has been answered yet: only a
                    // probe can tell, and only an app being shed needs one.
                    None => seen.refused,
                    Some(base) => {
                        self.adjust(base, recent, seen);
                        seen.refused
                            && self.growth == Growth::Gradient
                            && !self.clear_of(base, recent, TOLERANCE)
                    }
                };
                if shed && now >= self.next_probe {
                    self.phase = Phase::Probing {
                        saved: self.limit,
                        since: now,
                    };
                }
                true
            }
        }
    }

    /// A baseline measured at low concurrency, outside a probe.
    fn measured(&mut self, m: Duration, now: Instant) {
        let first = self.baseline.is_none();
        self.measurements = self.measurements.saturating_add(1);
        let weight = (1.0 / f64::from(self.measurements)).max(BASELINE_WEIGHT);
        let b = self.baseline.unwrap_or(m).as_secs_f64();
        self.baseline = Some(Duration::from_secs_f64(b + (m.as_secs_f64() - b) * weight));
        // A first baseline taken as an overload began may have seen some queue.
        self.next_probe = now + if first { PROBE_SOON } else { self.jittered() };
    }

    /// Whether `recent` is within `margin` of the baseline.
    fn clear_of(&self, base: Duration, recent: Duration, margin: f64) -> bool {
        recent.as_secs_f64() <= base.as_secs_f64() * (1.0 + margin)
    }

    /// One step of the law.
    fn adjust(&mut self, base: Duration, recent: Duration, seen: Seen) {
        let gradient = (base.as_secs_f64() * (1.0 + TOLERANCE) / recent.as_secs_f64().max(1e-6))
            .clamp(GRADIENT_MIN, GRADIENT_MAX);
        let queue = !self.clear_of(base, recent, QUEUE);
        let reached = seen.refused || seen.grew;
        let peak = seen.peak as f64;
        let headroom = self.limit.sqrt() / 4.0;
        if !reached && peak * 2.0 < self.limit {
            // Not in use: follow demand down; the latency says nothing about the limit.
            let floor = (peak * 2.0).max(INITIAL_LIMIT);
            if self.limit > floor {
                self.limit -= (self.limit - floor) * SMOOTHING;
            }
            if gradient >= 1.0 {
                self.growth = Growth::SlowStart;
            }
        } else if self.growth == Growth::SlowStart {
            if queue && reached {
                self.growth = Growth::Gradient;
                self.limit = self.limit * gradient.min(1.0) + headroom;
            } else if !queue {
                self.limit = self.limit.max(seen.proven as f64 * 2.0);
            }
        } else {
            let mut g = gradient;
            if seen.refused && g >= 1.0 {
                g = g.max(REFUSED_GROWTH);
            }
            let target = self.limit * g + headroom;
            self.limit = self.limit * (1.0 - SMOOTHING) + target * SMOOTHING;
            if !seen.refused && gradient >= 1.0 {
                self.growth = Growth::SlowStart;
            }
        }
        self.limit = self.limit.clamp(MIN_LIMIT, MAX_LIMIT);
        self.clear = !queue;
        self.proven = seen.proven;
    }

    /// `PROBE_EVERY`, ± 20%.
    fn jittered(&mut self) -> Duration {
        PROBE_EVERY.mul_f64(0.8 + 0.4 * self.rng.f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// An app with `workers` workers and service time `service`, given `limit` requests
    /// at once all the time (offered more than it can take): its median latency.
    fn loaded(workers: usize, service: Duration, limit: usize) -> Duration {
        service.mul_f64((limit as f64 / workers as f64).max(1.0))
    }

    /// Runs the control loop against an overloaded app for `windows` windows; returns
    /// the limits it set. Every answer waits as long as the others, so the app proves
    /// it serves the limit at once only while that is within its workers.
    fn run(
        c: &mut Control,
        at: &mut Instant,
        workers: usize,
        service: Duration,
        windows: usize,
    ) -> Vec<usize> {
        let mut limits = Vec::new();
        for _ in 0..windows {
            let limit = c.limit();
            *at += c.window();
            let seen = Seen {
                count: 50,
                peak: limit,
                refused: true,
                proven: limit.min(workers),
                ..Seen::default()
            };
            c.close(*at, seen, || Some(loaded(workers, service, limit)), || None);
            limits.push(c.limit());
        }
        limits
    }

    #[test]
    fn under_overload_the_limit_settles_a_little_above_the_workers() {
        for workers in [4, 10, 40] {
            let mut at = Instant::now();
            let mut c = Control::new(at, fastrand::Rng::with_seed(1));
            let limits = run(&mut c, &mut at, workers, 20 * MS, 600);
            let settled = &limits[400..];
            let tracking: Vec<usize> = settled.iter().copied().filter(|l| *l >= workers).collect();
            let mean = tracking.iter().sum::<usize>() as f64 / tracking.len() as f64;
            let ratio = mean / workers as f64;
            assert!(
                (1.0..=1.6).contains(&ratio),
                "{workers} workers: the limit settled at {mean:.1} ({ratio:.2}x)"
            );
            let base = c.baseline().unwrap().as_secs_f64() * 1000.0;
            assert!((19.0..=21.0).contains(&base), "baseline {base} ms");
        }
    }

    #[test]
    fn the_limit_grows_while_the_latency_stays_flat_and_the_app_is_busy() {
        let mut at = Instant::now();
        let mut c = Control::new(at, fastrand::Rng::with_seed(2));
        let limits = run(&mut c, &mut at, 10_000, 10 * MS, 300);
        assert!(limits[299] > 200, "{:?}", &limits[..40]);
        // Given less than half of it, it stays where it is.
        let before = c.limit();
        for _ in 0..50 {
            at += c.window();
            let seen = Seen {
                count: 50,
                peak: before / 4,
                low: 50,
                ..Seen::default()
            };
            c.close(at, seen, || Some(10 * MS), || Some(10 * MS));
        }
        assert!(c.limit() <= before, "{} > {before}", c.limit());
    }

    #[test]
    fn refusals_while_the_app_shows_no_queue_grow_the_limit_fast() {
        let mut at = Instant::now();
        let mut c = Control::new(at, fastrand::Rng::with_seed(6));
        // 64 at once wanted of an app that takes 1000 without a queue.
        let mut windows = 0;
        while c.limit() < 64 {
            let limit = c.limit();
            at += c.window();
            let seen = Seen {
                count: 50,
                peak: limit,
                refused: true,
                proven: limit,
                ..Seen::default()
            };
            c.close(at, seen, || Some(loaded(1000, 2 * MS, limit)), || None);
            windows += 1;
            assert!(windows < 40, "still {} after {windows} windows", c.limit());
        }
    }

    #[test]
    fn a_probe_pins_half_the_limit_and_measures_the_baseline() {
        let t0 = Instant::now();
        let mut c = Control::new(t0, fastrand::Rng::with_seed(3));
        assert!(!c.probing(), "no probe at the start");
        assert_eq!(c.limit(), 20);
        // Shed, and nothing admitted at low concurrency answered: a probe.
        let shed = Seen {
            count: 30,
            peak: 20,
            refused: true,
            ..Seen::default()
        };
        assert!(c.close(t0 + 100 * MS, shed, || Some(90 * MS), || None));
        assert!(c.probing());
        assert_eq!((c.limit(), c.low_mark()), (10, 10), "half the limit");
        let seen = |count| Seen {
            count,
            peak: 10,
            ..Seen::default()
        };
        // Too few responses: it goes on collecting.
        let unread = || panic!("not read");
        assert!(!c.close(t0 + 200 * MS, seen(PROBE_SAMPLES - 1), unread, unread));
        assert!(c.close(t0 + 300 * MS, seen(PROBE_SAMPLES), || Some(30 * MS), unread));
        assert!(!c.probing());
        assert_eq!(c.baseline(), Some(30 * MS));
        assert_eq!(c.limit(), 20, "the limit before the probe is back");
        // While it is still shed with a queue, the first baseline is followed by
        // another probe soon.
        let mut at = t0 + 300 * MS;
        while !c.probing() {
            at += c.window();
            c.close(at, shed, || Some(90 * MS), || None);
            assert!(at < t0 + 2 * PROBE_SOON, "no probe after the first");
        }
    }

    #[test]
    fn a_probe_without_traffic_ends_and_keeps_the_baseline() {
        let t0 = Instant::now();
        let mut c = Control::new(t0, fastrand::Rng::with_seed(4));
        let shed = Seen {
            count: 10,
            peak: 20,
            refused: true,
            ..Seen::default()
        };
        assert!(c.close(t0 + 100 * MS, shed, || Some(MS), || None));
        assert!(c.probing());
        let one = Seen {
            count: 1,
            peak: 1,
            ..Seen::default()
        };
        assert!(!c.close(t0 + 200 * MS, one, || None, || None));
        assert!(c.close(t0 + Duration::from_secs(3), one, || Some(MS), || None));
        assert_eq!(c.baseline(), None, "one response is no measurement");
        assert!(!c.probing());
    }

    /// Windows of an app that is given `peak` at once and never refused, whose median
    /// latency is `median`, every answer admitted at low concurrency.
    fn healthy(c: &mut Control, at: &mut Instant, peak: usize, median: Duration, windows: usize) {
        for _ in 0..windows {
            *at += c.window();
            let seen = Seen {
                count: 40,
                peak,
                proven: peak,
                low: 40,
                ..Seen::default()
            };
            assert!(c.close(*at, seen, || Some(median), || Some(median)));
            assert!(!c.probing(), "a healthy app is probed");
        }
    }

    #[test]
    fn slow_start_doubles_while_there_is_no_queue_and_ends_at_the_first() {
        let mut at = Instant::now();
        let mut c = Control::new(at, fastrand::Rng::with_seed(7));
        healthy(&mut c, &mut at, 3, 100 * MS, 3);
        assert!(
            c.may_grow(),
            "a baseline and no queue: the limit may double"
        );
        // A request found the limit full and doubled it; 30 were in flight, each
        // answered as quickly as before.
        c.grew_to(40);
        at += c.window();
        let grown = Seen {
            count: 40,
            peak: 30,
            grew: true,
            proven: 30,
            low: 10,
            ..Seen::default()
        };
        c.close(at, grown, || Some(105 * MS), || Some(100 * MS));
        assert_eq!(c.limit(), 60, "twice what it proved");
        assert!(c.may_grow());
        // Doubled again, into a queue: the latency doubled with it.
        c.grew_to(120);
        at += c.window();
        let queued = Seen { peak: 120, ..grown };
        c.close(at, queued, || Some(200 * MS), || None);
        let l = c.limit();
        assert!((60..=70).contains(&l), "the last doubling taken back: {l}");
        assert!(!c.may_grow(), "slow start is over");
    }

    #[test]
    fn an_app_that_gets_slower_without_a_queue_is_not_shed() {
        let mut at = Instant::now();
        let mut c = Control::new(at, fastrand::Rng::with_seed(8));
        healthy(&mut c, &mut at, 30, 20 * MS, 20);
        let before = c.limit();
        assert!(before >= 60, "{before}");
        // Its database got three times slower; as many requests as before.
        healthy(&mut c, &mut at, 30, 60 * MS, 40);
        assert!(c.limit() >= 60, "{}", c.limit());
        let base = c.baseline().unwrap().as_secs_f64() * 1000.0;
        assert!(
            (55.0..=60.0).contains(&base),
            "the baseline followed: {base} ms"
        );
    }

    #[test]
    fn a_limit_not_in_use_follows_demand_down_to_the_initial_limit() {
        let mut at = Instant::now();
        let mut c = Control::new(at, fastrand::Rng::with_seed(9));
        healthy(&mut c, &mut at, 400, 10 * MS, 10);
        assert!(c.limit() >= 800, "{}", c.limit());
        healthy(&mut c, &mut at, 2, 10 * MS, 100);
        assert_eq!(c.limit(), INITIAL_LIMIT as usize);
    }

    #[test]
    fn when_the_app_slows_for_good_the_next_probe_follows_it() {
        let mut at = Instant::now();
        let mut c = Control::new(at, fastrand::Rng::with_seed(5));
        run(&mut c, &mut at, 10, 20 * MS, 200);
        let slow = run(&mut c, &mut at, 10, 60 * MS, 400);
        let base = c.baseline().unwrap().as_secs_f64() * 1000.0;
        assert!((57.0..=63.0).contains(&base), "baseline {base} ms");
        let tail = &slow[300..];
        let mean = tail.iter().sum::<usize>() as f64 / tail.len() as f64;
        assert!(mean >= 9.0, "the limit did not come back: {mean}");
    }
}
