//! Recorded spans to an OTLP `ExportTraceServiceRequest` (protobuf), on the exporter's
//! thread: the only place a span's attributes get their names and its numbers become
//! text.
//!
//! The attributes follow OpenTelemetry's HTTP semantic conventions where they have a
//! word (`http.request.method`, `url.full`, `server.address`, `http.response.status_code`,
//! `http.request.resend_count`, `error.type`) and tollgate's own otherwise
//! (`tollgate.*`; docs/tracing.md lists them). Span names are `{method} {upstream}`
//! (`{method} inbound` on the inbound side): low in cardinality, as the conventions ask.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::Method;
use tokio::time::Instant;

use super::context::SpanId;
use super::protobuf::Writer;
use super::span::{Attempt, Backoff, Side, Spans};
use crate::fault::Fault;

/// Who exported: the resource every span of the process shares.
#[derive(Clone, Debug)]
pub(super) struct Resource {
    pub service_name: String,
    pub host_name: Option<String>,
}

impl Resource {
    /// `service.name` from `OTEL_SERVICE_NAME` (OpenTelemetry's variable), else
    /// `tollgate`; `host.name` from `HOSTNAME` (a pod's name), when set.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Resource {
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| "tollgate".into()),
            host_name: var("HOSTNAME"),
        }
    }
}

/// Reads a recorded [`Instant`] as Unix time: the two clocks are read together once
/// per export, so a span's times are as right as the wall clock is then.
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock {
    unix: Duration,
    at: Instant,
}

impl Clock {
    pub fn now() -> Self {
        Clock {
            unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            at: Instant::now(),
        }
    }

    fn unix_nanos(&self, t: Instant) -> u64 {
        let unix = if t <= self.at {
            self.unix.saturating_sub(self.at - t)
        } else {
            self.unix + (t - self.at)
        };
        u64::try_from(unix.as_nanos()).unwrap_or(u64::MAX)
    }
}

// Field numbers, from opentelemetry/proto/{collector/trace,trace,common,resource}/v1.
const REQUEST_RESOURCE_SPANS: u32 = 1;
const RESOURCE_SPANS_RESOURCE: u32 = 1;
const RESOURCE_SPANS_SCOPE_SPANS: u32 = 2;
const RESOURCE_ATTRIBUTES: u32 = 1;
const SCOPE_SPANS_SCOPE: u32 = 1;
const SCOPE_SPANS_SPANS: u32 = 2;
const SCOPE_NAME: u32 = 1;
const SCOPE_VERSION: u32 = 2;
const SPAN_TRACE_ID: u32 = 1;
const SPAN_SPAN_ID: u32 = 2;
const SPAN_TRACE_STATE: u32 = 3;
const SPAN_PARENT_SPAN_ID: u32 = 4;
const SPAN_NAME: u32 = 5;
const SPAN_KIND: u32 = 6;
const SPAN_START: u32 = 7;
const SPAN_END: u32 = 8;
const SPAN_ATTRIBUTES: u32 = 9;
const SPAN_EVENTS: u32 = 11;
const SPAN_STATUS: u32 = 15;
const SPAN_FLAGS: u32 = 16;
const EVENT_TIME: u32 = 1;
const EVENT_NAME: u32 = 2;
const EVENT_ATTRIBUTES: u32 = 3;
const STATUS_CODE: u32 = 3;
const KEY_VALUE_KEY: u32 = 1;
const KEY_VALUE_VALUE: u32 = 2;
const ANY_STRING: u32 = 1;
const ANY_BOOL: u32 = 2;
const ANY_INT: u32 = 3;
const ANY_DOUBLE: u32 = 4;

