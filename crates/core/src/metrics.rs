//! Every metric tollgate exports, in one place.
//!
//! Label values are only upstream names from the config and fixed words; nothing a
//! request carries ever becomes a label. Handles are resolved once per upstream (and,
//! for the final status code, once per code on first use), so the request path does
//! atomic adds and never formats or hashes a label.
//!
//! An upstream's series cost what is used ([`upstream`]): they are made with its first
//! request and removed when a reload removes it. The process's own series and the
//! state of its listeners, config and discovery exist whether or not traffic came.
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
mod upstream;

pub use labels::{AttemptResult, Denied, Evidence, Outcome, Shortage};
pub use upstream::{Ejections, Gauges, UpstreamMetrics, UpstreamSeries};

use std::sync::{Arc, OnceLock};

use family::{counters, family, int_gauges};
pub use health::HedgeResult;
use prometheus::{
    Encoder, Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Seconds; from a pooled loopback hop (~100 us) to a patient caller (~30 s).
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The process-wide registry and metric families.
pub struct Metrics {
    registry: Registry,
    /// The families of every upstream's traffic ([`upstream`]).
    upstreams: Arc<upstream::Families>,
    reloads: IntCounterVec,
    /// `[accept, connect]`.
    exhausted: [IntCounter; 2],
    last_reload: Gauge,
    last_reload_ok: IntGauge,
    listener_up: IntGaugeVec,
    passthrough: passthrough::Passthrough,
    trace: trace::TraceDrops,
    discovery: discovery::Families,
    /// Registered with the inbound side, when the config has one.
    inbound: OnceLock<inbound::InboundMetrics>,
    /// Registered with `[inbound.dedupe]`, when the config has one.
    dedupe: OnceLock<dedupe::DedupeMetrics>,
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
        let exhausted = exhausted_family(&r);
        let m = Metrics {
            upstreams: Arc::new(upstream::Families::new(
                &r,
                exhausted[Shortage::Connect as usize].clone(),
            )),
            reloads: counters(
                &r,
                "tollgate_config_reloads_total",
                "Config reloads, by result.",
                &["result"],
            ),
            exhausted,
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
                &["upstream"],
            ),
            passthrough: passthrough::Passthrough::new(&r),
            trace: trace::TraceDrops::new(&r),
            discovery: discovery::Families::new(&r),
            inbound: OnceLock::new(),
            dedupe: OnceLock::new(),
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

    /// The metrics of one build of an upstream: nothing until its first request
    /// ([`UpstreamSeries::get`]). `mints` with `mint_idempotency_key`.
    pub fn upstream(&self, name: &str, retry_on: &[String], mints: bool) -> UpstreamSeries {
        UpstreamSeries::new(&self.upstreams, name, retry_on, mints)
    }

    /// A reload removed the upstream: every series with its name goes (its traffic's,
    /// and its discovery's).
    pub fn forget_upstream(&self, series: &UpstreamSeries) {
        series.remove();
        self.discovery.forget(series.name());
    }

    /// Requests that matched no upstream: `tollgate_requests_total{upstream="",
    /// code="404", outcome="no-route"}` (`code="200"` for gRPC calls, answered with a
    /// gRPC status), and no other series for the empty name.
    pub fn unrouted(&self, grpc: bool) -> IntCounter {
        self.upstreams.unrouted(grpc)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_metric_is_exported() {
        let m = Metrics::new();
        let u = m.upstream("payments", &["503".into()], true);
        u.get().request(200, Outcome::Ok, 1);
        u.get().set(Gauges {
            amplification: 1.0,
            budget_available: 10.0,
            inflight: 0,
            connections: 0,
            ejected: 0,
            budget_ratio: 0.1,
            throttle_probability: 0.0,
        });
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
            "tollgate_upstream_connections",
            "tollgate_idempotency_keys_minted_total",
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
        let u = m.upstream("quiet", &[], false);
        u.get().set(Gauges {
            amplification: amplification(0, 0),
            budget_available: 10.0,
            inflight: 0,
            connections: 0,
            ejected: 0,
            budget_ratio: 0.1,
            throttle_probability: 0.0,
        });
        let text = String::from_utf8(m.encode()).unwrap();
        assert!(
            text.contains("tollgate_amplification{upstream=\"quiet\"} NaN\n"),
            "{text}"
        );
    }

    #[test]
    fn request_counts_land_on_their_code_and_outcome() {
        let m = Metrics::new();
        let u = m.upstream("api", &[], false);
        let u = u.get();
        u.request(503, Outcome::BudgetExhausted, 2);
        u.request(503, Outcome::BudgetExhausted, 1);
        let text = String::from_utf8(m.encode()).unwrap();
        assert!(text.contains(
            "tollgate_requests_total{code=\"503\",outcome=\"budget-exhausted\",upstream=\"api\"} 2"
        ));
        assert!(text.contains("tollgate_attempts_per_request_sum{upstream=\"api\"} 3"));
    }
}
