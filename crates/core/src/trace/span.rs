//! The spans of one traced request, recorded in place: a SERVER span for the request
//! tollgate received and a CLIENT span per attempt it sent (hedges included), with the
//! decisions between them.
//!
//! Recording is cheap by construction: every attribute is a typed field of a small
//! struct (a status a `u16`, a refusal a [`Denied`], a reason or a failure a
//! [`Fault`]), the
//! few strings a span needs (the URL, the upstream, `tracestate`) are copied once, at
//! the start, into one buffer, and nothing is formatted or named until the exporter
//! encodes it on its own thread. A request that is not traced has no [`RequestTrace`]
//! at all.
//!
//! A trace is handed to the export queue when it is dropped, finished or not: a
//! request whose caller went away still shows what its attempts did, its unfinished
//! spans ended where it was dropped and marked `cancelled`.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method};
use tokio::time::Instant;

use super::context::{SpanId, TRACESTATE, TraceId, TraceParent};
use super::queue::{Counted, Queue};
use crate::fault::Fault;
use crate::metrics::{Denied, Outcome};

/// Which side of tollgate received the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The app's own call, to one of the upstreams.
    Outbound,
    /// A caller's request to the app, through `[inbound]`.
    Inbound,
}

/// The fleet budget's decision on a caller's retry, on the inbound side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fleet {
    Granted,
    Rejected,
}

impl Fleet {
    pub fn as_str(self) -> &'static str {
        match self {
            Fleet::Granted => "granted",
            Fleet::Rejected => "rejected",
        }
    }
}

/// What the dedupe store made of a keyed request, on the inbound side (`tollgate.dedupe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dedupe {
    /// The first of its key: it ran.
    Executed,
    /// Answered from the store.
    Replayed,
    InProgress,
    KeyMismatch,
    NotReplayable,
    Unavailable,
}

impl Dedupe {
    pub fn as_str(self) -> &'static str {
        match self {
            Dedupe::Executed => "executed",
            Dedupe::Replayed => "replayed",
            Dedupe::InProgress => "in-progress",
            Dedupe::KeyMismatch => "key-mismatch",
            Dedupe::NotReplayable => "not-replayable",
            Dedupe::Unavailable => "unavailable",
        }
    }
}

/// What the request path knows of an attempt when it starts one.
#[derive(Clone, Copy, Debug)]
pub struct AttemptStart {
    /// 1 for the first try (`x-tollgate-attempt`).
    pub number: u32,
    pub hedge: bool,
    /// The endpoint it goes to.
    pub endpoint: Option<SocketAddr>,
    /// For a retry, why: the fault of the attempt before it (`tollgate.retry.reason`,
    /// its [`Fault::condition`]).
    pub reason: Option<Fault>,
    /// The time left of the request's deadline, when it has one.
    pub deadline_left: Option<Duration>,
}

/// What became of an attempt.
#[derive(Clone, Copy, Debug)]
pub struct AttemptEnd {
    /// The response's status, when a head came back.
    pub status: Option<u16>,
    /// Why it ended without one (`error.type`, its [`Fault::error_type`]); neither a
    /// status nor a fault: it was cancelled (dropped before it had a result).
    pub fault: Option<Fault>,
    /// The outcome the callee's answer carried (`x-tollgate-outcome`), if any.
    pub callee_outcome: Option<Outcome>,
    /// This attempt's failure ejected its endpoint.
    pub ejected: bool,
}

/// The decision after a failed attempt, recorded on that attempt's span.
#[derive(Clone, Copy, Debug)]
pub struct AfterFailure {
    /// `None`: retried.
    pub denied: Option<Denied>,
    /// What the budget would grant at that moment; `None` without a budget.
    pub budget_available: Option<f64>,
}

/// An attempt of this request, to find its span again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptId(u16);

/// One request's spans, traced. Dropping it hands them to the export queue.
pub struct RequestTrace {
    spans: Option<Box<Spans>>,
    queue: Arc<Queue<Spans>>,
}

/// The spans as the exporter reads them.
pub(super) struct Spans {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The caller's span, when the request came with a sampled `traceparent`.
    pub remote_parent: Option<SpanId>,
    pub flags: u8,
    pub side: Side,
    pub method: Method,
    pub https: bool,
    /// `authority`, `path` (no query), `upstream` and `tracestate`, in one buffer.
    pub text: String,
    pub authority: Range<usize>,
    pub path: Range<usize>,
    pub upstream: Range<usize>,
    pub tracestate: Range<usize>,
    pub start: Instant,
    pub end: Option<Instant>,
    pub status: Option<u16>,
    pub outcome: Option<Outcome>,
    pub inbound: Inbound,
    pub backoffs: Vec<Backoff>,
    pub attempts: Vec<Attempt>,
}