const KIND_SERVER: u64 = 2;
const KIND_CLIENT: u64 = 3;
const STATUS_ERROR: u64 = 2;
/// `SpanFlags`: whether the parent is remote is known, and that it is.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The body of one export: every span of `batch`, under one resource and scope.
pub(super) fn export_request(batch: &[Box<Spans>], resource: &Resource, clock: Clock) -> Vec<u8> {
    let spans: usize = batch.iter().map(|s| s.count()).sum();
    let mut w = Writer::with_capacity(256 + spans * 512);
    w.message(REQUEST_RESOURCE_SPANS, |w| {
        w.message(RESOURCE_SPANS_RESOURCE, |w| {
            let a = RESOURCE_ATTRIBUTES;
            string(w, a, "service.name", &resource.service_name);
            string(w, a, "service.version", env!("CARGO_PKG_VERSION"));
            if let Some(host) = &resource.host_name {
                string(w, a, "host.name", host);
            }
        });
        w.message(RESOURCE_SPANS_SCOPE_SPANS, |w| {
            w.message(SCOPE_SPANS_SCOPE, |w| {
                w.bytes(SCOPE_NAME, b"tollgate");
                w.bytes(SCOPE_VERSION, env!("CARGO_PKG_VERSION").as_bytes());
            });
            for spans in batch {
                w.message(SCOPE_SPANS_SPANS, |w| server_span(w, spans, &clock));
                for a in &spans.attempts {
                    w.message(SCOPE_SPANS_SPANS, |w| client_span(w, spans, a, &clock));
                }
            }
        });
    });
    w.buf
}

/// What every span of the request begins with: its trace and its own id, the trace's
/// state, its parent, its name, its kind, and when it began and ended (`end`, when it
/// has not ended, is its start).
fn span_head(
    w: &mut Writer,
    s: &Spans,
    (id, parent): (SpanId, Option<SpanId>),
    kind: u64,
    (start, end): (Instant, Option<Instant>),
    clock: &Clock,
) {
    w.bytes(SPAN_TRACE_ID, &s.trace_id.to_bytes());
    w.bytes(SPAN_SPAN_ID, &id.to_bytes());
    w.bytes(SPAN_TRACE_STATE, s.str(&s.tracestate).as_bytes());
    if let Some(parent) = parent {
        w.bytes(SPAN_PARENT_SPAN_ID, &parent.to_bytes());
    }
    name(w, s);
    w.uint(SPAN_KIND, kind);
    w.fixed64(SPAN_START, clock.unix_nanos(start));
    w.fixed64(SPAN_END, clock.unix_nanos(end.unwrap_or(start)));
}

/// The span of the request tollgate received.
fn server_span(w: &mut Writer, s: &Spans, clock: &Clock) {
    let ids = (s.span_id, s.remote_parent);
    span_head(w, s, ids, KIND_SERVER, (s.start, s.end), clock);
    let mut flags = u32::from(s.flags) | HAS_IS_REMOTE;
    if s.remote_parent.is_some() {
        flags |= IS_REMOTE;
    }
    let a = SPAN_ATTRIBUTES;
    method(w, &s.method);
    string(w, a, "url.scheme", if s.https { "https" } else { "http" });
    string(w, a, "url.path", s.str(&s.path));
    address(w, s);
    let mut error: Option<ErrorType> = None;
    match s.status {
        Some(status) => {
            int(w, a, "http.response.status_code", i64::from(status));
            // A server's 4xx is the client's error, not its own.
            if status >= 500 {
                error = Some(ErrorType::Status(status));
            }
        }
        None => error = Some(ErrorType::Word("cancelled")),
    }
    if let Some(e) = error {
        e.write(w);
    }
    match s.side {
        Side::Outbound => {
            string(w, a, "tollgate.upstream", s.str(&s.upstream));
            int(w, a, "tollgate.attempts", s.attempts.len() as i64);
        }
        Side::Inbound => {
            let i = &s.inbound;
            if let Some(n) = i.caller_attempt {
                int(w, a, "tollgate.caller.attempt", i64::from(n));
            }
            if let Some(f) = i.fleet {
                string(w, a, "tollgate.fleet", f.as_str());
            }
            if let Some(b) = i.budget_available {
                double(w, a, "tollgate.budget.available", b);
            }
            if let Some(d) = i.dedupe {
                string(w, a, "tollgate.dedupe", d.as_str());
            }
        }
    }
    if let Some(o) = s.outcome {
        string(w, a, "tollgate.outcome", o.as_str());
    }
    for b in &s.backoffs {
        w.message(SPAN_EVENTS, |w| backoff(w, b, clock));
    }
    if error.is_some() {
        w.message(SPAN_STATUS, |w| w.uint(STATUS_CODE, STATUS_ERROR));
    }
    w.fixed32(SPAN_FLAGS, flags);
}

