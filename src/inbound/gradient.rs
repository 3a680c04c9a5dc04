//! The control law of the adaptive concurrency limit: how many requests the app is
//! given at once, learned from its latency. The ideas are those of Netflix's
//! concurrency-limits (gradient2) and Envoy's adaptive concurrency filter; the code is
//! tollgate's own.
//!
//! # The idea
//!
//! An app with `N` workers serves `N` requests at the latency it has unloaded; each
//! request beyond `N` waits in its queue, and the latency grows with the queue while the
//! throughput does not. So the latency, against the latency with no queue, says how
//! much of the concurrency is queue:
//!
//! - **baseline**: the median latency when the app has no queue. It is *sampled
//!   periodically* by a probe: for a moment the limit is pinned to half its value (a
//!   queue, if there was one, drains) and the median of the requests admitted during the
//!   probe becomes the baseline. A probe costs little: at the limit's usual value, half
//!   of it still keeps the app's workers busy, and a probe lasts about
//!   [`PROBE_SAMPLES`] requests. Pinning is what keeps the baseline honest: a minimum
//!   taken under load is the loaded latency, and a limit tuned to it lets the queue
//!   grow a little more at every round.
//! - **gradient**: `baseline × (1 + TOLERANCE) / recent median`, clamped to
//!   `[0.5, 2]`. Below 1 there is a queue, and the limit shrinks in proportion; above 1
//!   there is none.
//! - **headroom**: `√limit / 4`, added every window, so the limit keeps probing upwards
//!   for capacity the app may have gained. It is what makes the limit settle a little
//!   above the app's workers (`limit ≈ (1 + TOLERANCE) × N + √limit / 4`): throughput
//!   at capacity, with a short queue.
//!
//! Every sampling window (twice the baseline, between 100 ms and 1 s, and at least
//! [`MIN_SAMPLES`] responses) the limit moves a fifth of the way to
//! `limit × gradient + headroom`. It does not grow while the app is given less than half
//! of it: a limit that was never reached says nothing about the app's capacity.
//!
//! Probes come every 10 s (± 20%, so a fleet of sidecars does not probe in step), and
//! after 1 s when the last probe found the baseline lower than the one before (it is
//! still coming down from a start under load). The first probe is at the start: until
//! [`PROBE_SAMPLES`] requests have been answered, the app is given at most
//! [`INITIAL_LIMIT`] / 2 at once.

use std::time::Duration;

use tokio::time::Instant;

pub const MIN_LIMIT: f64 = 1.0;
pub const MAX_LIMIT: f64 = 10_000.0;
pub const INITIAL_LIMIT: f64 = 20.0;
/// Latency above the baseline tolerated before the limit shrinks.
const TOLERANCE: f64 = 0.05;
/// The share of the way to the new limit taken each window.
const SMOOTHING: f64 = 0.2;
const GRADIENT_MIN: f64 = 0.5;
const GRADIENT_MAX: f64 = 2.0;
/// Responses a window needs before it is judged.
pub const MIN_SAMPLES: u32 = 10;
/// Responses a probe measures.
pub const PROBE_SAMPLES: u32 = 20;
/// A probe that took this long ends with what it has, if it has this many.
const PROBE_ENOUGH: u32 = 5;
const PROBE_EVERY: Duration = Duration::from_secs(10);
const PROBE_SOON: Duration = Duration::from_secs(1);
/// A baseline this much lower than the one before is still coming down.
const FELL: f64 = 0.1;
const WINDOW_MIN: Duration = Duration::from_millis(100);
const WINDOW_MAX: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// The limit is pinned to half of `saved` while the baseline is measured.
    Probing {
        saved: f64,
        since: Instant,
    },
    Tracking,
}

/// Growth while requests are being refused and the app shows no queue: the limit, not
/// the app, is what holds them back (a start under load, traffic that grew).
const REFUSED_GROWTH: f64 = 1.5;

/// What a sampling window saw besides the latencies.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    /// Responses measured.
    pub count: u32,
    /// The most requests in flight at once.
    pub peak: usize,
    /// Whether any request was refused at the limit.
    pub refused: bool,
}

/// The adaptive limit's state, changed once per sampling window.
#[derive(Debug)]
pub struct Control {
    limit: f64,
    baseline: Option<Duration>,
    phase: Phase,
    next_probe: Instant,
    rng: fastrand::Rng,
}

