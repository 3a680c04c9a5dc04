//! What a column's calls add up to, and the verdict on it.
//!
//! "Worse beyond noise" is a one-sided two-proportion z-test at 99 %: with `n` calls
//! each side, a column is worse than the one it is judged against when
//! `(p_against - p_column) / sqrt(p (1 - p) (1/n_against + 1/n_column)) > 2.326`, `p`
//! the pooled success share. Below a thousand calls a side the test says little, so
//! every row sends at least that many. Besides success, a column of tollgate must not
//! send the upstream more than the first attempts plus what its budget allows
//! (`ratio` of the requests, or `max_ratio`, plus `min_per_sec` for each budget window
//! the calls could span).
//!
//! An opt-in trade (`[throttle]`, `app_retries = "refuse"`) trades success for
//! protection by design: its column is judged by its documented purpose, never by its
//! success.

use std::collections::BTreeMap;
use std::time::Duration;

use super::client::Record;
use super::rows::{Column, Feature, Path, Purpose, Row};

/// The z above which a one-sided test at 99 % says worse.
pub const Z_99: f64 = 2.326_347_874;

/// The default budget's figures (`[upstreams.NAME.budget]` with no key set).
const RATIO: f64 = 0.1;
const MAX_RATIO: f64 = 0.5;
const MIN_PER_SEC: f64 = 10.0;
const WINDOW: Duration = Duration::from_secs(10);

/// What the upstream saw of one column.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    pub calls: u64,
    pub retried: u64,
    pub peak_waiting: u64,
}

/// One column's figures.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub requests: u64,
    pub succeeded: u64,
    pub p50: Duration,
    pub p99: Duration,
    /// Calls the upstream received from this column.
    pub calls: u64,
    /// Of them, marked as retries.
    pub retried: u64,
    /// The most of them that waited for their response head at once.
    pub peak_waiting: u64,
    /// The failures by what the app got (`"504 deadline-exceeded"`), most first.
    pub failures: Vec<(String, u64)>,
    /// Answers with outcome `throttled` / `app-retry`.
    pub throttled: u64,
    pub refused_as_app_retry: u64,
    /// The median over the calls that succeeded at the first attempt on both sides of
    /// (this column's latency - direct's), divided by the hops; `None` for direct.
    pub overhead_per_hop: Option<Duration>,
}

impl Figures {
    pub fn success(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.succeeded as f64 / self.requests as f64
        }
    }

    pub fn calls_per_request(&self) -> f64 {
        self.calls as f64 / self.requests.max(1) as f64
    }

    pub fn build(records: &[Record], direct: Option<&[Record]>, hops: u32, seen: Seen) -> Self {
        let mut latencies: Vec<Duration> = records.iter().map(|r| r.latency).collect();
        latencies.sort();
        let mut failures: BTreeMap<String, u64> = BTreeMap::new();
        for r in records.iter().filter(|r| !r.ok) {
            let mut what = match (r.status, r.outcome) {
                (0, _) => "no answer".to_string(),
                (s, Some(o)) => format!("{s} {o}"),
                (200, None) => "200, body cut".to_string(),
                (s, None) => s.to_string(),
            };
            // tollgate says how many attempts an answer took; its own answer without
            // the header made none.
            match (r.attempts, r.outcome) {
                (0, Some(_)) => what.push_str(" (no upstream call)"),
                (0, None) => {}
                (1, _) => what.push_str(" (1 attempt)"),
                (n, _) => what.push_str(&format!(" ({n} attempts)")),
            }
            *failures.entry(what).or_default() += 1;
        }
        let mut failures: Vec<(String, u64)> = failures.into_iter().collect();
        failures.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let count = |o: &str| records.iter().filter(|r| r.outcome == Some(o)).count() as u64;
        Figures {
            requests: records.len() as u64,
            succeeded: records.iter().filter(|r| r.ok).count() as u64,
            p50: quantile(&latencies, 0.5),
            p99: quantile(&latencies, 0.99),
            calls: seen.calls,
            retried: seen.retried,
            peak_waiting: seen.peak_waiting,
            failures,
            throttled: count("throttled"),
            refused_as_app_retry: count("app-retry"),
            overhead_per_hop: direct.and_then(|d| overhead(d, records, hops)),
        }
    }
}

