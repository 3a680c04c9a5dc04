//! `tollgate lab` and `tollgate sim`.
//!
//! The lab builds a real HTTP chain on loopback inside this process: open-loop load ->
//! edge -> api -> backend, where edge and api are real tollgate proxies (the same code
//! as `run`, on their own ports) and the backend is a degraded HTTP server. Each
//! scenario runs two such chains side by side, at the same time, against two identical
//! backends: one configured naively, one the way tollgate recommends. Amplification is
//! measured at the backends.
//!
//! The simulator ([`sim`]) replays the published tick model on a virtual clock, driving
//! tollgate's own budget and backoff types.

pub mod backend;
pub mod fleet;
pub mod load;
pub mod overload;
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
    /// Scenario: storm (the published experiment), brownout, dip, down; fleet (many
    /// callers and the inbound side's budget), overload (the adaptive limit).
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
    /// fleet: the numbers of callers to run, e.g. 1,10,50.
    #[arg(long, value_delimiter = ',')]
    pub callers: Option<Vec<usize>>,
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
}

/// Both chains' results for one scenario.
pub struct LabRun {
    pub scenario: Scenario,
    pub naive: ChainResult,
    pub owned: ChainResult,
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

/// Runs both chains of `s` side by side; `progress` draws a bar on stderr.
pub async fn run(s: Scenario, progress: bool) -> Result<LabRun, LabError> {
    let start = Instant::now() + Duration::from_millis(300);
    let naive = rig(Chain::Naive, &s, start).await?;
    let owned = rig(Chain::Owned, &s, start).await?;
    let (live_n, live_o) = (Arc::new(Live::default()), Arc::new(Live::default()));
    let ticker = progress.then(|| {
        let (ln, lo) = (live_n.clone(), live_o.clone());
        let (cn, co) = (
            naive.backend.counters.clone(),
            owned.backend.counters.clone(),
        );
        let total = s.load.duration;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let t = start.elapsed().min(total);
                let frac = t.as_secs_f64() / total.as_secs_f64();
                let filled = (frac * 30.0) as usize;
                let amp = |calls: u64, l: &Live| {
                    let sent = l.sent.load(Relaxed).max(1);
                    (
                        calls as f64 / sent as f64,
                        l.ok.load(Relaxed) as f64 / l.done.load(Relaxed).max(1) as f64,
                    )
                };
                let (an, okn) = amp(cn.total.load(Relaxed), &ln);
                let (ao, oko) = amp(co.total.load(Relaxed), &lo);
                eprint!(
                    "\r  [{}{}] {:>4.1}s  naive {:>5.2}x {:>5.1}% ok   owned {:>5.2}x {:>5.1}% ok ",
                    "#".repeat(filled),
                    ".".repeat(30 - filled),
                    t.as_secs_f64(),
                    an,
                    okn * 100.0,
                    ao,
                    oko * 100.0
                );
                let _ = std::io::stderr().flush();
            }
        })
    });
    let edge_n = naive.edge.server.local_addr();
    let edge_o = owned.edge.server.local_addr();
    let (records_n, records_o) = tokio::join!(
        load::run(edge_n, s.load.clone(), start, live_n),
        load::run(edge_o, s.load.clone(), start, live_o),
    );
    if let Some(t) = ticker {
        t.abort();
        eprintln!();
    }
    let finish = |rig: ChainRig, records: Vec<load::Record>, name: &'static str, s: &Scenario| {
        let arrivals: Vec<u64> = rig
            .backend
            .counters
            .arrivals
            .iter()
            .map(|a| a.load(Relaxed))
            .collect();
        let calls = rig.backend.counters.total.load(Relaxed);
        (ChainResult::build(name, &records, &arrivals, calls, s), rig)
    };
    let (naive_result, naive) = finish(naive, records_n, "naive", &s);
    let (owned_result, owned) = finish(owned, records_o, "owned", &s);
    for rig in [naive, owned] {
        rig.edge.shutdown(Duration::ZERO).await;
        rig.api.shutdown(Duration::ZERO).await;
        rig.backend.stop().await;
    }
    Ok(LabRun {
        scenario: s,
        naive: naive_result,
        owned: owned_result,
    })
}

