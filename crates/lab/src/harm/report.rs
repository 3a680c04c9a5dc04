//! The harm scenario's table for people and its JSON for machines.

use std::time::Duration;

use serde_json::{Value, json};

use super::verdict::{Figures, Verdict, Z_99};
use super::{HarmRun, RowResult};

fn fmt_ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2}ms")
    } else if ms < 1000.0 {
        format!("{ms:.0}ms")
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}

fn pct(f: &Figures) -> String {
    format!("{:.1}%", f.success() * 100.0)
}

/// The failures a column met, the commonest first.
fn failures(f: &Figures, at_most: usize) -> String {
    let mut parts: Vec<String> = f
        .failures
        .iter()
        .take(at_most)
        .map(|(what, n)| format!("{n} x {what}"))
        .collect();
    if f.failures.len() > at_most {
        parts.push("...".into());
    }
    parts.join(", ")
}

/// `text` in lines of at most `width`, each after `indent`.
fn wrap(text: &str, indent: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent.len() + line.len() + 1 + word.len() > width {
            out.push_str(&format!("{indent}{line}\n"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&format!("{indent}{line}\n"));
    }
    out
}

const INTRO: &str = "\
The same calls, at the same time, against the same upstream process: straight to it (direct: no
proxy at all, the same client, which sends each call once), and through tollgate at its defaults
(retries on: empty [retry] and [budget] sections, every key at its default) plus the row's
feature. Success: a 200 with its whole body. The upstream draws each call's fate (latency,
failure) from the call's number, so direct and tollgate meet the same luck; a retry draws anew.
WORSE: success below direct's (or, in a feature's row, below tollgate's without it) beyond noise,
a one-sided two-proportion z-test at 99% (z > 2.33), or more upstream calls than the first
attempts plus what the budget allows. trade: an opt-in feature that trades success for
protection, judged by its documented purpose. +p50/hop: the median added per tollgate hop, over
the calls both sides served at the first attempt.
";

fn row_block(out: &mut String, n: usize, r: &RowResult) {
    out.push_str(&format!("  {n:>2} {}: {}\n", r.row.key, r.row.what));
    if let Some(note) = r.row.note {
        out.push_str(&wrap(note, "       ", 100));
    }
    if let Some(why) = &r.skipped {
        out.push_str(&format!("       skipped: {why}\n\n"));
        return;
    }
    let w = r
        .row
        .columns
        .iter()
        .map(|c| c.title.len())
        .max()
        .unwrap_or(0)
        .max(6);
    out.push_str(&format!(
        "       {:<w$}  {:>8}  {:>7}  {:>8}  {:>8}  {:>9}  {:>9}  verdict\n",
        "column", "requests", "success", "p50", "p99", "calls/req", "+p50/hop"
    ));
    for ((c, f), v) in r.row.columns.iter().zip(&r.figures).zip(&r.verdicts) {
        let overhead = f.overhead_per_hop.map_or(String::new(), fmt_ms);
        let line = format!(
            "       {:<w$}  {:>8}  {:>7}  {:>8}  {:>8}  {:>9.2}  {:>9}  {}",
            c.title,
            f.requests,
            pct(f),
            fmt_ms(f.p50),
            fmt_ms(f.p99),
            f.calls_per_request(),
            overhead,
            v.word()
        );
        out.push_str(line.trim_end());
        out.push('\n');
        match v {
            Verdict::Worse(_) | Verdict::Trade { .. } => {
                out.push_str(&format!("           {}\n", v.explain()));
            }
            Verdict::Direct | Verdict::Ok => {}
        }
        if f.succeeded < f.requests {
            out.push_str(&format!("           failed: {}\n", failures(f, 3)));
        }
    }
    if let Some(shown) = &r.shown {
        out.push_str(&wrap(shown, "       ", 100));
    }
    out.push('\n');
}

