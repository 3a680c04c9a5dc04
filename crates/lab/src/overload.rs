//! `tollgate lab --scenario overload`: an app offered three times its capacity, behind
//! the inbound side's adaptive concurrency limit, and behind no limit at all.
//!
//! The app is the lab's backend: a fixed pool of workers in front of a FIFO queue, a
//! log-normal service time, and work dropped unstarted when its caller's deadline
//! (`x-timeout-ms`) no longer leaves time for it. First it is measured unloaded (a
//! third of its capacity); then open-loop load at three times its capacity goes
//! through an inbound tollgate with `max_inflight = "adaptive"`, and the same load
//! through one with no limit. Measured after a warm-up: the latency of the requests
//! served, the throughput of successes against the capacity, and the refused.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::LabError;
use super::backend::{Backend, Condition, Schedule};
use super::load::{self, Live, LoadSpec, Record, Urls};
use tollgate_core::run::Running;

/// What the overload scenario runs.
#[derive(Clone, Debug)]
pub struct OverloadSpec {
    pub workers: usize,
    pub service: Duration,
    /// Offered load, as a multiple of the capacity.
    pub factor: f64,
    pub duration: Duration,
    /// Discarded at the start of each loaded run: the limit is learning.
    pub warmup: Duration,
}

impl Default for OverloadSpec {
    fn default() -> Self {
        OverloadSpec {
            workers: 8,
            service: Duration::from_millis(25),
            factor: 3.0,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(3),
        }
    }
}

impl OverloadSpec {
    /// The mean service time: the backend draws it log-normally around its median
    /// with sigma 0.3, whose mean is `median × e^(0.3² / 2)`.
    pub fn mean_service(&self) -> Duration {
        self.service.mul_f64((0.3f64 * 0.3 / 2.0).exp())
    }

    /// Requests a second the workers complete when always busy.
    pub fn capacity(&self) -> f64 {
        self.workers as f64 / self.mean_service().as_secs_f64()
    }
}

/// One run, as the users saw it over the measured part.
#[derive(Clone, Debug)]
pub struct Phase {
    pub name: &'static str,
    pub offered_rps: f64,
    pub requests: u64,
    pub served: u64,
    /// `503 overloaded` from the inbound side.
    pub shed: u64,
    /// Anything else: timeouts, the app's own 504 for work it dropped.
    pub failed: u64,
    pub seconds: f64,
    pub p50: Duration,
    pub p99: Duration,
}

impl Phase {
    pub fn throughput(&self) -> f64 {
        self.served as f64 / self.seconds
    }

    fn build(
        name: &'static str,
        offered_rps: f64,
        records: &[Record],
        from: Duration,
        to: Duration,
    ) -> Self {
        let part: Vec<&Record> = records
            .iter()
            .filter(|r| r.sent >= from && r.sent < to)
            .collect();
        let mut ok: Vec<Duration> = part.iter().filter(|r| r.ok).map(|r| r.latency).collect();
        ok.sort();
        let pct = |p: f64| {
            if ok.is_empty() {
                return Duration::ZERO;
            }
            ok[((p * ok.len() as f64).ceil() as usize).clamp(1, ok.len()) - 1]
        };
        let shed = part.iter().filter(|r| r.status == 503).count() as u64;
        Phase {
            name,
            offered_rps,
            requests: part.len() as u64,
            served: ok.len() as u64,
            shed,
            failed: part.len() as u64 - ok.len() as u64 - shed,
            seconds: (to - from).as_secs_f64(),
            p50: pct(0.5),
            p99: pct(0.99),
        }
    }
}

pub struct OverloadResult {
    pub spec: OverloadSpec,
    pub phases: Vec<Phase>,
}

fn inbound_config(app: std::net::SocketAddr, limit: &str) -> String {
    format!(
        "[listener]\naddr = \"127.0.0.1:0\"\nmax_connections = 5000\n[admin]\naddr = \"127.0.0.1:0\"\n\
         [inbound]\naddr = \"127.0.0.1:0\"\napp = \"{app}\"\nmax_inflight = {limit}\nrequest_timeout = \"5s\"\n"
    )
}

