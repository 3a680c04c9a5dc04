//! `tollgate check`: validate config files, show what each upstream can cost the
//! dependency behind it, and warn about settings that are valid but will hurt someone
//! during an outage.
//!
//! Errors come from [`config::load`]: every problem of every file, each at
//! `FILE:LINE:COLUMN` with its fix. The lints here are warnings in the same shape. A
//! file that draws one works as written; the warning says what it costs when the
//! upstream fails, and what to write instead.
//!
//! A single file cannot show the worst mistake of all, which is a chain of services
//! that each retry. With `--chain` every file is one layer of a call chain, listed top
//! first, and its upstream is the call to the next layer. The attempts of the layers
//! multiply, and a layer's patience has to shrink with depth: an inner layer that
//! keeps working after the outer layer stopped waiting for its attempt holds
//! connections for an answer nobody reads, while the outer layer retries on top.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Method;

use crate::config::units::format_duration;
use crate::config::{self, Config, Diagnostic, Ownership, Severity, UpstreamConfig};
use crate::retry::backoff::Jitter;

/// A retry budget above this share of requests barely caps a storm.
pub const LOOSE_BUDGET_RATIO: f64 = 0.5;

/// Exit codes of `tollgate check`.
pub const EXIT_VALID: i32 = 0;
pub const EXIT_INVALID: i32 = 1;
pub const EXIT_WARNINGS: i32 = 3;

/// Arguments of `tollgate check`.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// Config file [default: $TOLLGATE_CONFIG, then config/tollgate.toml; with --chain:
    /// none, only the chain's files are checked].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Config files of a call chain, top layer first (the way a request travels). Each
    /// file is a layer; FILE#UPSTREAM picks the upstream that calls the next layer
    /// (default: the one with the most attempts).
    #[arg(long, value_delimiter = ',', value_name = "FILE[#UPSTREAM],...")]
    pub chain: Option<Vec<PathBuf>>,
    /// Exit 3 when the config is valid but has warnings.
    #[arg(long)]
    pub strict: bool,
}

/// Runs `tollgate check`; returns the exit code.
pub fn main(args: CheckArgs) -> i32 {
    let config = match (&args.config, &args.chain) {
        (None, Some(_)) => None,
        (flag, _) => Some(config::resolve_path(flag.clone())),
    };
    let report = Report::run(config.as_deref(), args.chain.as_deref().unwrap_or(&[]));
    print!("{}", report.render(args.strict));
    report.exit_code(args.strict)
}

/// One config file as checked.
#[derive(Debug)]
pub struct CheckedFile {
    /// As named in diagnostics.
    pub name: String,
    /// The config, or every error in the file.
    pub config: Result<Config, Vec<Diagnostic>>,
    /// The lints of the file alone (empty when it is invalid).
    pub warnings: Vec<Diagnostic>,
}

impl CheckedFile {
    pub fn load(path: &Path) -> Self {
        let name = path.display().to_string();
        match config::load(path) {
            Ok(config) => CheckedFile {
                name,
                warnings: lint(&config),
                config: Ok(config),
            },
            Err(errors) => CheckedFile {
                name,
                config: Err(errors.0),
                warnings: Vec::new(),
            },
        }
    }
}

/// Everything `check` found: each file once, then the chain.
#[derive(Debug)]
pub struct Report {
    pub files: Vec<CheckedFile>,
    /// `None` without `--chain`.
    pub chain: Option<ChainCheck>,
}

/// The chain as checked: not analysed while any of its files is invalid.
#[derive(Debug)]
pub enum ChainCheck {
    Analysed(ChainReport),
    Skipped,
}

impl Report {
    /// Checks `config` (if any) and every file of `chain`, each file once however often
    /// it is named, then the chain itself.
    pub fn run(config: Option<&Path>, chain: &[PathBuf]) -> Report {
        let mut files: Vec<CheckedFile> = Vec::new();
        let mut paths: Vec<PathBuf> = Vec::new();
        let mut index_of = |path: &Path, files: &mut Vec<CheckedFile>| -> usize {
            if let Some(i) = paths.iter().position(|p| p == path) {
                return i;
            }
            paths.push(path.to_path_buf());
            files.push(CheckedFile::load(path));
            files.len() - 1
        };
        if let Some(path) = config {
            index_of(path, &mut files);
        }
        let layers: Vec<(usize, Option<String>)> = chain
            .iter()
            .map(|spec| {
                let (path, upstream) = split_layer(spec);
                (index_of(&path, &mut files), upstream)
            })
            .collect();
        let chain = (!layers.is_empty()).then(|| {
            let configs: Option<Vec<(&Config, Option<&str>)>> = layers
                .iter()
                .map(|(i, up)| files[*i].config.as_ref().ok().map(|c| (c, up.as_deref())))
                .collect();
            match configs {
                Some(configs) => ChainCheck::Analysed(check_chain(&configs)),
                None => ChainCheck::Skipped,
            }
        });
        Report { files, chain }
    }

