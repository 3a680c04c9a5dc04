//! `tollgate lab --scenario harm`: is a service better off with tollgate than without
//! it? Row after row of upstream behaviour and traffic, the same calls at the same time
//! against the same upstream process, straight to it and through tollgate at its
//! defaults (plus the row's feature), judged with a one-sided two-proportion z-test.
//!
//! - [`rows`]: what each row runs and what its columns are judged against;
//! - [`app`]: the upstream, bound by waiting rather than CPU, which draws each call's
//!   fate from the call's number so that every column meets the same luck;
//! - [`client`]: the app, the same HTTP client for every column, sending each call once
//!   on an open-loop schedule over repeated URLs;
//! - [`program`]: real client programs (Node's undici, Python's grpcio) as the app of
//!   a row, one process a column on the same schedule;
//! - [`rig`]: the real tollgate proxies (outbound, inbound sidecars) of each column;
//! - [`netns`]: the node of the rows about Kubernetes Services, network namespaces of
//!   their own; [`netns_row`]: one such row on it; [`netns_parts`]: what runs inside the
//!   namespaces; [`kube`]: the real API server of those with discovery;
//! - [`verdict`]: the figures, the test, the budget's bound and the trades' purposes;
//! - [`report`]: the table and the JSON.

pub mod app;
pub mod client;
pub mod kube;
pub mod netns;
pub mod netns_parts;
pub mod netns_row;
pub mod program;
pub mod report;
pub mod rig;
pub mod rows;
pub mod verdict;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::LabError;
use app::Latency;
use client::{Caller, Client};
use rows::{Path, Row};
use verdict::{Figures, Seen, Verdict};

/// What a run of the harm scenario runs.
#[derive(Clone, Debug, Default)]
pub struct HarmSpec {
    /// The short set ([`rows::SHORT`]).
    pub short: bool,
    /// Only these rows, by key (all of the set when empty).
    pub only: Vec<String>,
}

/// One row, measured.
#[derive(Clone, Debug)]
pub struct RowResult {
    pub row: Row,
    /// Per column, in the row's order.
    pub figures: Vec<Figures>,
    pub verdicts: Vec<Verdict>,
    /// Why the row did not run.
    pub skipped: Option<String>,
    /// What the row showed beyond the columns' figures (when a new pod took calls).
    pub shown: Option<String>,
}

impl RowResult {
    pub fn is_worse(&self) -> bool {
        self.verdicts.iter().any(Verdict::is_worse)
    }

    /// `WORSE` when a column is, else `trade` when it has one, else `ok`.
    pub fn verdict_word(&self) -> &'static str {
        if self.skipped.is_some() {
            "skipped"
        } else if self.is_worse() {
            "WORSE"
        } else if self
            .verdicts
            .iter()
            .any(|v| matches!(v, Verdict::Trade { .. }))
        {
            "trade"
        } else {
            "ok"
        }
    }
}

pub struct HarmRun {
    pub short: bool,
    /// The soft limit on open files the run had.
    pub open_files: Option<u64>,
    pub rows: Vec<RowResult>,
}

impl HarmRun {
    /// The keys of the rows where tollgate did harm.
    pub fn worse(&self) -> Vec<&'static str> {
        self.rows
            .iter()
            .filter(|r| r.is_worse())
            .map(|r| r.row.key)
            .collect()
    }
}

/// Descriptors a row holds at its peak, all in this one process: every call in
/// flight holds the client's socket and the upstream's, and two more per tollgate hop.
fn descriptors_needed(row: &Row) -> u64 {
    let peak_rps = row.traffic.steps.iter().map(|s| s.0).fold(0.0, f64::max);
    let hold = match (row.behaviour.stream, row.behaviour.latency) {
        (Some(d), _) | (None, Latency::Fixed(d)) => d.as_secs_f64(),
        _ => 0.5,
    };
    let calls = (peak_rps * hold).ceil() as u64;
    let per_call: u64 = row
        .columns
        .iter()
        .map(|c| 2 + 2 * u64::from(c.path.hops()))
        .sum();
    calls * per_call + 512
}

/// Raises the soft limit on open files to the hard one; the limit in force.
fn raise_open_files() -> Option<u64> {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    tollgate_core::descriptors::soft_limit()
}

