//! `tollgate lab --scenario fleet`: why the dependency's side needs a budget of its own.
//!
//! N caller sidecars (each a real tollgate, [`tollgate_core::run::Running`], with its own retry
//! budget, its own listener and its own connections over real sockets: `ratio = 0.1`,
//! `min_per_sec = 1`) send to one inbound tollgate in front of an app that answers
//! every request with 503. Each caller behaves: its budget caps its retries at a tenth
//! of its traffic, plus a floor of one a second so that a quiet caller can still retry.
//! But the floor is per caller: N callers are N floors, and at a request a second each
//! (a sidecar's usual share of a dependency) the floors alone make every caller's
//! request 2.1 calls at the app. The same run, side by side, with `[inbound.retries]`
//! on the inbound tollgate: one budget for every caller's retries.
//!
//! Each caller sends the same (one user request a second by default), so the fleet's
//! load grows with N, as a fleet's does. Amplification is measured at the app: the
//! calls it received over the user requests sent, over a few seconds after a warm-up
//! of one budget window; and every first attempt must reach it (the fleet budget
//! refuses retries only).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::LabError;
use super::backend::{BUCKET, Backend, Condition, Schedule};
use super::load::{self, Live, LoadSpec, Record, Urls};
use tollgate_core::run::Running;

/// What the fleet scenario runs.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    /// The fleet sizes to run, one after another.
    pub callers: Vec<usize>,
    /// User requests a second, from each caller.
    pub each_rps: f64,
    /// The lone quiet caller's requests a second.
    pub quiet_rps: f64,
    /// Discarded at the start: one budget window, so every window is full.
    pub warmup: Duration,
    pub measure: Duration,
}

impl Default for FleetSpec {
    fn default() -> Self {
        FleetSpec {
            callers: vec![1, 20, 200, 1000],
            each_rps: 1.0,
            quiet_rps: 2.0,
            warmup: WINDOW,
            measure: Duration::from_secs(3),
        }
    }
}

/// The budget window of every tollgate in the run (short, so that a run of a few
/// seconds is in its steady state after one window).
pub const WINDOW: Duration = Duration::from_secs(2);
/// Each caller's budget, and the retries it asks for at most (`max_attempts = 3`).
pub const CALLER_RATIO: f64 = 0.1;
pub const CALLER_FLOOR: f64 = 1.0;
pub const MAX_ATTEMPTS: u32 = 3;
/// The largest fleet the lab runs (two of them side by side, each caller a tollgate).
pub const MAX_CALLERS: usize = 1000;
const RETRIES_PER_REQUEST: f64 = 2.0;
/// The inbound side's budget for the whole fleet.
pub const INBOUND_RATIO: f64 = 0.05;
pub const INBOUND_FLOOR: f64 = 5.0;

/// One run of one fleet, as measured at the app.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measured {
    pub requests: u64,
    pub app_calls: u64,
    /// Retries the inbound side answered `503 retry-rejected`.
    pub rejected: u64,
    /// First attempts the inbound side kept from the app (any other reason it denies).
    pub first_refused: u64,
}

impl Measured {
    pub fn amplification(&self) -> f64 {
        self.app_calls as f64 / self.requests.max(1) as f64
    }
}

/// A fleet size, without and with the inbound budget, and what the arithmetic says.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub callers: usize,
    pub rps: f64,
    pub without: Measured,
    pub with: Measured,
}

impl Row {
    /// The most amplification the budgets' arithmetic allows: each caller retries at
    /// most `min(2 × its rate, 0.1 × its rate + 1)` a second; with the inbound budget,
    /// all of them together at most `0.05 × rate + 5`. (A budget grants whole retries,
    /// paced: at a request a second a caller's 2.2 retries a window are 2, spent on one
    /// request, so the measured figure is lower.)
    pub fn predicted(&self, inbound: bool) -> f64 {
        let each = self.rps / self.callers as f64;
        let callers = self.callers as f64
            * (RETRIES_PER_REQUEST * each).min(CALLER_RATIO * each + CALLER_FLOOR);
        let admitted = if inbound {
            callers.min(INBOUND_RATIO * self.rps + INBOUND_FLOOR)
        } else {
            callers
        };
        1.0 + admitted / self.rps
    }
}