/// The span of one attempt.
fn client_span(w: &mut Writer, s: &Spans, at: &Attempt, clock: &Clock) {
    let ids = (at.span_id, Some(s.span_id));
    span_head(w, s, ids, KIND_CLIENT, (at.start, at.end), clock);
    let a = SPAN_ATTRIBUTES;
    method(w, &s.method);
    w.message(a, |w| {
        w.bytes(KEY_VALUE_KEY, b"url.full");
        w.message(KEY_VALUE_VALUE, |w| {
            w.message(ANY_STRING, |w| {
                let scheme: &[u8] = if s.https { b"https://" } else { b"http://" };
                w.buf.extend_from_slice(scheme);
                w.buf.extend_from_slice(s.str(&s.authority).as_bytes());
                w.buf.extend_from_slice(s.str(&s.path).as_bytes());
            })
        });
    });
    address(w, s);
    let started = &at.started;
    if let Some(peer) = started.endpoint {
        let mut ip = [0u8; 64];
        let ip = display(&mut ip, format_args!("{}", peer.ip()));
        string(w, a, "network.peer.address", ip);
        int(w, a, "network.peer.port", i64::from(peer.port()));
    }
    let mut error = None;
    if let Some(end) = &at.ended {
        if let Some(status) = end.status {
            int(w, a, "http.response.status_code", i64::from(status));
        }
        error = match (end.fault, end.status) {
            (Some(fault), _) => Some(ErrorType::Fault(fault)),
            (None, None) => Some(ErrorType::Word("cancelled")),
            // A client's 4xx is an error too (the conventions' rule for CLIENT spans).
            (None, Some(status)) if status >= 400 => Some(ErrorType::Status(status)),
            _ => None,
        };
        if let Some(e) = error {
            e.write(w);
        }
        if let Some(o) = end.callee_outcome {
            string(w, a, "tollgate.outcome", o.as_str());
        }
        if end.ejected {
            boolean(w, a, "tollgate.endpoint.ejected", true);
        }
    }
    if started.number > 1 {
        int(
            w,
            a,
            "http.request.resend_count",
            i64::from(started.number - 1),
        );
    }
    string(w, a, "tollgate.upstream", s.str(&s.upstream));
    int(w, a, "tollgate.attempt", i64::from(started.number));
    boolean(w, a, "tollgate.hedge", started.hedge);
    if let Some(reason) = started.reason {
        string(w, a, "tollgate.retry.reason", reason.condition());
    }
    if let Some(left) = started.deadline_left {
        let ms = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
        int(w, a, "tollgate.deadline.left_ms", ms);
    }
    if let Some(after) = &at.after {
        if let Some(d) = after.denied {
            string(w, a, "tollgate.denied", d.as_str());
        }
        if let Some(b) = after.budget_available {
            double(w, a, "tollgate.budget.available", b);
        }
    }
    if error.is_some() {
        w.message(SPAN_STATUS, |w| w.uint(STATUS_CODE, STATUS_ERROR));
    }
    w.fixed32(SPAN_FLAGS, u32::from(s.flags) | HAS_IS_REMOTE);
}

fn name(w: &mut Writer, s: &Spans) {
    w.message(SPAN_NAME, |w| {
        w.buf.extend_from_slice(s.method.as_str().as_bytes());
        w.buf.push(b' ');
        match s.side {
            Side::Outbound => w.buf.extend_from_slice(s.str(&s.upstream).as_bytes()),
            Side::Inbound => w.buf.extend_from_slice(b"inbound"),
        }
    });
}

