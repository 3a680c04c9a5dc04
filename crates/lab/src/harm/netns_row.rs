//! One harm row about Services on its node ([`super::netns`]): the parts started in
//! order, each waited for (bounded), the Service changed on its schedule, then what the
//! client got and what the apps counted read back from their lines, and the figures and
//! verdicts made as for any other row. In a scale row, when the pod that joined took its
//! first call and the one that left its last, per column, is said beside them (from the
//! apps, which count each pod's calls); the verdict is on success alone.

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::RowResult;
use super::app::Reached;
use super::client::{OUTCOMES, Record};
use super::kube;
use super::netns::{
    CLIENT_NS, Node, PODS, PODS_NS, READY_WAIT, caller_config, discovered, set_headless,
    sidecar_config, wait_for,
};
use super::rows::{Path, Row, Shape};
use super::verdict::{self, Figures, Seen};
use crate::LabError;

/// When, from the first call, a pod joins the name (scale-up) or leaves it
/// (scale-down), and when the pod that left is stopped: after the 5 s the names are
/// followed at, and 2 s more, as a pod's grace period lets its callers see it gone.
pub(super) const SCALE_AT: Duration = Duration::from_secs(5);
const STOP_AT: Duration = Duration::from_secs(12);
/// With discovery, both in one row: a pod joins the Service at [`SCALE_AT`], one
/// leaves it at 10 s and stops 3 s later (a change reaches tollgate within 1 s).
pub(super) const LEAVE_AT: Duration = Duration::from_secs(10);
const DISCOVERED_STOP_AT: Duration = Duration::from_secs(13);
/// From the client's `START` to its first call.
pub(super) const LEAD: Duration = Duration::from_millis(500);

/// One row, in namespaces made for it.
pub async fn run_row(row: Row, shape: Shape, seed: u64) -> Result<RowResult, LabError> {
    tokio::task::spawn_blocking(move || run_blocking(row, shape, seed))
        .await
        .map_err(|e| LabError::Setup(format!("the row's rig: {e}")))?
}

