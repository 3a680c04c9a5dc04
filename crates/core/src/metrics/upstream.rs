//! The series of each upstream, which cost what is used.
//!
//! A sidecar is scraped once per pod, and a config may list hundreds of upstreams of
//! which a pod calls a few: series made for every configured upstream would be a scrape
//! of megabytes and memory to match, per pod, for counters that stay at zero. So an
//! upstream's series are made with its first request: then every fixed-word label value
//! of its counters at once, zeros included, so that `rate()` and alerts see the first
//! increase of each; its final status codes as they are seen; its histograms with their
//! buckets. A reload that removes the upstream removes its series; added again, it
//! starts afresh. An upstream never called costs no series, and in memory a handle to
//! the families and its name.
//!
//! Two types carry this. [`UpstreamSeries`], one per build of an upstream, holds the
//! handles ([`UpstreamMetrics`]) in a `OnceLock`, resolved at the first request: after
//! it, the request path pays one atomic load to reach them, and no label is looked up.
//! `Named`, shared by every build of one upstream across reloads, knows whether it was
//! used, which codes and retry reasons it made series for, and whether a reload took it
//! away: so a removal drops exactly its series, and a request still finishing on the
//! removed upstream cannot make them again (what makes series and what removes them hold
//! its lock, taken once per build and once per status code, never per request).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Registry,
};

use super::family::{counters, gauges, histograms, int_gauges};
use super::health;
use super::learning::{self, Learning};
use super::{AttemptResult, Denied, Evidence, LATENCY_BUCKETS, Outcome};

/// Every family with an `upstream` label that follows an upstream's traffic, registered
/// once per process.
pub(super) struct Families {
    registry: Registry,
    requests: IntCounterVec,
    attempts: IntCounterVec,
    retries: IntCounterVec,
    denied: IntCounterVec,
    attempts_per_request: HistogramVec,
    amplification: GaugeVec,
    budget_available: GaugeVec,
    request_duration: HistogramVec,
    attempt_duration: HistogramVec,
    inflight: IntGaugeVec,
    connections: IntGaugeVec,
    health: health::Families,
    learning: Learning,
    /// `tollgate_idempotency_keys_minted_total`, registered when an upstream that mints
    /// has its first request.
    minted: OnceLock<IntCounterVec>,
    /// `tollgate_descriptors_exhausted_total{at="connect"}`, shared by every upstream.
    exhausted: IntCounter,
}

impl Families {
    pub(super) fn new(r: &Registry, exhausted: IntCounter) -> Self {
        let up = &["upstream"];
        let latency = || LATENCY_BUCKETS.to_vec();
        Families {
            requests: counters(
                r,
                "tollgate_requests_total",
                "Requests answered, by final status and outcome.",
                &["upstream", "code", "outcome"],
            ),
            attempts: counters(
                r,
                "tollgate_attempts_total",
                "Attempts sent upstream (first tries and retries), by result.",
                &["upstream", "result"],
            ),
            retries: counters(
                r,
                "tollgate_retries_total",
                "Retries started, by the retry condition that fired.",
                &["upstream", "reason"],
            ),
            denied: counters(
                r,
                "tollgate_retries_denied_total",
                "Failures not retried, by what refused the retry.",
                &["upstream", "reason"],
            ),
            attempts_per_request: histograms(
                r,
                "tollgate_attempts_per_request",
                "Attempts each request took.",
                up,
                (1..=10).map(f64::from).collect(),
            ),
            amplification: gauges(
                r,
                "tollgate_amplification",
                "Attempts per request over the budget window.",
                up,
            ),
            budget_available: gauges(
                r,
                "tollgate_retry_budget_available",
                "Retries the budget would grant now (+Inf without a budget).",
                up,
            ),
            request_duration: histograms(
                r,
                "tollgate_request_duration_seconds",
                "From request head to the end of the response.",
                up,
                latency(),
            ),
            attempt_duration: histograms(
                r,
                "tollgate_attempt_duration_seconds",
                "From an attempt's start to its response head or failure.",
                up,
                latency(),
            ),
            inflight: int_gauges(
                r,
                "tollgate_inflight_requests",
                "Requests waiting for their response head now (what max_inflight counts).",
                up,
            ),
            connections: int_gauges(
                r,
                "tollgate_upstream_connections",
                "Open connections to the upstream's endpoints.",
                up,
            ),
            health: health::Families::new(r),
            learning: Learning::new(r),
            minted: OnceLock::new(),
            exhausted,
            registry: r.clone(),
        }
    }

