//! How many requests the app is given at once: a fixed `max_inflight`, or the adaptive
//! limit of [`super::gradient`]. Either way a request over the limit is refused at once
//! (`503 overloaded` with `Retry-After`), never queued: a queue in front of the app
//! is latency the caller pays without the app going any faster.
//!
//! Admission is an atomic add on the in-flight count against the limit, and a release
//! the matching subtraction; the in-flight count outlives a reload, so requests
//! admitted before it are still counted after it. The adaptive limit takes the app's
//! latency of each response into a lock-free histogram ([`super::samples`]), and
//! whichever response closes a sampling window runs the control law once for all.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::Histogram;
use tokio::time::Instant;

use super::gradient::{Control, Seen};
use super::samples::Samples;
use crate::config::InflightLimit;
use crate::server::Admission;

/// The concurrency limit in front of the app.
pub struct Limit {
    inflight: Arc<AtomicUsize>,
    limit: AtomicUsize,
    adaptive: Option<Adaptive>,
    /// `tollgate_inbound_request_duration_seconds`, observed as a request is released.
    duration: Histogram,
}

impl std::fmt::Debug for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limit")
            .field("inflight", &self.inflight())
            .field("limit", &self.current())
            .finish()
    }
}

/// The adaptive limit's measurements.
struct Adaptive {
    origin: Instant,
    samples: Samples,
    /// The most requests in flight since the window began.
    peak: AtomicUsize,
    /// A request was refused at the limit since the window began.
    refused: AtomicBool,
    /// Nanoseconds from `origin` at which the window closes.
    window_end: AtomicU64,
    /// Odd while a probe runs; a request admitted in an earlier epoch is not one the
    /// probe measures.
    epoch: AtomicU32,
    control: Mutex<Control>,
}

/// A request admitted: which epoch it was admitted in.
#[derive(Clone, Copy, Debug)]
pub struct Admitted(u32);

