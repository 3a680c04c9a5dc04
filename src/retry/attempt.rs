//! One attempt on one endpoint: a connection (pooled, or opened within
//! `connect_timeout`), the request sent with this attempt's own fields, and the response
//! head awaited until the request's deadline (none: as long as it takes). The attempt
//! timeout does not end an attempt: the loop starts a retry beside a slow one, and the
//! first good answer wins. Its result is recorded exactly once; an attempt dropped before
//! it has one counts as `cancelled` (the app left, another attempt won), or as `timeout`
//! when it had run past its attempt timeout (it was abandoned for being slow), and its
//! connection is closed, never pooled.
//!
//! Two ends are nobody's fault at the endpoint, and are told apart from its failures
//! ([`NotUpstream`]): the app's body broke as it was sent (counted `cancelled`), and
//! this process ran out of file descriptors before a connection could be opened (not
//! counted as an attempt at all). Neither is retried nor held against the endpoint.
//!
//! The attempt owns what it sends (its head's own fields, its body) and borrows only
//! the request's shared head, so two attempts of one request can run side by side (a
//! hedge). What it came to is reported to the endpoint's health
//! ([`crate::upstream::outlier`]) and to the latency estimates, once.

use http::{HeaderMap, HeaderName, Method, StatusCode, Uri};
use tokio::time::{Instant, timeout_at};

use super::headers::{ATTEMPT_HEADER, Callee, HEDGE_HEADER, HEDGE_VALUE, count_value};
use super::policy::Failure;
use super::replay::{AppBody, ReplayBody};
use super::upstream::Upstream;
use crate::deadline;
use crate::descriptors::Throttled;
use crate::metrics::AttemptResult;
use crate::upstream::outlier::Verdict;
use crate::upstream::pool::{SendError, Want, clock_ms};
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::{Fields, UpstreamResponse};
use crate::upstream::tls_failure;

/// The names of the per-attempt fields, borrowed by every attempt.
static ATTEMPT_NAME: HeaderName = ATTEMPT_HEADER;
static HEDGE_NAME: HeaderName = HEDGE_HEADER;

/// How much earlier than this attempt's own time a callee's `app-timeout` must come to
/// be its own limit rather than the deadline this attempt sent (rounded down to the
/// millisecond, and carried across the network).
const DEADLINE_SLACK: std::time::Duration = std::time::Duration::from_millis(10);

/// Stale pooled connections skipped within one attempt before giving up on it.
const MAX_STALE: u32 = 3;
/// How long a body behind `Expect: 100-continue` waits for `100 Continue` at most
/// (some servers never send one).
const CONTINUE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Why an attempt ended without a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AttemptError {
    /// The upstream failed, as `retry.on` names it.
    Upstream(Failure),
    /// Not the upstream's doing.
    NotUpstream(NotUpstream),
}

/// An attempt that ended for a reason the endpoint had no part in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NotUpstream {
    /// The app's body broke (malformed, or its connection failed) as it was sent.
    AppBody,
    /// This process was out of file descriptors when it needed a connection.
    NoDescriptors,
}

impl From<Failure> for AttemptError {
    fn from(f: Failure) -> Self {
        AttemptError::Upstream(f)
    }
}

/// Connects that failed for want of a descriptor, logged at most once per period.
static OUT_OF_DESCRIPTORS: Throttled = Throttled::new();

/// One attempt, before it runs.
pub(super) struct Attempt<'a, A> {
    pub up: &'a Upstream<A>,
    /// Which of the upstream's endpoints.
    pub endpoint: usize,
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
    /// own fields are added as it is sent).
    pub method: &'a Method,
    /// Origin-form (path and query).
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub body: ReplayBody<A>,
}

/// What an attempt came to.
pub(super) struct Ran<A> {
    pub result: Result<UpstreamResponse, AttemptError>,
    /// The body, when it never left (no connection took it): the next attempt sends it.
    pub unsent: Option<ReplayBody<A>>,
    /// What went wrong, when it is worth telling the app (a TLS failure's reason).
    pub detail: Option<String>,
    pub endpoint: usize,
    /// The attempt's number as sent (`x-tollgate-attempt`).
    pub number: u32,
}