fn lab_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
        .enable_all()
        .build()
}

/// The inbound side's scenarios, which are not two chains side by side.
fn inbound_scenario(args: &LabArgs) -> Option<i32> {
    let name = args.scenario.as_str();
    if name != "fleet" && name != "overload" {
        return None;
    }
    if args.plot.is_some() || args.error_rate.is_some() {
        eprintln!("tollgate lab: --plot and --error-rate are not for the {name} scenario");
        return Some(2);
    }
    let rt = match lab_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate lab: {e}");
            return Some(1);
        }
    };
    let progress = !args.json && std::io::stderr().is_terminal();
    let out = if name == "fleet" {
        let mut spec = fleet::FleetSpec::default();
        if let Some(c) = args.callers.clone() {
            if c.is_empty() || c.iter().any(|n| !(1..=200).contains(n)) {
                eprintln!("tollgate lab: --callers takes numbers from 1 to 200");
                return Some(2);
            }
            spec.callers = c;
        }
        if let Some(r) = args.rps {
            spec.rps = r;
        }
        if let Some(d) = args.duration {
            spec.measure = Duration::from_secs_f64(d);
        }
        rt.block_on(fleet::run(spec, progress)).map(|r| {
            if args.json {
                serde_json::to_string_pretty(&fleet::to_json(&r)).unwrap_or_default() + "\n"
            } else {
                fleet::table(&r)
            }
        })
    } else {
        let mut spec = overload::OverloadSpec::default();
        if let Some(d) = args.duration {
            spec.duration = Duration::from_secs_f64(d).max(spec.warmup + Duration::from_secs(1));
        }
        rt.block_on(overload::run(spec, progress)).map(|r| {
            if args.json {
                serde_json::to_string_pretty(&overload::to_json(&r)).unwrap_or_default() + "\n"
            } else {
                overload::table(&r)
            }
        })
    };
    match out {
        Ok(text) => {
            crate::print::stdout(&text);
            Some(0)
        }
        Err(e) => {
            eprintln!("tollgate lab: {e}");
            Some(1)
        }
    }
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
    if let Some(code) = inbound_scenario(&args) {
        return code;
    }
    let Some(s) = scenario::scenario(&args.scenario, &overrides) else {
        eprintln!(
            "tollgate lab: unknown scenario `{}` (choose one of: {}, fleet, overload)",
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
    let progress = !args.json && std::io::stderr().is_terminal();
    if progress {
        crate::print::stderr_line(&format!(
            "running two chains side by side for {:.0}s ...",
            s.load.duration.as_secs_f64()
        ));
    }
    let result = match rt.block_on(run(s, progress)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tollgate lab: {e}");
            return 1;
        }
    };
    if let Some(path) = &args.plot {
        let svg = plot::svg(&result.scenario, &result.naive, &result.owned);
        if let Err(e) = std::fs::write(path, svg) {
            eprintln!("tollgate lab: cannot write {}: {e}", path.display());
            return 1;
        }
    }
    let mut out = if args.json {
        let v = report::to_json(&result.scenario, &result.naive, &result.owned);
        serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
    } else {
        report::table(&result.scenario, &result.naive, &result.owned)
    };
    if let Some(path) = args.plot.as_ref().filter(|_| !args.json) {
        out.push_str(&format!("\n  plot written to {}\n", path.display()));
    }
    crate::print::stdout(&out);
    0
}

/// Runs `tollgate sim`; returns the exit code.
pub fn sim_main(args: SimArgs) -> i32 {
    let results = sim::run_all(args.seed);
    if args.json {
        let json = serde_json::to_string_pretty(&sim::to_json(&results)).unwrap_or_default();
        crate::print::stdout(&(json + "\n"));
    } else {
        crate::print::stdout(&sim::table(&results));
    }
    0
}
