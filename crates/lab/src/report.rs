//! What a lab run measured, as a table for people and JSON for machines. Latency and
//! success are the users'; calls and abandoned answers are counted at the backend;
//! hedges and ejections are read from the api tollgate's own metrics.

use std::time::Duration;

use serde_json::{Value, json};

use super::backend::BUCKET;
use super::load::Record;
use super::scenario::{Published, Scenario};

/// What the backend of one chain counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct BackendCounts {
    /// Calls that arrived at the answering endpoints.
    pub calls: u64,
    /// Calls whose caller went away before the answer (cancelled).
    pub abandoned: u64,
    /// Connections the silent endpoints accepted.
    pub silent_connections: u64,
}

/// What the api tollgate (the hop in front of the backend) counted.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Proxy {
    pub hedges_won: u64,
    pub hedges_lost: u64,
    pub hedges_denied: u64,
    pub ejections: u64,
}

impl Proxy {
    /// Reads the counters of `upstream` from Prometheus text.
    pub fn read(metrics: &[u8], upstream: &str) -> Self {
        let text = String::from_utf8_lossy(metrics);
        let value = |series: String| {
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .map_or(0, |v| v as u64)
        };
        let hedges = |result: &str| {
            value(format!(
                "tollgate_hedges_total{{result=\"{result}\",upstream=\"{upstream}\"}}"
            ))
        };
        Proxy {
            hedges_won: hedges("won"),
            hedges_lost: hedges("lost"),
            hedges_denied: hedges("denied"),
            ejections: value(format!(
                "tollgate_ejections_total{{upstream=\"{upstream}\"}}"
            )),
        }
    }

    pub fn hedges_sent(&self) -> u64 {
        self.hedges_won + self.hedges_lost
    }
}

/// One chain's results.
#[derive(Clone, Debug)]
pub struct ChainResult {
    /// Its name in `--json`.
    pub key: &'static str,
    /// Its heading in the table.
    pub title: &'static str,
    pub requests: u64,
    pub succeeded: u64,
    pub backend_calls: u64,
    pub backend: BackendCounts,
    pub proxy: Proxy,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    /// p90 of the requests sent after the scenario's `settled_after`.
    pub p90_settled: Option<Duration>,
    /// Requests sent after `settled_after` that failed.
    pub failed_settled: Option<u64>,
    /// Seconds after the trouble ended until the load offered to the backend fit its
    /// capacity again; `None` if it never did within the run.
    pub recovery: Option<Duration>,
    /// Per second: calls the backend received.
    pub backend_rps: Vec<f64>,
    /// Per second: user requests that succeeded (by completion time).
    pub success_rps: Vec<f64>,
    /// For a scenario with an episode: what it did while the trouble lasted.
    pub episode: Option<Episode>,
    /// Per second: the api hop's retry budget share (`+Inf` without a budget).
    pub share: Vec<f64>,
    /// Per second: the api hop's probability of throttling a first attempt.
    pub throttle: Vec<f64>,
}

/// A chain during and after a scenario's episode (the trouble from its start to its
/// end), measured in 100 ms steps over sliding seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Episode {
    /// Backend calls ÷ user requests sent while the trouble lasted.
    pub amplification: f64,
    /// From the trouble's start until the calls offered to the backend over a second
    /// fall below [`SHED_SHARE`] of the user requests; `None`: never within it.
    pub shed_after: Option<Duration>,
    /// From the trouble's end until the successes over a second reach
    /// [`GOODPUT_SHARE`] of the user requests; `None`: never within the run.
    pub goodput_after: Option<Duration>,
}

/// The load that counts as shed: below this share of the user request rate.
pub const SHED_SHARE: f64 = 0.3;
/// Full goodput: successes at this share of the user request rate.
pub const GOODPUT_SHARE: f64 = 0.95;

