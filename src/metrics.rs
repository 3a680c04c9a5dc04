//! Every metric tollgate exports, in one place.
//!
//! Label values are only upstream names from the config and fixed words; nothing a
//! request carries ever becomes a label. Handles are resolved once per upstream (and,
//! for the final status code, once per code on first use), so the request path does
//! atomic adds and never formats or hashes a label.
//!
//! Beside tollgate's own families the registry carries `tollgate_build_info` (which
//! version is running) and the standard `process_*` metrics every Prometheus client
//! exports ([`process`]), so the usual dashboards and alerts for CPU, memory and file
//! descriptors work on a tollgate as on any other service.

pub mod dedupe;
pub mod discovery;
mod family;
pub mod health;
pub mod inbound;
mod labels;
mod learning;
pub mod passthrough;
pub mod process;
pub mod trace;

pub use labels::{AttemptResult, Denied, Evidence, Outcome, Shortage};
pub use learning::Learning;

use std::sync::{Arc, OnceLock};

use family::{counters, family, gauges, histograms, int_gauges};
pub use health::HedgeResult;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Seconds; from a pooled loopback hop (~100 us) to a patient caller (~30 s).
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The process-wide registry and metric families.
pub struct Metrics {
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
    reloads: IntCounterVec,
    /// `[accept, connect]`.
    exhausted: [IntCounter; 2],
    last_reload: Gauge,
    last_reload_ok: IntGauge,
    listener_up: IntGaugeVec,
    health: health::Families,
    passthrough: passthrough::Passthrough,
    trace: trace::TraceDrops,
    discovery: discovery::Families,
    /// Registered with the inbound side, when the config has one.
    inbound: OnceLock<inbound::InboundMetrics>,
    /// Registered with `[inbound.dedupe]`, when the config has one.
    dedupe: OnceLock<dedupe::DedupeMetrics>,
    /// `tollgate_idempotency_keys_minted_total`, registered when an upstream mints.
    minted: OnceLock<IntCounterVec>,
    /// The families of a caller that learns from its upstream.
    pub learning: Learning,
}

/// How a reload ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadResult {
    /// Applied in full.
    Ok,
    /// Refused: the previous config stays in force.
    Error,
    /// Applied, but an upstream's own `listen` port could not be bound.
    Partial,
}

/// `tollgate_amplification`: attempts per request over the window, NaN when the
/// window holds no request (no traffic, no ratio: 0 would read as "fewer attempts than
/// requests", and 1 as "healthy", and neither was observed).
pub fn amplification(attempts: u64, requests: u64) -> f64 {
    if requests == 0 {
        f64::NAN
    } else {
        attempts as f64 / requests as f64
    }
}

