//! Real client programs as the app of a harm row: Node's undici, Python's grpcio and
//! Python's requests, the clients teams run, which reach tollgate through `http_proxy`:
//! undici and grpcio by sending `CONNECT host:80` even for plain `http://`, requests
//! with the request in absolute form on a connection that leaves Nagle's algorithm on.
//! The lab's own client cannot show what they do, so each column runs the program
//! itself: the same script, the same plan (its calls' instants and paths on stdin), the
//! same start on the wall clock, with `http_proxy` pointing at tollgate or unset; it
//! prints one line a call, read back as the column's records.
//!
//! The programs are not part of tollgate: a row whose program cannot run here (no
//! `node` that finds undici, through `NODE_PATH`; no `python3` that finds grpcio or
//! requests, through `PYTHONPATH` or a venv) is skipped and says how to install it.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::time::Instant;

use super::client::{Program, Record, Target, Traffic, outcome_word};
use crate::LabError;

/// How long a row waits for its programs to start before the first call.
pub const LEAD: Duration = Duration::from_secs(3);

/// What the programs' environment must not carry: the caller's own proxy settings.
const PROXY_VARS: [&str; 11] = [
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "grpc_proxy",
    "no_proxy",
    "NO_PROXY",
    "no_grpc_proxy",
    "GRPC_PROXY_EXP",
];

impl Program {
    pub fn name(self) -> &'static str {
        match self {
            Program::Undici => "node with undici",
            Program::Grpc => "python3 with grpcio",
            Program::Requests => "python3 with requests",
        }
    }

    fn interpreter(self) -> &'static str {
        match self {
            Program::Undici => "node",
            Program::Grpc | Program::Requests => "python3",
        }
    }

    /// The interpreter's flag for a program given on the command line.
    fn inline(self) -> &'static str {
        match self {
            Program::Undici => "-e",
            Program::Grpc | Program::Requests => "-c",
        }
    }

    fn script(self) -> &'static str {
        match self {
            Program::Undici => include_str!("programs/undici.js"),
            Program::Grpc => include_str!("programs/grpc_client.py"),
            Program::Requests => include_str!("programs/requests_post.py"),
        }
    }

    /// A line that fails unless the client library is there.
    fn probe(self) -> &'static str {
        match self {
            Program::Undici => {
                "if (typeof require('undici').EnvHttpProxyAgent !== 'function') process.exit(1)"
            }
            Program::Grpc => "import grpc",
            Program::Requests => "import requests",
        }
    }

    fn install(self) -> &'static str {
        match self {
            Program::Undici => {
                "`npm install undici@6` from the npm registry and set NODE_PATH to its node_modules"
            }
            Program::Grpc => {
                "`python3 -m pip install --target DIR grpcio` from the Python package index and \
                 set PYTHONPATH to DIR (or a venv with grpcio first on PATH)"
            }
            Program::Requests => {
                "`python3 -m pip install --target DIR requests` from the Python package index \
                 and set PYTHONPATH to DIR (or a venv with requests first on PATH)"
            }
        }
    }

    /// `Err(why)` when this machine cannot run the program.
    pub async fn available(self) -> Result<(), String> {
        let mut cmd = Command::new(self.interpreter());
        cmd.arg(self.inline())
            .arg(self.probe())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        match tokio::time::timeout(Duration::from_secs(30), cmd.status()).await {
            Ok(Ok(s)) if s.success() => Ok(()),
            Ok(Ok(_)) => Err(format!("needs {}: {}", self.name(), self.install())),
            Ok(Err(e)) => Err(format!(
                "cannot run {} ({e}): {}",
                self.interpreter(),
                self.install()
            )),
            Err(_) => Err(format!("{} did not start in 30 s", self.interpreter())),
        }
    }

    /// The program for one column: straight to its address, or through `http_proxy`
    /// (the target's `absolute`) to the host the app names.
    fn command(
        self,
        target: &Target,
        column: usize,
        start_ms: u128,
        patience: Duration,
    ) -> Command {
        let mut cmd = Command::new(self.interpreter());
        cmd.arg(self.inline()).arg(self.script());
        for var in PROXY_VARS {
            cmd.env_remove(var);
        }
        let addr = target
            .addrs
            .first()
            .map_or_else(String::new, ToString::to_string);
        if target.absolute {
            cmd.env("http_proxy", format!("http://{addr}"));
        }
        let (base, grpc_target) = if target.absolute {
            (
                format!("http://{}", target.host),
                format!("{}:80", target.host),
            )
        } else {
            (format!("http://{addr}"), addr)
        };
        cmd.env("HARM_BASE", base)
            .env("HARM_TARGET", grpc_target)
            .env("HARM_COLUMN", column.to_string())
            .env("HARM_START_MS", start_ms.to_string())
            .env("HARM_PATIENCE_MS", patience.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }
}

