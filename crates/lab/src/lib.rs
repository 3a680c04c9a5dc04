//! `tollgate lab` and `tollgate sim`.
//!
//! The lab builds a real HTTP chain on loopback inside this process: open-loop load ->
//! edge -> api -> backend, where edge and api are real tollgate proxies (the same code
//! as `run`, on their own ports) and the backend is a degraded HTTP server. Each
//! scenario runs such chains side by side, at the same time, against identical
//! backends of their own: for the retry storms one configured naively, one the way
//! tollgate recommends with a fixed budget, and the same with an adaptive budget and
//! with the throttle of first attempts on top; for the endpoint scenarios the owned
//! chain without and with the feature at stake ([`scenario::Column`]). Amplification is
//! measured at the backends. [`fleet`], [`overload`] and [`apps`] are scenarios of
//! their own around the inbound side.
//!
//! The simulator ([`sim`]) replays the published tick model on a virtual clock, driving
//! tollgate's own budget and backoff types.

pub mod apps;
pub mod backend;
pub mod fleet;
pub mod harm;
pub mod load;
pub mod overload;
pub mod payments;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod sim_fleet;

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::time::Instant;

use backend::{Backend, Silent};
use load::Live;
use report::{ChainResult, Proxy};
use scenario::{Chain, Column, Overrides, Scenario};

/// Arguments of `tollgate lab`.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Scenario: storm (the published experiment), brownout, dip, down, dead, hedge,
    /// blackhole; fleet (many callers and the inbound side's budget), overload (the
    /// adaptive limit), payments (POSTs over a lossy link: retries, duplicates and
    /// exactly once), apps (ownership through the app: an app between two tollgates);
    /// harm (direct vs through tollgate, row after row: does it do no harm?).
    #[arg(long, default_value = "storm")]
    pub scenario: String,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG time series (load offered to the backend, successes) to this file.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Run length in seconds (the scenario's episodes are scaled to fit).
    #[arg(long)]
    pub duration: Option<f64>,
    /// User requests per second (fleet: from each caller).
    #[arg(long)]
    pub rps: Option<f64>,
    /// The backend's base error rate, 0..=1 (payments: the share of answers the links
    /// lose).
    #[arg(long)]
    pub error_rate: Option<f64>,
    /// fleet: the numbers of callers to run, e.g. 1,20,200,1000 (at most 1000).
    #[arg(long, value_delimiter = ',')]
    pub callers: Option<Vec<usize>>,
    /// The chains to run side by side, comma-separated, by their names in `--json`
    /// (default: all of the scenario's; the retry storms have naive, owned, adaptive,
    /// throttled).
    #[arg(long, value_delimiter = ',')]
    pub chains: Vec<String>,
    /// harm: the short set of rows (the one CI runs).
    #[arg(long)]
    pub short: bool,
    /// harm: only these rows, by key, e.g. slow-700ms,replica-dead.
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
}

/// Arguments of `tollgate sim`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How long the capacity dip lasts, in ticks of 100 ms (the published model: 20).
    #[arg(long, default_value_t = sim::DIP_TICKS)]
    pub dip_ticks: usize,
    /// The lab's fleet instead (`tollgate lab --scenario fleet`): many callers, each
    /// with its own budget, against one inbound side's fleet budget.
    #[arg(long)]
    pub fleet: bool,
    /// --fleet: the numbers of callers, e.g. 1,20,200,1000,10000.
    #[arg(long, value_delimiter = ',')]
    pub callers: Option<Vec<usize>>,
    /// --fleet: each caller's requests a second.
    #[arg(long, default_value_t = 1.0)]
    pub rps: f64,
}

/// Every chain's results for one scenario, in the scenario's order.
pub struct LabRun {
    pub scenario: Scenario,
    pub chains: Vec<ChainResult>,
}

