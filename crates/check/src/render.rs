//! The text `tollgate check` prints: each file's verdict and its upstreams' figures,
//! every problem, the chain, and a one-line summary. Everything goes to stdout so that
//! `tollgate check | grep warning:` works.

use std::fmt::Write as _;

use super::chain::ChainReport;
use super::{ChainCheck, CheckedFile, EXIT_WARNINGS, Report};
use tollgate_core::config::figures::{
    attempts_that_fit, budget_cap, effective_patience, plain, total_backoff,
};
use tollgate_core::config::units::format_duration;
use tollgate_core::config::{InboundConfig, InflightLimit, UpstreamConfig};

impl Report {
    pub fn render(&self, strict: bool) -> String {
        let mut out = String::new();
        for file in &self.files {
            render_file(&mut out, file);
            out.push('\n');
        }
        match &self.chain {
            Some(ChainCheck::Analysed(chain)) => {
                render_chain(&mut out, chain);
                out.push('\n');
            }
            Some(ChainCheck::Skipped) => {
                out.push_str("chain: not analysed until every file of it is valid\n\n");
            }
            None => {}
        }
        let (errors, warnings) = (self.errors(), self.warnings());
        let files = plural(self.files.len(), "file", "files");
        let _ = match (errors, warnings) {
            (0, 0) => writeln!(out, "valid: {files}, no warnings"),
            (0, w) if strict => writeln!(
                out,
                "valid with {} (exit {EXIT_WARNINGS}: --strict)",
                plural(w, "warning", "warnings")
            ),
            (0, w) => writeln!(
                out,
                "valid with {} (--strict would exit {EXIT_WARNINGS})",
                plural(w, "warning", "warnings")
            ),
            (e, w) => writeln!(
                out,
                "invalid: {}, {} in {files}",
                plural(e, "error", "errors"),
                plural(w, "warning", "warnings")
            ),
        };
        out
    }
}

pub(super) fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn render_file(out: &mut String, file: &CheckedFile) {
    let config = match &file.config {
        Ok(config) => config,
        Err(errors) => {
            let _ = writeln!(
                out,
                "{}: invalid, {}",
                file.name,
                plural(errors.len(), "error", "errors")
            );
            for e in errors {
                let _ = writeln!(out, "{e}");
            }
            for w in &file.warnings {
                let _ = writeln!(out, "{w}");
            }
            return;
        }
    };
    let inbound = if config.inbound.is_some() {
        " and the inbound side"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "{}: valid, {}{inbound}",
        file.name,
        plural(config.upstreams.len(), "upstream", "upstreams")
    );
    for up in &config.upstreams {
        render_upstream(out, up);
    }
    if let Some(i) = &config.inbound {
        render_inbound(out, i);
    }
    for w in &file.warnings {
        let _ = writeln!(out, "{w}");
    }
}

fn render_upstream(out: &mut String, up: &UpstreamConfig) {
    let attempts = up.retry.max_attempts;
    let _ = writeln!(out, "  upstream {}", up.name);
    if attempts > 1 {
        let _ = writeln!(
            out,
            "    max_attempts  {attempts}: worst case {attempts}× the requests it receives, when every attempt fails"
        );
    } else {
        let _ = writeln!(out, "    max_attempts  1: retries off, 1×");
    }
    match &up.budget {
        _ if attempts == 1 => {}
        None => {
            let _ = writeln!(
                out,
                "    budget        none: only max_attempts caps retries, {attempts}× during an outage"
            );
        }
        Some(b) => {
            let cap = budget_cap(up).unwrap_or(f64::from(attempts));
            match b.adaptive_max() {
                None => {
                    let _ = writeln!(
                        out,
                        "    budget        {cap:.2}× in steady state: the lower of {attempts} and 1 + ratio {}",
                        b.ratio
                    );
                }
                Some(max) => {
                    let low = f64::from(attempts).min(1.0 + b.ratio);
                    let _ = writeln!(
                        out,
                        "    budget        {low:.2}× to {cap:.2}× in steady state: adapting between 1 + ratio {} and 1 + max_ratio {max} (never above {attempts})",
                        b.ratio
                    );
                    let _ = writeln!(
                        out,
                        "                  while retries keep failing the share falls below ratio and the floor is suspended"
                    );
                }
            }
            if b.min_per_sec > 0.0 && cap < f64::from(attempts) {
                let quiet = if b.ratio > 0.0 {
                    format!("below {} requests/s", short(b.min_per_sec / b.ratio))
                } else {
                    "at any rate".to_string()
                };
                let _ = writeln!(
                    out,
                    "                  {quiet} the floor of min_per_sec = {} retries/s allows more, up to {attempts}× on a quiet upstream",
                    b.min_per_sec
                );
            }
        }
    }
    if let Some(t) = &up.throttle {
        let _ = writeln!(
            out,
            "    throttle      first attempts rejected locally once fewer than {}% of requests are accepted over {} (k = {})",
            short(100.0 / t.k),
            format_duration(t.window),
            short(t.k)
        );
    }
    let retry = &up.retry;
    if let (false, Some(h)) = (
        retry.mint_idempotency_key.is_empty(),
        &retry.idempotency_header,
    ) {
        let methods: Vec<&str> = retry
            .mint_idempotency_key
            .iter()
            .map(|m| m.as_str())
            .collect();
        let _ = writeln!(
            out,
            "    keys          {h} minted for {} requests without one; after a failure that may have run, sent again only to an endpoint whose answers say x-tollgate-dedupe: on; header={h} (scope=replica: only back to that endpoint)",
            methods.join(", ")
        );
    }
    let _ = writeln!(out, "    patience      {}", patience(up));
}