impl Control {
    /// A limit that starts with a probe.
    pub fn new(now: Instant, rng: fastrand::Rng) -> Self {
        Control {
            limit: INITIAL_LIMIT,
            baseline: None,
            phase: Phase::Probing {
                saved: INITIAL_LIMIT,
                since: now,
            },
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
    /// of its responses and empties the window. Returns whether the window was used
    /// (`false`: it goes on collecting).
    pub fn close(
        &mut self,
        now: Instant,
        seen: Seen,
        median: impl FnOnce() -> Option<Duration>,
    ) -> bool {
        let count = seen.count;
        match self.phase {
            Phase::Probing { saved, since } => {
                let overdue = now.saturating_duration_since(since) >= self.probe_max();
                if count < PROBE_SAMPLES && !overdue {
                    return false;
                }
                let measured = median().filter(|_| count >= PROBE_ENOUGH);
                let soon = match (measured, self.baseline) {
                    (Some(new), Some(old)) => new.as_secs_f64() < old.as_secs_f64() * (1.0 - FELL),
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                if let Some(b) = measured {
                    self.baseline = Some(b);
                }
                self.limit = saved;
                self.phase = Phase::Tracking;
                self.next_probe = now + if soon { PROBE_SOON } else { self.jittered() };
                true
            }
            Phase::Tracking => {
                if count < MIN_SAMPLES {
                    return false;
                }
                let Some(recent) = median() else {
                    return false;
                };
                match self.baseline {
                    // No probe has measured it yet (there was no traffic): the first
                    // window stands in, and a probe follows soon.
                    None => {
                        self.baseline = Some(recent);
                        self.next_probe = self.next_probe.min(now + PROBE_SOON);
                    }
                    Some(base) => self.adjust(base, recent, seen),
                }
                if now >= self.next_probe {
                    self.phase = Phase::Probing {
                        saved: self.limit,
                        since: now,
                    };
                }
                true
            }
        }
    }

    /// One step of the gradient.
    fn adjust(&mut self, base: Duration, recent: Duration, seen: Seen) {
        let recent = recent.as_secs_f64().max(1e-6);
        let mut gradient =
            (base.as_secs_f64() * (1.0 + TOLERANCE) / recent).clamp(GRADIENT_MIN, GRADIENT_MAX);
        if seen.refused && gradient >= 1.0 {
            gradient = gradient.max(REFUSED_GROWTH);
        }
        let headroom = self.limit.sqrt() / 4.0;
        let mut target = self.limit * gradient + headroom;
        if (seen.peak as f64) * 2.0 < self.limit {
            // The app was given less than half the limit: no sign it can take more.
            target = target.min(self.limit);
        }
        self.limit =
            (self.limit * (1.0 - SMOOTHING) + target * SMOOTHING).clamp(MIN_LIMIT, MAX_LIMIT);
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
    /// the limits it set.
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
            };
            c.close(*at, seen, || Some(loaded(workers, service, limit)));
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
                refused: false,
            };
            c.close(at, seen, || Some(10 * MS));
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
            };
            c.close(at, seen, || Some(loaded(1000, 2 * MS, limit)));
            windows += 1;
            assert!(windows < 40, "still {} after {windows} windows", c.limit());
        }
    }

    #[test]
    fn a_probe_pins_half_the_limit_and_measures_the_baseline() {
        let t0 = Instant::now();
        let mut c = Control::new(t0, fastrand::Rng::with_seed(3));
        assert!(c.probing());
        assert_eq!(c.limit(), 10, "half the initial limit");
        let seen = |count| Seen {
            count,
            peak: 10,
            refused: false,
        };
        // Too few responses: it goes on collecting.
        assert!(!c.close(t0 + 100 * MS, seen(PROBE_SAMPLES - 1), || panic!(
            "not read"
        )));
        assert!(c.close(t0 + 200 * MS, seen(PROBE_SAMPLES), || Some(30 * MS)));
        assert!(!c.probing());
        assert_eq!(c.baseline(), Some(30 * MS));
        assert_eq!(c.limit(), 20, "the limit before the probe is back");
        // The first baseline is followed by another probe soon.
        let mut at = t0 + 200 * MS;
        while !c.probing() {
            at += c.window();
            c.close(at, seen(50), || Some(30 * MS));
            assert!(at < t0 + 2 * PROBE_SOON, "no probe after the first");
        }
    }

    #[test]
    fn a_probe_without_traffic_ends_and_keeps_the_baseline() {
        let t0 = Instant::now();
        let mut c = Control::new(t0, fastrand::Rng::with_seed(4));
        let one = Seen {
            count: 1,
            peak: 1,
            refused: false,
        };
        assert!(!c.close(t0 + MS, one, || None));
        assert!(c.close(t0 + Duration::from_secs(3), one, || Some(MS)));
        assert_eq!(c.baseline(), None, "one response is no measurement");
        assert!(!c.probing());
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