impl LabRun {
    /// The chain called `key` (`"naive"`, `"owned"`, `"hedged"`, ...).
    pub fn chain(&self, key: &str) -> Option<&ChainResult> {
        self.chains.iter().find(|c| c.key == key)
    }
}

struct ChainRig {
    column: Column,
    backend: Backend,
    silent: Vec<Silent>,
    api: tollgate_core::run::Running,
    edge: tollgate_core::run::Running,
}

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("lab setup failed: {0}")]
    Setup(String),
}

async fn rig(column: Column, s: &Scenario, start: Instant) -> Result<ChainRig, LabError> {
    let setup = |e: &dyn std::fmt::Display| LabError::Setup(e.to_string());
    let run_for = s.load.duration + s.load.patience + Duration::from_secs(2);
    let backend = Backend::start(s.backend.clone(), run_for, start, column.endpoints)
        .await
        .map_err(|e| setup(&e))?;
    let mut silent = Vec::new();
    for _ in 0..column.silent {
        silent.push(Silent::start().await.map_err(|e| setup(&e))?);
    }
    // The silent endpoint first: round-robin starts there.
    let endpoints: Vec<_> = silent
        .iter()
        .map(|q| q.addr)
        .chain(backend.addrs.iter().copied())
        .collect();
    let parse = |text: String| {
        tollgate_core::config::parse("lab.toml", &text, Path::new(".")).map_err(|e| setup(&e))
    };
    let api_config = scenario::api_config(column.chain, &endpoints, s);
    let api = tollgate_core::run::Running::start(parse(api_config)?, None)
        .await
        .map_err(|e| setup(&e))?;
    let edge_config = scenario::edge_config(column.chain, api.server.local_addr(), s);
    let edge = tollgate_core::run::Running::start(parse(edge_config)?, None)
        .await
        .map_err(|e| setup(&e))?;
    Ok(ChainRig {
        column,
        backend,
        silent,
        api,
        edge,
    })
}

/// Runs the columns of `s` whose chain is one of `chains`, side by side; `progress`
/// draws a bar on stderr.
pub async fn run_chains(
    mut s: Scenario,
    chains: &[Chain],
    progress: bool,
) -> Result<LabRun, LabError> {
    s.columns.retain(|c| chains.contains(&c.chain));
    run(s, progress).await
}

/// Runs the chains of `s` side by side; `progress` draws a bar on stderr.
pub async fn run(s: Scenario, progress: bool) -> Result<LabRun, LabError> {
    let start = Instant::now() + Duration::from_millis(300);
    let mut rigs = Vec::new();
    for column in &s.columns {
        rigs.push(rig(*column, &s, start).await?);
    }
    let lives: Vec<Arc<Live>> = rigs.iter().map(|_| Arc::new(Live::default())).collect();
    let ticker = progress.then(|| {
        let watched: Vec<_> = rigs
            .iter()
            .zip(&lives)
            .map(|(r, l)| (r.column.key, r.backend.counters.clone(), l.clone()))
            .collect();
        tokio::spawn(show_progress(watched, start, s.load.duration))
    });
    let samplers: Vec<_> = rigs
        .iter()
        .map(|r| tokio::spawn(sample_api(r.api.server.clone(), start, s.load.duration)))
        .collect();
    let loads = rigs.iter().zip(&lives).map(|(r, live)| {
        load::run(
            r.edge.server.local_addr(),
            s.load.clone(),
            start,
            live.clone(),
        )
    });
    let records = join_loads(loads).await;
    if let Some(t) = ticker {
        t.abort();
        if std::io::stderr().is_terminal() {
            eprintln!();
        }
    }
    let mut chains = Vec::new();
    for ((rig, records), sampler) in rigs.into_iter().zip(records).zip(samplers) {
        let counters = &rig.backend.counters;
        let arrivals: Vec<u64> = counters.arrivals.iter().map(|a| a.load(Relaxed)).collect();
        let backend = report::BackendCounts {
            calls: counters.total.load(Relaxed),
            abandoned: counters.abandoned.load(Relaxed),
            silent_connections: rig.silent.iter().map(|q| q.accepted.load(Relaxed)).sum(),
        };
        let proxy = Proxy::read(&rig.api.server.shared().metrics().encode(), "backend");
        let (key, title) = (rig.column.key, rig.column.title);
        let mut result = ChainResult::build((key, title), &records, &arrivals, backend, proxy, &s);
        (result.share, result.throttle) = sampler.await.unwrap_or_default();
        chains.push(result);
        rig.edge.shutdown(Duration::ZERO).await;
        rig.api.shutdown(Duration::ZERO).await;
        rig.backend.stop().await;
        for q in rig.silent {
            q.stop();
        }
    }
    Ok(LabRun {
        scenario: s,
        chains,
    })
}