/// The `q` quantile (nearest rank) of sorted `v`; zero for none.
fn quantile(v: &[Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The median added per hop, over the calls both sides served at the first attempt:
/// the same call, paired by its number (the upstream drew the same for both).
fn overhead(direct: &[Record], through: &[Record], hops: u32) -> Option<Duration> {
    if hops == 0 {
        return None;
    }
    let mut diffs: Vec<f64> = direct
        .iter()
        .zip(through)
        .filter(|(d, t)| d.seq == t.seq && d.ok && t.ok && t.attempts <= 1)
        .map(|(d, t)| t.latency.as_secs_f64() - d.latency.as_secs_f64())
        .collect();
    if diffs.is_empty() {
        return None;
    }
    diffs.sort_by(f64::total_cmp);
    let median = diffs[diffs.len() / 2] / f64::from(hops);
    Some(Duration::from_secs_f64(median.max(0.0)))
}

/// The one-sided z of "`column` succeeds less often than `against`"; 0 when neither
/// side varies (all succeeded, or all failed, on both).
pub fn z_worse(against: (u64, u64), column: (u64, u64)) -> f64 {
    let (ok_a, n_a) = (against.0 as f64, against.1.max(1) as f64);
    let (ok_c, n_c) = (column.0 as f64, column.1.max(1) as f64);
    let pooled = (ok_a + ok_c) / (n_a + n_c);
    let se = (pooled * (1.0 - pooled) * (1.0 / n_a + 1.0 / n_c)).sqrt();
    if se == 0.0 {
        return 0.0;
    }
    (ok_a / n_a - ok_c / n_c) / se
}

/// The most calls the upstream may get from a column: the requests, plus the retries
/// its budget can grant over the windows the row's calls span. `None`: not bounded
/// here (direct).
pub fn call_bound(row: &Row, column: &Column) -> Option<f64> {
    let requests = row.traffic.requests() as f64;
    match column.path {
        Path::Direct => None,
        // The inbound side never retries; a passed-through call is one attempt.
        Path::Inbound => Some(requests),
        Path::Outbound if row.unknown_host => Some(requests),
        Path::Outbound | Path::Sidecars => {
            let ratio = if column.feature == Feature::MaxRatio {
                MAX_RATIO
            } else {
                RATIO
            };
            let span = row.traffic.duration() + row.traffic.patience;
            let windows = (span.as_secs_f64() / WINDOW.as_secs_f64()).ceil();
            Some(requests * (1.0 + ratio) + MIN_PER_SEC * WINDOW.as_secs_f64() * windows)
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The reference everything is judged against.
    Direct,
    Ok,
    /// Worse beyond noise, or more upstream calls than the budget allows: why.
    Worse(Vec<String>),
    /// An opt-in trade: its purpose, whether it held, and what showed it.
    Trade {
        purpose: Purpose,
        held: bool,
        shown: String,
    },
}

impl Verdict {
    pub fn is_worse(&self) -> bool {
        matches!(self, Verdict::Worse(_))
    }

    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Direct => "",
            Verdict::Ok => "ok",
            Verdict::Worse(_) => "WORSE",
            Verdict::Trade { .. } => "trade",
        }
    }

    /// The verdict and why, in a few words.
    pub fn explain(&self) -> String {
        match self {
            Verdict::Direct | Verdict::Ok => self.word().to_string(),
            Verdict::Worse(why) => format!("WORSE: {}", why.join("; ")),
            Verdict::Trade {
                purpose,
                held,
                shown,
            } => format!(
                "trade ({}): {} ({shown})",
                purpose.describe(),
                if *held { "held" } else { "DID NOT HOLD" }
            ),
        }
    }
}

/// The verdict on column `i` of `row`, given every column's figures.
pub fn judge(row: &Row, i: usize, figures: &[Figures]) -> Verdict {
    let column = &row.columns[i];
    let me = &figures[i];
    if column.path == Path::Direct {
        return Verdict::Direct;
    }
    if let Some(purpose) = column.trade {
        return trade(purpose, me, &figures[1]);
    }
    let mut why = Vec::new();
    for &j in column.against {
        let other = &figures[j];
        let z = z_worse(
            (other.succeeded, other.requests),
            (me.succeeded, me.requests),
        );
        if z > Z_99 {
            why.push(format!(
                "success below {}'s beyond noise (z = {z:.1})",
                row.columns[j].key
            ));
        }
    }
    if let Some(bound) = call_bound(row, column)
        && me.calls as f64 > bound
    {
        why.push(format!(
            "{} upstream calls, above first attempts + budget ({bound:.0})",
            me.calls
        ));
    }
    if why.is_empty() {
        Verdict::Ok
    } else {
        Verdict::Worse(why)
    }
}

/// A trade's column against the same tollgate without it (`without`).
fn trade(purpose: Purpose, me: &Figures, without: &Figures) -> Verdict {
    let not_worse = z_worse(
        (without.succeeded, without.requests),
        (me.succeeded, me.requests),
    ) <= Z_99;
    let (held, shown) = match purpose {
        Purpose::ThrottleSheds => (
            me.calls < without.calls,
            format!(
                "{:.2} upstream calls a request, {:.2} without",
                me.calls_per_request(),
                without.calls_per_request()
            ),
        ),
        Purpose::ThrottleIdle => (
            me.throttled == 0 && not_worse,
            format!("{} throttled", me.throttled),
        ),
        Purpose::ThrottleIgnores500 => (
            me.throttled == 0 && not_worse,
            format!("{} throttled", me.throttled),
        ),
        Purpose::BoundsWaiting => (
            me.peak_waiting <= u64::from(super::rows::FIXED_LIMIT),
            format!(
                "at most {} calls waiting upstream at once, {} without",
                me.peak_waiting, without.peak_waiting
            ),
        ),
        Purpose::RefusesOnlyAppRetries => (
            me.refused_as_app_retry == 0,
            format!("{} first attempts refused", me.refused_as_app_retry),
        ),
    };
    Verdict::Trade {
        purpose,
        held,
        shown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_tells_noise_from_harm() {
        // 71% against 70% over a thousand each: noise.
        assert!(z_worse((710, 1000), (700, 1000)) < Z_99);
        // 71% against 60%: harm.
        assert!(z_worse((710, 1000), (600, 1000)) > Z_99);
        // Better is never worse.
        assert!(z_worse((600, 1000), (710, 1000)) < 0.0);
        // No variance on either side: nothing to say.
        assert_eq!(z_worse((1000, 1000), (1000, 1000)), 0.0);
        assert_eq!(z_worse((0, 1000), (0, 1000)), 0.0);
        // All against none.
        assert!(z_worse((1000, 1000), (0, 1000)) > 40.0);
        // The critical value is the 99th percentile of the normal law.
        assert!((Z_99 - 2.3263).abs() < 1e-4);
    }

    #[test]
    fn a_quantile_is_the_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&v, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    fn record(seq: u32, ms: u64, ok: bool, attempts: u8) -> Record {
        Record {
            seq,
            sent: Duration::ZERO,
            latency: Duration::from_millis(ms),
            status: if ok { 200 } else { 503 },
            ok,
            outcome: None,
            attempts,
        }
    }

    #[test]
    fn the_overhead_pairs_the_same_calls_and_leaves_out_retried_ones() {
        let direct = [
            record(0, 10, true, 0),
            record(1, 20, true, 0),
            record(2, 5, false, 0),
        ];
        let through = [
            record(0, 12, true, 1),
            record(1, 22, true, 1),
            record(2, 90, true, 2),
        ];
        assert_eq!(
            overhead(&direct, &through, 2),
            Some(Duration::from_millis(1))
        );
        assert_eq!(overhead(&direct, &through, 0), None);
    }

    #[test]
    fn the_budget_bounds_the_calls_over_the_windows_spanned() {
        let rows = super::super::rows::all();
        let row = rows
            .iter()
            .find(|r| r.key == "errors-one-url")
            .unwrap_or_else(|| unreachable!());
        // 1,000 requests over 10 s, patience 10 s: two windows of 10 s.
        let bound = call_bound(row, &row.columns[1]).unwrap_or_default();
        assert!((bound - (1000.0 * 1.1 + 200.0)).abs() < 1e-9, "{bound}");
        assert_eq!(call_bound(row, &row.columns[0]), None);
    }

    #[test]
    fn a_trade_is_judged_by_its_purpose() {
        let figures = |calls, throttled| Figures {
            requests: 1000,
            succeeded: 200,
            calls,
            throttled,
            ..Figures::default()
        };
        let v = trade(
            Purpose::ThrottleSheds,
            &figures(600, 400),
            &figures(1100, 0),
        );
        assert!(matches!(v, Verdict::Trade { held: true, .. }), "{v:?}");
        let v = trade(
            Purpose::ThrottleIgnores500,
            &figures(600, 400),
            &figures(1100, 0),
        );
        assert!(matches!(v, Verdict::Trade { held: false, .. }), "{v:?}");
        assert!(!v.is_worse());
    }
}
