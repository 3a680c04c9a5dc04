//! `tollgate lab` and `tollgate sim`.
//!
//! The lab builds a real HTTP chain on loopback inside this process: open-loop load ->
//! edge -> api -> backend, where edge and api are real tollgate proxies (the same code
//! as `run`, on their own ports) and the backend is a degraded HTTP server. Each
//! scenario runs four such chains side by side, at the same time, against identical
//! backends of their own: one configured naively, one the way tollgate recommends with
//! a fixed budget, and the same with an adaptive budget and with the throttle of first
//! attempts on top ([`scenario::Chain`]). Amplification is measured at the backends.
//!
//! The simulator ([`sim`]) replays the published tick model on a virtual clock, driving
//! tollgate's own budget and backoff types.

pub mod backend;
pub mod load;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod sim;

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::time::Instant;

use backend::Backend;
use load::Live;
use report::ChainResult;
use scenario::{Chain, Overrides, Scenario};

/// Arguments of `tollgate lab`.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Scenario: storm (the published experiment), brownout, dip, down.
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
    /// User requests per second.
    #[arg(long)]
    pub rps: Option<f64>,
    /// The backend's base error rate, 0..=1.
    #[arg(long)]
    pub error_rate: Option<f64>,
    /// The chains to run side by side, comma-separated: naive, owned, adaptive,
    /// throttled (default: all four).
    #[arg(long, value_delimiter = ',')]
    pub chains: Vec<String>,
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
}

/// The results of the chains of one scenario.
pub struct LabRun {
    pub scenario: Scenario,
    /// In the order of [`Chain::ALL`].
    pub chains: Vec<ChainResult>,
}

impl LabRun {
    /// The results of `chain`, if it ran.
    pub fn chain(&self, chain: Chain) -> Option<&ChainResult> {
        self.chains.iter().find(|c| c.chain == chain.as_str())
    }

    fn all(&self) -> Vec<&ChainResult> {
        self.chains.iter().collect()
    }
}

struct ChainRig {
    backend: Backend,
    api: crate::run::Running,
    edge: crate::run::Running,
}

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("lab setup failed: {0}")]
    Setup(String),
}

async fn rig(chain: Chain, s: &Scenario, start: Instant) -> Result<ChainRig, LabError> {
    let run_for = s.load.duration + s.load.patience + Duration::from_secs(2);
    let backend = Backend::start(s.backend.clone(), run_for, start)
        .await
        .map_err(|e| LabError::Setup(e.to_string()))?;
    let parse = |text: String| {
        crate::config::parse("lab.toml", &text, Path::new("."))
            .map_err(|e| LabError::Setup(e.to_string()))
    };
    let api =
        crate::run::Running::start(parse(scenario::api_config(chain, backend.addr, s))?, None)
            .await
            .map_err(|e| LabError::Setup(e.to_string()))?;
    let edge = crate::run::Running::start(
        parse(scenario::edge_config(chain, api.server.local_addr(), s))?,
        None,
    )
    .await
    .map_err(|e| LabError::Setup(e.to_string()))?;
    Ok(ChainRig { backend, api, edge })
}

/// Runs every chain of `s` side by side; `progress` draws a bar on stderr.
pub async fn run(s: Scenario, progress: bool) -> Result<LabRun, LabError> {
    run_chains(s, &Chain::ALL, progress).await
}