/// Once a second, what the api hop has learnt about the backend: its budget's share
/// and its throttle's probability of rejecting a first attempt.
async fn sample_api(
    api: Arc<tollgate_core::sides::Server>,
    start: Instant,
    duration: Duration,
) -> (Vec<f64>, Vec<f64>) {
    let (mut share, mut throttle) = (Vec::new(), Vec::new());
    let mut at = start + Duration::from_millis(500);
    while at < start + duration {
        tokio::time::sleep_until(at).await;
        let snap = api.shared().snapshot();
        if let Some(up) = snap.upstreams.first() {
            share.push(up.budget().share());
            throttle.push(up.throttle().map_or(0.0, |t| t.probability(at)));
        }
        at += Duration::from_secs(1);
    }
    (share, throttle)
}

/// Every load at once, each on its own task; the records in the order given.
async fn join_loads(
    loads: impl Iterator<Item = impl Future<Output = Vec<load::Record>> + Send + 'static>,
) -> Vec<Vec<load::Record>> {
    let handles: Vec<_> = loads.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap_or_default());
    }
    out
}

/// The progress line on stderr: time, and per chain the amplification and successes
/// so far; redrawn in place on a terminal, else a line every 2 s.
async fn show_progress(
    watched: Vec<(&'static str, Arc<backend::Counters>, Arc<Live>)>,
    start: Instant,
    total: Duration,
) {
    let terminal = std::io::stderr().is_terminal();
    let every = if terminal {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(2)
    };
    loop {
        tokio::time::sleep(every).await;
        let t = start.elapsed().min(total);
        let frac = t.as_secs_f64() / total.as_secs_f64();
        let filled = (frac * 20.0) as usize;
        let mut line = format!(
            "\r  [{}{}] {:>4.1}s",
            "#".repeat(filled),
            ".".repeat(20 - filled),
            t.as_secs_f64()
        );
        for (key, counters, live) in &watched {
            let sent = live.sent.load(Relaxed).max(1);
            let amp = counters.total.load(Relaxed) as f64 / sent as f64;
            let ok = live.ok.load(Relaxed) as f64 / live.done.load(Relaxed).max(1) as f64;
            line.push_str(&format!("  {key} {amp:>4.2}x {:>5.1}%", ok * 100.0));
        }
        if terminal {
            eprint!("{line} ");
        } else {
            eprintln!("{}", line.trim_start_matches('\r'));
        }
        let _ = std::io::stderr().flush();
    }
}

/// Runs a scenario on a runtime of its own, `work` told whether to show progress (on a
/// terminal, without `--json`); `None` once it has said why the scenario could not run.
fn run_scenario<R, F>(args: &LabArgs, work: impl FnOnce(bool) -> F) -> Option<R>
where
    F: Future<Output = Result<R, LabError>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
        .enable_all()
        .build();
    // Always said while it runs (the table comes only at the end): redrawn in place on
    // a terminal, a line every few seconds into a log. Not with --json.
    let progress = !args.json;
    match rt
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(work(progress)).map_err(|e| e.to_string()))
    {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("tollgate lab: {e}");
            None
        }
    }
}