impl<'a, A: AppBody> Attempt<'a, A> {
    /// Runs the attempt: the head goes out with this attempt's fields, then the body
    /// (which comes back in [`Ran::unsent`] when it never left).
    pub async fn run(mut self) -> Ran<A> {
        let mut record = Record {
            up: self.up,
            endpoint: self.endpoint,
            started: self.started,
            slow_after: self.slow_after,
            done: false,
        };
        let watch = self.body.watch();
        let mut body = Some(std::mem::replace(&mut self.body, ReplayBody::Empty));
        let mut detail = None;
        // In place, not matched into a new binding: a response is a few hundred bytes,
        // and every move of it is a copy.
        let mut result = self.exchange(&mut body, &mut detail).await;
        if matches!(result, Err(AttemptError::Upstream(_))) && watch.app_failed() {
            // Whatever the exchange then failed with, the app's body broke first.
            result = Err(AttemptError::NotUpstream(NotUpstream::AppBody));
        }
        let ran = |result| Ran {
            result,
            unsent: body,
            detail,
            endpoint: self.endpoint,
            number: self.number,
        };
        if let Ok(resp) = &result {
            let endpoint = self.up.endpoints.get(self.endpoint);
            if resp.status() == StatusCode::BAD_GATEWAY
                && Callee::of(resp.status(), Fields::of(resp)) == Callee::AppUnreachable
            {
                endpoint.unreachable_behind();
            } else {
                endpoint.answered();
            }
        }
        let r = match &result {
            Ok(resp) => AttemptResult::of_status(resp.status().as_u16()),
            Err(AttemptError::Upstream(Failure::ConnectFailure)) => AttemptResult::ConnectFailure,
            Err(AttemptError::Upstream(Failure::Tls)) => AttemptResult::Tls,
            Err(AttemptError::Upstream(Failure::Timeout)) => AttemptResult::Timeout,
            Err(AttemptError::Upstream(_)) => AttemptResult::Reset,
            Err(AttemptError::NotUpstream(NotUpstream::AppBody)) => {
                record.cancelled();
                return ran(result);
            }
            Err(AttemptError::NotUpstream(NotUpstream::NoDescriptors)) => {
                record.done = true;
                return ran(result);
            }
        };
        if self.up.endpoints.ejects() {
            let verdict = self.verdict(&result);
            self.up.endpoints.report(self.endpoint, verdict);
        }
        record.finish(&result, r);
        ran(result)
    }

    /// Whether the attempt ended before its attempt timeout (or had none): it had not
    /// had the time an endpoint is judged by.
    fn cut_short(&self) -> bool {
        self.slow_after.is_none_or(|s| self.started.elapsed() < s)
    }

    /// What the result says about the endpoint.
    fn verdict(&self, result: &Result<UpstreamResponse, AttemptError>) -> Verdict {
        match result {
            Ok(resp) => match Callee::of(resp.status(), Fields::of(resp)) {
                // The callee's inbound side ran out of the time this attempt gave it (the
                // request's deadline) before the attempt timeout, as this attempt would
                // have: judged as a timeout of its own is.
                Callee::AppTimeout
                    if self.cut_short()
                        && self
                            .by
                            .is_some_and(|by| Instant::now() + DEADLINE_SLACK >= by) =>
                {
                    Verdict::Neutral
                }
                callee if callee.endpoint_failed(resp.status()) => Verdict::Failure,
                _ => Verdict::Success,
            },
            // Cut short by the deadline before its attempt timeout, the attempt did not
            // have the time an endpoint is judged by.
            Err(AttemptError::Upstream(Failure::Timeout)) if self.cut_short() => Verdict::Neutral,
            Err(AttemptError::Upstream(_)) => Verdict::Failure,
            Err(AttemptError::NotUpstream(_)) => Verdict::Neutral,
        }
    }