pub struct FleetResult {
    pub spec: FleetSpec,
    pub rows: Vec<Row>,
    /// One caller at `quiet_rps`: a quiet dependency's failures still get retried.
    pub quiet: Row,
}

/// The app, N callers and the inbound tollgate between them.
struct Rig {
    app: Backend,
    inbound: Running,
    callers: Vec<Running>,
}

fn parse(text: &str) -> Result<tollgate_core::config::Config, LabError> {
    tollgate_core::config::parse("lab.toml", text, Path::new("."))
        .map_err(|e| LabError::Setup(e.to_string()))
}

const LOOPBACK: &str = "[listener]\naddr = \"127.0.0.1:0\"\nmax_connections = 5000\n\
                        [admin]\naddr = \"127.0.0.1:0\"\n";

fn window() -> String {
    format!("{}ms", WINDOW.as_millis())
}

/// The inbound tollgate's config, with or without the fleet budget.
pub fn inbound_config(app: std::net::SocketAddr, budget: bool) -> String {
    let retries = if budget {
        format!(
            "[inbound.retries]\nratio = {INBOUND_RATIO}\nmin_per_sec = {INBOUND_FLOOR}\nwindow = \"{}\"\n",
            window()
        )
    } else {
        String::new()
    };
    format!(
        "{LOOPBACK}[inbound]\naddr = \"127.0.0.1:0\"\napp = \"{app}\"\nmax_inflight = 100000\n\
         request_timeout = \"5s\"\n{retries}"
    )
}

/// A caller's config: its app's calls to `app` go to the inbound tollgate at `next`.
pub fn caller_config(next: std::net::SocketAddr) -> String {
    format!(
        "{LOOPBACK}[upstreams.app]\nauthorities = [\"app\"]\nendpoints = [\"{next}\"]\n\
         request_timeout = \"5s\"\nmax_inflight = 100000\n\
         [upstreams.app.retry]\nmax_attempts = {MAX_ATTEMPTS}\nbackoff_base = \"10ms\"\nbackoff_max = \"100ms\"\n\
         [upstreams.app.budget]\nratio = {CALLER_RATIO}\nmin_per_sec = {CALLER_FLOOR}\nwindow = \"{}\"\n",
        window()
    )
}

async fn rig(callers: usize, budget: bool, run: Duration, start: Instant) -> Result<Rig, LabError> {
    let failing = Schedule {
        workers: 64,
        normal: Condition {
            error_rate: 1.0,
            ..Condition::healthy(Duration::from_millis(2))
        },
        episodes: vec![],
    };
    let setup = |e: &dyn std::fmt::Display| LabError::Setup(e.to_string());
    let app = Backend::start(failing, run, start, 1)
        .await
        .map_err(|e| setup(&e))?;
    let inbound = Running::start(parse(&inbound_config(app.addrs[0], budget))?, None)
        .await
        .map_err(|e| setup(&e))?;
    let next = inbound
        .server
        .inbound_addr()
        .ok_or_else(|| LabError::Setup("the inbound side did not start".into()))?;
    let mut list = Vec::with_capacity(callers);
    for _ in 0..callers {
        let c = Running::start(parse(&caller_config(next))?, None)
            .await
            .map_err(|e| setup(&e))?;
        list.push(c);
    }
    Ok(Rig {
        app,
        inbound,
        callers: list,
    })
}

/// What the app received in the measured window, against what the users sent in it.
fn measured(rig: &Rig, records: &[Record], from: Duration, to: Duration) -> Measured {
    let bucket = |d: Duration| (d.as_millis() / BUCKET.as_millis()) as usize;
    let app_calls = rig.app.counters.arrivals[bucket(from)..bucket(to)]
        .iter()
        .map(|a| a.load(Relaxed))
        .sum();
    let requests = records
        .iter()
        .filter(|r| r.sent >= from && r.sent < to)
        .count() as u64;
    let metrics =
        String::from_utf8(rig.inbound.server.shared().metrics().encode()).unwrap_or_default();
    let denied = |retries: bool| -> u64 {
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix("tollgate_inbound_denied_total{reason=\""))
            .filter(|l| l.starts_with("retry-budget\"") == retries)
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    Measured {
        requests,
        app_calls,
        rejected: denied(true),
        first_refused: denied(false),
    }
}