    /// `tollgate_requests_total{upstream="",code,outcome="no-route"}`: requests that
    /// matched no upstream (`code="200"` for gRPC calls, answered with a gRPC status).
    pub(super) fn unrouted(&self, grpc: bool) -> IntCounter {
        let code = if grpc { "200" } else { "404" };
        self.requests
            .with_label_values(&["", code, Outcome::NoRoute.as_str()])
    }

    fn minted(&self) -> &IntCounterVec {
        self.minted.get_or_init(|| {
            counters(
                &self.registry,
                "tollgate_idempotency_keys_minted_total",
                "Idempotency keys minted for requests sent without one \
                 (mint_idempotency_key).",
                &["upstream"],
            )
        })
    }

    /// Makes (or finds) the series of `named` and returns their handles.
    fn resolve(&self, named: &Arc<Named>, retry_on: &[String], mints: bool) -> UpstreamMetrics {
        let name = &*named.name;
        let l = &[name];
        UpstreamMetrics {
            attempts: AttemptResult::ALL
                .map(|r| self.attempts.with_label_values(&[name, r.as_str()])),
            denied: Denied::ALL.map(|d| self.denied.with_label_values(&[name, d.as_str()])),
            retries: retry_on
                .iter()
                .map(|c| (c.clone(), self.retries.with_label_values(&[name, c])))
                .collect(),
            attempts_per_request: self.attempts_per_request.with_label_values(l),
            request_duration: self.request_duration.with_label_values(l),
            attempt_duration: self.attempt_duration.with_label_values(l),
            ok: OnceLock::new(),
            by_code: Default::default(),
            named: named.clone(),
            exhausted: self.exhausted.clone(),
            health: self.health.upstream(name),
            learning: self.learning.upstream(name),
            minted: mints.then(|| self.minted().with_label_values(l)),
            amplification: self.amplification.with_label_values(l),
            budget_available: self.budget_available.with_label_values(l),
            inflight: self.inflight.with_label_values(l),
            connections: self.connections.with_label_values(l),
        }
    }

    /// Removes every series of `name`: the fixed ones, and the codes and retry reasons
    /// `made` says it has.
    fn remove(&self, name: &str, made: &Made) {
        let l = &[name];
        for (code, outcome) in &made.codes {
            let code = code.to_string();
            let _ = self
                .requests
                .remove_label_values(&[name, &code, outcome.as_str()]);
        }
        for r in AttemptResult::ALL {
            let _ = self.attempts.remove_label_values(&[name, r.as_str()]);
        }
        for reason in &made.reasons {
            let _ = self.retries.remove_label_values(&[name, reason]);
        }
        for d in Denied::ALL {
            let _ = self.denied.remove_label_values(&[name, d.as_str()]);
        }
        for h in [
            &self.attempts_per_request,
            &self.request_duration,
            &self.attempt_duration,
        ] {
            let _ = h.remove_label_values(l);
        }
        for g in [&self.amplification, &self.budget_available] {
            let _ = g.remove_label_values(l);
        }
        for g in [&self.inflight, &self.connections] {
            let _ = g.remove_label_values(l);
        }
        if let Some(m) = self.minted.get() {
            let _ = m.remove_label_values(l);
        }
        self.health.remove(name);
        self.learning.remove(name);
    }
}

/// What one upstream has made series for, beyond its fixed ones.
#[derive(Default)]
struct Made {
    /// Removed by a reload: nothing more is made.
    removed: bool,
    /// The `(code, outcome)` pairs of `tollgate_requests_total`.
    codes: Vec<(u16, Outcome)>,
    /// The `reason` values of `tollgate_retries_total` (the `retry.on` words of every
    /// build that had a request).
    reasons: Vec<String>,
}

/// One upstream as every build of it shares it, from the load that added it to the
/// reload that removes it.
struct Named {
    name: Arc<str>,
    families: Arc<Families>,
    /// Its series exist (set with the first request of any build).
    used: AtomicBool,
    made: Mutex<Made>,
}

impl Named {
    fn made(&self) -> std::sync::MutexGuard<'_, Made> {
        self.made.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn resolve(self: &Arc<Self>, retry_on: &[String], mints: bool) -> UpstreamMetrics {
        let mut made = self.made();
        let handles = self.families.resolve(self, retry_on, mints);
        for r in retry_on {
            if !made.reasons.contains(r) {
                made.reasons.push(r.clone());
            }
        }
        if made.removed {
            // A request finishing on an upstream a reload removed: its handles count
            // for nobody.
            self.families.remove(&self.name, &made);
        } else {
            self.used.store(true, Ordering::Release);
        }
        handles
    }

