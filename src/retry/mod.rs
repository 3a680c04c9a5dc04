//! The attempt loop: one request in, one answer out, with every retry tollgate makes on
//! the app's behalf in between.
//!
//! Each attempt picks an endpoint (a different one after a failure), connects or takes
//! a pooled connection, tells the upstream how long it may take and which attempt this
//! is, and waits for the response head no longer than `attempt_timeout` or the time
//! left. A failure goes to [`policy::Policy::decide`], which either names the reason to
//! stop or grants a retry from the budget with a full-jitter sleep. When the caller
//! leaves or the deadline passes, the future is dropped: the attempt in flight is
//! cancelled and its connection closed, never returned to the pool.

pub mod backoff;
pub mod budget;
pub mod median;
pub mod policy;
pub mod replay;
pub mod retry_after;

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Uri, Version};
use http_body::Body;
use tokio::time::{Instant, timeout_at};

use crate::deadline::{self, Deadline};
use crate::metrics::{AttemptResult, Outcome, UpstreamMetrics};
use crate::proxy::body::AppBody;
use crate::upstream::Upstream;
use crate::upstream::pool::{AttemptFields, Fields, RequestHead, SendError, UpstreamBody};
use backoff::Backoff;
use policy::{ATTEMPT_HEADER, BodyState, Failure, Policy, Situation, Stop};
use replay::{Recording, Replay, RequestBody, TapeHandle};

/// A request ready to forward: headers already cleaned, Host already set.
pub struct Exchange {
    pub method: Method,
    pub uri: Uri,
    /// The HTTP version the app spoke (for `protocol = "auto"`).
    pub version: Version,
    pub headers: HeaderMap,
    pub body: AppBody,
    pub deadline: Deadline,
    /// A gRPC call: `grpc-timeout` is rewritten on each attempt too.
    pub grpc: bool,
}

/// What goes back to the app.
// Unboxed: almost every answer is the upstream's, and a box would cost an allocation
// per request for the rare local one's sake.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// The upstream's response. An HTTP/1.1 body carries its connection, which goes
    /// back to the pool once the body has been read to the end.
    Upstream(Response<UpstreamBody>),
    /// tollgate answers itself (502 or 504).
    Local(StatusCode),
}

pub struct Answer {
    pub reply: Reply,
    pub attempts: u32,
    pub outcome: Outcome,
    /// The response already carries another tollgate's `x-tollgate-outcome`.
    pub owned_elsewhere: bool,
    /// The app's body was not read to its end: the client connection cannot carry
    /// another request.
    pub body_unread: bool,
}

/// `x-tollgate-attempt` values, without formatting per attempt.
static ATTEMPT_VALUES: [HeaderValue; 10] = [
    HeaderValue::from_static("1"),
    HeaderValue::from_static("2"),
    HeaderValue::from_static("3"),
    HeaderValue::from_static("4"),
    HeaderValue::from_static("5"),
    HeaderValue::from_static("6"),
    HeaderValue::from_static("7"),
    HeaderValue::from_static("8"),
    HeaderValue::from_static("9"),
    HeaderValue::from_static("10"),
];

pub fn count_value(n: u32) -> HeaderValue {
    match ATTEMPT_VALUES.get((n as usize).wrapping_sub(1)) {
        Some(v) => v.clone(),
        None => HeaderValue::from(n),
    }
}

/// How long a body still arriving when a retryable failure came may take to finish.
const BODY_GRACE: Duration = Duration::from_millis(50);

/// Stale pooled connections skipped within one attempt before giving up on it.
const MAX_STALE: u32 = 3;

/// Records an attempt's result exactly once; an attempt dropped before it has a
/// result (the app left, the deadline passed) counts as `cancelled`.
struct AttemptRecord<'a> {
    metrics: &'a UpstreamMetrics,
    done: bool,
}

