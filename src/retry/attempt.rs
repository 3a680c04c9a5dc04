//! One attempt on one endpoint: a connection (pooled, or opened within
//! `connect_timeout`), the request sent with this attempt's own fields, and the response
//! head awaited until the attempt's deadline. Its result is recorded exactly once; an
//! attempt dropped before it has one (the app left, the deadline passed) counts as
//! `cancelled`, and its connection is closed, never pooled.
//!
//! Two ends are nobody's fault at the endpoint, and are told apart from its failures
//! ([`NotUpstream`]): the app's body broke as it was sent (counted `cancelled`), and
//! this process ran out of file descriptors before a connection could be opened (not
//! counted as an attempt at all). Neither is retried nor held against the endpoint.

use http::{HeaderName, Response};
use tokio::time::{Instant, timeout_at};

use super::headers::{ATTEMPT_HEADER, count_value};
use super::policy::Failure;
use super::replay::{AppBody, BodySource};
use super::upstream::Upstream;
use crate::deadline;
use crate::descriptors::Throttled;
use crate::metrics::{AttemptResult, UpstreamMetrics};
use crate::upstream::pool::{SendError, Want, clock_ms};
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::UpstreamBody;
use crate::upstream::tls_failure;

/// The names of the per-attempt fields, borrowed by every attempt.
static ATTEMPT_NAME: HeaderName = ATTEMPT_HEADER;
static GRPC_TIMEOUT_NAME: HeaderName = deadline::GRPC_TIMEOUT;

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
    pub want: Want,
    pub started: Instant,
    /// When tollgate stops waiting for this attempt's response head.
    pub by: Instant,
    /// A gRPC call with a deadline of its caller's own: when that ends (sent as
    /// `grpc-timeout`, which a gRPC server applies to the whole call).
    pub grpc_deadline: Option<Instant>,
    /// How much of the app's body to keep for a replay (0: no retry can follow).
    pub keep: usize,
}

impl<'a, A: AppBody> Attempt<'a, A> {
    /// Runs the attempt: `head` goes out with this attempt's fields, the body is taken
    /// from `body` (and given back when it never left).
    /// `detail` is set to what went wrong when it is worth telling the app (a TLS
    /// failure's reason).
    pub async fn run<'h>(
        self,
        head: &mut RequestHead<'h>,
        body: &mut BodySource<A>,
        detail: &mut Option<String>,
    ) -> Result<Response<UpstreamBody>, AttemptError>
    where
        'a: 'h,
    {
        let mut record = Record {
            metrics: &self.up.metrics,
            done: false,
        };
        let result = match self.exchange(head, body, detail).await {
            // Whatever the exchange then failed with, the app's body broke first.
            Err(AttemptError::Upstream(_)) if body.app_failed() => {
                Err(AttemptError::NotUpstream(NotUpstream::AppBody))
            }
            r => r,
        };
        let r = match &result {
            Ok(resp) => AttemptResult::of_status(resp.status().as_u16()),
            Err(AttemptError::Upstream(Failure::ConnectFailure)) => AttemptResult::ConnectFailure,
            Err(AttemptError::Upstream(Failure::Tls)) => AttemptResult::Tls,
            Err(AttemptError::Upstream(Failure::Timeout)) => AttemptResult::Timeout,
            Err(AttemptError::Upstream(_)) => AttemptResult::Reset,
            Err(AttemptError::NotUpstream(NotUpstream::AppBody)) => {
                record.cancelled();
                return result;
            }
            Err(AttemptError::NotUpstream(NotUpstream::NoDescriptors)) => {
                record.done = true;
                return result;
            }
        };
        record.finish(self.up, r, self.started);
        result
    }

    async fn exchange<'h>(
        &self,
        head: &mut RequestHead<'h>,
        body: &mut BodySource<A>,
        detail: &mut Option<String>,
    ) -> Result<Response<UpstreamBody>, AttemptError>
    where
        'a: 'h,
    {
        let cfg = &self.up.config;
        let endpoint = self.up.endpoints.get(self.endpoint);
        let tls = self.up.tls.as_deref();
        let mut stale = 0;
        loop {
            let (conn, fresh) = match endpoint.pooled(self.want, self.started) {
                Some(c) => (c, false),
                None => {
                    let connect_by = (Instant::now() + cfg.connect_timeout).min(self.by);
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
                            if let Some(reason) = e.tls_reason() {
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
            head.fields = self.fields(if fresh { Instant::now() } else { self.started });
            // As curl waits, but leaving most of the attempt's time to the exchange.
            head.continue_wait =
                CONTINUE_WAIT.min(self.by.saturating_duration_since(Instant::now()) / 4);
            match timeout_at(self.by, conn.send(head, body.take(self.keep))).await {
                Err(_) => return Err(Failure::Timeout.into()),
                Ok(Ok(resp)) => return Ok(resp),
                Ok(Err(SendError::NotSent(unsent, _))) => {
                    // The pooled connection had closed under us: the request never
                    // left, so it goes out on another connection as the same attempt,
                    // or, after a few, as the next attempt.
                    body.give_back(unsent);
                    stale += 1;
                    if stale > MAX_STALE {
                        return Err(Failure::ConnectFailure.into());
                    }
                }
                Ok(Err(SendError::Failed(e))) => {
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

    /// The per-attempt fields: the attempt number, the time this attempt may take,
    /// `min(attempt_timeout, time left)`, and for a gRPC call with a deadline the time
    /// left of the caller's own.
    fn fields(&self, now: Instant) -> AttemptFields<'a> {
        let left = self.by.saturating_duration_since(now);
        AttemptFields([
            Some((&ATTEMPT_NAME, count_value(self.number))),
            Some((&self.up.deadline.header, deadline::format_millis(left))),
            self.grpc_deadline.map(|at| {
                let left = at.saturating_duration_since(now);
                (&GRPC_TIMEOUT_NAME, deadline::format_grpc_timeout(left))
            }),
        ])
    }
}

/// Records an attempt's result exactly once; dropped before, it records `cancelled`.
struct Record<'a> {
    metrics: &'a UpstreamMetrics,
    done: bool,
}

impl Record<'_> {
    fn cancelled(&mut self) {
        self.done = true;
        self.metrics.attempt(AttemptResult::Cancelled);
    }

    fn finish<A>(&mut self, up: &Upstream<A>, result: AttemptResult, started: Instant) {
        self.done = true;
        let took = started.elapsed();
        self.metrics.attempt(result);
        self.metrics.attempt_duration.observe(took.as_secs_f64());
        up.median.observe(took);
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.attempt(AttemptResult::Cancelled);
        }
    }
}