    fn diagnostics(&self) -> impl Iterator<Item = &Diagnostic> {
        let chain = match &self.chain {
            Some(ChainCheck::Analysed(c)) => c.diagnostics.as_slice(),
            _ => &[],
        };
        self.files
            .iter()
            .flat_map(|f| {
                let errors = f.config.as_ref().err().map_or(&[][..], |e| e.as_slice());
                errors.iter().chain(&f.warnings)
            })
            .chain(chain)
    }

    pub fn errors(&self) -> usize {
        self.diagnostics().filter(|d| d.is_error()).count()
    }

    pub fn warnings(&self) -> usize {
        self.diagnostics().filter(|d| !d.is_error()).count()
    }

    /// 1 with any error; 3 with warnings under `--strict`; 0 otherwise.
    pub fn exit_code(&self, strict: bool) -> i32 {
        if self.errors() > 0 {
            EXIT_INVALID
        } else if strict && self.warnings() > 0 {
            EXIT_WARNINGS
        } else {
            EXIT_VALID
        }
    }

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

/// `FILE` or `FILE#UPSTREAM`; a file whose name itself contains `#` is taken whole.
fn split_layer(spec: &Path) -> (PathBuf, Option<String>) {
    if spec.exists() {
        return (spec.to_path_buf(), None);
    }
    let text = spec.to_string_lossy();
    match text.rsplit_once('#') {
        Some((file, name)) if !name.is_empty() && !name.contains(['/', '\\']) => {
            (PathBuf::from(file), Some(name.to_string()))
        }
        _ => (spec.to_path_buf(), None),
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
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
            return;
        }
    };
    let _ = writeln!(
        out,
        "{}: valid, {}",
        file.name,
        plural(config.upstreams.len(), "upstream", "upstreams")
    );
    for up in &config.upstreams {
        render_upstream(out, up);
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
            let _ = writeln!(
                out,
                "    budget        {cap:.2}× in steady state: the lower of {attempts} and 1 + ratio {}",
                b.ratio
            );
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
    let patience = up.total_patience();
    let backoff = patience.saturating_sub(up.attempt_timeout * attempts);
    let verdict = if patience <= up.request_timeout {
        "within".to_string()
    } else {
        let fit = attempts_that_fit(up, up.request_timeout);
        let verb = if fit == 1 { "fits" } else { "fit" };
        format!("{fit} of {attempts} attempts {verb} in")
    };
    let how = if attempts > 1 {
        format!(
            "= {attempts} × {} + {} backoff",
            format_duration(up.attempt_timeout),
            format_duration(backoff)
        )
    } else {
        "for its one attempt".to_string()
    };
    let _ = writeln!(
        out,
        "    patience      {} {how}; {verdict} request_timeout {}",
        format_duration(patience),
        format_duration(up.request_timeout),
    );
}

/// The steady-state amplification a budget allows: `min(max_attempts, 1 + ratio)`.
/// `None` without a budget. The `min_per_sec` floor allows more at low traffic.
pub fn budget_cap(up: &UpstreamConfig) -> Option<f64> {
    up.budget
        .as_ref()
        .map(|b| f64::from(up.retry.max_attempts).min(1.0 + b.ratio))
}

/// The model's total patience for `attempts` attempts instead of `max_attempts`.
fn patience_with(up: &UpstreamConfig, attempts: u32) -> Duration {
    let mut fewer = up.clone();
    fewer.retry.max_attempts = attempts;
    fewer.total_patience()
}

/// How many attempts, with their backoffs, fit whole within `limit`.
fn attempts_that_fit(up: &UpstreamConfig, limit: Duration) -> u32 {
    (1..=up.retry.max_attempts)
        .take_while(|n| patience_with(up, *n) <= limit)
        .last()
        .unwrap_or(0)
}

/// What the attempts cost a caller's deadline: total patience, but never longer than
/// `request_timeout`, since the deadline cancels whatever is still running then.
fn effective_patience(up: &UpstreamConfig) -> Duration {
    up.total_patience().min(up.request_timeout)
}

fn warning(config: &Config, key: &str, message: String, fix: String) -> Diagnostic {
    let (line, column) = config.position(key);
    Diagnostic {
        severity: Severity::Warning,
        file: config.file.clone(),
        line,
        column,
        key: key.to_string(),
        message,
        fix,
    }
}

/// The warnings of one valid config, in file order.
pub fn lint(config: &Config) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if !config.listener.addr.ip().is_loopback() {
        out.push(exposed_listener(
            config,
            "listener.addr",
            config.listener.addr,
        ));
    }
    if !config.admin.addr.ip().is_loopback() {
        out.push(warning(
            config,
            "admin.addr",
            format!(
                "{} is reachable from other hosts: /config shows the whole config (upstreams, \
                 endpoints, certificate paths) and /metrics the traffic",
                config.admin.addr
            ),
            format!(
                "bind it to 127.0.0.1:{}; if Prometheus must scrape it from outside, allow only \
                 the scraper, with a NetworkPolicy for instance",
                config.admin.addr.port()
            ),
        ));
    }
    for up in &config.upstreams {
        lint_upstream(config, up, &mut out);
    }
    out.sort_by_key(|d| (d.line, d.column));
    out
}