impl AttemptRecord<'_> {
    fn finish(&mut self, up: &Upstream, result: AttemptResult, started: Instant) {
        self.done = true;
        let took = started.elapsed();
        self.metrics.attempt(result);
        self.metrics.attempt_duration.observe(took.as_secs_f64());
        up.median.observe(took);
    }
}

impl Drop for AttemptRecord<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.attempt(AttemptResult::Cancelled);
        }
    }
}

/// Forwards `ex` to `up`, retrying as the policy allows.
pub async fn forward(up: &Upstream, ex: Exchange) -> Answer {
    let cfg = &up.config;
    let retry = &cfg.retry;
    let Exchange {
        method,
        uri,
        version,
        headers,
        body,
        deadline,
        grpc,
    } = ex;
    let request_retryable = retry.max_attempts > 1
        && (retry.method_allowed(&method)
            || retry
                .idempotency_header
                .as_ref()
                .is_some_and(|h| headers.contains_key(h)));
    let want = up.want(version);
    let tls = up.tls.as_deref();

    // The body not yet handed to any attempt, its recording once one has, and the
    // replay the next attempt will send.
    let mut fresh_body = (!body.is_end_stream()).then_some(body);
    // A body handed to an attempt that never left (no connection).
    let mut unsent: Option<RequestBody> = None;
    let mut tape: Option<TapeHandle> = None;
    let mut replay_next: Option<Replay> = None;

    let mut attempts = 0u32;
    let mut avoid = None;
    let mut rng: Option<fastrand::Rng> = None;

    loop {
        attempts += 1;
        let start = Instant::now();
        if deadline.expired(start) {
            up.metrics.denied(crate::metrics::Denied::Deadline);
            return local(
                StatusCode::GATEWAY_TIMEOUT,
                attempts - 1,
                Outcome::DeadlineExceeded,
                unread(&fresh_body, &unsent, &tape),
            );
        }
        let attempt_deadline = (start + cfg.attempt_timeout).min(deadline.at());
        let ep_index = up.pick(avoid);
        let endpoint = &up.endpoints[ep_index];
        up.budget.record_attempt(start);
        let mut record = AttemptRecord {
            metrics: &up.metrics,
            done: false,
        };
        // Whether this attempt's request may have to be sent again after it is sent.
        let may_resend = request_retryable && attempts < retry.max_attempts;

        // The body of a request that never left (a pooled connection found closed).
        let mut returned: Option<RequestBody> = None;
        let mut stale = 0;
        let result: Result<Response<UpstreamBody>, Failure> = loop {
            let conn = match endpoint.pooled(want) {
                Some(c) => c,
                None => {
                    let connect_by = (Instant::now() + cfg.connect_timeout).min(attempt_deadline);
                    // Boxed: connecting (TLS included) is a large future, and keeping it
                    // inline would make every request's future that large to move.
                    let connecting = Box::pin(endpoint.checkout(want, tls, cfg.connect_timeout));
                    match timeout_at(connect_by, connecting).await {
                        Ok(Ok(c)) => c,
                        Ok(Err(e)) => {
                            tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "connect failed");
                            break Err(Failure::ConnectFailure);
                        }
                        Err(_) => break Err(Failure::ConnectFailure),
                    }
                }
            };
            let body = match returned.take() {
                Some(b) => b,
                None => {
                    if let Some(b) = unsent.take() {
                        b
                    } else if let Some(b) = fresh_body.take() {
                        // Recorded for a replay when one may follow; otherwise the
                        // recording keeps nothing and only notes whether the body ended.
                        let keep = if may_resend { retry.max_body } else { 0 };
                        let (rec, handle) = Recording::new(b, keep);
                        tape = Some(handle);
                        RequestBody::Recording(rec)
                    } else if let Some(r) = replay_next.take() {
                        RequestBody::Replay(Box::new(r))
                    } else {
                        RequestBody::Empty
                    }
                }
            };
            // The head is borrowed, not copied: every attempt sends the same one, with
            // its own attempt number and time allowed.
            let head = RequestHead {
                method: &method,
                uri: &uri,
                headers: &headers,
                fields: attempt_fields(up, attempts, attempt_deadline, grpc),
                https: tls.is_some(),
            };
            match timeout_at(attempt_deadline, conn.send(&head, body)).await {
                Err(_) => break Err(Failure::Timeout),
                Ok(Ok(resp)) => break Ok(resp),
                Ok(Err(SendError::NotSent(body, _))) if stale < MAX_STALE => {
                    // The pooled connection had closed under us: the request never
                    // left, so it goes out on another connection as the same attempt.
                    stale += 1;
                    returned = Some(body);
                }
                Ok(Err(SendError::NotSent(body, _))) => {
                    match body {
                        // Never sent: the body goes out, as it is, on the next attempt.
                        RequestBody::Empty => {}
                        unsent_body => unsent = Some(unsent_body),
                    }
                    break Err(Failure::ConnectFailure);
                }
                Ok(Err(SendError::Failed(e))) => {
                    tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "attempt failed");
                    break Err(Failure::Reset);
                }
            }
        };

        let (failure, failed_response) = match result {
            Ok(resp) => {
                record.finish(up, AttemptResult::of_status(resp.status().as_u16()), start);
                let failure =
                    policy::classify_response(resp.status(), Fields::of(&resp), &retry.on);
                let owned = policy::owned_elsewhere(Fields::of(&resp));
                match failure {
                    None => {
                        let outcome = if owned {
                            outcome_of(Fields::of(&resp))
                        } else {
                            Outcome::Ok
                        };
                        return Answer {
                            reply: Reply::Upstream(resp),
                            attempts,
                            outcome,
                            owned_elsewhere: owned,
                            body_unread: unread(&fresh_body, &unsent, &tape),
                        };
                    }
                    Some(f) => (f, Some(resp)),
                }
            }
            Err(f) => {
                let r = match f {
                    Failure::ConnectFailure => AttemptResult::ConnectFailure,
                    Failure::Timeout => AttemptResult::Timeout,
                    _ => AttemptResult::Reset,
                };
                record.finish(up, r, start);
                (f, None)
            }
        };

        // The response came while the app's body was still arriving (an upstream that
        // refuses a call without reading it): give the rest a moment to arrive (the
        // backoff before the retry, at least `BODY_GRACE`), so it can be replayed.
        if let Some(t) = &tape
            && failure.maybe_sent()
            && request_retryable
            && attempts < retry.max_attempts
        {
            let wait = retry
                .backoff
                .cap(attempts - 1)
                .max(BODY_GRACE)
                .min(deadline.remaining(Instant::now()) / 2);
            t.finish_within(wait).await;
        }
        let now = Instant::now();
        let decision = if failure == Failure::Timeout && deadline.expired(now) {
            Err(Stop::Deadline)
        } else {
            let policy = Policy {
                retry,
                backoff: &Backoff::from(&retry.backoff),
                budget: &up.budget,
                median: up.median.get(),
            };
            let replay_now = &mut replay_next;
            let pending = fresh_body.is_some() || unsent.is_some();
            let recorded = tape.as_ref();
            let mut situation = Situation {
                failure,
                response: failed_response.as_ref().map(Fields::of),
                attempts,
                request_retryable,
                // The next attempt sends the body from the recording, if it can be
                // replayed (a body never handed to an attempt needs nothing).
                body: Box::new(move || match recorded {
                    Some(t) if replay_now.is_none() && !pending => match t.replay() {
                        Ok(r) => {
                            *replay_now = Some(r);
                            Ok(())
                        }
                        Err(replay::NotReplayable::TooLarge) => Err(BodyState::TooLarge),
                        Err(replay::NotReplayable::Incomplete) => Err(BodyState::Incomplete),
                    },
                    _ => Ok(()),
                }),
                deadline,
                now,
            };
            policy.decide(&mut situation, rng.get_or_insert_with(fastrand::Rng::new))
        };
        match decision {
            Ok(sleep) => {
                up.metrics.retried(failure.condition());
                if let Some(resp) = failed_response {
                    discard(resp);
                }
                if !sleep.is_zero() {
                    tokio::time::sleep(sleep).await;
                }
                avoid = Some(ep_index);
            }
            Err(stop) => {
                if let Some(d) = stop.denied() {
                    up.metrics.denied(d);
                }
                let outcome = stop.outcome(failure);
                return match failed_response {
                    Some(resp) => {
                        let owned = stop == Stop::Ownership;
                        let outcome = if owned {
                            outcome_of(Fields::of(&resp))
                        } else {
                            outcome
                        };
                        Answer {
                            reply: Reply::Upstream(resp),
                            attempts,
                            outcome,
                            owned_elsewhere: owned,
                            body_unread: unread(&fresh_body, &unsent, &tape),
                        }
                    }
                    None => {
                        let status = match failure {
                            Failure::Timeout => StatusCode::GATEWAY_TIMEOUT,
                            _ if outcome == Outcome::DeadlineExceeded => {
                                StatusCode::GATEWAY_TIMEOUT
                            }
                            _ => StatusCode::BAD_GATEWAY,
                        };
                        local(
                            status,
                            attempts,
                            outcome,
                            unread(&fresh_body, &unsent, &tape),
                        )
                    }
                };
            }
        }
    }
}

