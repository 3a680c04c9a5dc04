//! One attempt on one endpoint: a connection (pooled, or opened within
//! `connect_timeout`), the request sent with this attempt's own fields, and the response
//! head awaited until the attempt's deadline. Its result is recorded exactly once; an
//! attempt dropped before it has one (the app left, the deadline passed) counts as
//! `cancelled`, and its connection is closed, never pooled.

use http::Response;
use tokio::time::{Instant, timeout_at};

use super::headers::{ATTEMPT_HEADER, count_value};
use super::policy::Failure;
use super::replay::{AppBody, BodySource};
use super::upstream::Upstream;
use crate::deadline;
use crate::http::fields::ExtraFields;
use crate::metrics::{AttemptResult, UpstreamMetrics};
use crate::upstream::pool::SendError;
use crate::upstream::pool::Want;
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::UpstreamBody;

/// Stale pooled connections skipped within one attempt before giving up on it.
const MAX_STALE: u32 = 3;

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
    ) -> Result<Response<UpstreamBody>, Failure> {
        let mut record = Record {
            metrics: &self.up.metrics,
            done: false,
        };
        let result = self.exchange(head, body).await;
        let r = match &result {
            Ok(resp) => AttemptResult::of_status(resp.status().as_u16()),
            Err(Failure::ConnectFailure) => AttemptResult::ConnectFailure,
            Err(Failure::Timeout) => AttemptResult::Timeout,
            Err(_) => AttemptResult::Reset,
        };
        record.finish(self.up, r, self.started);
        result
    }

    async fn exchange(
        &self,
        head: &mut RequestHead<'_>,
        body: &mut BodySource<A>,
    ) -> Result<Response<UpstreamBody>, Failure> {
        let cfg = &self.up.config;
        let endpoint = self.up.endpoints.get(self.endpoint);
        let tls = self.up.tls.as_deref();
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
                        Ok(Err(e)) => {
                            tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "connect failed");
                            return Err(Failure::ConnectFailure);
                        }
                        Err(_) => return Err(Failure::ConnectFailure),
                    }
                }
            };
            head.fields = self.fields();
            match timeout_at(self.by, conn.send(head, body.take(self.keep))).await {
                Err(_) => return Err(Failure::Timeout),
                Ok(Ok(resp)) => return Ok(resp),
                Ok(Err(SendError::NotSent(unsent, _))) => {
                    // The pooled connection had closed under us: the request never
                    // left, so it goes out on another connection as the same attempt,
                    // or, after a few, as the next attempt.
                    body.give_back(unsent);
                    stale += 1;
                    if stale > MAX_STALE {
                        return Err(Failure::ConnectFailure);
                    }
                }
                Ok(Err(SendError::Failed(e))) => {
                    tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "attempt failed");
                    return Err(Failure::Reset);
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