    fn code(&self, status: u16, outcome: Outcome) -> IntCounter {
        let mut made = self.made();
        let code = status.to_string();
        let labels = [&*self.name, &code, outcome.as_str()];
        let counter = self.families.requests.with_label_values(&labels);
        if made.removed {
            let _ = self.families.requests.remove_label_values(&labels);
        } else if !made.codes.contains(&(status, outcome)) {
            made.codes.push((status, outcome));
        }
        counter
    }

    fn remove(&self) {
        let mut made = self.made();
        made.removed = true;
        self.used.store(false, Ordering::Release);
        self.families.remove(&self.name, &made);
    }
}

/// One build of an upstream's metrics: nothing until its first request, then its
/// handles, for good.
pub struct UpstreamSeries {
    named: Arc<Named>,
    retry_on: Box<[String]>,
    mints: bool,
    handles: OnceLock<Box<UpstreamMetrics>>,
}

impl std::fmt::Debug for UpstreamSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamSeries")
            .field("name", &self.named.name)
            .field("used", &self.handles.get().is_some())
            .finish()
    }
}

impl UpstreamSeries {
    pub(super) fn new(
        families: &Arc<Families>,
        name: &str,
        retry_on: &[String],
        mints: bool,
    ) -> Self {
        UpstreamSeries {
            named: Arc::new(Named {
                name: name.into(),
                families: families.clone(),
                used: AtomicBool::new(false),
                made: Mutex::new(Made::default()),
            }),
            retry_on: retry_on.into(),
            mints,
            handles: OnceLock::new(),
        }
    }

    /// The next build of the same upstream (a reload that keeps it): its series, if it
    /// has them, carry on.
    pub fn next(&self, retry_on: &[String], mints: bool) -> Self {
        UpstreamSeries {
            named: self.named.clone(),
            retry_on: retry_on.into(),
            mints,
            handles: OnceLock::new(),
        }
    }

    /// Whether this build counts with these settings (then it is kept across a reload).
    pub fn built_with(&self, retry_on: &[String], mints: bool) -> bool {
        *self.retry_on == *retry_on && self.mints == mints
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.named.name
    }

    /// The handles, for a request: the first call makes the upstream's series.
    #[inline]
    pub fn get(&self) -> &UpstreamMetrics {
        match self.handles.get() {
            Some(h) => h,
            None => self.make(),
        }
    }

    #[cold]
    fn make(&self) -> &UpstreamMetrics {
        self.handles
            .get_or_init(|| Box::new(self.named.resolve(&self.retry_on, self.mints)))
    }

    /// The handles if the upstream has its series (a request came, to this build or an
    /// earlier one): what a scrape sets the gauges of.
    pub fn used(&self) -> Option<&UpstreamMetrics> {
        match self.handles.get() {
            Some(h) => Some(h),
            None => self.named.used.load(Ordering::Acquire).then(|| self.get()),
        }
    }

    /// A reload removed the upstream: its series go, and are not made again.
    pub fn remove(&self) {
        self.named.remove();
    }
}

/// The gauges of an upstream read from live state just before a scrape.
#[derive(Clone, Copy, Debug)]
pub struct Gauges {
    /// `tollgate_amplification` (see [`super::amplification`]).
    pub amplification: f64,
    pub budget_available: f64,
    pub inflight: usize,
    pub connections: usize,
    pub ejected: usize,
    pub budget_ratio: f64,
    pub throttle_probability: f64,
}

type Codes = OnceLock<Box<[OnceLock<IntCounter>]>>;

/// One upstream's handles, resolved at its first request.
pub struct UpstreamMetrics {
    attempts: [IntCounter; AttemptResult::ALL.len()],
    denied: [IntCounter; Denied::ALL.len()],
    retries: Vec<(String, IntCounter)>,
    pub attempts_per_request: Histogram,
    pub request_duration: Histogram,
    pub attempt_duration: Histogram,
    /// `200` with outcome `ok`, nearly every request: one lookup instead of three.
    ok: OnceLock<IntCounter>,
    /// `[outcome]` → `[status / 100 - 1]` → `[status % 100]`, filled on first use of
    /// each: a class is a hundred handles, made when its first code is seen.
    by_code: [OnceLock<Box<[Codes; 5]>>; Outcome::ALL.len()],
    /// Who makes the series of a code seen for the first time.
    named: Arc<Named>,
    /// `tollgate_descriptors_exhausted_total{at="connect"}`, shared by every upstream.
    pub exhausted: IntCounter,
    /// Ejections and hedges.
    pub health: health::Handles,
    learning: learning::Handles,
    /// `tollgate_idempotency_keys_minted_total`, with `mint_idempotency_key`.
    minted: Option<IntCounter>,
    amplification: Gauge,
    budget_available: Gauge,
    inflight: IntGauge,
    connections: IntGauge,
}