fn run_blocking(row: Row, shape: Shape, seed: u64) -> Result<RowResult, LabError> {
    let node = Node::create(shape)?;
    // The API server first: it takes the longest to be ready.
    let token = if discovered(shape) {
        node.start_api()?
    } else {
        String::new()
    };
    let (apps_in, apps_out) = node.spawn_part(PODS_NS, "apps", &row, seed, &token)?;
    if !wait_for(&apps_out, "READY", READY_WAIT) {
        return Err(node.failure("the apps did not start"));
    }
    for (i, pod) in PODS.iter().enumerate() {
        node.spawn_tollgate(PODS_NS, &format!("sidecar-{i}"), &sidecar_config(pod))?;
    }
    // tollgate reads the kubeconfig's CA when it starts: the API server's own, which
    // it writes when it starts.
    if discovered(shape) && !node.wait_file(&kube::ca_file(&node.dir), kube::READY_WAIT) {
        return Err(node.failure("kube-apiserver made no certificate"));
    }
    node.spawn_tollgate(CLIENT_NS, "caller", &caller_config(shape, &node.dir))?;
    // The client waits until every sidecar and the caller's tollgate listen (and, with
    // discovery, until the API is ready and tollgate has the Service's pods).
    let (_client_in, client_out) = node.spawn_part(CLIENT_NS, "client", &row, seed, &token)?;
    if !wait_for(&client_out, "START", 2 * READY_WAIT + kube::READY_WAIT) {
        return Err(node.failure("the client did not start"));
    }
    let start = std::time::Instant::now() + LEAD;
    let start_wall = SystemTime::now() + LEAD;
    let at = |d: Duration| {
        std::thread::sleep((start + d).saturating_duration_since(std::time::Instant::now()))
    };
    match shape {
        Shape::HeadlessScaleUp => {
            at(SCALE_AT);
            set_headless(&PODS[1..4])?;
        }
        Shape::HeadlessScaleDown => {
            at(SCALE_AT);
            set_headless(&PODS[2..4])?;
            at(STOP_AT);
            node.stop("sidecar-1");
        }
        Shape::DiscoveredScale => {
            // The client writes the API; the pod that left is stopped here.
            at(DISCOVERED_STOP_AT);
            node.stop("sidecar-1");
        }
        Shape::ClusterIpDeadPod
        | Shape::HeadlessDeadFirst
        | Shape::DiscoveredDeadPod
        | Shape::DualStackName => {}
    }
    // Every call has its answer within the app's patience of being sent.
    let until = start + row.traffic.duration() + row.traffic.patience + Duration::from_secs(10);
    let mut records: Vec<Vec<Record>> = vec![Vec::new(); row.columns.len()];
    let mut done = false;
    while !done {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match client_out.recv_timeout(left) {
            Ok(line) if line.trim() == "DONE" => done = true,
            Ok(line) => {
                if let Some((c, r)) = parse_record(&line)
                    && let Some(column) = records.get_mut(c)
                {
                    column.push(r);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(node.failure("the client did not finish in time"));
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(node.failure("the client ended before its last call"));
            }
        }
    }
    // Its stdin closed, the apps say what they counted.
    drop(apps_in);
    let mut seen = vec![Seen::default(); row.columns.len()];
    let mut counted = 0;
    let mut apps_start = None;
    let mut reached = Vec::new();
    while counted < seen.len() {
        match apps_out.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => {
                if let Some((c, s)) = parse_count(&line)
                    && let Some(slot) = seen.get_mut(c)
                {
                    *slot = s;
                    counted += 1;
                }
                if let Some(us) = line.strip_prefix("EPOCH_US ").and_then(|t| t.parse().ok()) {
                    apps_start = Some(UNIX_EPOCH + Duration::from_micros(us));
                }
                reached.extend(parse_reached(&line));
            }
            Err(_) => return Err(node.failure("the apps did not say what they counted")),
        }
    }
    drop(node);
    let direct = records.first().map(Vec::as_slice);
    let figures: Vec<Figures> = row
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let paired = if c.path == Path::Direct { None } else { direct };
            Figures::build(&records[i], paired, c.path.hops(), seen[i])
        })
        .collect();
    let verdicts = (0..row.columns.len())
        .map(|i| verdict::judge(&row, i, &figures))
        .collect();
    // When the pods that came and went took calls, from the row's start.
    let since_start = |d: Duration| {
        let at = apps_start.map_or(start_wall, |a| a + d);
        match at.duration_since(start_wall) {
            Ok(after) => after.as_secs_f64(),
            Err(before) => -before.duration().as_secs_f64(),
        }
    };
    let reached: Vec<Pod> = reached
        .into_iter()
        .map(|((replica, column), r)| Pod {
            replica,
            column,
            first: since_start(r.first),
            last: since_start(r.last),
            calls: r.calls,
        })
        .collect();
    Ok(RowResult {
        shown: shown(shape, &reached),
        row,
        figures,
        verdicts,
        skipped: None,
    })
}

/// The calls of one column that reached one pod's app, in seconds from the row's start.
struct Pod {
    /// Of the apps: 0 is the second pod (the first pod's app is dead).
    replica: usize,
    column: usize,
    first: f64,
    last: f64,
    calls: u64,
}

/// In a scale row, when the pod that joined took its first call and the one that left
/// its last, per column.
fn shown(shape: Shape, reached: &[Pod]) -> Option<String> {
    let (joined, left) = match shape {
        Shape::HeadlessScaleUp => (Some(SCALE_AT), None),
        Shape::HeadlessScaleDown => (None, Some((SCALE_AT, STOP_AT))),
        Shape::DiscoveredScale => (Some(SCALE_AT), Some((LEAVE_AT, DISCOVERED_STOP_AT))),
        Shape::ClusterIpDeadPod
        | Shape::HeadlessDeadFirst
        | Shape::DiscoveredDeadPod
        | Shape::DualStackName => {
            return None;
        }
    };
    let column = |replica: usize, column: usize| {
        reached
            .iter()
            .find(|p| p.replica == replica && p.column == column)
    };
    let name = |c: usize| if c == 0 { "direct" } else { "tollgate" };
    let mut out = Vec::new();
    if let Some(at) = joined {
        // The fourth pod: the apps' third.
        let said: Vec<String> = (0..2)
            .map(|c| match column(2, c) {
                Some(p) => format!(
                    "{}: its first call {:.1} s after ({} calls)",
                    name(c),
                    p.first - at.as_secs_f64(),
                    p.calls
                ),
                None => format!("{}: no call", name(c)),
            })
            .collect();
        out.push(format!(
            "the pod that joined at {} s: {}",
            at.as_secs(),
            said.join("; ")
        ));
    }
    if let Some((at, stopped)) = left {
        // The second pod: the apps' first.
        let said: Vec<String> = (0..2)
            .map(|c| match column(0, c) {
                Some(p) if p.last < at.as_secs_f64() => {
                    format!("{}: its last call before it left", name(c))
                }
                Some(p) => format!(
                    "{}: its last call {:.1} s after",
                    name(c),
                    p.last - at.as_secs_f64()
                ),
                None => format!("{}: no call", name(c)),
            })
            .collect();
        out.push(format!(
            "the pod that left at {} s (stopped at {} s): {}",
            at.as_secs(),
            stopped.as_secs(),
            said.join("; ")
        ));
    }
    Some(out.join(". "))
}