/// `http.request.method`: a method the conventions know, else `_OTHER` and the
/// original beside it.
fn method(w: &mut Writer, m: &Method) {
    let known = matches!(
        *m,
        Method::GET
            | Method::HEAD
            | Method::POST
            | Method::PUT
            | Method::DELETE
            | Method::CONNECT
            | Method::OPTIONS
            | Method::TRACE
            | Method::PATCH
    );
    let a = SPAN_ATTRIBUTES;
    if known {
        string(w, a, "http.request.method", m.as_str());
    } else {
        string(w, a, "http.request.method", "_OTHER");
        string(w, a, "http.request.method_original", m.as_str());
    }
}

/// `server.address` and `server.port`, from the authority the request was for.
fn address(w: &mut Writer, s: &Spans) {
    let authority = s.str(&s.authority);
    let (host, port) = match authority.rsplit_once(':') {
        // Not the colon of a bare IPv6 address.
        Some((h, p)) if !h.ends_with(':') && p.bytes().all(|b| b.is_ascii_digit()) => {
            (h, p.parse().ok())
        }
        _ => (authority, None),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let a = SPAN_ATTRIBUTES;
    string(w, a, "server.address", host);
    let default = if s.https { 443 } else { 80 };
    int(w, a, "server.port", port.unwrap_or(default));
}

fn backoff(w: &mut Writer, b: &Backoff, clock: &Clock) {
    w.fixed64(EVENT_TIME, clock.unix_nanos(b.at));
    w.bytes(EVENT_NAME, b"backoff");
    let ms = i64::try_from(b.sleep.as_millis()).unwrap_or(i64::MAX);
    int(w, EVENT_ATTRIBUTES, "tollgate.backoff.ms", ms);
    boolean(
        w,
        EVENT_ATTRIBUTES,
        "tollgate.backoff.retry_after",
        b.retry_after,
    );
}

/// `error.type`: a word of tollgate's, or the status code as the conventions say.
#[derive(Clone, Copy)]
enum ErrorType {
    Word(&'static str),
    Status(u16),
    Fault(Fault),
}

impl ErrorType {
    fn write(self, w: &mut Writer) {
        let mut buf = [0u8; 8];
        let v = match self {
            ErrorType::Word(word) => word,
            ErrorType::Status(s) => display(&mut buf, format_args!("{s}")),
            ErrorType::Fault(ref f) => f.error_type(),
        };
        string(w, SPAN_ATTRIBUTES, "error.type", v);
    }
}

/// Formats into a stack buffer (a status code, an IP address): no allocation.
fn display<'b>(buf: &'b mut [u8], args: std::fmt::Arguments<'_>) -> &'b str {
    use std::io::Write;
    let mut cursor = std::io::Cursor::new(&mut *buf);
    let _ = cursor.write_fmt(args);
    let n = usize::try_from(cursor.position()).unwrap_or(0);
    std::str::from_utf8(&buf[..n]).unwrap_or("")
}

fn attribute(w: &mut Writer, field: u32, key: &str, value: impl FnOnce(&mut Writer)) {
    w.message(field, |w| {
        w.bytes(KEY_VALUE_KEY, key.as_bytes());
        w.message(KEY_VALUE_VALUE, value);
    });
}

fn string(w: &mut Writer, field: u32, key: &str, v: &str) {
    attribute(w, field, key, |w| w.bytes_always(ANY_STRING, v.as_bytes()));
}

fn int(w: &mut Writer, field: u32, key: &str, v: i64) {
    attribute(w, field, key, |w| w.int_always(ANY_INT, v));
}

fn boolean(w: &mut Writer, field: u32, key: &str, v: bool) {
    attribute(w, field, key, |w| w.bool_always(ANY_BOOL, v));
}

fn double(w: &mut Writer, field: u32, key: &str, v: f64) {
    attribute(w, field, key, |w| w.double_always(ANY_DOUBLE, v));
}