    async fn exchange(
        &mut self,
        body: &mut Option<ReplayBody<A>>,
        detail: &mut Option<String>,
    ) -> Result<UpstreamResponse, AttemptError> {
        let cfg = &self.up.config;
        let endpoint = self.up.endpoints.get(self.endpoint);
        let tls = self.up.tls.as_deref();
        let mut stale = 0;
        loop {
            let (conn, fresh) = match endpoint.pooled(self.want, self.started) {
                Some(c) => (c, false),
                None => {
                    let connect_by = Instant::now() + cfg.connect_timeout;
                    let connect_by = self.by.map_or(connect_by, |by| connect_by.min(by));
                    // Boxed: connecting (TLS included) is a large future, and keeping it
                    // inline would make every request's future that large to move.
                    let connecting =
                        Box::pin(endpoint.checkout(self.want, tls, cfg.connect_timeout));
                    match timeout_at(connect_by, connecting).await {
                        Ok(Ok(c)) => c,
                        Ok(Err(e)) if e.out_of_descriptors() => {
                            self.up.metrics.exhausted.inc();
                            if let Some(n) = OUT_OF_DESCRIPTORS.due() {
                                tracing::warn!(upstream = %cfg.name, count = n, error = %e, "out of file descriptors: requests answered 503 overloaded (raise the open-file limit)");
                            }
                            return Err(AttemptError::NotUpstream(NotUpstream::NoDescriptors));
                        }
                        Ok(Err(e)) => {
                            let client_cert =
                                cfg.tls.as_ref().is_some_and(|t| t.client_cert.is_some());
                            if let Some(reason) = e.tls_reason(client_cert) {
                                return Err(self.tls_failed(reason, detail).into());
                            }
                            tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "connect failed");
                            return Err(Failure::ConnectFailure.into());
                        }
                        Err(_) => {
                            tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, "connect timed out");
                            return Err(Failure::ConnectFailure.into());
                        }
                    }
                }
            };
            // A pooled connection is taken at once: the attempt's start is still now.
            let now = if fresh { Instant::now() } else { self.started };
            let left = self.by.map(|by| by.saturating_duration_since(now));
            // As curl waits, but leaving most of the time to the exchange.
            let patience = match (left, self.slow_after) {
                (Some(l), Some(s)) => Some(l.min(s)),
                (l, s) => l.or(s),
            };
            let head = RequestHead {
                method: self.method,
                uri: self.uri,
                headers: self.headers,
                fields: self.fields(now, left),
                https: cfg.tls.is_some(),
                continue_wait: patience.map_or(CONTINUE_WAIT, |p| CONTINUE_WAIT.min(p / 4)),
            };
            let Some(sending) = body.take() else {
                return Err(Failure::ConnectFailure.into());
            };
            match deadline::within(self.by, conn.send(&head, sending)).await {
                None => return Err(Failure::Timeout.into()),
                Some(Ok(resp)) => return Ok(resp),
                Some(Err(SendError::NotSent(unsent, _))) => {
                    // The pooled connection had closed under us: the request never
                    // left, so it goes out on another connection as the same attempt,
                    // or, after a few, as the next attempt.
                    *body = Some(unsent);
                    stale += 1;
                    if stale > MAX_STALE {
                        return Err(Failure::ConnectFailure.into());
                    }
                }
                Some(Err(SendError::Failed(e))) => {
                    // A server that refuses tollgate's client certificate may say so
                    // only once the handshake seemed done: on a new connection's first
                    // exchange, that is a TLS failure too.
                    if let Some(t) = cfg.tls.as_ref().filter(|_| fresh)
                        && let Some(reason) = tls_failure::rejection(&*e, t.client_cert.is_some())
                    {
                        return Err(self.tls_failed(reason, detail).into());
                    }
                    tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "attempt failed");
                    return Err(Failure::Reset.into());
                }
            }
        }
    }

    /// A TLS failure: warned about (at most once every few seconds per endpoint) and
    /// named for the app.
    fn tls_failed(&self, reason: String, detail: &mut Option<String>) -> Failure {
        let endpoint = self.up.endpoints.get(self.endpoint);
        let text = format!("TLS handshake with {} failed: {reason}", endpoint.addr);
        if let Some(suppressed) = endpoint.tls_warn.allow(clock_ms()) {
            tracing::warn!(
                upstream = %self.up.config.name,
                endpoint = %endpoint.addr,
                suppressed,
                "{text}"
            );
        }
        *detail = Some(text);
        Failure::Tls
    }

    /// The per-attempt fields: the attempt number, the time left of the request's
    /// deadline when it has one (not the attempt timeout: tollgate may keep waiting past
    /// that), for a gRPC call with a deadline the time left of the caller's own, and on
    /// a hedge `x-tollgate-hedge: 1`.
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
    endpoint: usize,
    started: Instant,
    slow_after: Option<std::time::Duration>,
    done: bool,
}

impl<A> Record<'_, A> {
    fn cancelled(&mut self) {
        self.done = true;
        self.up.metrics.attempt(AttemptResult::Cancelled);
    }

    fn finish(&mut self, result: &Result<UpstreamResponse, AttemptError>, r: AttemptResult) {
        self.done = true;
        let took = self.started.elapsed();
        let metrics = &self.up.metrics;
        metrics.attempt(r);
        metrics.attempt_duration.observe(took.as_secs_f64());
        self.up.median.observe(took);
        if let Some(h) = &self.up.hedge {
            // The hedge delay is about response heads: a connection refused at once
            // says nothing of it, an attempt that timed out took at least its time.
            match result {
                Ok(_) => h.observe(took),
                Err(AttemptError::Upstream(Failure::Timeout)) => h.observe_at_least(took),
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
            self.up.metrics.attempt(AttemptResult::Timeout);
            if self.up.endpoints.ejects() {
                self.up.endpoints.report(self.endpoint, Verdict::Failure);
            }
        } else {
            self.up.metrics.attempt(AttemptResult::Cancelled);
        }
        // A hedge's loser, or an attempt the app or the deadline cut off: it had not
        // answered after this long.
        if let Some(h) = &self.up.hedge {
            h.observe_at_least(took);
        }
    }
}