/// `REACHED replica column first_us last_us calls`, from the apps' start.
fn parse_reached(line: &str) -> Option<((usize, usize), Reached)> {
    let mut f = line.strip_prefix("REACHED ")?.split_whitespace();
    let mut next = || f.next()?.parse::<u64>().ok();
    let (replica, column) = (next()? as usize, next()? as usize);
    Some((
        (replica, column),
        Reached {
            first: Duration::from_micros(next()?),
            last: Duration::from_micros(next()?),
            calls: next()?,
        },
    ))
}

/// `REC column seq sent_us latency_us status ok outcome attempts`.
pub(super) fn format_record(column: usize, r: &Record) -> String {
    format!(
        "REC {column} {} {} {} {} {} {} {}",
        r.seq,
        r.sent.as_micros(),
        r.latency.as_micros(),
        r.status,
        u8::from(r.ok),
        r.outcome.unwrap_or("-"),
        r.attempts
    )
}

fn parse_record(line: &str) -> Option<(usize, Record)> {
    let mut f = line.strip_prefix("REC ")?.split_whitespace();
    let column = f.next()?.parse().ok()?;
    let seq = f.next()?.parse().ok()?;
    let sent = Duration::from_micros(f.next()?.parse().ok()?);
    let latency = Duration::from_micros(f.next()?.parse().ok()?);
    let status = f.next()?.parse().ok()?;
    let ok = f.next()? == "1";
    let word = f.next()?;
    let outcome = OUTCOMES.iter().find(|o| **o == word).copied();
    let attempts = f.next()?.parse().ok()?;
    Some((
        column,
        Record {
            seq,
            sent,
            latency,
            status,
            ok,
            outcome,
            attempts,
        },
    ))
}

/// `COUNT column calls retries peak`.
fn parse_count(line: &str) -> Option<(usize, Seen)> {
    let mut f = line.strip_prefix("COUNT ")?.split_whitespace();
    let column = f.next()?.parse().ok()?;
    Some((
        column,
        Seen {
            calls: f.next()?.parse().ok()?,
            retried: f.next()?.parse().ok()?,
            peak_waiting: f.next()?.parse().ok()?,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_goes_through_its_line_whole() {
        let r = Record {
            seq: 41,
            sent: Duration::from_micros(820_000),
            latency: Duration::from_micros(1_234),
            status: 502,
            ok: false,
            outcome: Some("app-unreachable"),
            attempts: 3,
        };
        let (c, back) = parse_record(&format_record(1, &r)).unwrap_or_else(|| unreachable!());
        assert_eq!(c, 1);
        assert_eq!(
            (back.seq, back.sent, back.latency, back.status, back.ok),
            (r.seq, r.sent, r.latency, r.status, r.ok)
        );
        assert_eq!((back.outcome, back.attempts), (r.outcome, r.attempts));
        let none = Record { outcome: None, ..r };
        let (_, back) = parse_record(&format_record(0, &none)).unwrap_or_else(|| unreachable!());
        assert_eq!(back.outcome, None);
        assert_eq!(
            parse_count("COUNT 1 1040 40 3").map(|(c, s)| (c, s.calls, s.retried)),
            Some((1, 1040, 40))
        );
    }
}
