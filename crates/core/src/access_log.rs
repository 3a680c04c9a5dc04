//! The access log: with `[access_log] enabled = true`, one line per request on stderr,
//! outbound and inbound alike (`direction`), written when its answer has gone out (so
//! the duration covers a streamed body): upstream, method, authority, path (without the
//! query unless `query = true`),
//! status, attempts, outcome, the reason of each retry, the reason a retry was
//! refused, the deadline the caller sent, the total and upstream durations, and, for
//! a request taken for the app's own retry, the evidence (`app_retry`), and the
//! request's idempotency key (`idempotency_key`: the app's own, or the one minted for
//! it; inbound, the one the caller sent). An inbound line
//! also says who called (`caller`, its address) and what the request was to the fleet
//! budget (`kind`: `first`, `retry`, or `probe` for a kubelet probe spared shedding).
//! A request that is traced ([`crate::trace`]) ends its line with its `trace_id`.
//!
//! Off, it costs a request nothing: the handler reads one flag. On, each request
//! builds its line on its own thread and hands it to a writer thread over a bounded
//! queue, so a slow stderr never stalls a request; lines that do not fit are counted
//! and the count is written instead.
//!
//! After each batch the writer lets the next lines gather for [`LINGER`] before it
//! looks again: under load a line then costs neither a wake-up of the writer (a futex
//! call on each side) nor a write of its own, only its place in the next batch. An idle
//! writer waits for the next line without waking. At exit, [`drain`] gives the writer
//! a moment to write what is queued.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{Method, Request};

use crate::config::{AccessLogConfig, AccessLogFormat};
use crate::fault::Fault;
use crate::http::fields::authority_of;
use crate::metrics::{Evidence, Outcome};
use crate::server::Finish;

/// Lines waiting for the writer before new ones are dropped (and counted).
const QUEUE: usize = 16 * 1024;
/// How long lines gather after a batch before the writer takes the next one.
const LINGER: Duration = Duration::from_millis(5);

/// The logs are JSON lines (`--log-format json`): so are the access lines.
static JSON_LOGS: AtomicBool = AtomicBool::new(false);

/// Says the logs are JSON lines, so the access log writes JSON whatever its `format`.
pub fn logs_are_json() {
    JSON_LOGS.store(true, Relaxed);
}

/// Which side a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the app, to an upstream.
    Outbound,
    /// From a caller, to the app (`[inbound]`).
    Inbound,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }
}

/// One request's line, filled in as the request is answered.
pub struct Entry {
    pub format: AccessLogFormat,
    pub direction: Direction,
    pub upstream: Option<String>,
    pub method: Method,
    pub authority: String,
    pub path: String,
    pub status: u16,
    pub attempts: u32,
    pub outcome: Outcome,
    pub retries: Vec<Fault>,
    /// The endpoint address each attempt went to (`None`: a name not resolved yet).
    pub peers: Vec<Option<std::net::SocketAddr>>,
    /// Why a retry (or, inbound, the request) was refused: a `reason` of
    /// `tollgate_retries_denied_total` or `tollgate_inbound_denied_total`.
    pub denied: Option<&'static str>,
    /// The deadline the caller sent, if any.
    pub deadline: Option<Duration>,
    /// From arrival to the response head.
    pub upstream_time: Option<Duration>,
    /// Taken for the app's own retry, on this evidence.
    pub app_retry: Option<Evidence>,
    /// Inbound: the caller's address.
    pub caller: Option<std::net::IpAddr>,
    /// Inbound: `first`, `retry` or `probe`.
    pub kind: Option<&'static str>,
    /// The request's idempotency key (outbound: the app's own or the one minted).
    pub idempotency_key: Option<String>,
    /// The trace the request is part of, when it is traced.
    pub trace_id: Option<crate::trace::TraceId>,
}

impl Entry {
    /// The line of `req`, begun as it arrives: its method, the authority it names and
    /// its path (with the query when `log.query` asks for it).
    pub fn of_request<B>(
        req: &Request<B>,
        log: AccessLogConfig,
        direction: Direction,
    ) -> Box<Entry> {
        let uri = req.uri();
        let path = if log.query {
            uri.path_and_query().map_or("/", |p| p.as_str())
        } else {
            uri.path()
        };
        Entry::new(
            log.format,
            direction,
            req.method().clone(),
            authority_of(req).unwrap_or_default().to_string(),
            path.to_string(),
        )
    }

    /// A line begun as the request arrives, the rest filled in as it is answered.
    pub fn new(
        format: AccessLogFormat,
        direction: Direction,
        method: Method,
        authority: String,
        path: String,
    ) -> Box<Entry> {
        Box::new(Entry {
            format,
            direction,
            upstream: None,
            method,
            authority,
            path,
            status: 0,
            attempts: 0,
            outcome: Outcome::Ok,
            retries: Vec::new(),
            peers: Vec::new(),
            denied: None,
            deadline: None,
            upstream_time: None,
            app_retry: None,
            idempotency_key: None,
            caller: None,
            kind: None,
            trace_id: None,
        })
    }
}