/// The whole table: every row's block, then a summary.
pub fn table(run: &HarmRun) -> String {
    let mut out = format!(
        "tollgate lab: harm{}\n{INTRO}\n",
        if run.short { " (short)" } else { "" }
    );
    for (i, r) in run.rows.iter().enumerate() {
        row_block(&mut out, i + 1, r);
    }
    out.push_str("  summary: success, direct and through each path\n");
    let w = run.rows.iter().map(|r| r.row.key.len()).max().unwrap_or(0);
    for r in &run.rows {
        let mut line = format!("    {:<w$}  {:<8}", r.row.key, r.verdict_word());
        if r.skipped.is_none() {
            for (c, f) in r.row.columns.iter().zip(&r.figures) {
                line.push_str(&format!("  {} {:>6}", c.key, pct(f)));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let overheads: Vec<(&str, Duration)> = run
        .rows
        .iter()
        .flat_map(|r| {
            r.figures
                .iter()
                .filter_map(move |f| f.overhead_per_hop.map(|d| (r.row.key, d)))
        })
        .collect();
    if !overheads.is_empty() {
        let mut sorted: Vec<Duration> = overheads.iter().map(|(_, d)| *d).collect();
        sorted.sort();
        let median = sorted[sorted.len() / 2];
        let healthy = overheads
            .iter()
            .find(|(k, _)| *k == "healthy")
            .map_or(String::new(), |(_, d)| {
                format!("{} in the healthy row, ", fmt_ms(*d))
            });
        let (row, most) = overheads
            .iter()
            .max_by_key(|(_, d)| *d)
            .copied()
            .unwrap_or(("", Duration::ZERO));
        out.push_str(&format!(
            "\n  p50 overhead per hop, calls served at the first attempt (target under 1 ms): {healthy}\
             median {} over every column, most {} ({row})\n",
            fmt_ms(median),
            fmt_ms(most)
        ));
    }
    let worse = run.worse();
    let skipped: Vec<&str> = run
        .rows
        .iter()
        .filter(|r| r.skipped.is_some())
        .map(|r| r.row.key)
        .collect();
    if !skipped.is_empty() {
        out.push_str(&format!("  skipped: {}\n", skipped.join(", ")));
    }
    if worse.is_empty() {
        out.push_str(&format!(
            "  no row WORSE: tollgate did no harm in {} rows\n",
            run.rows.len() - skipped.len()
        ));
    } else {
        out.push_str(&format!(
            "  WORSE in {} of {} rows: {}\n",
            worse.len(),
            run.rows.len() - skipped.len(),
            worse.join(", ")
        ));
    }
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn verdict_json(v: &Verdict) -> Value {
    match v {
        Verdict::Direct => Value::Null,
        Verdict::Ok => json!({ "verdict": "ok" }),
        Verdict::Worse(why) => json!({ "verdict": "WORSE", "why": why }),
        Verdict::Trade {
            purpose,
            held,
            shown,
        } => json!({
            "verdict": "trade",
            "purpose": purpose.describe(),
            "held": held,
            "shown": shown,
        }),
    }
}

fn row_json(r: &RowResult) -> Value {
    let t = &r.row.traffic;
    let columns: Vec<Value> = r
        .row
        .columns
        .iter()
        .zip(&r.figures)
        .zip(&r.verdicts)
        .map(|((c, f), v)| {
            json!({
                "key": c.key,
                "title": c.title,
                "hops": c.path.hops(),
                "requests": f.requests,
                "succeeded": f.succeeded,
                "success_rate": f.success(),
                "p50_ms": ms(f.p50),
                "p99_ms": ms(f.p99),
                "upstream_calls": f.calls,
                "upstream_retries": f.retried,
                "calls_per_request": f.calls_per_request(),
                "overhead_per_hop_ms": f.overhead_per_hop.map(ms),
                "failures": f.failures.iter().map(|(w, n)| json!({ "what": w, "count": n })).collect::<Vec<_>>(),
                "judged_against": c.against.iter().map(|&j| r.row.columns[j].key).collect::<Vec<_>>(),
                "verdict": verdict_json(v),
            })
        })
        .collect();
    json!({
        "key": r.row.key,
        "what": r.row.what,
        "note": r.row.note,
        "verdict": r.verdict_word(),
        "skipped": r.skipped,
        "shown": r.shown,
        "traffic": {
            "requests": t.requests(),
            "steps": t.steps.iter().map(|(rps, d)| json!({ "rps": rps, "seconds": d.as_secs_f64() })).collect::<Vec<_>>(),
            "deadline_ms": t.deadline.map(ms),
            "patience_ms": ms(t.patience),
            "post": t.post,
            "urls": format!("{:?}", t.urls),
        },
        "columns": columns,
    })
}

pub fn to_json(run: &HarmRun) -> Value {
    json!({
        "scenario": "harm",
        "short": run.short,
        "test": { "kind": "one-sided two-proportion z-test", "confidence": 0.99, "z_critical": Z_99 },
        "open_files_limit": run.open_files,
        "rows": run.rows.iter().map(row_json).collect::<Vec<_>>(),
        "worse": run.worse(),
    })
}