/// One line of a program's output: `seq status ok latency_us attempts outcome`.
fn parse_line(line: &str, plan: &[(Duration, String)]) -> Option<Record> {
    let mut f = line.split_whitespace();
    let seq: u32 = f.next()?.parse().ok()?;
    let status: u16 = f.next()?.parse().ok()?;
    let ok = f.next()? == "1";
    let us: u64 = f.next()?.parse().ok()?;
    let attempts: u8 = f.next()?.parse().unwrap_or(0);
    let outcome = f.next().filter(|o| *o != "-").map(outcome_word);
    Some(Record {
        seq,
        sent: plan.get(seq as usize)?.0,
        latency: Duration::from_micros(us),
        status,
        ok,
        outcome,
        attempts,
    })
}

/// The records a program printed, one for each call of the plan: a call it said
/// nothing of is one that got no answer.
fn records(stdout: &str, plan: &[(Duration, String)], patience: Duration) -> Vec<Record> {
    let mut by_seq: Vec<Option<Record>> = vec![None; plan.len()];
    for r in stdout.lines().filter_map(|l| parse_line(l, plan)) {
        if let Some(slot) = by_seq.get_mut(r.seq as usize) {
            *slot = Some(r);
        }
    }
    by_seq
        .into_iter()
        .enumerate()
        .map(|(seq, r)| {
            r.unwrap_or(Record {
                seq: seq as u32,
                sent: plan[seq].0,
                latency: patience,
                status: 0,
                ok: false,
                outcome: None,
                attempts: 0,
            })
        })
        .collect()
}

/// Runs `program` for every column at once, each sending `plan` from `start`; each
/// column's records, in order of `seq`.
pub async fn drive(
    program: Program,
    targets: &[Target],
    plan: &[(Duration, String)],
    traffic: &Traffic,
    start: Instant,
) -> Result<Vec<Vec<Record>>, LabError> {
    let setup = |what: String| LabError::Setup(format!("{}: {what}", program.name()));
    let wall = SystemTime::now() + start.saturating_duration_since(Instant::now());
    let start_ms = wall
        .duration_since(UNIX_EPOCH)
        .map_err(|e| setup(e.to_string()))?
        .as_millis();
    let input: String = plan
        .iter()
        .enumerate()
        .map(|(seq, (at, path))| format!("{seq} {} {path}\n", at.as_millis()))
        .collect();
    // Every call has its answer or its patience spent by then, with room to start and
    // to print.
    let bound = LEAD + traffic.duration() + traffic.patience + Duration::from_secs(30);
    let mut runs = tokio::task::JoinSet::new();
    for (column, target) in targets.iter().enumerate() {
        let mut child = program
            .command(target, column, start_ms, traffic.patience)
            .spawn()
            .map_err(|e| setup(e.to_string()))?;
        let input = input.clone();
        runs.spawn(async move {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(input.as_bytes()).await;
            }
            (
                column,
                tokio::time::timeout(bound, child.wait_with_output()).await,
            )
        });
    }
    let mut out: Vec<Vec<Record>> = targets.iter().map(|_| Vec::new()).collect();
    while let Some(done) = runs.join_next().await {
        let (column, run) = done.map_err(|e| setup(e.to_string()))?;
        let output = match run {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(setup(e.to_string())),
            Err(_) => {
                return Err(setup(format!(
                    "column {column} did not finish in {} s",
                    bound.as_secs()
                )));
            }
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(setup(format!(
                "column {column} exited with {}: {}",
                output.status,
                tail.join("\n")
            )));
        }
        out[column] = records(
            &String::from_utf8_lossy(&output.stdout),
            plan,
            traffic.patience,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_line_is_a_record_and_a_silent_call_is_unanswered() {
        let plan: Vec<(Duration, String)> = (0..3)
            .map(|i| (Duration::from_millis(i * 5), format!("/item/{i}")))
            .collect();
        let text = "2 503 0 1500 3 attempts-exhausted\n0 200 1 250 1 -\nnot a line\n";
        let r = records(text, &plan, Duration::from_secs(10));
        assert_eq!(r.len(), 3);
        assert!(r[0].ok && r[0].status == 200 && r[0].outcome.is_none());
        assert_eq!(r[0].latency, Duration::from_micros(250));
        assert_eq!((r[1].status, r[1].ok), (0, false));
        assert_eq!(r[2].outcome, Some("attempts-exhausted"));
        assert_eq!((r[2].attempts, r[2].sent), (3, Duration::from_millis(10)));
    }
}