impl Finish for Entry {
    fn finish(self: Box<Self>, total: Duration) {
        write_line(self.line(total));
    }
}

impl Entry {
    /// The line, built by hand: `format!` and float formatting would cost several
    /// times what the request itself costs.
    fn line(&self, total: Duration) -> String {
        let json = self.format == AccessLogFormat::Json || JSON_LOGS.load(Relaxed);
        let mut l = String::with_capacity(320);
        let upstream = self.upstream.as_deref();
        if json {
            l.push_str("{\"timestamp\":\"");
            push_timestamp(&mut l, SystemTime::now());
            l.push_str("\",\"kind\":\"access\",\"direction\":\"");
            l.push_str(self.direction.as_str());
            l.push_str("\",\"upstream\":");
            push_json_opt(&mut l, upstream);
            l.push_str(",\"method\":");
            push_json(&mut l, self.method.as_str());
            l.push_str(",\"authority\":");
            push_json(&mut l, &self.authority);
            l.push_str(",\"path\":");
            push_json(&mut l, &self.path);
            l.push_str(",\"status\":");
            push_int(&mut l, u64::from(self.status));
            l.push_str(",\"attempts\":");
            push_int(&mut l, u64::from(self.attempts));
            l.push_str(",\"outcome\":\"");
            l.push_str(self.outcome.as_str());
            l.push_str("\",\"retries\":[");
            for (i, f) in self.retries.iter().enumerate() {
                if i > 0 {
                    l.push(',');
                }
                push_json(&mut l, f.condition());
            }
            l.push_str("],\"peer\":[");
            for (i, p) in self.peers.iter().enumerate() {
                if i > 0 {
                    l.push(',');
                }
                match p {
                    Some(p) => {
                        let _ = write!(l, "\"{p}\"");
                    }
                    None => l.push_str("null"),
                }
            }
            l.push_str("],\"denied\":");
            push_json_opt(&mut l, self.denied);
            l.push_str(",\"deadline_ms\":");
            match self.deadline {
                Some(d) => push_int(&mut l, d.as_millis() as u64),
                None => l.push_str("null"),
            }
            l.push_str(",\"duration_ms\":");
            push_millis(&mut l, total);
            l.push_str(",\"upstream_ms\":");
            match self.upstream_time {
                Some(d) => push_millis(&mut l, d),
                None => l.push_str("null"),
            }
            l.push_str(",\"app_retry\":");
            push_json_opt(&mut l, self.app_retry.map(Evidence::as_str));
            l.push_str(",\"idempotency_key\":");
            push_json_opt(&mut l, self.idempotency_key.as_deref());
            if self.direction == Direction::Inbound {
                l.push_str(",\"caller\":");
                push_json_opt(&mut l, self.caller.map(|c| c.to_string()).as_deref());
                l.push_str(",\"request_kind\":");
                push_json_opt(&mut l, self.kind);
            }
            if let Some(id) = self.trace_id {
                let _ = write!(l, ",\"trace_id\":\"{id}\"");
            }
            l.push('}');
            return l;
        }
        push_timestamp(&mut l, SystemTime::now());
        l.push_str(" access direction=");
        l.push_str(self.direction.as_str());
        l.push_str(" upstream=");
        l.push_str(upstream.unwrap_or("-"));
        l.push_str(" method=");
        l.push_str(self.method.as_str());
        l.push_str(" authority=");
        push_quoted(&mut l, &self.authority);
        l.push_str(" path=");
        push_quoted(&mut l, &self.path);
        l.push_str(" status=");
        push_int(&mut l, u64::from(self.status));
        l.push_str(" attempts=");
        push_int(&mut l, u64::from(self.attempts));
        // Outbound: the endpoint each attempt went to (inbound, the app is the one).
        if self.direction == Direction::Outbound {
            l.push_str(" peer=");
        }
        if self.peers.is_empty() && self.direction == Direction::Outbound {
            l.push('-');
        }
        for (i, p) in self.peers.iter().enumerate() {
            if i > 0 {
                l.push(',');
            }
            match p {
                Some(p) => {
                    let _ = write!(l, "{p}");
                }
                None => l.push('-'),
            }
        }
        l.push_str(" outcome=");
        l.push_str(self.outcome.as_str());
        l.push_str(" retries=");
        if self.retries.is_empty() {
            l.push('-');
        }
        for (i, f) in self.retries.iter().enumerate() {
            if i > 0 {
                l.push(',');
            }
            l.push_str(f.condition());
        }
        l.push_str(" denied=");
        l.push_str(self.denied.unwrap_or("-"));
        l.push_str(" deadline_ms=");
        match self.deadline {
            Some(d) => push_int(&mut l, d.as_millis() as u64),
            None => l.push('-'),
        }
        l.push_str(" duration_ms=");
        push_millis(&mut l, total);
        l.push_str(" upstream_ms=");
        match self.upstream_time {
            Some(d) => push_millis(&mut l, d),
            None => l.push('-'),
        }
        l.push_str(" app_retry=");
        l.push_str(self.app_retry.map_or("-", Evidence::as_str));
        l.push_str(" idempotency_key=");
        match &self.idempotency_key {
            Some(k) => push_quoted(&mut l, k),
            None => l.push('-'),
        }
        if self.direction == Direction::Inbound {
            l.push_str(" caller=");
            match self.caller {
                Some(c) => {
                    let _ = write!(l, "{c}");
                }
                None => l.push('-'),
            }
            l.push_str(" request_kind=");
            l.push_str(self.kind.unwrap_or("-"));
        }
        if let Some(id) = self.trace_id {
            let _ = write!(l, " trace_id={id}");
        }
        l
    }
}