impl ChainResult {
    pub fn success_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.succeeded as f64 / self.requests as f64
        }
    }

    pub fn amplification(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.backend_calls as f64 / self.requests as f64
        }
    }

    /// Calls beyond one per request, as a share of the requests (0.05: 5% more load).
    pub fn extra_load(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.backend_calls as f64 / self.requests as f64 - 1.0
        }
    }

    pub fn build(
        (key, title): (&'static str, &'static str),
        records: &[Record],
        arrivals: &[u64],
        backend: BackendCounts,
        proxy: Proxy,
        scenario: &Scenario,
    ) -> Self {
        let latencies: Vec<Duration> = records.iter().map(|r| r.latency).collect();
        let pct = |p: f64| percentile(latencies.clone(), p);
        let settled = |after: Duration| records.iter().filter(move |r| r.sent >= after);
        let p90_settled = scenario
            .settled_after
            .map(|after| percentile(settled(after).map(|r| r.latency).collect(), 0.9));
        let failed_settled = scenario
            .settled_after
            .map(|after| settled(after).filter(|r| !r.ok).count() as u64);
        let run_secs = scenario.load.duration.as_secs_f64().ceil() as usize + 2;
        let per_sec = (Duration::from_secs(1).as_millis() / BUCKET.as_millis()) as usize;
        let backend_rps: Vec<f64> = (0..run_secs)
            .map(|s| arrivals.iter().skip(s * per_sec).take(per_sec).sum::<u64>() as f64)
            .collect();
        let mut success_rps = vec![0.0; run_secs];
        for r in records.iter().filter(|r| r.ok) {
            let s = (r.sent + r.latency).as_secs() as usize;
            if let Some(slot) = success_rps.get_mut(s) {
                *slot += 1.0;
            }
        }
        // Only while load is still offered: a backend that goes quiet because the run
        // ended has not recovered.
        let offered = (scenario.load.duration.as_millis() / BUCKET.as_millis()) as usize;
        let recovery = scenario.recovery_from.and_then(|from| {
            recovery(
                &arrivals[..offered.min(arrivals.len())],
                from,
                scenario.backend.capacity(&scenario.backend.normal),
            )
        });
        let episode = scenario
            .backend
            .episodes
            .first()
            .map(|(from, to, _)| episode(records, arrivals, *from, *to, scenario));
        ChainResult {
            key,
            title,
            episode,
            share: Vec::new(),
            throttle: Vec::new(),
            requests: records.len() as u64,
            succeeded: records.iter().filter(|r| r.ok).count() as u64,
            backend_calls: backend.calls,
            backend,
            proxy,
            p50: pct(0.50),
            p90: pct(0.90),
            p99: pct(0.99),
            p90_settled,
            failed_settled,
            recovery,
            backend_rps,
            success_rps,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "episode": self.episode.map(|e| json!({
                "amplification": e.amplification,
                "shed_after_s": e.shed_after.map(|d| d.as_secs_f64()),
                "goodput_after_s": e.goodput_after.map(|d| d.as_secs_f64()),
            })),
            "requests": self.requests,
            "succeeded": self.succeeded,
            "success_rate": self.success_rate(),
            "backend_calls": self.backend_calls,
            "amplification": self.amplification(),
            "p50_ms": self.p50.as_secs_f64() * 1000.0,
            "p90_ms": self.p90.as_secs_f64() * 1000.0,
            "p99_ms": self.p99.as_secs_f64() * 1000.0,
            "p90_settled_ms": self.p90_settled.map(|d| d.as_secs_f64() * 1000.0),
            "failed_settled": self.failed_settled,
            "extra_load": self.extra_load(),
            "abandoned_at_backend": self.backend.abandoned,
            "silent_connections": self.backend.silent_connections,
            "hedges": {
                "won": self.proxy.hedges_won,
                "lost": self.proxy.hedges_lost,
                "denied": self.proxy.hedges_denied,
            },
            "ejections": self.proxy.ejections,
            "recovery_s": self.recovery.map(|d| d.as_secs_f64()),
            "series": {
                "backend_rps": self.backend_rps,
                "success_rps": self.success_rps,
                "budget_share": self.share.iter().map(|s| s.is_finite().then_some(*s)).collect::<Vec<_>>(),
                "throttle_probability": self.throttle,
            },
        })
    }
}