/// A scenario's report: one JSON object with `--json`, else its table.
fn report_text(
    args: &LabArgs,
    json: impl FnOnce() -> serde_json::Value,
    table: impl FnOnce() -> String,
) -> String {
    if args.json {
        serde_json::to_string_pretty(&json()).unwrap_or_default() + "\n"
    } else {
        table()
    }
}

/// The inbound side's scenarios, which are not two chains side by side.
fn inbound_scenario(args: &LabArgs) -> Option<i32> {
    let name = args.scenario.as_str();
    if name != "fleet" && name != "overload" && name != "apps" {
        return None;
    }
    if args.plot.is_some() || args.error_rate.is_some() {
        eprintln!("tollgate lab: --plot and --error-rate are not for the {name} scenario");
        return Some(2);
    }
    let out = if name == "apps" {
        run_scenario(args, |progress| {
            apps::run(apps::AppsSpec::default(), progress)
        })
        .map(|r| report_text(args, || apps::to_json(&r), || apps::table(&r)))
    } else if name == "fleet" {
        let mut spec = fleet::FleetSpec::default();
        if let Some(c) = args.callers.clone() {
            if c.is_empty() || c.iter().any(|n| !(1..=fleet::MAX_CALLERS).contains(n)) {
                eprintln!(
                    "tollgate lab: --callers takes numbers from 1 to {}",
                    fleet::MAX_CALLERS
                );
                return Some(2);
            }
            spec.callers = c;
        }
        if let Some(r) = args.rps {
            spec.each_rps = r;
        }
        if let Some(d) = args.duration {
            spec.measure = Duration::from_secs_f64(d);
        }
        run_scenario(args, |progress| fleet::run(spec, progress))
            .map(|r| report_text(args, || fleet::to_json(&r), || fleet::table(&r)))
    } else {
        let mut spec = overload::OverloadSpec::default();
        if let Some(d) = args.duration {
            spec.duration = Duration::from_secs_f64(d).max(spec.warmup + Duration::from_secs(1));
        }
        run_scenario(args, |progress| overload::run(spec, progress))
            .map(|r| report_text(args, || overload::to_json(&r), || overload::table(&r)))
    };
    let Some(text) = out else {
        return Some(1);
    };
    tollgate_core::print::stdout(&text);
    Some(0)
}

/// Runs `tollgate lab`; returns the exit code.
pub fn lab_main(args: LabArgs) -> i32 {
    let overrides = Overrides {
        duration: args.duration.map(Duration::from_secs_f64),
        rps: args.rps,
        error_rate: args.error_rate,
    };
    if let Some(d) = args.duration
        && !(d.is_finite() && d >= 1.0)
    {
        eprintln!("tollgate lab: --duration must be at least 1 second");
        return 2;
    }
    if args
        .rps
        .is_some_and(|r| !(r.is_finite() && r > 0.0 && r <= 5000.0))
    {
        eprintln!("tollgate lab: --rps must be between 0 and 5000");
        return 2;
    }
    if args.error_rate.is_some_and(|e| !(0.0..=1.0).contains(&e)) {
        eprintln!("tollgate lab: --error-rate must be between 0 and 1");
        return 2;
    }
    if args.scenario == "harm" {
        return harm::harm_main(&args);
    }
    if args.short || !args.rows.is_empty() {
        eprintln!("tollgate lab: --short and --rows are for the harm scenario");
        return 2;
    }
    if args.scenario == "payments" {
        return payments::main(&args);
    }
    if let Some(code) = inbound_scenario(&args) {
        return code;
    }
    let Some(mut s) = scenario::scenario(&args.scenario, &overrides) else {
        eprintln!(
            "tollgate lab: unknown scenario `{}` (choose one of: {}, fleet, overload, payments, apps, harm)",
            args.scenario,
            scenario::NAMES.join(", ")
        );
        return 2;
    };
    if !choose(&mut s, &args.chains) {
        return 2;
    }
    let result = run_scenario(&args, |progress| {
        // The table printed at the end starts with the scenario's name and
        // description; while it runs, stderr only says how long that will be.
        if progress {
            tollgate_core::print::stderr_line(&format!(
                "running {} chains side by side for {:.0}s ...",
                s.columns.len(),
                s.load.duration.as_secs_f64()
            ));
        }
        run(s, progress)
    });
    let Some(result) = result else {
        return 1;
    };
    if let Some(path) = &args.plot {
        let svg = plot::svg(&result.scenario, &result.chains);
        if let Err(e) = std::fs::write(path, svg) {
            eprintln!("tollgate lab: cannot write {}: {e}", path.display());
            return 1;
        }
    }
    let mut out = report_text(
        &args,
        || report::to_json(&result.scenario, &result.chains),
        || report::table(&result.scenario, &result.chains),
    );
    if let Some(path) = args.plot.as_ref().filter(|_| !args.json) {
        out.push_str(&format!("\n  plot written to {}\n", path.display()));
    }
    tollgate_core::print::stdout(&out);
    0
}