fn exposed_listener(config: &Config, key: &str, addr: SocketAddr) -> Diagnostic {
    warning(
        config,
        key,
        format!(
            "{addr} accepts requests from other hosts, who can then send traffic through this \
             sidecar, spending its retry budgets and using its client certificates"
        ),
        format!(
            "bind it to 127.0.0.1:{}: the app reaches its sidecar on localhost",
            addr.port()
        ),
    )
}

fn lint_upstream(config: &Config, up: &UpstreamConfig, out: &mut Vec<Diagnostic>) {
    let key = |k: &str| format!("upstreams.{}.{k}", up.name);
    let retry = &up.retry;
    let attempts = retry.max_attempts;
    let retries = attempts > 1;
    let d = format_duration;

    if let Some(listen) = up.listen.filter(|a| !a.ip().is_loopback()) {
        out.push(exposed_listener(config, &key("listen"), listen));
    }

    if up.attempt_timeout > up.request_timeout {
        out.push(warning(
            config,
            &key("attempt_timeout"),
            format!(
                "attempt_timeout {} is longer than request_timeout {}: the deadline always ends \
                 an attempt first, so attempt_timeout never applies{}",
                d(up.attempt_timeout),
                d(up.request_timeout),
                if retries {
                    " and a slow attempt is never retried"
                } else {
                    ""
                }
            ),
            if attempts > 1 {
                format!(
                    "set attempt_timeout to at most {}, request_timeout / max_attempts, so that every attempt fits",
                    d(whole_ms(up.request_timeout / attempts))
                )
            } else {
                format!(
                    "set attempt_timeout below request_timeout, or raise request_timeout to {}",
                    d(up.attempt_timeout)
                )
            },
        ));
    } else if up.total_patience() > up.request_timeout {
        // When attempt_timeout alone is over the deadline the warning above says it all.
        let patience = up.total_patience();
        let backoff = patience.saturating_sub(up.attempt_timeout * attempts);
        let fit = attempts_that_fit(up, up.request_timeout);
        let mut fixes = Vec::new();
        if let Some(room) = up.request_timeout.checked_sub(backoff) {
            let most = whole_ms(room / attempts);
            if !most.is_zero() {
                fixes.push(format!("lower attempt_timeout to {} or less", d(most)));
            }
        }
        fixes.push(format!("lower max_attempts to {fit}"));
        fixes.push(format!("raise request_timeout to {}", d(patience)));
        out.push(warning(
            config,
            &key("retry.max_attempts"),
            format!(
                "total patience {} ({attempts} × attempt_timeout {} + {} backoff) is longer than \
                 request_timeout {}: the deadline cuts off the later attempts, only {fit} of \
                 {attempts} {}",
                d(patience),
                d(up.attempt_timeout),
                d(backoff),
                d(up.request_timeout),
                if fit == 1 { "fits" } else { "fit" }
            ),
            join_or(&fixes),
        ));
    }

    if !retries {
        return;
    }

    let unsafe_methods: Vec<&str> = retry
        .methods
        .iter()
        .filter(|m| !is_idempotent(m))
        .map(Method::as_str)
        .collect();
    if !unsafe_methods.is_empty() {
        let list = join_and(&unsafe_methods);
        let header = match &retry.idempotency_header {
            Some(h) => format!("a request carrying the {h} header is retried whatever its method"),
            None => "set idempotency_header = \"idempotency-key\": a request carrying it is \
                     retried whatever its method"
                .to_string(),
        };
        out.push(warning(
            config,
            &key("retry.methods"),
            format!(
                "{list} {} not idempotent: a request that timed out may already have been \
                 applied, and the retry applies it again (a second charge, a duplicate order)",
                if unsafe_methods.len() == 1 {
                    "is"
                } else {
                    "are"
                }
            ),
            format!(
                "remove {list} from methods; {header}, so the app can mark what is safe to repeat"
            ),
        ));
    }

    match &up.budget {
        None => out.push(warning(
            config,
            &key("budget"),
            format!(
                "no retry budget: when the upstream fails, every request makes all {attempts} \
                 attempts, {attempts}× the load on a dependency that is already failing"
            ),
            format!(
                "add [upstreams.{}.budget] with ratio = 0.1 and min_per_sec = 10: retries then add at most 10% to the requests",
                up.name
            ),
        )),
        Some(b) if b.ratio > LOOSE_BUDGET_RATIO => out.push(warning(
            config,
            &key("budget.ratio"),
            format!(
                "ratio {} lets retries add {:.0}% to the load of an upstream that is failing: \
                 a budget that loose hardly caps a retry storm",
                b.ratio,
                b.ratio * 100.0
            ),
            "lower it to 0.1 or 0.2; min_per_sec keeps quiet upstreams able to retry".to_string(),
        )),
        Some(_) => {}
    }

    if retry.backoff.jitter() == Jitter::None {
        out.push(warning(
            config,
            &key("retry.backoff_jitter"),
            "backoff_jitter = \"none\": callers that failed together sleep exactly as long and \
             retry together, in synchronised waves"
                .to_string(),
            "remove it or set \"full\", the default: sleeps drawn between 0 and the cap spread \
             the retries out"
                .to_string(),
        ));
    }

    if retry.ownership == Ownership::Ignore {
        out.push(warning(
            config,
            &key("retry.ownership"),
            "ownership = \"ignore\": failures another tollgate has already retried are retried \
             again here, so the layers' attempts multiply"
                .to_string(),
            "remove it or set \"honor\", the default; \"ignore\" exists to demonstrate retry storms"
                .to_string(),
        ));
    }
}

