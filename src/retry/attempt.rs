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

use http::Response;
use tokio::time::{Instant, timeout_at};

use super::headers::{ATTEMPT_HEADER, count_value};
use super::policy::Failure;
use super::replay::{AppBody, BodySource};
use super::upstream::Upstream;
use crate::deadline;
use crate::descriptors::Throttled;
use crate::http::fields::ExtraFields;
use crate::metrics::{AttemptResult, UpstreamMetrics};
use crate::upstream::pool::SendError;
use crate::upstream::pool::Want;
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::UpstreamBody;

/// Stale pooled connections skipped within one attempt before giving up on it.
const MAX_STALE: u32 = 3;

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
    /// A gRPC call: the deadline travels as `grpc-timeout` too.
    pub grpc: bool,
    /// How much of the app's body to keep for a replay (0: no retry can follow).
    pub keep: usize,
}

impl<A: AppBody> Attempt<'_, A> {
    /// Runs the attempt: `head` goes out with this attempt's fields, the body is taken
    /// from `body` (and given back when it never left).
    pub async fn run(
        self,
        head: &mut RequestHead<'_>,
        body: &mut BodySource<A>,
    ) -> Result<Response<UpstreamBody>, AttemptError> {
        let mut record = Record {
            metrics: &self.up.metrics,
            done: false,
        };
        let result = match self.exchange(head, body).await {
            // Whatever the exchange then failed with, the app's body broke first.
            Err(AttemptError::Upstream(_)) if body.app_failed() => {
                Err(AttemptError::NotUpstream(NotUpstream::AppBody))
            }
            r => r,
        };
        let r = match &result {
            Ok(resp) => AttemptResult::of_status(resp.status().as_u16()),
            Err(AttemptError::Upstream(Failure::ConnectFailure)) => AttemptResult::ConnectFailure,
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

    async fn exchange(
        &self,
        head: &mut RequestHead<'_>,
        body: &mut BodySource<A>,
    ) -> Result<Response<UpstreamBody>, AttemptError> {
        let cfg = &self.up.config;
        let endpoint = self.up.endpoints.get(self.endpoint);
        let tls = cfg.tls.as_ref();
        let mut stale = 0;
        loop {
            let conn = match endpoint.pooled(self.want) {
                Some(c) => c,
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
                            tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "connect failed");
                            return Err(Failure::ConnectFailure.into());
                        }
                        Err(_) => return Err(Failure::ConnectFailure.into()),
                    }
                }
            };
            head.fields = self.fields();
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
                    tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "attempt failed");
                    return Err(Failure::Reset.into());
                }
            }
        }
    }

    /// The per-attempt fields: the attempt number and the time this attempt may take,
    /// `min(attempt_timeout, time left)`.
    fn fields(&self) -> AttemptFields {
        let left = self.by.saturating_duration_since(Instant::now());
        ExtraFields([
            Some((ATTEMPT_HEADER, count_value(self.number))),
            Some((
                self.up.deadline.header.clone(),
                deadline::format_millis(left),
            )),
            self.grpc
                .then(|| (deadline::GRPC_TIMEOUT, deadline::format_grpc_timeout(left))),
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