/// Keeps the columns `--chains` names, in the scenario's order (all of them when it
/// names none); `false` after saying which name is unknown.
fn choose(s: &mut Scenario, names: &[String]) -> bool {
    if names.is_empty() {
        return true;
    }
    if let Some(name) = names
        .iter()
        .find(|n| !s.columns.iter().any(|c| c.key == n.trim()))
    {
        let keys: Vec<&str> = s.columns.iter().map(|c| c.key).collect();
        eprintln!(
            "tollgate lab: the {} scenario has no chain `{name}` (choose from: {})",
            s.name,
            keys.join(", ")
        );
        return false;
    }
    s.columns
        .retain(|c| names.iter().any(|n| n.trim() == c.key));
    true
}

/// Runs `tollgate sim --fleet`; returns the exit code.
fn sim_fleet_main(args: &SimArgs) -> i32 {
    let callers = args.callers.clone().unwrap_or(sim_fleet::CALLERS.to_vec());
    if callers.is_empty()
        || callers
            .iter()
            .any(|n| !(1..=sim_fleet::MAX_CALLERS).contains(n))
    {
        eprintln!(
            "tollgate sim: --callers takes numbers from 1 to {}",
            sim_fleet::MAX_CALLERS
        );
        return 2;
    }
    if !(args.rps > 0.0 && args.rps <= 100.0) {
        eprintln!(
            "tollgate sim: --rps (each caller's requests a second) must be above 0 and at most 100"
        );
        return 2;
    }
    let measure = Duration::from_secs(4);
    let rows = sim_fleet::fleet(&callers, args.rps, measure, args.seed);
    if args.json {
        let json = serde_json::to_string_pretty(&sim_fleet::to_json(&rows, args.rps, measure))
            .unwrap_or_default();
        tollgate_core::print::stdout(&(json + "\n"));
    } else {
        tollgate_core::print::stdout(&sim_fleet::table(&rows, args.rps, measure));
    }
    0
}

/// Runs `tollgate sim`; returns the exit code.
pub fn sim_main(args: SimArgs) -> i32 {
    if args.fleet {
        return sim_fleet_main(&args);
    }
    if !(1..=sim::MAX_DIP_TICKS).contains(&args.dip_ticks) {
        eprintln!(
            "tollgate sim: --dip-ticks must be from 1 to {}",
            sim::MAX_DIP_TICKS
        );
        return 2;
    }
    let results = sim::run_with_dip(args.seed, args.dip_ticks);
    if args.json {
        let json = serde_json::to_string_pretty(&sim::to_json(&results, args.dip_ticks))
            .unwrap_or_default();
        tollgate_core::print::stdout(&(json + "\n"));
    } else {
        tollgate_core::print::stdout(&sim::table(&results, args.dip_ticks));
    }
    0
}