/// Idempotent by RFC 9110 §9.2.2. Any other method, extension methods included, may
/// change something each time it is applied.
fn is_idempotent(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::TRACE,
        Method::PUT,
        Method::DELETE,
    ]
    .contains(method)
}

/// Rounded down to whole milliseconds, so a suggested value reads like a config value.
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn join_and(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

fn join_or(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{}, or {last}", rest.join(", ")),
    }
}

/// One layer of a chain: a file and the upstream through which it calls the next layer.
#[derive(Clone, Debug)]
pub struct ChainLayer {
    pub file: String,
    /// `None` when the file has no upstream, or not the one asked for.
    pub upstream: Option<UpstreamConfig>,
}

impl ChainLayer {
    pub fn max_attempts(&self) -> u32 {
        self.upstream.as_ref().map_or(1, |u| u.retry.max_attempts)
    }
}

/// A chain as checked: its layers, the worst case at the bottom, and what is wrong.
#[derive(Clone, Debug)]
pub struct ChainReport {
    /// Top first.
    pub layers: Vec<ChainLayer>,
    /// `Π max_attempts`: requests at the bottom per request at the top, every attempt failing.
    pub worst_case: f64,
    pub diagnostics: Vec<Diagnostic>,
}

/// Checks a call chain, top layer first. Each layer is a config and, optionally, the
/// name of the upstream that calls the next layer; without a name it is the upstream
/// with the most attempts (then the most patience, then the first by name), which is
/// the one that can cost the chain the most.
pub fn check_chain(layers: &[(&Config, Option<&str>)]) -> ChainReport {
    let mut diagnostics = Vec::new();
    let resolved: Vec<ChainLayer> = layers
        .iter()
        .map(|(config, name)| ChainLayer {
            file: config.file.clone(),
            upstream: pick_link(config, *name, &mut diagnostics).cloned(),
        })
        .collect();
    let retries: Vec<u32> = resolved
        .iter()
        .map(|l| l.max_attempts().saturating_sub(1))
        .collect();
    let worst_case = crate::calc::worst_case(&retries);

    let retrying: Vec<usize> = (0..resolved.len())
        .filter(|i| resolved[*i].max_attempts() > 1)
        .collect();
    if let [first, _, ..] = retrying[..] {
        let (config, _) = layers[first];
        let name = resolved[first]
            .upstream
            .as_ref()
            .map_or("", |u| u.name.as_str());
        let who: Vec<String> = retrying
            .iter()
            .map(|i| {
                let layer = &resolved[*i];
                format!("{} ({} attempts)", layer.file, layer.max_attempts())
            })
            .collect();
        diagnostics.push(warning(
            config,
            &format!("upstreams.{name}.retry.max_attempts"),
            format!(
                "{} layers of the chain retry: {}; when the bottom fails, it gets {}× the \
                 requests of the top",
                retrying.len(),
                who.join(", "),
                plain(worst_case)
            ),
            "retry at one layer only: set max_attempts = 1 at the others; the ownership \
             header does the rest"
                .to_string(),
        ));
    }

    for i in 1..resolved.len() {
        let (Some(outer), Some(inner)) = (&resolved[i - 1].upstream, &resolved[i].upstream) else {
            continue;
        };
        let outer_wait = outer.attempt_timeout.min(outer.request_timeout);
        let inner_work = effective_patience(inner);
        if inner_work < outer_wait {
            continue;
        }
        let d = format_duration;
        let (inner_config, _) = layers[i];
        let total = inner.total_patience();
        let how = if total > inner.request_timeout {
            format!("{} cut to its request_timeout", d(total))
        } else {
            format!(
                "{} × {} + {} backoff",
                inner.retry.max_attempts,
                d(inner.attempt_timeout),
                d(total.saturating_sub(inner.attempt_timeout * inner.retry.max_attempts))
            )
        };
        let then = if outer.retry.max_attempts > 1 {
            "retries while this layer is still working on the first call"
        } else {
            "has stopped waiting while this layer is still working"
        };
        diagnostics.push(warning(
            inner_config,
            &format!("upstreams.{}.attempt_timeout", inner.name),
            format!(
                "patience does not shrink with depth: this layer may work {} ({how}) on a call \
                 that {} gives up after {} (upstreams.{}.attempt_timeout), so the outer layer {then}",
                d(inner_work),
                resolved[i - 1].file,
                d(outer_wait),
                outer.name
            ),
            format!(
                "make this layer's total patience, attempts × attempt_timeout + backoff, shorter \
                 than {}, or raise attempt_timeout in {}",
                d(outer_wait),
                resolved[i - 1].file
            ),
        ));
    }

    ChainReport {
        layers: resolved,
        worst_case,
        diagnostics,
    }
}

