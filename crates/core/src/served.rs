//! A request's edge, on either side and passed through: what must happen exactly once
//! however the request ends. [`Served`] is made as a request arrives and holds its
//! guard (its place on the connection and in a limit), whether it is a gRPC call,
//! whether its HTTP/1.x body will be left unread, its access log line and its SERVER
//! span. It has two ways out, and every answer takes one of them:
//!
//! - [`Served::refuse`] (or [`Served::answer`] for a refusal in its own words): an
//!   answer tollgate makes itself, counted, logged, and marked `Connection: close`
//!   when the body was left unread;
//! - [`Served::answered`]: the upstream's or the app's answer, counted and logged, its
//!   guard handed to the body that carries the answer back.
//!
//! What is counted where is the side's: a [`Tally`].

use std::sync::Arc;

use http::{Request, Version};
use http_body::Body;
use tokio::time::Instant;

use crate::access_log::Entry;
use crate::answer::{Local, Refusal, announce_close};
use crate::metrics::{Outcome, UpstreamMetrics};
use crate::server::service::AppResponse;
use crate::server::{AppBody, ConnState, RequestGuard};
use crate::trace::RequestTrace;

/// Where a side counts the answers it gives.
pub trait Tally {
    fn answered(&self, status: u16, outcome: Outcome, attempts: u32);
}

/// An upstream's answers (and the pass-through's), with the attempts they took.
impl Tally for UpstreamMetrics {
    #[inline]
    fn answered(&self, status: u16, outcome: Outcome, attempts: u32) {
        self.request(status, outcome, attempts);
    }
}

/// Counted nowhere: a request no upstream is known for.
pub struct Uncounted;

impl Tally for Uncounted {
    #[inline]
    fn answered(&self, _: u16, _: Outcome, _: u32) {}
}

/// One request's edge, from its arrival to the one answer it gets.
pub struct Served {
    guard: RequestGuard,
    grpc: bool,
    /// HTTP/1.x, with a body the connection cannot read by itself if the answer leaves
    /// it unread.
    h1_closes: bool,
    /// The answer says `Connection: close`: an HTTP/1.x body is not read to its end
    /// (or the side wants a new connection for the caller's next request).
    close: bool,
    log: Option<Box<Entry>>,
    trace: Option<RequestTrace>,
}

impl Served {
    /// `req` arrived at `start` on `conn`.
    #[inline(always)]
    pub fn arrive(conn: Arc<ConnState>, start: Instant, req: &Request<AppBody>) -> Served {
        // A small body the connection reads to its end by itself after the answer: the
        // connection is kept whether or not the answer read it. Any other HTTP/1.x body
        // left unread leaves the connection unable to carry another request: the answer
        // must say so, or the next request on it meets a reset (and its HTTP client may
        // retry that behind tollgate's back).
        // A request without a body (most of them) is known so without a look at its
        // connection.
        let h1_closes = req.version() < Version::HTTP_2
            && !req.body().is_end_stream()
            && !matches!(req.body(), AppBody::Http1(b) if b.read_after_answer());
        Served {
            guard: RequestGuard::new(conn, start),
            grpc: false,
            h1_closes,
            close: h1_closes,
            log: None,
            trace: None,
        }
    }

    /// When the request arrived.
    #[inline]
    pub fn start(&self) -> Instant {
        self.guard.start()
    }

    /// It is a gRPC call (`true`), or not: tollgate's own answers to a gRPC call are
    /// gRPC answers. Read from the request's headers by the side, where it reads them
    /// anyway; until then it is not one.
    #[inline]
    pub fn grpc_call(&mut self, grpc: bool) {
        self.grpc = grpc;
    }

    /// Whether it is a gRPC call: tollgate's own answers to it are gRPC answers.
    #[inline]
    pub fn grpc(&self) -> bool {
        self.grpc
    }

    /// Whether a body the answer leaves unread closes the connection: HTTP/1.x, a body
    /// not already at its end on arrival, and not a small one the connection reads by
    /// itself.
    #[inline]
    pub fn unread_closes(&self) -> bool {
        self.h1_closes
    }

    /// The connection is kept: the body was read to its end after all.
    pub fn keep_connection(&mut self) {
        self.close = false;
    }

    /// The answer closes the connection, whatever the body.
    pub fn close_connection(&mut self) {
        self.close = true;
    }

    /// Whether the answer says `Connection: close`.
    #[inline]
    pub fn closes(&self) -> bool {
        self.close
    }

    /// The request's place on its connection, to be admitted into a limit.
    #[inline]
    pub fn guard(&mut self) -> &mut RequestGuard {
        &mut self.guard
    }

    /// The access log's line, from now on.
    #[inline]
    pub fn begin_log(&mut self, entry: Option<Box<Entry>>) {
        self.log = entry;
    }

    /// The access log's line, while it is being written (`None`: the log is off).
    #[inline]
    pub fn log(&mut self) -> Option<&mut Entry> {
        self.log.as_deref_mut()
    }

    /// The request's SERVER span, from now on; its trace id goes into the log line.
    #[inline]
    pub fn begin_trace(&mut self, trace: Option<RequestTrace>) {
        if let (Some(t), Some(e)) = (&trace, self.log.as_mut()) {
            e.trace_id = Some(t.trace_id());
        }
        self.trace = trace;
    }

    /// The request's SERVER span, when it is traced.
    #[inline]
    pub fn trace(&mut self) -> Option<&mut RequestTrace> {
        self.trace.as_mut()
    }

    /// A way out: tollgate refuses the request with `r`, saying how many attempts it
    /// took (`Some`, outbound and passed through) or not (`None`, inbound).
    #[inline]
    pub fn refuse(self, r: &Refusal, attempts: Option<u32>, tally: &impl Tally) -> AppResponse {
        self.answer(r.local(attempts), tally)
    }

    /// A way out: tollgate answers in its own words.
    pub fn answer(mut self, local: Local<'_>, tally: &impl Tally) -> AppResponse {
        let status = local.status(self.grpc).as_u16();
        let attempts = local.attempts.unwrap_or(0);
        tally.answered(status, local.outcome, attempts);
        self.end(status, local.outcome, attempts);
        let mut resp = Box::new(local.answer(self.grpc, self.guard));
        if self.close {
            announce_close(&mut resp);
        }
        resp
    }

    /// The other way out: the upstream's or the app's answer goes back with `status`,
    /// counted and logged (what only the side knows it wrote into [`Self::log`]
    /// before). The guard goes on to the body that carries the answer, which says
    /// `Connection: close` when [`Self::closes`].
    #[inline(always)]
    pub fn answered(
        mut self,
        (status, outcome, attempts): (u16, Outcome, u32),
        tally: &impl Tally,
    ) -> RequestGuard {
        tally.answered(status, outcome, attempts);
        self.end(status, outcome, attempts);
        self.guard
    }

    /// A `CONNECT` whose tunnel carries requests of its own, each served and logged
    /// as it comes: the guard goes on to the tunnel, and nothing is logged for the
    /// `CONNECT` itself.
    pub fn tunnel(self) -> RequestGuard {
        self.guard
    }

    /// Ends the span and the log line, which is written once the answer has gone.
    #[inline(always)]
    fn end(&mut self, status: u16, outcome: Outcome, attempts: u32) {
        if let Some(t) = self.trace.take() {
            t.finish(status, outcome, Instant::now());
        }
        if let Some(mut e) = self.log.take() {
            e.status = status;
            e.outcome = outcome;
            e.attempts = attempts;
            self.guard.on_finish(e);
        }
    }
}
