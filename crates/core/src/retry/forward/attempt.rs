//! One attempt on one endpoint: a connection (pooled, or opened within
//! `connect_timeout`), the request sent with this attempt's own fields, and the response
//! head awaited until the request's deadline (none: as long as it takes). The attempt
//! timeout does not end an attempt: the loop starts a retry beside a slow one, and the
//! first good answer wins. Its result is recorded exactly once; an attempt dropped before
//! it has one counts as `cancelled` (the app left, another attempt won), or as `timeout`
//! when it had run past its attempt timeout (it was abandoned for being slow), and its
//! connection is closed, never pooled.
//!
//! An attempt that ends without a response ends with a [`Fault`]. Two are not the
//! endpoint's ([`Fault::whose`]): the app's body broke as it was sent (counted
//! `cancelled`), and this process ran out of file descriptors before a connection could
//! be opened (not counted as an attempt at all). Neither is retried nor held against
//! the endpoint.
//!
//! The attempt owns what it sends (its head's own fields, its body) and borrows only
//! the request's shared head, so two attempts of one request can run side by side (a
//! hedge). What it came to is reported to the endpoint's health
//! ([`crate::upstream::outlier`]) and to the latency estimates, once.

use std::future::Future;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method, StatusCode, Uri};
use tokio::time::Instant;

use crate::contract::headers::{ATTEMPT_HEADER, HEDGE_HEADER, HEDGE_VALUE, count_value};
use crate::contract::outcome::Callee;
use crate::deadline;
use crate::fault::Fault;
use crate::http::response::Fields;
use crate::metrics::AttemptResult;
use crate::retry::forward::replay::{ReplayBody, RetriedBody};
use crate::retry::upstream::Upstream;
use crate::trace::TRACEPARENT;
use crate::upstream::exchange;
use crate::upstream::outlier::EndpointReport;
use crate::upstream::pool::{Endpoint, Want};
use crate::upstream::request::{AttemptFields, RareFields, RequestHead};
use crate::upstream::response::UpstreamResponse;

/// The names of the per-attempt fields, borrowed by every attempt.
static ATTEMPT_NAME: HeaderName = ATTEMPT_HEADER;
static HEDGE_NAME: HeaderName = HEDGE_HEADER;
pub(super) static TRACEPARENT_NAME: HeaderName = TRACEPARENT;

/// How much earlier than this attempt's own time a callee's `app-timeout` must come to
/// be its own limit rather than the deadline this attempt sent (rounded down to the
/// millisecond, and carried across the network).
const DEADLINE_SLACK: std::time::Duration = std::time::Duration::from_millis(10);

/// The seam under the retry loop: carries one attempt to one endpoint and waits for its
/// response head. The loop ([`forward`](mod@crate::retry::forward)) decides which attempt goes where and
/// when; a transport carries it. The real one is the upstream's endpoints
/// ([`crate::retry::forward::transport`]); tests drive the loop with a scripted one and paused time, so
/// every way a request can end is tried without a socket.
pub trait Transport<A>: Sync {
    /// Sends `attempt` (its head, with the attempt's own fields as of the moment it goes
    /// out, and the body in `body`) to endpoint `attempt.endpoint`, and waits for the
    /// response head until `attempt.by`. The body comes back in `body` when it never
    /// left. `carried` is set to the endpoint that carried the attempt instead, when
    /// its connect was slow and one raced beside it to another endpoint was made first.
    fn exchange<'s>(
        &'s self,
        attempt: &'s Attempt<'_, A>,
        body: &'s mut Option<ReplayBody<A>>,
        carried: &'s mut Option<Arc<Endpoint<ReplayBody<A>>>>,
    ) -> impl Future<Output = Result<UpstreamResponse, NoHead>> + Send + 's;
}

/// Why a transport got no response head: the fault, and what is worth telling the app
/// of it (a TLS failure's reason), as Pingora's errors carry their context.
#[derive(Debug)]
pub struct NoHead {
    pub fault: Fault,
    pub detail: Option<String>,
}