/// One run: the app behind an inbound tollgate with `limit`, offered `rps` for
/// `duration`; measured from `warmup`.
async fn phase(
    spec: &OverloadSpec,
    name: &'static str,
    limit: &str,
    rps: f64,
    duration: Duration,
    warmup: Duration,
) -> Result<Phase, LabError> {
    let setup = |e: &dyn std::fmt::Display| LabError::Setup(e.to_string());
    let start = Instant::now() + Duration::from_millis(300);
    let schedule = Schedule {
        workers: spec.workers,
        normal: Condition::healthy(spec.service),
        episodes: vec![],
    };
    let app = Backend::start(schedule, duration + Duration::from_secs(5), start, 1)
        .await
        .map_err(|e| setup(&e))?;
    let config = tollgate_core::config::parse(
        "lab.toml",
        &inbound_config(app.addrs[0], limit),
        Path::new("."),
    )
    .map_err(|e| setup(&e))?;
    let inbound = Running::start(config, None).await.map_err(|e| setup(&e))?;
    let target = inbound
        .server
        .inbound_addr()
        .ok_or_else(|| LabError::Setup("the inbound side did not start".into()))?;
    let load = LoadSpec {
        rps,
        duration,
        deadline: Duration::from_secs(1),
        patience: Duration::from_secs(2),
        host: "app",
        urls: Urls::Zipf(100),
    };
    let records = load::run(target, load, start, Arc::new(Live::default())).await;
    inbound.shutdown(Duration::ZERO).await;
    app.stop().await;
    Ok(Phase::build(name, rps, &records, warmup, duration))
}

pub async fn run(spec: OverloadSpec, progress: bool) -> Result<OverloadResult, LabError> {
    let cap = spec.capacity();
    let say = |what: &str| {
        if progress {
            tollgate_core::print::stderr_line(&format!("  {what} ..."));
        }
    };
    say("unloaded (a third of the capacity)");
    let unloaded = phase(
        &spec,
        "unloaded",
        "\"adaptive\"",
        cap / 3.0,
        Duration::from_secs(4),
        Duration::from_secs(1),
    )
    .await?;
    say("adaptive limit, 3x the capacity");
    let loaded = cap * spec.factor;
    let adaptive = phase(
        &spec,
        "adaptive",
        "\"adaptive\"",
        loaded,
        spec.duration,
        spec.warmup,
    )
    .await?;
    say("no limit, 3x the capacity");
    let unlimited = phase(
        &spec,
        "no limit",
        "1000000",
        loaded,
        spec.duration,
        spec.warmup,
    )
    .await?;
    Ok(OverloadResult {
        spec,
        phases: vec![unloaded, adaptive, unlimited],
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn table(r: &OverloadResult) -> String {
    let s = &r.spec;
    let mut out = format!(
        "tollgate lab: overload\n\
         an app of {} workers, service time log-normal around {} ms (mean {:.1} ms): capacity {:.0} requests/s;\n\
         callers' deadline 1 s; open-loop load through an inbound tollgate; measured after {:.0} s of warm-up.\n\n",
        s.workers,
        s.service.as_millis(),
        ms(s.mean_service()),
        s.capacity(),
        s.warmup.as_secs_f64(),
    );
    out.push_str("  run          offered/s   served/s  (of capacity)   p50 ms   p99 ms   shed 503   failed\n");
    for p in &r.phases {
        out.push_str(&format!(
            "  {:<11}  {:>9.0}   {:>8.0}  ({:>5.1}%)        {:>6.1}   {:>6.1}   {:>8}   {:>6}\n",
            p.name,
            p.offered_rps,
            p.throughput(),
            p.throughput() / s.capacity() * 100.0,
            ms(p.p50),
            ms(p.p99),
            p.shed,
            p.failed,
        ));
    }
    out
}

pub fn to_json(r: &OverloadResult) -> Value {
    let s = &r.spec;
    json!({
        "scenario": "overload",
        "app": {
            "workers": s.workers,
            "median_service_ms": ms(s.service),
            "mean_service_ms": ms(s.mean_service()),
            "capacity_rps": s.capacity(),
        },
        "runs": r.phases.iter().map(|p| json!({
            "run": p.name,
            "offered_rps": p.offered_rps,
            "requests": p.requests,
            "served": p.served,
            "served_rps": p.throughput(),
            "share_of_capacity": p.throughput() / s.capacity(),
            "shed": p.shed,
            "failed": p.failed,
            "p50_ms": ms(p.p50),
            "p99_ms": ms(p.p99),
        })).collect::<Vec<_>>(),
    })
}