impl Limit {
    /// The limit `config` asks for; `previous` (the one it replaces on reload) hands over
    /// its in-flight count, and an adaptive limit its state when it stays adaptive.
    pub fn build(
        config: InflightLimit,
        previous: Option<&Arc<Limit>>,
        duration: Histogram,
        now: Instant,
    ) -> Arc<Self> {
        if let (InflightLimit::Adaptive, Some(p)) = (config, previous)
            && p.adaptive.is_some()
        {
            return p.clone();
        }
        let inflight = previous.map_or_else(Arc::default, |p| p.inflight.clone());
        let (limit, adaptive) = match config {
            InflightLimit::Fixed(n) => (n, None),
            InflightLimit::Adaptive => {
                let control = Control::new(now, fastrand::Rng::new());
                let origin = now;
                (
                    control.limit(),
                    Some(Adaptive {
                        origin,
                        samples: Samples::default(),
                        peak: AtomicUsize::new(0),
                        refused: AtomicBool::new(false),
                        window_end: AtomicU64::new(nanos(control.window())),
                        epoch: AtomicU32::new(1),
                        control: Mutex::new(control),
                    }),
                )
            }
        };
        Arc::new(Limit {
            inflight,
            limit: AtomicUsize::new(limit),
            adaptive,
            duration,
        })
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Acquire)
    }

    /// The limit in force now.
    pub fn current(&self) -> usize {
        self.limit.load(Acquire)
    }

    /// Admits a request if the limit has room.
    pub fn try_enter(&self) -> Option<Admitted> {
        let before = self.inflight.fetch_add(1, AcqRel);
        if before >= self.limit.load(Acquire) {
            self.inflight.fetch_sub(1, AcqRel);
            if let Some(a) = &self.adaptive
                && !a.refused.load(Relaxed)
            {
                a.refused.store(true, Relaxed);
            }
            return None;
        }
        Some(self.entered(before + 1))
    }

    /// Admits a request whatever the limit (a kubelet probe): it is counted in flight,
    /// but never refused.
    pub fn enter(&self) -> Admitted {
        let now = self.inflight.fetch_add(1, AcqRel) + 1;
        self.entered(now)
    }

    fn entered(&self, inflight: usize) -> Admitted {
        match &self.adaptive {
            Some(a) => {
                a.peak.fetch_max(inflight, Relaxed);
                Admitted(a.epoch.load(Acquire))
            }
            None => Admitted(0),
        }
    }

    /// A request admitted and then refused for another reason: it leaves at once.
    pub fn leave(&self) {
        self.inflight.fetch_sub(1, AcqRel);
    }

    /// The app's latency for a request admitted as `admitted`: from when it was sent to
    /// its response head (or to giving up on it).
    pub fn sample(&self, admitted: Admitted, latency: Duration, now: Instant) {
        let Some(a) = &self.adaptive else {
            return;
        };
        let epoch = a.epoch.load(Acquire);
        if epoch % 2 == 1 && admitted.0 != epoch {
            // A probe measures only what it admitted itself.
            return;
        }
        a.samples.record(latency);
        let at = nanos(now.saturating_duration_since(a.origin));
        let end = a.window_end.load(Acquire);
        if at < end
            || a.window_end
                .compare_exchange(end, u64::MAX, AcqRel, Acquire)
                .is_err()
        {
            return;
        }
        // This response closes the window; the others go on recording.
        let mut control = a.control.lock().unwrap_or_else(|p| p.into_inner());
        let was_probing = control.probing();
        let seen = Seen {
            count: a.samples.count(),
            peak: a.peak.load(Acquire),
            refused: a.refused.load(Acquire),
        };
        if control.close(now, seen, || a.samples.take_quantile(0.5)) {
            a.peak.store(self.inflight(), Release);
            a.refused.store(false, Release);
        }
        if control.probing() != was_probing {
            // A probe began or ended: what was measured before belongs to the other phase.
            a.samples.clear();
            a.epoch.fetch_add(1, AcqRel);
        }
        self.limit.store(control.limit(), Release);
        a.window_end.store(at + nanos(control.window()), Release);
    }

    /// The adaptive limit's baseline latency, once measured.
    pub fn baseline(&self) -> Option<Duration> {
        let a = self.adaptive.as_ref()?;
        a.control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .baseline()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A request the app was given has its response head: it leaves the in-flight count (a
/// body that streams on holds no place); once answered, body and all, its duration is
/// observed.
impl Admission for Limit {
    fn leave(&self) {
        self.inflight.fetch_sub(1, AcqRel);
    }

    fn finished(&self, took: Duration) {
        self.duration.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::inbound::gradient::{INITIAL_LIMIT, PROBE_SAMPLES};

    fn histogram() -> Histogram {
        Histogram::with_opts(prometheus::HistogramOpts::new("t", "t")).unwrap()
    }

    #[test]
    fn a_fixed_limit_refuses_the_request_over_it_and_counts_the_rest() {
        let l = Limit::build(InflightLimit::Fixed(2), None, histogram(), Instant::now());
        assert!(l.try_enter().is_some());
        assert!(l.try_enter().is_some());
        assert!(l.try_enter().is_none(), "the third is over the limit");
        assert_eq!(l.inflight(), 2);
        l.enter();
        assert_eq!(l.inflight(), 3, "a probe is counted, never refused");
        l.leave();
        l.leave();
        assert_eq!(l.inflight(), 1);
        // A reload to a higher limit keeps the count of what is in flight.
        let l2 = Limit::build(
            InflightLimit::Fixed(3),
            Some(&l),
            histogram(),
            Instant::now(),
        );
        assert_eq!((l2.inflight(), l2.current()), (1, 3));
        let l3 = Limit::build(
            InflightLimit::Adaptive,
            Some(&l2),
            histogram(),
            Instant::now(),
        );
        assert_eq!(l3.inflight(), 1);
        let l4 = Limit::build(
            InflightLimit::Adaptive,
            Some(&l3),
            histogram(),
            Instant::now(),
        );
        assert!(
            Arc::ptr_eq(&l3, &l4),
            "staying adaptive keeps what it learned"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_adaptive_limit_learns_the_baseline_from_its_first_probe() {
        let l = Limit::build(InflightLimit::Adaptive, None, histogram(), Instant::now());
        assert_eq!(
            l.current(),
            (INITIAL_LIMIT / 2.0) as usize,
            "a probe at the start"
        );
        let mut admitted = Vec::new();
        while let Some(a) = l.try_enter() {
            admitted.push(a);
        }
        assert_eq!(admitted.len(), l.current());
        for _ in 0..2 * PROBE_SAMPLES {
            tokio::time::advance(Duration::from_millis(15)).await;
            let a = admitted.pop().unwrap_or_else(|| l.try_enter().unwrap());
            l.leave();
            l.sample(a, Duration::from_millis(15), Instant::now());
            admitted.push(l.try_enter().unwrap());
        }
        let base = l.baseline().unwrap().as_secs_f64() * 1000.0;
        assert!((14.0..=16.0).contains(&base), "{base}");
        assert!(
            l.current() >= INITIAL_LIMIT as usize,
            "the probe ended: {}",
            l.current()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_ignores_requests_admitted_before_it() {
        let l = Limit::build(InflightLimit::Adaptive, None, histogram(), Instant::now());
        let before = Admitted(0);
        for _ in 0..100 {
            tokio::time::advance(Duration::from_millis(50)).await;
            l.sample(before, Duration::from_secs(5), Instant::now());
        }
        assert!(
            l.baseline().is_none(),
            "nothing the probe admitted was measured"
        );
    }
}