/// The `p` quantile (nearest rank) of `latencies`; zero for none.
fn percentile(mut latencies: Vec<Duration>, p: f64) -> Duration {
    if latencies.is_empty() {
        return Duration::ZERO;
    }
    latencies.sort();
    let i = ((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len()) - 1;
    latencies[i]
}

/// From `from`, the first instant when the calls arriving over the next second fit
/// the capacity; measured in 100 ms steps.
pub fn recovery(arrivals: &[u64], from: Duration, capacity_per_sec: f64) -> Option<Duration> {
    let start = (from.as_millis() / BUCKET.as_millis()) as usize;
    let window = (Duration::from_secs(1).as_millis() / BUCKET.as_millis()) as usize;
    (start..arrivals.len().saturating_sub(window)).find_map(|i| {
        let calls: u64 = arrivals[i..i + window].iter().sum();
        (calls as f64 <= capacity_per_sec).then(|| BUCKET * (i - start) as u32)
    })
}

/// What a chain did during the episode `from..to` and after it.
fn episode(
    records: &[Record],
    arrivals: &[u64],
    from: Duration,
    to: Duration,
    s: &Scenario,
) -> Episode {
    let bucket = |d: Duration| (d.as_millis() / BUCKET.as_millis()) as usize;
    let second = bucket(Duration::from_secs(1));
    let (start, end) = (bucket(from), bucket(to).min(arrivals.len()));
    let sent = records
        .iter()
        .filter(|r| r.sent >= from && r.sent < to)
        .count();
    let calls: u64 = arrivals.get(start..end).map_or(0, |a| a.iter().sum());
    let per_second = s.load.rps;
    // The first 100 ms step from which the next second's calls are shed.
    let shed_after = (start..end.saturating_sub(second)).find_map(|i| {
        let calls: u64 = arrivals[i..i + second].iter().sum();
        ((calls as f64) < SHED_SHARE * per_second).then(|| BUCKET * (i - start) as u32)
    });
    let mut ok = vec![0u64; arrivals.len().max(bucket(s.load.duration) + second)];
    for r in records.iter().filter(|r| r.ok) {
        if let Some(b) = ok.get_mut(bucket(r.sent + r.latency)) {
            *b += 1;
        }
    }
    // Only while load is still offered: the end of the run is no loss of goodput.
    let last = bucket(s.load.duration).saturating_sub(second);
    let goodput_after = (end..last).find_map(|i| {
        let done: u64 = ok[i..i + second].iter().sum();
        (done as f64 >= GOODPUT_SHARE * per_second).then(|| BUCKET * (i - end) as u32)
    });
    Episode {
        amplification: if sent == 0 {
            0.0
        } else {
            calls as f64 / sent as f64
        },
        shed_after,
        goodput_after,
    }
}

fn fmt_latency(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

/// One row of the table: its label, each chain's cell, and the published figure.
type Row = (String, Vec<String>, String);

/// The table's rows, one cell per chain.
struct Rows<'a> {
    chains: &'a [ChainResult],
    rows: Vec<Row>,
}

impl Rows<'_> {
    fn add(&mut self, label: &str, f: &dyn Fn(&ChainResult) -> String, p: Option<String>) {
        self.rows.push((
            label.to_string(),
            self.chains.iter().map(f).collect(),
            p.unwrap_or_default(),
        ));
    }
}

/// The side-by-side table.
pub fn table(s: &Scenario, chains: &[ChainResult]) -> String {
    let published: Option<&Published> = s.published.as_ref();
    let mut rows = Rows {
        chains,
        rows: Vec::new(),
    };
    let mut row =
        |label: &str, f: &dyn Fn(&ChainResult) -> String, p: Option<String>| rows.add(label, f, p);
    row(
        "requests",
        &|c| c.requests.to_string(),
        published.map(|p| p.requests.to_string()),
    );
    row(
        "succeeded",
        &|c| format!("{} ({:.1}%)", c.succeeded, c.success_rate() * 100.0),
        published.map(|p| {
            format!(
                "{} ({:.1}%)",
                p.succeeded,
                p.succeeded as f64 / p.requests as f64 * 100.0
            )
        }),
    );
    row(
        "backend calls",
        &|c| c.backend_calls.to_string(),
        published.map(|p| p.backend_calls.to_string()),
    );
    row(
        "AMPLIFICATION",
        &|c| format!("{:.2}x", c.amplification()),
        published.map(|p| format!("{:.2}x", p.amplification)),
    );
    row(
        "latency p50",
        &|c| fmt_latency(c.p50),
        published.map(|p| fmt_latency(p.p50)),
    );
    row("latency p90", &|c| fmt_latency(c.p90), None);
    row(
        "latency p99",
        &|c| fmt_latency(c.p99),
        published.map(|p| fmt_latency(p.p99)),
    );
    if let Some(after) = s.settled_after {
        let label = format!("p90 after {:.0}s", after.as_secs_f64());
        row(
            &label,
            &|c| c.p90_settled.map_or(String::new(), fmt_latency),
            None,
        );
        let label = format!("failed after {:.0}s", after.as_secs_f64());
        row(
            &label,
            &|c| c.failed_settled.map_or(String::new(), |n| n.to_string()),
            None,
        );
    }
    if chains
        .iter()
        .any(|c| c.proxy.hedges_sent() + c.proxy.hedges_denied > 0)
    {
        row(
            "extra load",
            &|c| format!("{:.1}%", c.extra_load() * 100.0),
            None,
        );
        row(
            "hedges won/lost/denied",
            &|c| {
                let p = &c.proxy;
                format!("{}/{}/{}", p.hedges_won, p.hedges_lost, p.hedges_denied)
            },
            None,
        );
        row(
            "cancelled at backend",
            &|c| c.backend.abandoned.to_string(),
            None,
        );
    }
    if chains.iter().any(|c| c.backend.silent_connections > 0) {
        row(
            "to the silent endpoint",
            &|c| format!("{} connections", c.backend.silent_connections),
            None,
        );
        row("ejections", &|c| c.proxy.ejections.to_string(), None);
    }
    if s.recovery_from.is_some() {
        row(
            "recovery",
            &|c| match c.recovery {
                Some(d) => format!("{:.1}s", d.as_secs_f64()),
                None => "not within the run".to_string(),
            },
            None,
        );
    }
    episode_rows(&mut rows);
    let head: Row = (
        String::new(),
        chains.iter().map(|c| c.title.to_string()).collect(),
        published.map_or(String::new(), |p| p.source.to_string()),
    );
    render(s, head, &rows.rows)
}

