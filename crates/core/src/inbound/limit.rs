//! How many requests the app is given at once: a fixed `max_inflight`, or the adaptive
//! limit of [`super::gradient`]. Either way a request over the limit is refused at once
//! (`503 overloaded` with `Retry-After`), never queued: a queue in front of the app
//! is latency the caller pays without the app going any faster.
//!
//! Admission is an atomic add on the in-flight count against the limit, and a release
//! the matching subtraction; the in-flight count outlives a reload, so requests
//! admitted before it are still counted after it. The adaptive limit takes the app's
//! latency of each response into lock-free histograms ([`super::samples`]): one for
//! every response, one for those that had at most half the limit in flight from their
//! admission to their answer (the baseline's: known from a count of the requests
//! admitted above that mark, read at both ends). Whichever response closes a sampling
//! window runs the control law once for all. In slow start the law arms a flag, and the
//! first request that finds the limit full takes it and doubles the limit with an
//! atomic max instead of being refused: still no lock on the way in.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::Histogram;
use tokio::time::Instant;

use super::gradient::{Control, MAX_LIMIT, Seen};
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
    /// The latencies of requests that had at most `low_mark` in flight (themselves
    /// included) from their admission to their answer.
    low: Samples,
    low_mark: AtomicUsize,
    /// Requests admitted above `low_mark` so far: one admitted while a low request was
    /// in flight makes that request's latency no longer a measure of the baseline.
    high: AtomicU64,
    /// The most requests in flight since the window began.
    peak: AtomicUsize,
    /// A request was refused at the limit since the window began.
    refused: AtomicBool,
    /// Armed by the law in slow start: the next request that finds the limit full
    /// doubles it.
    grow: AtomicBool,
    /// The limit was doubled since the window began.
    grew: AtomicBool,
    /// Nanoseconds: an answer this quick met no queue (0: no baseline yet).
    clear_below: AtomicU64,
    /// The most requests in flight at the admission of one answered that quickly since
    /// the window began.
    proven: AtomicUsize,
    /// Nanoseconds from `origin` at which the window closes.
    window_end: AtomicU64,
    /// Odd while a probe runs; a request admitted in an earlier epoch is not measured.
    epoch: AtomicU32,
    control: Mutex<Control>,
}

