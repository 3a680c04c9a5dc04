//! The access log: with `[access_log] enabled = true`, one line per request on stderr,
//! written when its answer has gone out (so the duration covers a streamed body):
//! upstream, method, authority, path (without the query unless `query = true`),
//! status, attempts, outcome, the reason of each retry, the reason a retry was
//! refused, the deadline the caller sent, and the total and upstream durations.
//!
//! Off, it costs a request nothing: the handler reads one flag. On, each request
//! builds its line on its own thread and hands it to a writer thread over a bounded
//! queue, so a slow stderr never stalls a request; lines that do not fit are counted
//! and the count is written instead.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;
use serde_json::json;

use super::server::Finish;
use crate::config::AccessLogFormat;
use crate::metrics::{Denied, Outcome};
use crate::retry::policy::Failure;

/// Lines waiting for the writer before new ones are dropped (and counted).
const QUEUE: usize = 16 * 1024;

/// The logs are JSON lines (`--log-format json`): so are the access lines.
static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// Says the logs are JSON lines, so the access log writes JSON whatever its `format`.
pub fn logs_are_json() {
    JSON_LOGS.store(true, Relaxed);
}

/// One request's line, filled in as the request is answered.
pub struct Entry {
    pub format: AccessLogFormat,
    pub upstream: Option<String>,
    pub method: Method,
    pub authority: String,
    pub path: String,
    pub status: u16,
    pub attempts: u32,
    pub outcome: Outcome,
    pub retries: Vec<Failure>,
    pub denied: Option<Denied>,
    /// The deadline the caller sent, if any.
    pub deadline: Option<Duration>,
    /// From arrival to the response head.
    pub upstream_time: Option<Duration>,
}

impl Finish for Entry {
    fn finish(self: Box<Self>, total: Duration) {
        write_line(self.line(total));
    }
}

impl Entry {
    fn line(&self, total: Duration) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let retries: Vec<&str> = self.retries.iter().map(Failure::condition).collect();
        if self.format == AccessLogFormat::Json || JSON_LOGS.load(Relaxed) {
            return json!({
                "timestamp": timestamp(SystemTime::now()),
                "kind": "access",
                "upstream": self.upstream,
                "method": self.method.as_str(),
                "authority": self.authority,
                "path": self.path,
                "status": self.status,
                "attempts": self.attempts,
                "outcome": self.outcome.as_str(),
                "retries": retries,
                "denied": self.denied.map(Denied::as_str),
                "deadline_ms": self.deadline.map(|d| d.as_millis() as u64),
                "duration_ms": round3(ms(total)),
                "upstream_ms": self.upstream_time.map(|d| round3(ms(d))),
            })
            .to_string();
        }
        let mut line = String::with_capacity(256);
        let _ = write!(
            line,
            "{} access upstream={} method={} authority={} path={} status={} attempts={} \
             outcome={} retries={} denied={} deadline_ms={} duration_ms={:.3} upstream_ms={}",
            timestamp(SystemTime::now()),
            self.upstream.as_deref().unwrap_or("-"),
            self.method,
            quoted(&self.authority),
            quoted(&self.path),
            self.status,
            self.attempts,
            self.outcome.as_str(),
            if retries.is_empty() {
                "-".to_string()
            } else {
                retries.join(",")
            },
            self.denied.map_or("-", Denied::as_str),
            self.deadline
                .map_or("-".to_string(), |d| d.as_millis().to_string()),
            ms(total),
            self.upstream_time
                .map_or("-".to_string(), |d| format!("{:.3}", ms(d))),
        );
        line
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A value as `key=value` text: as it is when it is one plain word, else quoted with
/// `"` and `\` escaped (a request's path is the app's, and may hold anything).
fn quoted(v: &str) -> String {
    if !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' && b != b'=')
    {
        return v.to_string();
    }
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `2026-12-01T07:00:00.123456Z`.
fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// The proleptic Gregorian date of a day number since 1970-01-01 (Howard Hinnant's
/// algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Lines dropped because the writer was behind.
static DROPPED: AtomicU64 = AtomicU64::new(0);

fn sender() -> &'static SyncSender<String> {
    static SENDER: OnceLock<SyncSender<String>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = sync_channel(QUEUE);
        // A writer that cannot start leaves the queue to fill: lines are then dropped
        // and counted, never blocking a request.
        let _ = std::thread::Builder::new()
            .name("tollgate-access-log".into())
            .spawn(move || writer(rx));
        tx
    })
}

fn write_line(line: String) {
    match sender().try_send(line) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            DROPPED.fetch_add(1, Relaxed);
        }
    }
}

/// Writes lines as they come, in batches when they come faster than stderr takes them.
fn writer(rx: Receiver<String>) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stderr());
    while let Ok(line) = rx.recv() {
        let _ = out.write_all(line.as_bytes());
        let _ = out.write_all(b"\n");
        while let Ok(line) = rx.try_recv() {
            let _ = out.write_all(line.as_bytes());
            let _ = out.write_all(b"\n");
        }
        let dropped = DROPPED.swap(0, Relaxed);
        if dropped > 0 {
            let _ = writeln!(
                out,
                "{} access log: {dropped} lines dropped (stderr could not keep up)",
                timestamp(SystemTime::now())
            );
        }
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::from_micros(1_764_572_400_123_456);
        assert_eq!(timestamp(t), "2025-12-01T07:00:00.123456Z");
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(timestamp(leap), "2000-02-29T00:00:00.000000Z");
    }

    #[test]
    fn values_that_are_not_plain_words_are_quoted() {
        assert_eq!(quoted("/charge/1"), "/charge/1");
        assert_eq!(quoted("/a b"), "\"/a b\"");
        assert_eq!(quoted("x\"y\\z"), "\"x\\\"y\\\\z\"");
        assert_eq!(quoted(""), "\"\"");
        assert_eq!(quoted("a\nb"), "\"a\\u{a}b\"");
    }
}