fn pick_link<'c>(
    config: &'c Config,
    name: Option<&str>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<&'c UpstreamConfig> {
    let names = || {
        config
            .upstreams
            .iter()
            .map(|u| u.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(name) => {
            let found = config.upstream(name);
            if found.is_none() {
                let (line, column) = config.position("upstreams");
                diagnostics.push(Diagnostic {
                    severity: Severity::Error,
                    file: config.file.clone(),
                    line,
                    column,
                    key: format!("upstreams.{name}"),
                    message: format!(
                        "--chain names upstream `{name}`, which this file does not have"
                    ),
                    fix: if config.upstreams.is_empty() {
                        "add the upstream that calls the next layer".to_string()
                    } else {
                        format!("name one of: {}", names())
                    },
                });
            }
            found
        }
        None => {
            let found = config
                .upstreams
                .iter()
                .rev()
                .max_by_key(|u| (u.retry.max_attempts, effective_patience(u)));
            if found.is_none() {
                diagnostics.push(warning(
                    config,
                    "upstreams",
                    "no upstream, so this layer cannot call the next one; it counts as 1 attempt"
                        .to_string(),
                    "add the upstream that calls the next layer, or leave the file out of --chain"
                        .to_string(),
                ));
            }
            found
        }
    }
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
                format_duration(u.attempt_timeout),
                format_duration(effective_patience(u)),
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

/// A whole number without a fraction, or scientific notation when it is huge.
fn plain(x: f64) -> String {
    if x < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.3e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[listener]
addr = "127.0.0.1:15001"

[admin]
addr = "127.0.0.1:15090"

[upstreams.api]
authorities = ["api"]
endpoints = ["127.0.0.1:8080"]
request_timeout = "2s"
attempt_timeout = "600ms"

[upstreams.api.retry]
max_attempts = 3

[upstreams.api.budget]
ratio = 0.1
"#;

    fn parse(text: &str) -> Config {
        config::parse("test.toml", text, Path::new(".")).unwrap()
    }

    fn keys(config: &Config) -> Vec<String> {
        lint(config).into_iter().map(|d| d.key).collect()
    }

    #[test]
    fn a_sound_config_draws_no_warning() {
        assert_eq!(keys(&parse(BASE)), Vec::<String>::new());
    }

    #[test]
    fn the_shipped_example_draws_no_warning() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(config::DEFAULT_CONFIG_PATH);
        let config = config::load(&path).unwrap();
        assert_eq!(keys(&config), Vec::<String>::new());
    }

    #[test]
    fn each_lint_names_its_key_and_line() {
        let cases = [
            (
                r#"attempt_timeout = "600ms""#,
                r#"attempt_timeout = "1s""#,
                "upstreams.api.retry.max_attempts",
            ),
            (
                r#"attempt_timeout = "600ms""#,
                r#"attempt_timeout = "3s""#,
                "upstreams.api.attempt_timeout",
            ),
            (
                "max_attempts = 3",
                "max_attempts = 3\nmethods = [\"GET\", \"POST\"]",
                "upstreams.api.retry.methods",
            ),
            ("ratio = 0.1", "ratio = 0.8", "upstreams.api.budget.ratio"),
            (
                "[upstreams.api.budget]\nratio = 0.1",
                "",
                "upstreams.api.budget",
            ),
            (
                "max_attempts = 3",
                "max_attempts = 3\nbackoff_jitter = \"none\"",
                "upstreams.api.retry.backoff_jitter",
            ),
            (
                "max_attempts = 3",
                "max_attempts = 3\nownership = \"ignore\"",
                "upstreams.api.retry.ownership",
            ),
            (
                r#"addr = "127.0.0.1:15090""#,
                r#"addr = "0.0.0.0:15090""#,
                "admin.addr",
            ),
            (
                r#"addr = "127.0.0.1:15001""#,
                r#"addr = "0.0.0.0:15001""#,
                "listener.addr",
            ),
        ];
        for (from, to, key) in cases {
            let text = BASE.replacen(from, to, 1);
            let config = parse(&text);
            let found = lint(&config);
            assert_eq!(
                found.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(),
                vec![key],
                "after replacing {from:?} with {to:?}"
            );
            let d = &found[0];
            assert_eq!(d.severity, Severity::Warning);
            assert!(!d.fix.is_empty());
            let (line, column) = config.position(key);
            assert_eq!((d.line, d.column), (line, column));
            assert!(d.line > 1, "{key} was not placed: {d}");
        }
    }

    #[test]
    fn retry_lints_stay_quiet_when_retries_are_off() {
        let text = BASE
            .replacen("max_attempts = 3", "max_attempts = 1\nmethods = [\"POST\"]\nbackoff_jitter = \"none\"\nownership = \"ignore\"", 1)
            .replacen("[upstreams.api.budget]\nratio = 0.1", "", 1);
        assert_eq!(keys(&parse(&text)), Vec::<String>::new());
    }

    #[test]
    fn the_patience_warning_offers_values_that_fit() {
        let text = BASE.replacen(
            r#"attempt_timeout = "600ms""#,
            r#"attempt_timeout = "1s""#,
            1,
        );
        let d = lint(&parse(&text)).remove(0);
        // 3 × 1s + 25ms + 50ms of backoff against 2s.
        assert!(d.message.contains("3075ms"), "{}", d.message);
        assert!(d.message.contains("only 1 of 3 fits"), "{}", d.message);
        assert!(
            d.fix.contains("lower attempt_timeout to 641ms"),
            "{}",
            d.fix
        );
        assert!(d.fix.contains("lower max_attempts to 1"), "{}", d.fix);
        assert!(
            d.fix.contains("raise request_timeout to 3075ms"),
            "{}",
            d.fix
        );
    }

    #[test]
    fn budget_cap_is_the_lower_of_attempts_and_one_plus_ratio() {
        let config = parse(BASE);
        assert_eq!(budget_cap(&config.upstreams[0]), Some(1.1));
        let loose = parse(&BASE.replacen("ratio = 0.1", "ratio = 5", 1));
        assert_eq!(budget_cap(&loose.upstreams[0]), Some(3.0));
        let none = parse(&BASE.replacen("[upstreams.api.budget]\nratio = 0.1", "", 1));
        assert_eq!(budget_cap(&none.upstreams[0]), None);
    }

    #[test]
    fn a_chain_multiplies_its_layers_and_flags_every_retrying_layer() {
        let a = parse(BASE);
        let report = check_chain(&[(&a, None), (&a, None), (&a, None)]);
        assert_eq!(report.worst_case, 27.0);
        let multiply: Vec<_> = report
            .diagnostics
            .iter()
            .filter(|d| d.message.contains("layers of the chain retry"))
            .collect();
        assert_eq!(multiply.len(), 1);
        assert!(multiply[0].message.contains("27×"));
        assert!(multiply[0].fix.starts_with("retry at one layer only"));
    }

    #[test]
    fn patience_must_shrink_with_depth() {
        let outer = parse(
            &BASE
                .replacen("max_attempts = 3", "max_attempts = 1", 1)
                .replacen(
                    r#"attempt_timeout = "600ms""#,
                    r#"attempt_timeout = "2s""#,
                    1,
                ),
        );
        // 3 × 600ms + 75ms = 1875ms of work under an outer attempt of 2s: fine.
        let ok = check_chain(&[(&outer, None), (&parse(BASE), None)]);
        assert!(ok.diagnostics.is_empty(), "{:?}", ok.diagnostics);
        // 3 × 650ms + 75ms = 2025ms: longer than the outer layer waits.
        let slow = parse(
            &BASE
                .replacen(
                    r#"attempt_timeout = "600ms""#,
                    r#"attempt_timeout = "650ms""#,
                    1,
                )
                .replacen(r#"request_timeout = "2s""#, r#"request_timeout = "3s""#, 1),
        );
        let bad = check_chain(&[(&outer, None), (&slow, None)]);
        assert_eq!(bad.diagnostics.len(), 1, "{:?}", bad.diagnostics);
        let d = &bad.diagnostics[0];
        assert_eq!(d.key, "upstreams.api.attempt_timeout");
        assert!(
            d.message.contains("2s") && d.message.contains("2025ms"),
            "{d}"
        );
    }

    #[test]
    fn the_deadline_caps_an_inner_layers_patience() {
        let inner = parse(&BASE.replacen(
            r#"attempt_timeout = "600ms""#,
            r#"attempt_timeout = "1s""#,
            1,
        ));
        assert_eq!(
            effective_patience(&inner.upstreams[0]),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn a_chain_layer_may_name_its_upstream() {
        let two = parse(&format!(
            "{BASE}\n[upstreams.db]\nauthorities = [\"db\"]\nendpoints = [\"127.0.0.1:5432\"]\n"
        ));
        let by_default = check_chain(&[(&two, None)]);
        assert_eq!(by_default.layers[0].max_attempts(), 3);
        let picked = check_chain(&[(&two, Some("db"))]);
        assert_eq!(picked.layers[0].max_attempts(), 1);
        let missing = check_chain(&[(&two, Some("nope"))]);
        assert!(missing.diagnostics[0].is_error());
        assert!(missing.diagnostics[0].fix.contains("api, db"));
    }

    #[test]
    fn layer_specs_split_at_the_last_hash() {
        assert_eq!(
            split_layer(Path::new("no/such/a.toml#db")),
            (PathBuf::from("no/such/a.toml"), Some("db".to_string()))
        );
        assert_eq!(
            split_layer(Path::new("no/such/a.toml")),
            (PathBuf::from("no/such/a.toml"), None)
        );
    }
}
