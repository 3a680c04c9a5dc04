//! `tollgate lab` and `tollgate sim`.
//!
//! The lab builds a real HTTP chain on loopback inside this process: open-loop load ->
//! edge -> api -> backend, where edge and api are real tollgate proxies (the same code
//! as `run`, on their own ports) and the backend is a degraded HTTP server. Each
//! scenario runs such chains side by side, at the same time, against identical
//! backends: for the retry storms one configured naively and one the way tollgate
//! recommends, for the endpoint scenarios the owned chain without and with the feature
//! at stake. Amplification is measured at the backends.
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

use backend::{Backend, Silent};
use load::Live;
use report::{ChainResult, Proxy};
use scenario::{Column, Overrides, Scenario};

/// Arguments of `tollgate lab`.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Scenario: storm (the published experiment), brownout, dip, down, hedge,
    /// blackhole; fleet (many callers and the inbound side's budget), overload (the
    /// adaptive limit).
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
    api: crate::run::Running,
    edge: crate::run::Running,
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
        crate::config::parse("lab.toml", &text, Path::new(".")).map_err(|e| setup(&e))
    };
    let api_config = scenario::api_config(column.chain, &endpoints, s);
    let api = crate::run::Running::start(parse(api_config)?, None)
        .await
        .map_err(|e| setup(&e))?;
    let edge_config = scenario::edge_config(column.chain, api.server.local_addr(), s);
    let edge = crate::run::Running::start(parse(edge_config)?, None)
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
        let total = s.load.duration;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let t = start.elapsed().min(total);
                let frac = t.as_secs_f64() / total.as_secs_f64();
                let filled = (frac * 30.0) as usize;
                let mut line = format!(
                    "\r  [{}{}] {:>4.1}s ",
                    "#".repeat(filled),
                    ".".repeat(30 - filled),
                    t.as_secs_f64()
                );
                for (key, counters, live) in &watched {
                    let sent = live.sent.load(Relaxed).max(1);
                    let amp = counters.total.load(Relaxed) as f64 / sent as f64;
                    let ok = live.ok.load(Relaxed) as f64 / live.done.load(Relaxed).max(1) as f64;
                    line.push_str(&format!(" {key} {amp:>5.2}x {:>5.1}% ok ", ok * 100.0));
                }
                eprint!("{line}");
                let _ = std::io::stderr().flush();
            }
        })
    });
    let loads = rigs.iter().zip(&lives).map(|(r, live)| {
        load::run(
            r.edge.server.local_addr(),
            s.load.clone(),
            start,
            live.clone(),
        )
    });
    let records = futures_join_all(loads).await;
    if let Some(t) = ticker {
        t.abort();
        eprintln!();
    }
    let mut chains = Vec::new();
    for (rig, records) in rigs.into_iter().zip(records) {
        let counters = &rig.backend.counters;
        let arrivals: Vec<u64> = counters.arrivals.iter().map(|a| a.load(Relaxed)).collect();
        let backend = report::BackendCounts {
            calls: counters.total.load(Relaxed),
            abandoned: counters.abandoned.load(Relaxed),
            silent_connections: rig.silent.iter().map(|q| q.accepted.load(Relaxed)).sum(),
        };
        let proxy = Proxy::read(&rig.api.server.shared().metrics.encode(), "backend");
        let (key, title) = (rig.column.key, rig.column.title);
        chains.push(ChainResult::build(
            (key, title),
            &records,
            &arrivals,
            backend,
            proxy,
            &s,
        ));
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

/// Runs the futures concurrently on this task and returns their outputs in order.
async fn futures_join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.map(|f| Some(Box::pin(f))).collect();
    let mut out: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (slot, result) in pending.iter_mut().zip(out.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        *result = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
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
            "running {} chains side by side for {:.0}s ...",
            s.columns.len(),
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
        let svg = plot::svg(&result.scenario, &result.chains);
        if let Err(e) = std::fs::write(path, svg) {
            eprintln!("tollgate lab: cannot write {}: {e}", path.display());
            return 1;
        }
    }
    let mut out = if args.json {
        let v = report::to_json(&result.scenario, &result.chains);
        serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
    } else {
        report::table(&result.scenario, &result.chains)
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
