//! What a lab run measured, as a table for people and JSON for machines.

use std::time::Duration;

use serde_json::{Value, json};

use super::backend::BUCKET;
use super::load::Record;
use super::scenario::{Published, Scenario};

/// One chain's results.
#[derive(Clone, Debug)]
pub struct ChainResult {
    pub chain: &'static str,
    pub requests: u64,
    pub succeeded: u64,
    pub backend_calls: u64,
    pub p50: Duration,
    pub p99: Duration,
    /// Seconds after the trouble ended until the load offered to the backend fit its
    /// capacity again; `None` if it never did within the run.
    pub recovery: Option<Duration>,
    /// Per second: calls the backend received.
    pub backend_rps: Vec<f64>,
    /// Per second: user requests that succeeded (by completion time).
    pub success_rps: Vec<f64>,
}

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

    pub fn build(
        chain: &'static str,
        records: &[Record],
        arrivals: &[u64],
        backend_calls: u64,
        scenario: &Scenario,
    ) -> Self {
        let mut latencies: Vec<Duration> = records.iter().map(|r| r.latency).collect();
        latencies.sort();
        let pct = |p: f64| -> Duration {
            if latencies.is_empty() {
                return Duration::ZERO;
            }
            let i = ((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len()) - 1;
            latencies[i]
        };
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
        ChainResult {
            chain,
            requests: records.len() as u64,
            succeeded: records.iter().filter(|r| r.ok).count() as u64,
            backend_calls,
            p50: pct(0.50),
            p99: pct(0.99),
            recovery,
            backend_rps,
            success_rps,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "requests": self.requests,
            "succeeded": self.succeeded,
            "success_rate": self.success_rate(),
            "backend_calls": self.backend_calls,
            "amplification": self.amplification(),
            "p50_ms": self.p50.as_secs_f64() * 1000.0,
            "p99_ms": self.p99.as_secs_f64() * 1000.0,
            "recovery_s": self.recovery.map(|d| d.as_secs_f64()),
            "series": {
                "backend_rps": self.backend_rps,
                "success_rps": self.success_rps,
            },
        })
    }
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

fn fmt_latency(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

/// The side-by-side table.
pub fn table(s: &Scenario, naive: &ChainResult, owned: &ChainResult) -> String {
    let published: Option<&Published> = s.published.as_ref();
    let mut rows: Vec<(String, String, String, String)> = Vec::new();
    let mut row = |label: &str, f: &dyn Fn(&ChainResult) -> String, p: Option<String>| {
        rows.push((label.to_string(), f(naive), f(owned), p.unwrap_or_default()));
    };
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
    row(
        "latency p99",
        &|c| fmt_latency(c.p99),
        published.map(|p| fmt_latency(p.p99)),
    );
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
    let head = (
        String::new(),
        "naive (blind retries)".to_string(),
        "owned (tollgate)".to_string(),
        published.map_or(String::new(), |p| p.source.to_string()),
    );
    let all: Vec<&(String, String, String, String)> =
        std::iter::once(&head).chain(rows.iter()).collect();
    let w0 = all.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let w1 = all.iter().map(|r| r.1.len()).max().unwrap_or(0);
    let w2 = all.iter().map(|r| r.2.len()).max().unwrap_or(0);
    let mut out = format!("tollgate lab: {}\n{}\n\n", s.name, s.about);
    for r in all {
        let line = format!("  {:<w0$}   {:<w1$}   {:<w2$}   {}", r.0, r.1, r.2, r.3);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub fn to_json(s: &Scenario, naive: &ChainResult, owned: &ChainResult) -> Value {
    json!({
        "scenario": s.name,
        "description": s.about,
        "load": {
            "rps": s.load.rps,
            "duration_s": s.load.duration.as_secs_f64(),
            "deadline_ms": s.load.deadline.as_millis() as u64,
            "patience_ms": s.load.patience.as_millis() as u64,
        },
        "backend_capacity_rps": s.backend.capacity(&s.backend.normal),
        "naive": naive.to_json(),
        "owned": owned.to_json(),
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
    })
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