/// The inbound side's own facts about a request.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Inbound {
    /// The caller's attempt number, when it said.
    pub caller_attempt: Option<u32>,
    pub fleet: Option<Fleet>,
    pub budget_available: Option<f64>,
    pub dedupe: Option<Dedupe>,
}

/// A backoff sleep: an event of the SERVER span.
#[derive(Clone, Copy, Debug)]
pub(super) struct Backoff {
    pub at: Instant,
    pub sleep: Duration,
    /// The upstream asked for it (`Retry-After`, `grpc-retry-pushback-ms`).
    pub retry_after: bool,
}

/// A CLIENT span.
#[derive(Clone, Copy, Debug)]
pub(super) struct Attempt {
    pub span_id: SpanId,
    pub start: Instant,
    pub end: Option<Instant>,
    pub started: AttemptStart,
    pub ended: Option<AttemptEnd>,
    pub after: Option<AfterFailure>,
}

/// What the request looked like when it arrived.
pub struct Arrival<'a> {
    pub side: Side,
    pub method: &'a Method,
    /// The host (and port) it was for: `Host`, or the target's authority.
    pub authority: &'a str,
    /// The path, with or without its query (which is left out).
    pub path: &'a str,
    pub https: bool,
    /// The upstream it was routed to (outbound; empty on the inbound side).
    pub upstream: &'a str,
    /// Its header fields: `traceparent` and `tracestate` are read from them.
    pub headers: &'a HeaderMap,
}

/// Past this a string is cut (at a character boundary): a span is not a log of the URL.
const MAX_TEXT: usize = 2048;

impl RequestTrace {
    pub(super) fn new(
        queue: Arc<Queue<Spans>>,
        (trace_id, remote_parent, flags): (TraceId, Option<SpanId>, u8),
        a: &Arrival<'_>,
        now: Instant,
    ) -> Self {
        let path = a.path.split('?').next().unwrap_or("");
        // A new trace does not inherit the state of one it does not continue.
        let mut states = remote_parent
            .map(|_| a.headers.get_all(TRACESTATE).iter())
            .into_iter()
            .flatten()
            .filter_map(|v| v.to_str().ok());
        let state_len = a.headers.get(TRACESTATE).map_or(0, |v| v.len());
        let mut text = String::with_capacity(
            (a.authority.len() + path.len() + a.upstream.len() + state_len).min(MAX_TEXT),
        );
        let mut put = |s: &str| {
            let from = text.len();
            let room = MAX_TEXT.saturating_sub(from);
            let mut end = s.len().min(room);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            text.push_str(&s[..end]);
            from..text.len()
        };
        let (authority, path, upstream) = (put(a.authority), put(path), put(a.upstream));
        // Several `tracestate` fields are one list (W3C): joined with commas.
        let mut tracestate = put(states.next().unwrap_or(""));
        for more in states {
            tracestate.end = put(",").end;
            tracestate.end = put(more).end;
        }
        let spans = Spans {
            trace_id,
            span_id: SpanId::random(),
            remote_parent,
            flags,
            side: a.side,
            method: a.method.clone(),
            https: a.https,
            text,
            authority,
            path,
            upstream,
            tracestate,
            start: now,
            end: None,
            status: None,
            outcome: None,
            inbound: Inbound::default(),
            backoffs: Vec::new(),
            attempts: Vec::new(),
        };
        RequestTrace {
            spans: Some(Box::new(spans)),
            queue,
        }
    }

    fn spans(&mut self) -> &mut Spans {
        match &mut self.spans {
            Some(s) => s,
            // Taken only in `drop`: present for the whole life of the handle.
            None => unreachable!("spans are taken only when dropped"),
        }
    }

    fn get(&self) -> &Spans {
        match &self.spans {
            Some(s) => s,
            None => unreachable!("spans are taken only when dropped"),
        }
    }

    /// The trace this request belongs to: for the access log, and to tell which calls
    /// were made for which request.
    pub fn trace_id(&self) -> TraceId {
        self.get().trace_id
    }

    /// The SERVER span's own id.
    pub fn span_id(&self) -> SpanId {
        self.get().span_id
    }

    /// The `traceparent` for what is sent on behalf of the SERVER span itself (the
    /// inbound side's request to its app): its id as the parent.
    pub fn traceparent(&self) -> HeaderValue {
        let s = self.get();
        TraceParent {
            trace_id: s.trace_id,
            parent_id: s.span_id,
            flags: s.flags,
        }
        .header_value()
    }