impl From<Fault> for NoHead {
    #[inline]
    fn from(fault: Fault) -> Self {
        NoHead {
            fault,
            detail: None,
        }
    }
}

/// One attempt, before it runs.
pub struct Attempt<'a, A> {
    pub up: &'a Upstream<A>,
    /// Which of the upstream's endpoints (its number).
    pub endpoint: usize,
    /// That endpoint.
    pub peer: Arc<Endpoint<ReplayBody<A>>>,
    /// On a connection of its own, not a pooled one (a retry back to the endpoint that
    /// just failed the request).
    pub own_connection: bool,
    /// Held to its endpoint: a slow connect races no other endpoint's (the request's
    /// key is known only there).
    pub held: bool,
    /// 1 for the first try.
    pub number: u32,
    /// Sent beside another attempt still running (`x-tollgate-hedge: 1`).
    pub hedge: bool,
    pub want: Want,
    pub started: Instant,
    /// When tollgate stops waiting for this attempt's response head: the request's
    /// deadline, if it has one.
    pub by: Option<Instant>,
    /// The attempt timeout: an attempt that ends without a head after this long (cut
    /// off by the deadline, or abandoned for another attempt's answer) is a `timeout`
    /// and the endpoint's failure; one cut off sooner had not had the time an endpoint
    /// is judged by.
    pub slow_after: Option<std::time::Duration>,
    /// A gRPC call with a deadline of its caller's own: when that ends (sent as
    /// `grpc-timeout`, which a gRPC server applies to the whole call).
    pub grpc_deadline: Option<Instant>,
    /// The request's head, shared with every attempt of the request (the attempt's
    /// own fields are added as it is sent); its URI in origin-form. One reference, not
    /// three: an attempt is moved as it starts, and fits the size moved without a call.
    pub head: &'a Head,
    pub body: ReplayBody<A>,
    /// The idempotency key minted for the request (the same on every attempt), and
    /// the attempt's own `traceparent` (its CLIENT span as the parent) when the request
    /// is traced (else the app's passes as it came); `None` without either.
    pub rare: Option<Box<RareFields<'a>>>,
}

/// What every attempt of a request sends ahead of its body: headers already cleaned,
/// Host already set. The caller keeps it, and every attempt borrows it, so what the
/// request was is still at hand when its answer comes.
pub struct Head {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
}

/// What an attempt came to.
pub(super) struct Ran<A> {
    pub result: Result<UpstreamResponse, Fault>,
    /// The body, when it never left (no connection took it): the next attempt sends it.
    pub unsent: Option<ReplayBody<A>>,
    /// What went wrong, when it is worth telling the app (a TLS failure's reason).
    pub detail: Option<String>,
    /// The endpoint that carried it.
    pub endpoint: usize,
    /// The endpoint it started on, when another carried it (its connect was slow, and
    /// one raced beside it to that other was made first).
    pub moved_from: Option<usize>,
    /// The attempt's number as sent (`x-tollgate-attempt`).
    pub number: u32,
    /// Its failure ejected its endpoint.
    pub ejected: bool,
    /// What the answer's `x-tollgate-outcome` says, read once (`Silent` without an
    /// answer).
    pub callee: Callee,
}