fn push_int(l: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        l.push(char::from(d));
    }
}

/// Milliseconds with three decimals (microseconds).
fn push_millis(l: &mut String, d: Duration) {
    let micros = d.as_micros() as u64;
    push_int(l, micros / 1000);
    l.push('.');
    let frac = micros % 1000;
    l.push(char::from(b'0' + (frac / 100) as u8));
    l.push(char::from(b'0' + (frac / 10 % 10) as u8));
    l.push(char::from(b'0' + (frac % 10) as u8));
}

/// A JSON string.
fn push_json(l: &mut String, v: &str) {
    l.push('"');
    for c in v.chars() {
        match c {
            '"' => l.push_str("\\\""),
            '\\' => l.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(l, "\\u{:04x}", c as u32);
            }
            c => l.push(c),
        }
    }
    l.push('"');
}

fn push_json_opt(l: &mut String, v: Option<&str>) {
    match v {
        Some(v) => push_json(l, v),
        None => l.push_str("null"),
    }
}

fn push_quoted(l: &mut String, v: &str) {
    if !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' && b != b'=')
    {
        l.push_str(v);
    } else {
        l.push_str(&quoted(v));
    }
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

thread_local! {
    /// The date and time of the current second, formatted once per second per thread.
    static SECOND: std::cell::RefCell<(u64, String)> =
        const { std::cell::RefCell::new((u64::MAX, String::new())) };
}

/// Appends `2026-12-01T07:00:00.123456Z`.
fn push_timestamp(l: &mut String, t: SystemTime) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    SECOND.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != d.as_secs() {
            let whole = timestamp(UNIX_EPOCH + Duration::from_secs(d.as_secs()));
            *cached = (d.as_secs(), whole[..19].to_string());
        }
        l.push_str(&cached.1);
    });
    l.push('.');
    let mut micros = [b'0'; 6];
    let mut m = d.subsec_micros();
    for slot in micros.iter_mut().rev() {
        *slot = b'0' + (m % 10) as u8;
        m /= 10;
    }
    for &b in &micros {
        l.push(char::from(b));
    }
    l.push('Z');
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
/// Lines queued and not yet written.
static PENDING: AtomicU64 = AtomicU64::new(0);

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
    PENDING.fetch_add(1, Relaxed);
    match sender().try_send(line) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            PENDING.fetch_sub(1, Relaxed);
            DROPPED.fetch_add(1, Relaxed);
        }
    }
}

/// Waits, at most `within`, until every queued line is written: for the exit, after the
/// last requests are answered.
pub fn drain(within: Duration) {
    let by = std::time::Instant::now() + within;
    while PENDING.load(Relaxed) > 0 && std::time::Instant::now() < by {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Writes lines in batches: what has come, then what comes within [`LINGER`].
fn writer(rx: Receiver<String>) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stderr());
    while let Ok(line) = rx.recv() {
        let mut written = 1;
        let _ = out.write_all(line.as_bytes());
        let _ = out.write_all(b"\n");
        while let Ok(line) = rx.try_recv() {
            written += 1;
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
        PENDING.fetch_sub(written, Relaxed);
        std::thread::sleep(LINGER);
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
    fn numbers_and_strings_are_written_by_hand_as_they_would_be_formatted() {
        let mut l = String::new();
        push_millis(&mut l, Duration::from_micros(3_397));
        l.push(' ');
        push_millis(&mut l, Duration::from_micros(12_000_045));
        l.push(' ');
        push_int(&mut l, 0);
        l.push(' ');
        push_json(&mut l, "a\"b\\c\u{1}");
        assert_eq!(l, "3.397 12000.045 0 \"a\\\"b\\\\c\\u0001\"");
        let mut t = String::new();
        let at = UNIX_EPOCH + Duration::from_micros(1_764_572_400_000_042);
        push_timestamp(&mut t, at);
        assert_eq!(t, timestamp(at));
        let v: serde_json::Value = serde_json::from_str(&format!(
            "{{\"x\":{}}}",
            &l[l.rfind(' ').map_or(0, |i| i + 1)..]
        ))
        .unwrap_or_default();
        assert_eq!(v["x"], "a\"b\\c\u{1}");
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