impl std::fmt::Debug for UpstreamMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamMetrics").finish_non_exhaustive()
    }
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl UpstreamMetrics {
    pub fn attempt(&self, r: AttemptResult) {
        self.attempts[r as usize].inc();
    }

    pub fn denied(&self, d: Denied) {
        self.denied[d as usize].inc();
    }

    /// The app's own retry, seen on `evidence`.
    pub fn app_retry(&self, evidence: Evidence) {
        self.learning.app_retry(evidence);
    }

    /// `condition` is a `retry.on` word (`"503"`, `"reset"`, ...).
    pub fn retried(&self, condition: &str) {
        if let Some((_, c)) = self.retries.iter().find(|(name, _)| name == condition) {
            c.inc();
        }
    }

    /// The count of idempotency keys minted, with `mint_idempotency_key`.
    pub fn keys_minted(&self) -> Option<&IntCounter> {
        self.minted.as_ref()
    }

    fn request_counter(&self, status: u16, outcome: Outcome) -> &IntCounter {
        if status == 200 && outcome == Outcome::Ok {
            return self.ok.get_or_init(|| self.named.code(200, Outcome::Ok));
        }
        let status = status.clamp(100, 599);
        let class = self.by_code[outcome.index()].get_or_init(Default::default);
        let codes = class[usize::from(status / 100 - 1)]
            .get_or_init(|| (0..100).map(|_| OnceLock::new()).collect());
        codes[usize::from(status % 100)].get_or_init(|| self.named.code(status, outcome))
    }

    pub fn request(&self, status: u16, outcome: Outcome, attempts: u32) {
        self.request_counter(status, outcome).inc();
        if attempts > 0 {
            self.attempts_per_request.observe(f64::from(attempts));
        }
    }

    /// Sets the gauges from live state, just before a scrape.
    pub fn set(&self, g: Gauges) {
        self.amplification.set(g.amplification);
        self.budget_available.set(g.budget_available);
        self.inflight.set(count(g.inflight));
        self.connections.set(count(g.connections));
        self.health.ejected.set(count(g.ejected));
        self.learning.set(g.budget_ratio, g.throttle_probability);
    }
}

/// `tollgate_ejections_total{upstream}` as the endpoints count it: the upstream's own
/// (made with its series; an ejection follows requests), or one of its own in tests and
/// benches.
#[derive(Clone, Debug)]
pub struct Ejections(Arc<UpstreamSeries>);

impl Ejections {
    pub fn of(series: &Arc<UpstreamSeries>) -> Self {
        Ejections(series.clone())
    }

    /// Counted in a registry of nothing else.
    pub fn detached() -> Self {
        let families = Arc::new(Families::new(
            &Registry::new(),
            IntCounter::new("detached", "detached").unwrap_or_else(|_| unreachable!()),
        ));
        Ejections(Arc::new(UpstreamSeries::new(&families, "", &[], false)))
    }

    pub fn inc(&self) {
        self.0.get().health.ejections.inc();
    }