    /// A new CLIENT span, started `now`.
    pub fn attempt(&mut self, start: AttemptStart, now: Instant) -> AttemptId {
        let spans = self.spans();
        if spans.attempts.is_empty() {
            spans.attempts.reserve_exact(4);
        }
        let id = AttemptId(u16::try_from(spans.attempts.len()).unwrap_or(u16::MAX));
        spans.attempts.push(Attempt {
            span_id: SpanId::random(),
            start: now,
            end: None,
            started: start,
            ended: None,
            after: None,
        });
        id
    }

    /// The `traceparent` an attempt carries upstream: the trace, with the attempt's own
    /// span as the parent, so the upstream's spans hang under the attempt that reached it.
    pub fn attempt_traceparent(&self, id: AttemptId) -> HeaderValue {
        let s = self.get();
        let parent_id = s
            .attempts
            .get(usize::from(id.0))
            .map_or(s.span_id, |a| a.span_id);
        TraceParent {
            trace_id: s.trace_id,
            parent_id,
            flags: s.flags,
        }
        .header_value()
    }

    /// The attempt is over (answered, failed, or given up on) at `now`.
    pub fn attempt_ended(&mut self, id: AttemptId, end: AttemptEnd, now: Instant) {
        if let Some(a) = self.spans().attempts.get_mut(usize::from(id.0)) {
            a.end = Some(now);
            a.ended = Some(end);
        }
    }

    /// The attempt was carried by the endpoint at `endpoint` rather than the one it
    /// started on (its connect was slow, and one raced beside it was made first).
    pub fn attempt_moved(&mut self, id: AttemptId, endpoint: Option<SocketAddr>) {
        if let Some(a) = self.spans().attempts.get_mut(usize::from(id.0)) {
            a.started.endpoint = endpoint;
        }
    }

    /// The request has its answer at `now`: an attempt still in flight beside the one
    /// that answered (a hedge's loser) is cancelled then.
    pub fn cancel_open(&mut self, now: Instant) {
        for a in self.spans().attempts.iter_mut().filter(|a| a.end.is_none()) {
            a.end = Some(now);
            a.ended = Some(AttemptEnd {
                status: None,
                fault: None,
                callee_outcome: None,
                ejected: false,
            });
        }
    }

    /// The decision after the attempt's failure: retried, or refused (and why), with
    /// what the budget would have granted.
    pub fn after_failure(&mut self, id: AttemptId, after: AfterFailure) {
        if let Some(a) = self.spans().attempts.get_mut(usize::from(id.0)) {
            a.after = Some(after);
        }
    }

    /// A backoff sleep of `sleep` starting `now`.
    pub fn backoff(&mut self, sleep: Duration, retry_after: bool, now: Instant) {
        let spans = self.spans();
        if spans.backoffs.len() < 64 {
            spans.backoffs.push(Backoff {
                at: now,
                sleep,
                retry_after,
            });
        }
    }

    /// The inbound side: the caller's attempt number, as it said.
    pub fn caller_attempt(&mut self, number: u32) {
        self.spans().inbound.caller_attempt = Some(number);
    }

    /// The inbound side: the fleet budget's decision on a caller's retry.
    pub fn fleet(&mut self, decision: Fleet, budget_available: Option<f64>) {
        let inbound = &mut self.spans().inbound;
        inbound.fleet = Some(decision);
        inbound.budget_available = budget_available;
    }

    /// The inbound side: what the dedupe store made of the request.
    pub fn dedupe(&mut self, result: Dedupe) {
        self.spans().inbound.dedupe = Some(result);
    }

    /// The request is answered: its status to the caller and tollgate's outcome, at
    /// `now` (when the answer is whole). The spans go to the export queue.
    pub fn finish(mut self, status: u16, outcome: Outcome, now: Instant) {
        let spans = self.spans();
        spans.status = Some(status);
        spans.outcome = Some(outcome);
        spans.end = Some(now);
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        let Some(mut spans) = self.spans.take() else {
            return;
        };
        let end = *spans.end.get_or_insert_with(Instant::now);
        for a in spans.attempts.iter_mut().filter(|a| a.end.is_none()) {
            a.end = Some(end);
            a.ended = Some(AttemptEnd {
                status: None,
                fault: None,
                callee_outcome: None,
                ejected: false,
            });
        }
        self.queue.push(spans);
    }
}

impl Counted for Spans {
    fn count(&self) -> usize {
        Spans::count(self)
    }
}

impl Spans {
    /// How many spans this is: the SERVER span and one per attempt.
    pub fn count(&self) -> usize {
        1 + self.attempts.len()
    }

    pub fn str(&self, r: &Range<usize>) -> &str {
        self.text.get(r.clone()).unwrap_or("")
    }
}