/// `tollgate_descriptors_exhausted_total{at}`, one handle per place.
fn exhausted_family(r: &Registry) -> [IntCounter; 2] {
    let family = family(
        r,
        IntCounterVec::new(
            Opts::new(
                "tollgate_descriptors_exhausted_total",
                "Times the process was out of file descriptors: a client \
                     connection not accepted, or an upstream connection not opened \
                     (answered 503 overloaded, not counted as an attempt).",
            ),
            &["at"],
        ),
    );
    [Shortage::Accept, Shortage::Connect].map(|at| family.with_label_values(&[at.as_str()]))
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let r = Registry::new();
        let up = &["upstream"];
        let latency = || LATENCY_BUCKETS.to_vec();
        let m = Metrics {
            requests: counters(
                &r,
                "tollgate_requests_total",
                "Requests answered, by final status and outcome.",
                &["upstream", "code", "outcome"],
            ),
            attempts: counters(
                &r,
                "tollgate_attempts_total",
                "Attempts sent upstream (first tries and retries), by result.",
                &["upstream", "result"],
            ),
            retries: counters(
                &r,
                "tollgate_retries_total",
                "Retries started, by the retry condition that fired.",
                &["upstream", "reason"],
            ),
            denied: counters(
                &r,
                "tollgate_retries_denied_total",
                "Failures not retried, by what refused the retry.",
                &["upstream", "reason"],
            ),
            attempts_per_request: histograms(
                &r,
                "tollgate_attempts_per_request",
                "Attempts each request took.",
                up,
                (1..=10).map(f64::from).collect(),
            ),
            amplification: gauges(
                &r,
                "tollgate_amplification",
                "Attempts per request over the budget window.",
                up,
            ),
            budget_available: gauges(
                &r,
                "tollgate_retry_budget_available",
                "Retries the budget would grant now (+Inf without a budget).",
                up,
            ),
            request_duration: histograms(
                &r,
                "tollgate_request_duration_seconds",
                "From request head to the end of the response.",
                up,
                latency(),
            ),
            attempt_duration: histograms(
                &r,
                "tollgate_attempt_duration_seconds",
                "From an attempt's start to its response head or failure.",
                up,
                latency(),
            ),
            inflight: int_gauges(
                &r,
                "tollgate_inflight_requests",
                "Requests waiting for their response head now (what max_inflight counts).",
                up,
            ),
            connections: int_gauges(
                &r,
                "tollgate_upstream_connections",
                "Open connections to the upstream's endpoints.",
                up,
            ),
            reloads: counters(
                &r,
                "tollgate_config_reloads_total",
                "Config reloads, by result.",
                &["result"],
            ),
            exhausted: exhausted_family(&r),
            last_reload: family(
                &r,
                Gauge::with_opts(Opts::new(
                    "tollgate_config_last_reload_success_timestamp_seconds",
                    "When the config in force was loaded (Unix seconds).",
                )),
            ),
            last_reload_ok: family(
                &r,
                IntGauge::with_opts(Opts::new(
                    "tollgate_config_last_reload_successful",
                    "1 when the last load of the config file succeeded, 0 while a refused \
                     one is waiting to be fixed (the previous config stays in force).",
                )),
            ),
            listener_up: int_gauges(
                &r,
                "tollgate_listener_up",
                "1 when an upstream's own listen port is bound, 0 when a reload could not \
                 bind it.",
                up,
            ),
            health: health::Families::new(&r),
            passthrough: passthrough::Passthrough::new(&r),
            trace: trace::TraceDrops::new(&r),
            discovery: discovery::Families::new(&r),
            inbound: OnceLock::new(),
            dedupe: OnceLock::new(),
            minted: OnceLock::new(),
            learning: Learning::new(&r),
            registry: r,
        };
        m.register_fixed();
        Arc::new(m)
    }

    /// The series that exist once per process: the build, the process's own figures,
    /// and every result of a reload.
    fn register_fixed(&self) {
        int_gauges(
            &self.registry,
            "tollgate_build_info",
            "Always 1; the labels say which build of tollgate is running.",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        // Its names are constants too, and clash with nothing above.
        self.registry
            .register(Box::new(process::ProcessCollector::new()))
            .expect("metric registration");
        // Every result exists from the start, so `rate()` and `increase()` see the first
        // reload of each kind (a series born at 1 shows no increase).
        for result in ["ok", "error", "partial"] {
            self.reloads.with_label_values(&[result]);
        }
    }

    /// `tollgate_descriptors_exhausted_total{at}`.
    pub fn exhausted(&self, at: Shortage) -> &IntCounter {
        &self.exhausted[at as usize]
    }

    /// The passthrough of redirected connections ([`passthrough`]).
    pub fn passthrough(&self) -> &passthrough::Passthrough {
        &self.passthrough
    }

    /// Spans the trace export dropped ([`trace`]).
    pub fn trace_drops(&self) -> &trace::TraceDrops {
        &self.trace
    }

    /// The handles of an upstream with `discovery = "kubernetes"` ([`discovery`]):
    /// resolved when its watch starts, so its series exist from then on.
    pub fn discovery(&self, upstream: &str) -> discovery::DiscoveryMetrics {
        self.discovery.upstream(upstream)
    }

    /// Drops the endpoint gauge of an upstream no longer watched (its counters stay).
    pub fn forget_discovery(&self, upstream: &str) {
        self.discovery.forget(upstream);
    }

    /// The handles of one upstream; resolving them is the only label lookup.
    pub fn upstream(&self, name: &str, retry_on: &[String]) -> UpstreamMetrics {
        let l = &[name];
        let m = UpstreamMetrics {
            name: name.to_string(),
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
            requests: self.requests.clone(),
            by_code: Default::default(),
            exhausted: self.exhausted(Shortage::Connect).clone(),
            health: self.health.upstream(name),
            app_retries: self.learning.upstream(name),
        };
        // The common answers exist from the start so dashboards show zeros, not gaps.
        m.request_counter(200, Outcome::Ok);
        self.amplification.with_label_values(l);
        self.budget_available.with_label_values(l);
        self.inflight.with_label_values(l);
        self.connections.with_label_values(l);
        m
    }

    /// Requests that matched no upstream: `tollgate_requests_total{upstream="",
    /// code="404", outcome="no-route"}` (`code="200"` for gRPC calls, answered with a
    /// gRPC status), and no other series for the empty name.
    pub fn unrouted(&self, grpc: bool) -> IntCounter {
        let code = if grpc { "200" } else { "404" };
        self.requests
            .with_label_values(&["", code, Outcome::NoRoute.as_str()])
    }

    /// Gauges read from live state just before a scrape.
    pub fn set_gauges(
        &self,
        name: &str,
        amplification: f64,
        budget_available: f64,
        inflight: i64,
        connections: i64,
    ) {
        let l = &[name];
        self.amplification.with_label_values(l).set(amplification);
        self.budget_available
            .with_label_values(l)
            .set(budget_available);
        self.inflight.with_label_values(l).set(inflight);
        self.connections.with_label_values(l).set(connections);
    }

    /// Drops the gauges of an upstream that no longer exists (counters stay: they are
    /// history, and Prometheus handles their disappearance worse than their staying).
    pub fn forget_gauges(&self, name: &str) {
        let l = &[name];
        let _ = self.amplification.remove_label_values(l);
        let _ = self.budget_available.remove_label_values(l);
        let _ = self.inflight.remove_label_values(l);
        let _ = self.connections.remove_label_values(l);
        self.health.forget(name);
        self.learning.forget(name);
    }

    /// `tollgate_endpoints_ejected{upstream}`, read from live state before a scrape.
    pub fn set_ejected(&self, name: &str, ejected: usize) {
        self.health.set_ejected(name, ejected);
    }

    /// A reload: counted by result; `tollgate_config_last_reload_successful` says
    /// whether the newest file is the one in force, so an alert can last as long as a
    /// broken config stays in place (the error counter only moves once per edit). A
    /// partial reload is in force.
    pub fn reload(&self, result: ReloadResult) {
        let label = match result {
            ReloadResult::Ok => "ok",
            ReloadResult::Error => "error",
            ReloadResult::Partial => "partial",
        };
        self.reloads.with_label_values(&[label]).inc();
        if result == ReloadResult::Error {
            self.last_reload_ok.set(0);
        } else {
            self.mark_loaded();
        }
    }

    /// Whether an upstream's own `listen` port is bound.
    pub fn listener_up(&self, upstream: &str, up: bool) {
        self.listener_up
            .with_label_values(&[upstream])
            .set(i64::from(up));
    }

    /// An upstream's own `listen` port is gone from the config.
    pub fn forget_listener(&self, upstream: &str) {
        let _ = self.listener_up.remove_label_values(&[upstream]);
    }

    /// The file on disk is the config in force again (a bad edit was reverted, by hand
    /// or by a ConfigMap swap back), without a reload: nothing changed. `true` when a
    /// refused reload was outstanding, now cleared.
    pub fn in_effect_again(&self) -> bool {
        let was = self.last_reload_ok.get() == 0;
        if was {
            self.last_reload_ok.set(1);
        }
        was
    }

    pub fn mark_loaded(&self) {
        self.last_reload_ok.set(1);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.last_reload.set(now);
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding into a Vec cannot fail for I/O; a failure would be a bug in a family.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

/// One upstream's handles.
pub struct UpstreamMetrics {
    name: String,
    attempts: [IntCounter; 10],
    denied: [IntCounter; Denied::ALL.len()],
    retries: Vec<(String, IntCounter)>,
    pub attempts_per_request: Histogram,
    pub request_duration: Histogram,
    pub attempt_duration: Histogram,
    requests: IntCounterVec,
    /// `[outcome][status - 100]`, filled on first use of each pair.
    by_code: [OnceLock<Box<[OnceLock<IntCounter>]>>; Outcome::ALL.len()],
    /// `tollgate_descriptors_exhausted_total{at="connect"}`, shared by every upstream.
    pub exhausted: IntCounter,
    /// Ejections and hedges.
    pub health: health::Handles,
    /// `tollgate_app_retries_total`, by [`Evidence`].
    app_retries: [IntCounter; 3],
}

impl std::fmt::Debug for UpstreamMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamMetrics")
            .field("name", &self.name)
            .finish()
    }
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
        self.app_retries[evidence as usize].inc();
    }

    /// `condition` is a `retry.on` word (`"503"`, `"reset"`, ...).
    pub fn retried(&self, condition: &str) {
        if let Some((_, c)) = self.retries.iter().find(|(name, _)| name == condition) {
            c.inc();
        }
    }

    fn request_counter(&self, status: u16, outcome: Outcome) -> &IntCounter {
        let status = status.clamp(100, 599);
        let table = self.by_code[outcome.index()]
            .get_or_init(|| (100..600).map(|_| OnceLock::new()).collect());
        table[usize::from(status - 100)].get_or_init(|| {
            let code = status.to_string();
            self.requests
                .with_label_values(&[&self.name, &code, outcome.as_str()])
        })
    }

    pub fn request(&self, status: u16, outcome: Outcome, attempts: u32) {
        self.request_counter(status, outcome).inc();
        if attempts > 0 {
            self.attempts_per_request.observe(f64::from(attempts));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_metric_is_exported() {
        let m = Metrics::new();
        let _u = m.upstream("payments", &["503".into()]);
        m.set_gauges("payments", 1.0, 10.0, 0, 0);
        let text = String::from_utf8(m.encode()).unwrap();
        for name in [
            "tollgate_requests_total",
            "tollgate_attempts_total",
            "tollgate_retries_total",
            "tollgate_retries_denied_total",
            "tollgate_attempts_per_request",
            "tollgate_amplification",
            "tollgate_retry_budget_available",
            "tollgate_request_duration_seconds",
            "tollgate_attempt_duration_seconds",
            "tollgate_inflight_requests",
            "tollgate_config_reloads_total",
            "tollgate_config_last_reload_success_timestamp_seconds",
            "tollgate_build_info",
            "tollgate_config_last_reload_successful",
            "tollgate_descriptors_exhausted_total",
            "tollgate_hedges_total",
            "tollgate_endpoints_ejected",
            "tollgate_ejections_total",
            "tollgate_retry_budget_ratio",
            "tollgate_throttle_probability",
            "tollgate_app_retries_total",
            "tollgate_trace_spans_dropped_total",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        let d = m.discovery("payments");
        d.published(3);
        d.error(discovery::Reason::Auth);
        let text = String::from_utf8(m.encode()).unwrap();
        for name in [
            "tollgate_discovery_endpoints{upstream=\"payments\"} 3",
            "tollgate_discovery_updates_total{upstream=\"payments\"} 1",
            "tollgate_discovery_errors_total{reason=\"auth\",upstream=\"payments\"} 1",
            "tollgate_discovery_errors_total{reason=\"gone\",upstream=\"payments\"} 0",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
        assert!(text.contains(&format!(
            "tollgate_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        )));
        for result in ["ok", "error", "partial"] {
            assert!(
                text.contains(&format!(
                    "tollgate_config_reloads_total{{result=\"{result}\"}} 0\n"
                )),
                "reload result {result} missing"
            );
        }
    }

    #[test]
    fn last_reload_successful_follows_the_newest_load() {
        let m = Metrics::new();
        let value = |m: &Metrics| {
            let text = String::from_utf8(m.encode()).unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("tollgate_config_last_reload_successful "))
                .map(str::to_string)
        };
        m.mark_loaded();
        assert_eq!(value(&m).as_deref(), Some("1"));
        m.reload(ReloadResult::Error);
        assert_eq!(
            value(&m).as_deref(),
            Some("0"),
            "a refused file is not in force"
        );
        m.reload(ReloadResult::Error);
        assert_eq!(value(&m).as_deref(), Some("0"));
        m.reload(ReloadResult::Ok);
        assert_eq!(value(&m).as_deref(), Some("1"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_are_exported_with_their_standard_types() {
        let text = String::from_utf8(Metrics::new().encode()).unwrap();
        for (name, kind) in [
            ("process_cpu_seconds_total", "counter"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_virtual_memory_bytes", "gauge"),
            ("process_open_fds", "gauge"),
            ("process_max_fds", "gauge"),
            ("process_start_time_seconds", "gauge"),
            ("process_threads", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind} missing:\n{text}"
            );
        }
    }

    #[test]
    fn amplification_is_nan_without_requests() {
        assert!(amplification(0, 0).is_nan());
        assert!(amplification(3, 0).is_nan(), "attempts still in the window");
        assert_eq!(amplification(3, 2), 1.5);
        let m = Metrics::new();
        let _u = m.upstream("quiet", &[]);
        m.set_gauges("quiet", amplification(0, 0), 10.0, 0, 0);
        let text = String::from_utf8(m.encode()).unwrap();
        assert!(
            text.contains("tollgate_amplification{upstream=\"quiet\"} NaN\n"),
            "{text}"
        );
    }

    #[test]
    fn request_counts_land_on_their_code_and_outcome() {
        let m = Metrics::new();
        let u = m.upstream("api", &[]);
        u.request(503, Outcome::BudgetExhausted, 2);
        u.request(503, Outcome::BudgetExhausted, 1);
        let text = String::from_utf8(m.encode()).unwrap();
        assert!(text.contains(
            "tollgate_requests_total{code=\"503\",outcome=\"budget-exhausted\",upstream=\"api\"} 2"
        ));
        assert!(text.contains("tollgate_attempts_per_request_sum{upstream=\"api\"} 3"));
    }
}