    pub fn get(&self) -> u64 {
        self.0.get().health.ejections.get()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    fn text(m: &Metrics) -> String {
        String::from_utf8(m.encode()).unwrap()
    }

    /// The series of `name`, as `family{labels}` lines without their values.
    fn series_of(text: &str, name: &str) -> Vec<String> {
        let label = format!("upstream=\"{name}\"");
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(&label))
            .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_string())
            .collect()
    }

    #[test]
    fn an_upstream_has_no_series_until_its_first_request_then_every_fixed_one() {
        let m = Metrics::new();
        let on = ["503".to_string(), "reset".to_string()];
        let u = m.upstream("api", &on, true);
        assert!(u.used().is_none());
        let idle = text(&m);
        assert_eq!(series_of(&idle, "api"), Vec::<String>::new());
        for family in ["tollgate_attempts_total", "tollgate_requests_total"] {
            assert!(!idle.contains(&format!("# TYPE {family} ")), "{family}");
        }
        u.get().request(200, Outcome::Ok, 1);
        assert!(u.used().is_some());
        let t = text(&m);
        let zero = |series: &str| {
            let line = format!("{series} 0\n");
            assert!(t.contains(&line), "{series} not at zero:\n{t}");
        };
        for r in AttemptResult::ALL {
            zero(&format!(
                "tollgate_attempts_total{{result=\"{}\",upstream=\"api\"}}",
                r.as_str()
            ));
        }
        for d in Denied::ALL {
            zero(&format!(
                "tollgate_retries_denied_total{{reason=\"{}\",upstream=\"api\"}}",
                d.as_str()
            ));
        }
        for reason in &on {
            zero(&format!(
                "tollgate_retries_total{{reason=\"{reason}\",upstream=\"api\"}}"
            ));
        }
        for r in ["won", "lost", "denied"] {
            zero(&format!(
                "tollgate_hedges_total{{result=\"{r}\",upstream=\"api\"}}"
            ));
        }
        for e in Evidence::ALL {
            zero(&format!(
                "tollgate_app_retries_total{{evidence=\"{}\",upstream=\"api\"}}",
                e.as_str()
            ));
        }
        zero("tollgate_ejections_total{upstream=\"api\"}");
        zero("tollgate_idempotency_keys_minted_total{upstream=\"api\"}");
        zero("tollgate_request_duration_seconds_bucket{upstream=\"api\",le=\"0.0005\"}");
        assert!(
            t.contains("tollgate_requests_total{code=\"200\",outcome=\"ok\",upstream=\"api\"} 1\n")
        );
        assert!(!t.contains("code=\"503\""), "codes appear as they are seen");
    }

    #[test]
    fn removing_an_upstream_removes_its_series_and_a_late_request_makes_none() {
        let m = Metrics::new();
        let u = m.upstream("gone", &["503".into()], false);
        let kept = m.upstream("kept", &[], false);
        u.get().request(503, Outcome::AttemptsExhausted, 2);
        u.get().retried("503");
        kept.get().request(200, Outcome::Ok, 1);
        m.discovery("gone").published(2);
        assert!(!series_of(&text(&m), "gone").is_empty());
        let next = u.next(&["503".into(), "reset".into()], false);
        m.forget_upstream(&u);
        assert_eq!(series_of(&text(&m), "gone"), Vec::<String>::new());
        // Requests still finishing on the removed upstream, on its old build or one
        // made from it, count for nobody.
        u.get().request(502, Outcome::Ok, 1);
        next.get().attempt(AttemptResult::Success);
        assert!(next.used().is_some(), "its handles exist, detached");
        assert_eq!(series_of(&text(&m), "gone"), Vec::<String>::new());
        assert!(!series_of(&text(&m), "kept").is_empty());
        // Added again: it starts afresh, at its first request.
        let again = m.upstream("gone", &[], false);
        assert!(again.used().is_none());
        assert_eq!(series_of(&text(&m), "gone"), Vec::<String>::new());
        again.get().attempt(AttemptResult::Success);
        assert!(text(&m).contains("tollgate_attempts_total{result=\"2xx\",upstream=\"gone\"} 1\n"));
    }

    #[test]
    fn a_reload_that_keeps_an_upstream_keeps_its_series() {
        let m = Metrics::new();
        let first = m.upstream("api", &["503".into()], false);
        let idle = m.upstream("idle", &[], false);
        first.get().attempt(AttemptResult::Success);
        let second = first.next(&["503".into(), "reset".into()], false);
        assert!(
            second.used().is_some(),
            "used before the reload: still used"
        );
        assert!(idle.next(&[], false).used().is_none());
        second.get().retried("reset");
        let t = text(&m);
        assert!(t.contains("tollgate_attempts_total{result=\"2xx\",upstream=\"api\"} 1\n"));
        assert!(t.contains("tollgate_retries_total{reason=\"reset\",upstream=\"api\"} 1\n"));
        assert!(t.contains("tollgate_retries_total{reason=\"503\",upstream=\"api\"} 0\n"));
        // Removed on a later reload: the reasons of every build go too.
        m.forget_upstream(&second);
        assert_eq!(series_of(&text(&m), "api"), Vec::<String>::new());
    }

    #[test]
    fn codes_are_counted_by_class_and_clamped() {
        let m = Metrics::new();
        let u = m.upstream("api", &[], false);
        for status in [100, 299, 404, 599, 700, 42] {
            u.get().request(status, Outcome::Ok, 0);
        }
        let t = text(&m);
        for (code, n) in [("100", 2), ("299", 1), ("404", 1), ("599", 2)] {
            let line = format!(
                "tollgate_requests_total{{code=\"{code}\",outcome=\"ok\",upstream=\"api\"}} {n}\n"
            );
            assert!(t.contains(&line), "{line}");
        }
    }
}