/// Sends `rps` in all, spread over the callers of `rig`.
async fn drive(rig: &Rig, rps: f64, duration: Duration, start: Instant) -> Vec<Record> {
    let each = LoadSpec {
        rps: rps / rig.callers.len() as f64,
        duration,
        // Roomy: a thousand tollgates in one process on two cores are slow at times, and
        // what is measured here is the budgets, not deadlines.
        deadline: Duration::from_secs(5),
        patience: Duration::from_secs(6),
        host: "app",
        urls: Urls::Zipf(100),
    };
    let runs = rig.callers.iter().map(|c| {
        load::run(
            c.server.local_addr(),
            each.clone(),
            start,
            Arc::new(Live::default()),
        )
    });
    let all = futures_join_all(runs).await;
    all.into_iter().flatten().collect()
}

/// Runs the futures at the same time and collects their outputs in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}

async fn stop(rig: Rig) {
    for c in rig.callers {
        c.shutdown(Duration::ZERO).await;
    }
    rig.inbound.shutdown(Duration::ZERO).await;
    rig.app.stop().await;
}

/// One fleet size, without and with the inbound budget: side by side when the open-file
/// limit has room for both, else one after the other.
async fn row(callers: usize, rps: f64, spec: &FleetSpec) -> Result<Row, LabError> {
    let duration = spec.warmup + spec.measure;
    let run = duration + Duration::from_secs(8);
    let window = (spec.warmup, duration);
    if !room_for(callers)? {
        let mut each = [Measured::default(); 2];
        for (m, budget) in each.iter_mut().zip([false, true]) {
            let start = Instant::now() + Duration::from_millis(500);
            let r = rig(callers, budget, run, start).await?;
            let records = drive(&r, rps, duration, start).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            *m = measured(&r, &records, window.0, window.1);
            stop(r).await;
        }
        let [without, with] = each;
        return Ok(Row {
            callers,
            rps,
            without,
            with,
        });
    }
    let start = Instant::now() + Duration::from_millis(500);
    let without = rig(callers, false, run, start).await?;
    let with = rig(callers, true, run, start).await?;
    let (a, b) = tokio::join!(
        drive(&without, rps, duration, start),
        drive(&with, rps, duration, start)
    );
    // The retries of the last requests are in before the window is read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let row = Row {
        callers,
        rps,
        without: measured(&without, &a, window.0, window.1),
        with: measured(&with, &b, window.0, window.1),
    };
    stop(without).await;
    stop(with).await;
    Ok(row)
}

/// Open files a caller takes in one rig, with room to spare: its listeners, the spare
/// descriptor each tollgate keeps, and both ends of the load's connections to it and of
/// its connections to the inbound side, all in this process (about 16 measured at a
/// request a second).
const FILES_PER_CALLER: u64 = 18;

/// Open files `rigs` rigs of `callers` take.
fn files(callers: usize, rigs: u64) -> u64 {
    rigs * callers as u64 * FILES_PER_CALLER + 1024
}

/// Raises the soft limit on open files as far as this process may (to the hard one, or
/// beyond it as root with the capability); the limit in force.
fn raise_open_files(need: u64) -> u64 {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let have = tollgate_core::descriptors::soft_limit().unwrap_or(u64::MAX);
    if have < need && rlimit::setrlimit(rlimit::Resource::NOFILE, need, need).is_ok() {
        return need;
    }
    have
}

/// Whether the two rigs of `callers` can run side by side; an error when not even one
/// fits the open-file limit.
fn room_for(callers: usize) -> Result<bool, LabError> {
    let have = raise_open_files(files(callers, 2));
    if have >= files(callers, 2) {
        return Ok(true);
    }
    if have >= files(callers, 1) {
        return Ok(false);
    }
    let need = files(callers, 1);
    Err(LabError::Setup(format!(
        "{callers} callers take about {need} open files and the limit is {have}: raise it \
         (`ulimit -n {need}`) or run fewer callers"
    )))
}

pub async fn run(spec: FleetSpec, progress: bool) -> Result<FleetResult, LabError> {
    room_for(spec.callers.iter().copied().max().unwrap_or(1))?;
    let mut rows = Vec::new();
    for &n in &spec.callers {
        if progress {
            tollgate_core::print::stderr_line(&format!("  {n} caller(s) ..."));
        }
        rows.push(row(n, n as f64 * spec.each_rps, &spec).await?);
    }
    if progress {
        tollgate_core::print::stderr_line("  1 quiet caller ...");
    }
    let quiet = row(1, spec.quiet_rps, &spec).await?;
    Ok(FleetResult { spec, rows, quiet })
}