/// A request admitted: which epoch it was admitted in, with how many in flight
/// (itself included), whether that was at most half the limit, and how many requests
/// had been admitted above that mark.
#[derive(Clone, Copy, Debug)]
pub struct Admitted {
    epoch: u32,
    inflight: usize,
    low: bool,
    high: u64,
}

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
                        low: Samples::default(),
                        low_mark: AtomicUsize::new(control.low_mark()),
                        high: AtomicU64::new(0),
                        peak: AtomicUsize::new(0),
                        refused: AtomicBool::new(false),
                        grow: AtomicBool::new(control.may_grow()),
                        grew: AtomicBool::new(false),
                        clear_below: AtomicU64::new(0),
                        proven: AtomicUsize::new(0),
                        window_end: AtomicU64::new(nanos(control.window())),
                        epoch: AtomicU32::new(0),
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
        let limit = self.limit.load(Acquire);
        if before >= limit && !self.grow(limit.max(before + 1)) {
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

    /// Slow start: doubles the limit from `from` if the law armed it, once per window.
    fn grow(&self, from: usize) -> bool {
        let Some(a) = &self.adaptive else {
            return false;
        };
        if !a.grow.load(Relaxed) || !a.grow.swap(false, AcqRel) {
            return false;
        }
        let doubled = from.saturating_mul(2).min(MAX_LIMIT as usize);
        self.limit.fetch_max(doubled, AcqRel);
        a.grew.store(true, Release);
        true
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
                let low = inflight <= a.low_mark.load(Relaxed);
                let high = if low {
                    a.high.load(Acquire)
                } else {
                    a.high.fetch_add(1, AcqRel) + 1
                };
                Admitted {
                    epoch: a.epoch.load(Acquire),
                    inflight,
                    low,
                    high,
                }
            }
            None => Admitted {
                epoch: 0,
                inflight,
                low: false,
                high: 0,
            },
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
        if admitted.epoch != a.epoch.load(Acquire) {
            // A probe measures only what it admitted itself, and the windows after it
            // nothing it admitted.
            return;
        }
        a.samples.record(latency);
        if admitted.low && a.high.load(Acquire) == admitted.high {
            a.low.record(latency);
        }
        if nanos(latency) < a.clear_below.load(Relaxed) {
            a.proven.fetch_max(admitted.inflight, Relaxed);
        }
        let at = nanos(now.saturating_duration_since(a.origin));
        let end = a.window_end.load(Acquire);
        if at >= end
            && a.window_end
                .compare_exchange(end, u64::MAX, AcqRel, Acquire)
                .is_ok()
        {
            // This response closes the window; the others go on recording.
            self.close(a, at, now);
        }
    }

    /// Runs the control law on the window that just closed, and sets what admission
    /// reads from its outcome.
    fn close(&self, a: &Adaptive, at: u64, now: Instant) {
        let mut control = a.control.lock().unwrap_or_else(|p| p.into_inner());
        // No doubling while the law decides; it arms the next one.
        a.grow.store(false, Release);
        let grew = a.grew.load(Acquire);
        if grew {
            control.grew_to(self.limit.load(Acquire));
        }
        let was_probing = control.probing();
        let seen = Seen {
            count: a.samples.count(),
            peak: a.peak.load(Acquire),
            refused: a.refused.load(Acquire),
            grew,
            proven: a.proven.load(Acquire),
            low: a.low.count(),
        };
        let median = || a.samples.take_quantile(0.5);
        if control.close(now, seen, median, || a.low.take_quantile(0.5)) {
            a.peak.store(self.inflight(), Release);
            a.refused.store(false, Release);
            a.grew.store(false, Release);
            a.proven.store(0, Release);
        }
        if control.probing() != was_probing {
            // A probe began or ended: what was measured before belongs to the other phase.
            a.samples.clear();
            a.low.clear();
            a.epoch.fetch_add(1, AcqRel);
        }
        self.limit.store(control.limit(), Release);
        a.low_mark.store(control.low_mark(), Release);
        a.grow.store(control.may_grow(), Release);
        let clear = control.clear_below().map_or(0, nanos);
        a.clear_below.store(clear, Release);
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

    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    use super::*;
    use crate::inbound::gradient::INITIAL_LIMIT;

    const MS: Duration = Duration::from_millis(1);

    fn histogram() -> Histogram {
        Histogram::with_opts(prometheus::HistogramOpts::new("t", "t")).unwrap()
    }

    fn adaptive() -> Arc<Limit> {
        Limit::build(InflightLimit::Adaptive, None, histogram(), Instant::now())
    }

    fn probing(l: &Limit) -> bool {
        l.adaptive
            .as_ref()
            .unwrap()
            .control
            .lock()
            .unwrap()
            .probing()
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
    async fn the_adaptive_limit_learns_the_baseline_without_pinning_the_limit() {
        let l = adaptive();
        assert_eq!(l.current(), INITIAL_LIMIT as usize, "no probe at the start");
        for _ in 0..20 {
            tokio::time::advance(15 * MS).await;
            let a = l.try_enter().unwrap();
            l.sample(a, 15 * MS, Instant::now());
            l.leave();
        }
        let base = l.baseline().unwrap().as_secs_f64() * 1000.0;
        assert!((14.0..=16.0).contains(&base), "{base}");
        assert!(!probing(&l));
        assert!(l.current() >= INITIAL_LIMIT as usize, "{}", l.current());
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_ignores_requests_admitted_before_it() {
        let l = adaptive();
        // The limit full, a request refused, and only requests admitted above half the
        // limit answered: nothing says what the app does without a queue.
        let mut high = Vec::new();
        for i in 0..INITIAL_LIMIT as usize {
            let a = l.try_enter().unwrap();
            if i >= INITIAL_LIMIT as usize / 2 {
                high.push(a);
            }
        }
        assert!(l.try_enter().is_none());
        for a in high {
            tokio::time::advance(20 * MS).await;
            l.sample(a, Duration::from_secs(1), Instant::now());
        }
        assert!(probing(&l), "a shed app with no baseline is probed");
        assert_eq!(l.current(), INITIAL_LIMIT as usize / 2);
        let before = Admitted {
            epoch: 0,
            inflight: 1,
            low: true,
            high: 0,
        };
        for _ in 0..100 {
            tokio::time::advance(50 * MS).await;
            l.sample(before, Duration::from_secs(5), Instant::now());
        }
        assert!(
            l.baseline().is_none(),
            "nothing the probe admitted was measured"
        );
    }

    /// An app in the simulations below: when a request sent at `at` is answered.
    trait App {
        fn answer(&mut self, at: Instant) -> Instant;
    }

    /// Waiting, not working: any number at once, each taking 50 to 150 ms.
    struct Waiting(fastrand::Rng);

    impl App for Waiting {
        fn answer(&mut self, at: Instant) -> Instant {
            at + MS * self.0.u32(50..=150)
        }
    }

    /// `free.len()` workers in front of a FIFO queue, each request taking 20 to 30 ms.
    struct Workers {
        free: BinaryHeap<Reverse<Instant>>,
        rng: fastrand::Rng,
    }

    impl Workers {
        fn new(n: usize, at: Instant) -> Self {
            Workers {
                free: (0..n).map(|_| Reverse(at)).collect(),
                rng: fastrand::Rng::with_seed(3),
            }
        }
    }

    impl App for Workers {
        fn answer(&mut self, at: Instant) -> Instant {
            let Reverse(free) = self.free.pop().unwrap();
            let done = free.max(at) + MS * self.rng.u32(20..=30);
            self.free.push(Reverse(done));
            done
        }
    }

    /// Arrivals at `rps` a second from `from` for `run`: Poisson (bursts included).
    fn poisson(rng: &mut fastrand::Rng, from: Instant, rps: f64, run: Duration) -> Vec<Instant> {
        let mut at = from;
        let mut all = Vec::new();
        while at < from + run {
            all.push(at);
            at += Duration::from_secs_f64(-(1.0 - rng.f64()).ln() / rps);
        }
        all
    }

    #[derive(Debug, Default)]
    struct Run {
        admitted: usize,
        refused: usize,
        /// The most requests the app held at once, after `settled`.
        most: usize,
        probed: bool,
        /// The limit at each arrival after `settled`.
        limits: Vec<usize>,
    }

    /// Sends `arrivals` through the limit to `app`, on the clock the arrivals give.
    fn simulate(l: &Limit, arrivals: &[Instant], app: &mut impl App, settled: Instant) -> Run {
        let mut answers: BinaryHeap<Reverse<(Instant, Instant, usize)>> = BinaryHeap::new();
        let mut admitted = Vec::new();
        let mut run = Run::default();
        let mut next = arrivals.iter().peekable();
        loop {
            let answer = answers.peek().map(|Reverse((t, ..))| *t);
            match (next.peek(), answer) {
                (None, None) => return run,
                (arrival, Some(t)) if arrival.is_none_or(|a| t <= **a) => {
                    let Some(Reverse((t, sent, i))) = answers.pop() else {
                        unreachable!()
                    };
                    l.sample(admitted[i], t - sent, t);
                    l.leave();
                }
                (Some(at), _) => {
                    let at = **at;
                    next.next();
                    run.probed |= probing(l);
                    if at >= settled {
                        run.limits.push(l.current());
                    }
                    let Some(a) = l.try_enter() else {
                        run.refused += 1;
                        continue;
                    };
                    run.admitted += 1;
                    if at >= settled {
                        run.most = run.most.max(l.inflight());
                    }
                    admitted.push(a);
                    answers.push(Reverse((app.answer(at), at, admitted.len() - 1)));
                }
                (None, Some(_)) => unreachable!(),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_load_step_onto_a_healthy_app_is_never_shed() {
        for seed in 0..5 {
            let t0 = Instant::now();
            let l = adaptive();
            let mut rng = fastrand::Rng::with_seed(seed);
            // 5 a second, then 150 a second: about 15 at once, in bursts to 30.
            let mut arrivals = poisson(&mut rng, t0, 5.0, Duration::from_secs(5));
            arrivals.extend(poisson(
                &mut rng,
                t0 + Duration::from_secs(5),
                150.0,
                Duration::from_secs(10),
            ));
            let run = simulate(&l, &arrivals, &mut Waiting(rng), t0);
            assert_eq!(run.refused, 0, "seed {seed}: {run:?}");
            assert!(!run.probed, "seed {seed}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn steady_load_above_half_the_limit_is_never_probed_or_shed() {
        let t0 = Instant::now();
        let l = adaptive();
        let mut rng = fastrand::Rng::with_seed(9);
        // After a quiet start, about 15 at once against an initial limit of 20, for six
        // times the probe period.
        let mut arrivals = poisson(&mut rng, t0, 10.0, Duration::from_secs(2));
        let busy = t0 + Duration::from_secs(2);
        arrivals.extend(poisson(&mut rng, busy, 150.0, Duration::from_secs(60)));
        let run = simulate(&l, &arrivals, &mut Waiting(rng), t0);
        assert_eq!(run.refused, 0, "{run:?}");
        assert!(!run.probed);
        assert!(l.baseline().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn an_overloaded_app_is_given_little_more_than_its_workers() {
        let t0 = Instant::now();
        let l = adaptive();
        let mut rng = fastrand::Rng::with_seed(4);
        // 8 workers of 25 ms: 320 a second; offered three times that, for 30 s.
        let arrivals = poisson(&mut rng, t0, 960.0, Duration::from_secs(30));
        let settled = t0 + Duration::from_secs(5);
        let run = simulate(&l, &arrivals, &mut Workers::new(8, t0), settled);
        assert!(
            run.refused > run.admitted,
            "{} of {}",
            run.refused,
            run.admitted
        );
        let mean = run.limits.iter().sum::<usize>() as f64 / run.limits.len() as f64;
        assert!((8.0..=13.0).contains(&mean), "the limit averaged {mean:.1}");
        assert!(run.most <= 24, "the app was given {} at once", run.most);
        let base = l.baseline().unwrap().as_secs_f64() * 1000.0;
        assert!((22.0..=30.0).contains(&base), "baseline {base} ms");
    }

    #[tokio::test(start_paused = true)]
    async fn an_overload_onto_a_quiet_app_is_cut_back_after_one_doubling() {
        let t0 = Instant::now();
        let l = adaptive();
        let mut rng = fastrand::Rng::with_seed(1);
        // A quiet app of 8 workers (320 a second), then three times its capacity at
        // once: slow start is armed when it comes.
        let mut arrivals = poisson(&mut rng, t0, 5.0, Duration::from_secs(5));
        let step = t0 + Duration::from_secs(5);
        arrivals.extend(poisson(&mut rng, step, 960.0, Duration::from_secs(10)));
        let run = simulate(&l, &arrivals, &mut Workers::new(8, t0), step);
        // One doubling of the initial 20, none on answers that had not yet met the queue.
        assert!(run.most <= 45, "the app was given {} at once", run.most);
        let late = &run.limits[run.limits.len() / 2..];
        let mean = late.iter().sum::<usize>() as f64 / late.len() as f64;
        assert!((8.0..=13.0).contains(&mean), "the limit averaged {mean:.1}");
    }
}