fn local(status: StatusCode, attempts: u32, outcome: Outcome, body_unread: bool) -> Answer {
    Answer {
        reply: Reply::Local(status),
        attempts,
        outcome,
        owned_elsewhere: false,
        body_unread,
    }
}

/// Whether some of the app's body is still unread.
fn unread(
    fresh: &Option<AppBody>,
    unsent: &Option<RequestBody>,
    tape: &Option<TapeHandle>,
) -> bool {
    fresh.is_some() || unsent.is_some() || tape.as_ref().is_some_and(|t| !t.complete())
}

/// The outcome another tollgate put on a response, for our own metrics.
pub fn outcome_of(headers: Fields<'_>) -> Outcome {
    headers
        .get(&policy::OUTCOME_HEADER)
        .and_then(|v| {
            Outcome::ALL
                .iter()
                .copied()
                .find(|o| o.as_str().as_bytes() == v)
        })
        .unwrap_or(Outcome::Ok)
}

/// The per-attempt headers: the attempt number and the time this attempt may take,
/// `min(attempt_timeout, time left)`.
fn attempt_fields(up: &Upstream, attempt: u32, by: Instant, grpc: bool) -> AttemptFields {
    let left = by.saturating_duration_since(Instant::now());
    AttemptFields([
        Some((ATTEMPT_HEADER, count_value(attempt))),
        Some((up.deadline.header.clone(), deadline::format_millis(left))),
        grpc.then(|| (deadline::GRPC_TIMEOUT, deadline::format_grpc_timeout(left))),
    ])
}

/// Drops a failed response that will be retried. A small complete body is read in the
/// background so its HTTP/1.1 connection can be reused: during an incident the same
/// upstream is asked again within milliseconds, and a fresh connection per failure
/// would add a handshake to every retry.
fn discard(resp: Response<UpstreamBody>) {
    let body = match resp.into_body() {
        UpstreamBody::Http1(b) => b,
        UpstreamBody::Http2(_) => return,
    };
    // A body already at its end has released its connection.
    if body.is_end_stream() {
        return;
    }
    if body.size_hint().exact().is_some_and(|n| n <= 64 * 1024) {
        tokio::spawn(async move {
            use http_body_util::BodyExt;
            // Read to the end, the body releases its connection itself.
            let _ = tokio::time::timeout(Duration::from_secs(1), body.collect()).await;
        });
    }
}