/// The rows of a scenario with an episode: what each chain did while it lasted.
fn episode_rows(rows: &mut Rows<'_>) {
    if !rows.chains.iter().any(|c| c.episode.is_some()) {
        return;
    }
    let after = |d: Option<Duration>, never: &str| match d {
        Some(d) => format!("{:.1}s", d.as_secs_f64()),
        None => never.to_string(),
    };
    let during = |c: &ChainResult, f: &dyn Fn(&Episode) -> String| {
        c.episode.as_ref().map_or(String::new(), f)
    };
    rows.add(
        "amplification in episode",
        &|c| during(c, &|e| format!("{:.2}x", e.amplification)),
        None,
    );
    rows.add(
        "load < 0.3x after",
        &|c| during(c, &|e| after(e.shed_after, "never")),
        None,
    );
    rows.add(
        "full goodput after",
        &|c| during(c, &|e| after(e.goodput_after, "not within the run")),
        None,
    );
}

/// The table as text: its title, then the head and the rows, columns aligned.
fn render(s: &Scenario, head: Row, rows: &[Row]) -> String {
    let all: Vec<&Row> = std::iter::once(&head).chain(rows.iter()).collect();
    let w0 = all.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..head.1.len())
        .map(|i| all.iter().map(|r| r.1[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = format!("tollgate lab: {}\n{}\n\n", s.name, s.about);
    for r in all {
        let mut line = format!("  {:<w0$}", r.0);
        for (cell, w) in r.1.iter().zip(&widths) {
            line.push_str(&format!("   {cell:<w$}"));
        }
        line.push_str("   ");
        line.push_str(&r.2);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub fn to_json(s: &Scenario, chains: &[ChainResult]) -> Value {
    let mut v = json!({
        "scenario": s.name,
        "description": s.about,
        "load": {
            "rps": s.load.rps,
            "duration_s": s.load.duration.as_secs_f64(),
            "deadline_ms": s.load.deadline.as_millis() as u64,
            "patience_ms": s.load.patience.as_millis() as u64,
        },
        "backend_capacity_rps": s.backend.capacity(&s.backend.normal),
        "chains": chains.iter().map(|c| c.key).collect::<Vec<_>>(),
        "published": s.published.map(|p| json!({
            "source": p.source,
            "requests": p.requests,
            "succeeded": p.succeeded,
            "success_rate": p.succeeded as f64 / p.requests as f64,
            "backend_calls": p.backend_calls,
            "amplification": p.amplification,
            "p50_ms": p.p50.as_secs_f64() * 1000.0,
            "p99_ms": p.p99.as_secs_f64() * 1000.0,
        })),
    });
    for c in chains {
        v[c.key] = c.to_json();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_is_the_first_second_that_fits() {
        // 100 ms buckets: 30 calls each (300/s) for 2 s after `from`, then 5 (50/s).
        let mut a = vec![30u64; 20];
        a.extend(vec![5u64; 30]);
        assert_eq!(
            recovery(&a, Duration::ZERO, 100.0),
            Some(Duration::from_millis(1800))
        );
        assert_eq!(recovery(&[30; 40], Duration::ZERO, 100.0), None);
    }
}