/// Runs `chains` of `s` side by side; `progress` draws a bar on stderr.
pub async fn run_chains(s: Scenario, chains: &[Chain], progress: bool) -> Result<LabRun, LabError> {
    let start = Instant::now() + Duration::from_millis(300);
    let mut rigs = Vec::new();
    for chain in chains {
        rigs.push((*chain, rig(*chain, &s, start).await?));
    }
    let lives: Vec<Arc<Live>> = rigs.iter().map(|_| Arc::new(Live::default())).collect();
    let ticker = progress.then(|| {
        let watched: Vec<_> = rigs
            .iter()
            .zip(&lives)
            .map(|((c, r), l)| (*c, r.backend.counters.clone(), l.clone()))
            .collect();
        tokio::spawn(show_progress(watched, start, s.load.duration))
    });
    let samplers: Vec<_> = rigs
        .iter()
        .map(|(_, r)| tokio::spawn(sample_api(r.api.server.clone(), start, s.load.duration)))
        .collect();
    let loads = rigs.iter().zip(&lives).map(|((_, r), live)| {
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
        eprintln!();
    }
    let mut results = Vec::new();
    for (((chain, rig), records), sampler) in rigs.into_iter().zip(records).zip(samplers) {
        let arrivals: Vec<u64> = rig
            .backend
            .counters
            .arrivals
            .iter()
            .map(|a| a.load(Relaxed))
            .collect();
        let calls = rig.backend.counters.total.load(Relaxed);
        let mut result = ChainResult::build(chain.as_str(), &records, &arrivals, calls, &s);
        (result.share, result.throttle) = sampler.await.unwrap_or_default();
        results.push(result);
        rig.edge.shutdown(Duration::ZERO).await;
        rig.api.shutdown(Duration::ZERO).await;
        rig.backend.stop().await;
    }
    Ok(LabRun {
        chains: results,
        scenario: s,
    })
}

/// Once a second, what the api hop has learnt about the backend: its budget's share
/// and its throttle's probability of rejecting a first attempt.
async fn sample_api(
    api: Arc<crate::proxy::Server>,
    start: Instant,
    duration: Duration,
) -> (Vec<f64>, Vec<f64>) {
    let (mut share, mut throttle) = (Vec::new(), Vec::new());
    let mut at = start + Duration::from_millis(500);
    while at < start + duration {
        tokio::time::sleep_until(at).await;
        let snap = api.shared().snapshot();
        if let Some(up) = snap.upstreams.first() {
            share.push(up.budget.share());
            throttle.push(up.throttle.as_ref().map_or(0.0, |t| t.probability(at)));
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
/// so far.
async fn show_progress(
    watched: Vec<(Chain, Arc<backend::Counters>, Arc<Live>)>,
    start: Instant,
    total: Duration,
) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let t = start.elapsed().min(total);
        let frac = t.as_secs_f64() / total.as_secs_f64();
        let filled = (frac * 20.0) as usize;
        let mut line = format!(
            "\r  [{}{}] {:>4.1}s",
            "#".repeat(filled),
            ".".repeat(20 - filled),
            t.as_secs_f64()
        );
        for (chain, counters, live) in &watched {
            let sent = live.sent.load(Relaxed).max(1);
            let amp = counters.total.load(Relaxed) as f64 / sent as f64;
            let ok = live.ok.load(Relaxed) as f64 / live.done.load(Relaxed).max(1) as f64;
            line.push_str(&format!(
                "  {} {amp:>4.2}x {:>5.1}%",
                chain.as_str(),
                ok * 100.0
            ));
        }
        eprint!("{line} ");
        let _ = std::io::stderr().flush();
    }
}

fn lab_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
        .enable_all()
        .build()
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
    let Some(s) = scenario::scenario(&args.scenario, &overrides) else {
        eprintln!(
            "tollgate lab: unknown scenario `{}` (choose one of: {})",
            args.scenario,
            scenario::NAMES.join(", ")
        );
        return 2;
    };
    let rt = match lab_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate lab: {e}");
            return 1;
        }
    };
    // The table printed at the end starts with the scenario's name and description;
    // while it runs, stderr only says how long that will be.
    let Some(chains) = chosen(&args.chains) else {
        return 2;
    };
    let progress = !args.json && std::io::stderr().is_terminal();
    if progress {
        crate::print::stderr_line(&format!(
            "running {} chains side by side for {:.0}s ...",
            chains.len(),
            s.load.duration.as_secs_f64()
        ));
    }
    let result = match rt.block_on(run_chains(s, &chains, progress)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tollgate lab: {e}");
            return 1;
        }
    };
    if let Some(path) = &args.plot {
        let svg = plot::svg(&result.scenario, &result.all());
        if let Err(e) = std::fs::write(path, svg) {
            eprintln!("tollgate lab: cannot write {}: {e}", path.display());
            return 1;
        }
    }
    let mut out = if args.json {
        let v = report::to_json(&result.scenario, &result.all());
        serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
    } else {
        report::table(&result.scenario, &result.all())
    };
    if let Some(path) = args.plot.as_ref().filter(|_| !args.json) {
        out.push_str(&format!("\n  plot written to {}\n", path.display()));
    }
    crate::print::stdout(&out);
    0
}

/// The chains `--chains` names, in the order of [`Chain::ALL`] (all of them when it
/// names none); `None` after saying which name is unknown.
fn chosen(names: &[String]) -> Option<Vec<Chain>> {
    let mut chains = Vec::new();
    for name in names {
        match Chain::ALL.iter().find(|c| c.as_str() == name.trim()) {
            Some(c) => chains.push(*c),
            None => {
                eprintln!(
                    "tollgate lab: unknown chain `{name}` (choose from: naive, owned, adaptive, throttled)"
                );
                return None;
            }
        }
    }
    if chains.is_empty() {
        return Some(Chain::ALL.to_vec());
    }
    Some(
        Chain::ALL
            .into_iter()
            .filter(|c| chains.contains(c))
            .collect(),
    )
}

/// Runs `tollgate sim`; returns the exit code.
pub fn sim_main(args: SimArgs) -> i32 {
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
        crate::print::stdout(&(json + "\n"));
    } else {
        crate::print::stdout(&sim::table(&results, args.dip_ticks));
    }
    0
}