pub fn table(r: &FleetResult) -> String {
    let s = &r.spec;
    let mut out = format!(
        "tollgate lab: fleet\n\
         N caller tollgates (each: ratio {CALLER_RATIO}, min_per_sec {CALLER_FLOOR}, max_attempts 3) -> one inbound \
         tollgate -> an app that answers every request 503.\n\
         {} user request(s)/s from each caller; amplification = app calls / user requests over {:.0} s after {:.0} s of warm-up \
         (budget windows {:.0} s).\n\
         [inbound.retries]: ratio {INBOUND_RATIO}, min_per_sec {INBOUND_FLOOR}.\n\n",
        s.each_rps,
        s.measure.as_secs_f64(),
        s.warmup.as_secs_f64(),
        WINDOW.as_secs_f64(),
    );
    out.push_str("  callers          without [inbound.retries]   with [inbound.retries]   retries rejected   first attempts\n");
    out.push_str(
        "                   measured (bound)            measured (bound)         (whole run)        refused\n",
    );
    for row in r.rows.iter().chain(std::iter::once(&r.quiet)) {
        let label = if std::ptr::eq(row, &r.quiet) {
            format!("1, quiet: {:.0}/s", row.rps)
        } else {
            row.callers.to_string()
        };
        out.push_str(&format!(
            "  {:<15}  {:>6.2}x   ({:.2}x)            {:>6.2}x   ({:.2}x)         {:<17}  {}\n",
            label,
            row.without.amplification(),
            row.predicted(false),
            row.with.amplification(),
            row.predicted(true),
            row.with.rejected,
            row.with.first_refused + row.without.first_refused,
        ));
    }
    out
}

fn measured_json(m: &Measured) -> Value {
    json!({
        "user_requests": m.requests,
        "app_calls": m.app_calls,
        "amplification": m.amplification(),
        "retries_rejected": m.rejected,
        "first_attempts_refused": m.first_refused,
    })
}

pub fn to_json(r: &FleetResult) -> Value {
    let row = |row: &Row| {
        json!({
            "callers": row.callers,
            "rps": row.rps,
            "without_inbound_budget": measured_json(&row.without),
            "with_inbound_budget": measured_json(&row.with),
            "predicted": { "without": row.predicted(false), "with": row.predicted(true) },
        })
    };
    json!({
        "scenario": "fleet",
        "caller_budget": { "ratio": CALLER_RATIO, "min_per_sec": CALLER_FLOOR, "window_s": WINDOW.as_secs_f64() },
        "inbound_budget": { "ratio": INBOUND_RATIO, "min_per_sec": INBOUND_FLOOR, "window_s": WINDOW.as_secs_f64() },
        "rows": r.rows.iter().map(row).collect::<Vec<_>>(),
        "quiet": row(&r.quiet),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arithmetic_of_the_fleet() {
        let row = |callers, rps| Row {
            callers,
            rps,
            without: Measured::default(),
            with: Measured::default(),
        };
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // A request a second from each caller: each may retry 0.1 × 1 + 1 = 1.1 a
        // second, whatever the size of the fleet.
        for n in [1, 20, 200, 1000] {
            assert!(near(row(n, n as f64).predicted(false), 2.1), "{n}");
        }
        // With the fleet budget, all of them together 0.05 × N + 5.
        assert!(near(row(1, 1.0).predicted(true), 2.1));
        assert!(near(row(20, 20.0).predicted(true), 1.3));
        assert!(near(row(200, 200.0).predicted(true), 1.075));
        assert!(near(row(1000, 1000.0).predicted(true), 1.055));
        // A quiet caller: 2 requests/s want 4 retries/s; its budget allows 1.2.
        assert!(near(row(1, 2.0).predicted(true), 1.6));
    }

    #[test]
    fn the_configs_are_valid() {
        let a: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap_or_else(|_| unreachable!());
        for text in [
            inbound_config(a, true),
            inbound_config(a, false),
            caller_config(a),
        ] {
            parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
    }
}