/// Runs the rows of `spec`, one after another; `progress` says which on stderr.
pub async fn run(spec: HarmSpec, progress: bool) -> Result<HarmRun, LabError> {
    let open_files = raise_open_files();
    let mut rows = rows::rows(spec.short);
    if !spec.only.is_empty() {
        rows.retain(|r| spec.only.iter().any(|k| k.trim() == r.key));
    }
    let mut out = Vec::new();
    let total = rows.len();
    if rows
        .iter()
        .any(|r| r.service.is_some_and(|s| netns::can_run(s).is_ok()))
    {
        netns::clean_up_on_interrupt();
    }
    for (i, row) in rows.into_iter().enumerate() {
        if let Some(Err(why)) = row.service.map(netns::can_run) {
            out.push(RowResult {
                skipped: Some(why),
                shown: None,
                figures: Vec::new(),
                verdicts: Vec::new(),
                row,
            });
            continue;
        }
        let need = descriptors_needed(&row);
        if let Some(limit) = open_files.filter(|l| *l < need) {
            out.push(RowResult {
                shown: None,
                skipped: Some(format!(
                    "needs about {need} open files, the limit is {limit} (raise `ulimit -n`)"
                )),
                figures: Vec::new(),
                verdicts: Vec::new(),
                row,
            });
            continue;
        }
        if progress {
            tollgate_core::print::stderr_line(&format!(
                "  {}/{total} {} ({} calls a column, {:.0} s) ...",
                i + 1,
                row.key,
                row.traffic.requests(),
                row.traffic.duration().as_secs_f64()
            ));
        }
        out.push(run_row(row, i as u64 + 1).await?);
    }
    Ok(HarmRun {
        short: spec.short,
        open_files,
        rows: out,
    })
}

/// One row: its rig, the same plan sent down every column at once, and the verdicts.
pub async fn run_row(row: Row, seed: u64) -> Result<RowResult, LabError> {
    if let Some(shape) = row.service {
        return netns_row::run_row(row, shape, seed).await;
    }
    // Time to start the proxies (and a row's client programs) before the first call;
    // the upstream's clock (its outage) starts with the calls.
    let lead = match row.caller {
        Caller::Program(p) => {
            if let Err(why) = p.available().await {
                return Ok(RowResult {
                    row,
                    figures: Vec::new(),
                    verdicts: Vec::new(),
                    skipped: Some(why),
                    shown: None,
                });
            }
            program::LEAD
        }
        Caller::Lab | Caller::HalfClose => Duration::from_millis(500),
    };
    let start = Instant::now() + lead;
    let rig = rig::Rig::build(&row, seed, start).await?;
    let plan = Arc::new(row.traffic.plan(seed));
    let records = match row.caller {
        Caller::Program(p) => {
            match program::drive(p, &rig.targets, &plan, &row.traffic, start).await {
                Ok(r) => r,
                Err(e) => {
                    rig.stop().await;
                    return Err(e);
                }
            }
        }
        Caller::Lab | Caller::HalfClose => {
            let clients: Vec<Arc<Client>> = rig
                .targets
                .iter()
                .enumerate()
                .map(|(i, t)| Arc::new(Client::new(t.clone(), i, row.caller)))
                .collect();
            client::drive(clients, plan, Arc::new(row.traffic.clone()), start).await
        }
    };
    let counters = &rig.app.counters;
    let direct = records.first().map(Vec::as_slice);
    let figures: Vec<Figures> = row
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let seen = Seen {
                calls: counters.calls(i),
                retried: counters.retries(i),
                peak_waiting: counters.peak(i),
            };
            let paired = if c.path == Path::Direct { None } else { direct };
            Figures::build(&records[i], paired, c.path.hops(), seen)
        })
        .collect();
    rig.stop().await;
    let verdicts = (0..row.columns.len())
        .map(|i| verdict::judge(&row, i, &figures))
        .collect();
    Ok(RowResult {
        row,
        figures,
        verdicts,
        skipped: None,
        shown: None,
    })
}

/// Runs `tollgate lab --scenario harm`; the exit code: 0 when no row is WORSE, 1 when
/// one is (or the lab could not run), 2 for a bad flag.
pub fn harm_main(args: &super::LabArgs) -> i32 {
    if let Some(code) = netns_parts::part_main() {
        return code;
    }
    if args.plot.is_some()
        || args.duration.is_some()
        || args.rps.is_some()
        || args.error_rate.is_some()
        || args.callers.is_some()
        || !args.chains.is_empty()
    {
        eprintln!(
            "tollgate lab: the harm scenario takes --short, --rows and --json only (each row has its own load)"
        );
        return 2;
    }
    let known: Vec<&str> = rows::all().iter().map(|r| r.key).collect();
    if let Some(bad) = args.rows.iter().find(|k| !known.contains(&k.trim())) {
        eprintln!(
            "tollgate lab: the harm scenario has no row `{bad}` (choose from: {})",
            known.join(", ")
        );
        return 2;
    }
    let spec = HarmSpec {
        short: args.short,
        only: args.rows.clone(),
    };
    let Some(result) = super::run_scenario(args, |progress| run(spec, progress)) else {
        return 1;
    };
    tollgate_core::print::stdout(&super::report_text(
        args,
        || report::to_json(&result),
        || report::table(&result),
    ));
    if result.worse().is_empty() { 0 } else { 1 }
}