impl<'a, A: RetriedBody> Attempt<'a, A> {
    /// Runs the attempt on `wire`: the head goes out with this attempt's fields, then
    /// the body (which comes back in [`Ran::unsent`] when it never left).
    pub(super) async fn run<T: Transport<A>>(mut self, wire: &T) -> Ran<A> {
        let mut record = Record {
            up: self.up,
            endpoint: &self.peer,
            carried: None,
            started: self.started,
            slow_after: self.slow_after,
            done: false,
        };
        let watch = self.body.watch();
        let mut body = Some(std::mem::replace(&mut self.body, ReplayBody::Empty));
        let mut detail = None;
        // In place, not matched into a new binding: a response is a few hundred bytes,
        // and every move of it is a copy.
        let mut result = wire
            .exchange(&self, &mut body, &mut record.carried)
            .await
            .map_err(|f| {
                detail = f.detail;
                f.fault
            });
        // The endpoint that carried the attempt: another than its own only when its
        // connect was slow and one raced beside it was made first.
        let carried = record.carried.clone();
        let peer = carried.as_deref().unwrap_or(&self.peer);
        let moved_from = carried.as_ref().map(|_| self.endpoint);
        if result.as_ref().is_err_and(Fault::is_peers) && watch.app_failed() {
            // Whatever the exchange then failed with, the app's body broke first.
            result = Err(Fault::CallerBody);
        }
        let callee = match &result {
            Ok(resp) => Callee::of(resp.status(), Fields::of(resp)),
            Err(_) => Callee::Silent,
        };
        let ran = |result, ejected| Ran {
            result,
            unsent: body,
            detail,
            endpoint: peer.id,
            moved_from,
            number: self.number,
            ejected,
            callee,
        };
        match &result {
            Ok(resp) => {
                // Only a 502 or a 504 may be a callee's word about its own app, or to a
                // gRPC call its trailers-only answer (HTTP 200, the status in the head:
                // without it, an outcome on a 200 is read as stray).
                let status = resp.status();
                let about_app = matches!(
                    status,
                    StatusCode::OK | StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT
                );
                match callee {
                    Callee::AppUnreachable(_)
                        if about_app && status != StatusCode::GATEWAY_TIMEOUT =>
                    {
                        peer.unreachable_behind();
                        // No new stream on the connection that carried it: behind a
                        // virtual IP another connection may reach another pod.
                        peer.forget_h2();
                    }
                    Callee::AppTimeout if about_app => {
                        peer.answered();
                        peer.forget_h2();
                    }
                    _ => peer.answered(),
                }
            }
            Err(Fault::Reset | Fault::Timeout) => peer.forget_h2(),
            Err(_) => {}
        }
        let r = match &result {
            Ok(resp) => AttemptResult::of_status(resp.status().as_u16()),
            Err(f) => match f.attempt_result() {
                // The endpoint's fault: counted, and told to its health below.
                Some(r) if f.is_peers() => r,
                // Not the endpoint's: counted (or not, when it never was an attempt),
                // and nothing more.
                _ => {
                    record.not_the_peers(*f);
                    return ran(result, false);
                }
            },
        };
        let mut ejected = false;
        if self.up.endpoints.ejects() {
            let report = self.endpoint_report(&result, callee);
            // Only a failure puts an endpoint out: its state is read around that alone.
            let health = || &peer.health;
            let was_in = report == EndpointReport::Failure && !health().is_out();
            self.up.endpoints.report(peer, report);
            ejected = was_in && health().is_out();
        }
        record.finish(&result, r);
        ran(result, ejected)
    }

    /// Whether the attempt ended before its attempt timeout (or had none): it had not
    /// had the time an endpoint is judged by.
    fn cut_short(&self) -> bool {
        self.slow_after.is_none_or(|s| self.started.elapsed() < s)
    }

    /// What the result says about the endpoint.
    fn endpoint_report(
        &self,
        result: &Result<UpstreamResponse, Fault>,
        callee: Callee,
    ) -> EndpointReport {
        match result {
            Ok(resp) => match callee {
                // The callee's inbound side ran out of the time this attempt gave it (the
                // request's deadline) before the attempt timeout, as this attempt would
                // have: judged as a timeout of its own is.
                Callee::AppTimeout
                    if self.cut_short()
                        && self
                            .by
                            .is_some_and(|by| Instant::now() + DEADLINE_SLACK >= by) =>
                {
                    EndpointReport::Neutral
                }
                callee if callee.endpoint_failed(resp.status()) => EndpointReport::Failure,
                _ => EndpointReport::Success,
            },
            // Cut short by the deadline before its attempt timeout, the attempt did not
            // have the time an endpoint is judged by.
            Err(Fault::Timeout) if self.cut_short() => EndpointReport::Neutral,
            Err(f) if f.is_peers() => EndpointReport::Failure,
            Err(_) => EndpointReport::Neutral,
        }
    }