/// How long a caller can wait on `up`, and how the timeouts shape it.
fn patience(up: &UpstreamConfig) -> String {
    let attempts = up.retry.max_attempts;
    let d = format_duration;
    let deadline = match up.request_timeout {
        Some(r) => format!("request_timeout {}", d(r)),
        None => "the caller's deadline, or as long as it takes when it sends none (no \
                 request_timeout)"
            .to_string(),
    };
    let Some((patience, attempt_timeout)) = up.total_patience().zip(up.attempt_timeout) else {
        return format!("each attempt runs to {deadline}");
    };
    let backoff = total_backoff(up);
    let verdict = match up.request_timeout {
        Some(r) if patience > r => {
            let fit = attempts_that_fit(up, r);
            let verb = if fit == 1 { "fits" } else { "fit" };
            format!("{fit} of {attempts} attempts {verb} in")
        }
        _ => "within".to_string(),
    };
    let how = if attempts > 1 {
        format!(
            "= {attempts} × {} + {} backoff",
            d(attempt_timeout),
            d(backoff)
        )
    } else {
        "for its one attempt, which runs on past attempt_timeout".to_string()
    };
    format!("{} {how}; {verdict} {deadline}", d(patience))
}

fn render_inbound(out: &mut String, i: &InboundConfig) {
    let _ = writeln!(out, "  inbound {} -> app {}", i.addr, i.app);
    match &i.retries {
        Some(b) => {
            let _ = writeln!(
                out,
                "    retries       one budget for every caller: {} of their first attempts + {} retries/s on this replica (× replicas for the fleet)",
                b.ratio, b.min_per_sec
            );
        }
        None => {
            let _ = writeln!(
                out,
                "    retries       no fleet budget: every caller's retries reach the app"
            );
        }
    }
    let limit = match i.max_inflight {
        InflightLimit::Adaptive => "adaptive, learned from the app's latency".to_string(),
        InflightLimit::Fixed(n) => format!("{n} at once"),
    };
    let _ = writeln!(out, "    max_inflight  {limit}; beyond it 503 overloaded");
    if let Some(d) = &i.dedupe {
        let methods: Vec<&str> = d.methods.iter().map(|m| m.as_str()).collect();
        let _ = writeln!(
            out,
            "    dedupe        keyed {} run once, answers kept {} in {}; while the store fails: {}",
            methods.join(", "),
            format_duration(d.ttl),
            d.store.describe(),
            d.on_store_error.as_str(),
        );
    }
    let _ = match i.request_timeout {
        Some(r) => writeln!(
            out,
            "    deadline      the caller's, at most request_timeout {}",
            format_duration(r)
        ),
        None => writeln!(
            out,
            "    deadline      the caller's, or none when it sends none (no request_timeout)"
        ),
    };
}

fn render_chain(out: &mut String, chain: &ChainReport) {
    let n = chain.layers.len();
    let _ = writeln!(
        out,
        "chain of {}, top first (each file a layer; its upstream calls the next one)",
        plural(n, "layer", "layers")
    );
    let width = chain.layers.iter().map(|l| l.file.len()).max().unwrap_or(0);
    for (i, layer) in chain.layers.iter().enumerate() {
        let _ = match &layer.upstream {
            Some(u) => writeln!(
                out,
                "  {:>2}  {:<width$}  upstream {:<12}  max_attempts {:<2}  attempt_timeout {:<7}  patience {}",
                i + 1,
                layer.file,
                u.name,
                u.retry.max_attempts,
                u.attempt_timeout
                    .map_or_else(|| "none".to_string(), format_duration),
                effective_patience(u).map_or_else(|| "deadline".to_string(), format_duration),
            ),
            None => writeln!(
                out,
                "  {:>2}  {:<width$}  (no upstream to the next layer)",
                i + 1,
                layer.file
            ),
        };
    }
    let factors: Vec<String> = chain
        .layers
        .iter()
        .map(|l| l.max_attempts().to_string())
        .collect();
    let retries: Vec<String> = chain
        .layers
        .iter()
        .map(|l| (l.max_attempts() - 1).to_string())
        .collect();
    let _ = writeln!(
        out,
        "  worst case at the bottom: {} = {}× (expected load: tollgate calc --retries {})",
        factors.join(" × "),
        plain(chain.worst_case),
        retries.join(","),
    );
    for d in &chain.diagnostics {
        let _ = writeln!(out, "{d}");
    }
}

/// At most two decimals, without trailing zeros: `100`, `33.33`, `0.5`.
fn short(x: f64) -> String {
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}