    /// The head as it goes out at `now`: the request's, with this attempt's own fields.
    pub fn head_at(&self, now: Instant) -> RequestHead<'_> {
        let left = self.by.map(|by| by.saturating_duration_since(now));
        // As curl waits, but leaving most of the time to the exchange.
        let patience = match (left, self.slow_after) {
            (Some(l), Some(s)) => Some(l.min(s)),
            (l, s) => l.or(s),
        };
        RequestHead {
            method: &self.head.method,
            uri: &self.head.uri,
            headers: &self.head.headers,
            fields: self.fields(now, left),
            rare: self.rare.as_deref(),
            https: self.up.config.tls.is_some(),
            continue_wait: exchange::continue_wait(patience),
        }
    }

    /// The per-attempt fields: the attempt number, the time left of the request's
    /// deadline when it has one (not the attempt timeout: tollgate may keep waiting past
    /// that), for a gRPC call with a deadline the time left of the caller's own, and on
    /// a hedge `x-tollgate-hedge: 1`, and the rare ones.
    fn fields(&self, now: Instant, left: Option<std::time::Duration>) -> AttemptFields<'a> {
        AttemptFields([
            Some((&ATTEMPT_NAME, count_value(self.number))),
            left.map(|left| (&self.up.deadline.header, deadline::format_millis(left))),
            self.grpc_deadline.map(|at| {
                let left = at.saturating_duration_since(now);
                (
                    &deadline::GRPC_TIMEOUT_NAME,
                    deadline::format_grpc_timeout(left),
                )
            }),
            self.hedge.then_some((&HEDGE_NAME, HEDGE_VALUE)),
        ])
    }
}

/// Records an attempt's result exactly once; dropped before, it records `cancelled`,
/// or `timeout` (against the endpoint) once it had run past its attempt timeout.
struct Record<'a, A> {
    up: &'a Upstream<A>,
    endpoint: &'a Endpoint<ReplayBody<A>>,
    /// The endpoint that carried the attempt instead, once one did.
    carried: Option<Arc<Endpoint<ReplayBody<A>>>>,
    started: Instant,
    slow_after: Option<std::time::Duration>,
    done: bool,
}

impl<A> Record<'_, A> {
    /// An attempt ended by a fault that is not the endpoint's: counted by its own
    /// result (the app's body: `cancelled`), or not at all.
    fn not_the_peers(&mut self, fault: Fault) {
        self.done = true;
        if let Some(r) = fault.attempt_result() {
            self.up.metrics().attempt(r);
        }
    }

    fn finish(&mut self, result: &Result<UpstreamResponse, Fault>, r: AttemptResult) {
        self.done = true;
        let took = self.started.elapsed();
        let metrics = self.up.metrics();
        metrics.attempt(r);
        metrics.attempt_duration.observe(took.as_secs_f64());
        self.up.median.observe(took);
        if let Some(h) = &self.up.hedge {
            // The hedge delay is about response heads: a connection refused at once
            // says nothing of it, an attempt that timed out took at least its time.
            match result {
                Ok(_) => h.observe(took),
                Err(Fault::Timeout) => h.observe_at_least(took),
                Err(_) => {}
            }
        }
    }
}

impl<A> Drop for Record<'_, A> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let took = self.started.elapsed();
        if self.slow_after.is_some_and(|s| took >= s) {
            // Abandoned for being slow: another attempt answered first, or the app left.
            self.up.metrics().attempt(AttemptResult::Timeout);
            if self.up.endpoints.ejects() {
                let endpoint = self.carried.as_deref().unwrap_or(self.endpoint);
                self.up.endpoints.report(endpoint, EndpointReport::Failure);
            }
        } else {
            self.up.metrics().attempt(AttemptResult::Cancelled);
        }
        // A hedge's loser, or an attempt the app or the deadline cut off: it had not
        // answered after this long.
        if let Some(h) = &self.up.hedge {
            h.observe_at_least(took);
        }
    }
}
