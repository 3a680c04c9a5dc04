//! The attempt loop: one request in, one answer out, with every retry tollgate makes on
//! the app's behalf in between.
//!
//! Each turn picks an endpoint (a different one after a failure), runs an [`Attempt`],
//! and judges what came back. A failure goes to [`Policy::decide`], which either names
//! the reason to stop or grants a retry from the budget with a full-jitter sleep. The
//! app's body across attempts is the [`BodySource`]'s to keep. When the caller leaves
//! or the deadline passes, the future is dropped: the attempt in flight is cancelled
//! and its connection closed, never returned to the pool.
//!
//! What each attempt showed goes to the parts that learn from the upstream
//! ([`learn`](super::learn)); the failure a retry retries is kept while it runs, in case
//! the callee refuses the retry ([`rejected`](super::rejected)).

use std::time::Duration;

use http::{HeaderMap, Method, Response, StatusCode, Uri, Version};
use http_body::Body;
use tokio::time::Instant;

use super::attempt::{Attempt, AttemptError, NotUpstream};
use super::backoff::Backoff;
use super::headers::{outcome_of, owned_elsewhere};
use super::learn::{self, Seen};
use super::policy::{self, Failure, Policy, Situation, Stop};
use super::rejected::{self, Previous};
use super::replay::{AppBody, BodySource};
use super::upstream::Upstream;
use crate::deadline::Deadline;
use crate::metrics::{Denied, Outcome};
use crate::upstream::pool::Want;
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::{Fields, UpstreamBody};
use crate::upstream::want;

/// A request ready to forward: headers already cleaned, Host already set.
pub struct Exchange<A> {
    pub method: Method,
    pub uri: Uri,
    /// The HTTP version the app spoke (for `protocol = "auto"`).
    pub version: Version,
    pub headers: HeaderMap,
    pub body: A,
    pub deadline: Deadline,
    /// A gRPC call: `grpc-timeout` carries the caller's own deadline, and tollgate's
    /// own answers are gRPC answers.
    pub grpc: bool,
    /// An HTTP/1.1 upgrade (`Connection: upgrade`, `Upgrade: websocket`): sent over
    /// HTTP/1.1, never retried once sent, and a `101` is its answer.
    pub upgrade: bool,
    /// The app sent this again after a failure tollgate owned: it goes as a retry
    /// (`x-tollgate-attempt: 2`, its budget already spent) and is not retried again.
    pub app_retry: bool,
}

/// What goes back to the app.
// Unboxed: almost every answer is the upstream's, and a box would cost an allocation
// per request for the rare local one's sake.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// The upstream's response. An HTTP/1.1 body carries its connection, which goes
    /// back to the pool once the body has been read to the end.
    Upstream(Response<UpstreamBody>),
    /// tollgate answers itself: 502 or 504 for the upstream, 400 for a malformed body
    /// from the app, 503 (with `Retry-After`) when out of file descriptors.
    Local(StatusCode),
}

pub struct Answer {
    pub reply: Reply,
    pub attempts: u32,
    pub outcome: Outcome,
    /// The failure tollgate gave up on, when it gave up.
    pub failure: Option<Failure>,
    /// What went wrong, in words for the app, when there is more to say than the
    /// status (a TLS failure's reason).
    pub detail: Option<String>,
    /// The response already carries another tollgate's `x-tollgate-outcome`.
    pub owned_elsewhere: bool,
    /// The app's body was not read to its end: the client connection cannot carry
    /// another request.
    pub body_unread: bool,
    /// Nothing of the app's body was read, and nothing will be: an endpoint answered
    /// before its `100 Continue`, or no attempt took the body.
    pub body_untouched: bool,
}

/// How long a body still arriving when a retryable failure came may take to finish.
const BODY_GRACE: Duration = Duration::from_millis(50);
/// How long a body not sent at all (the endpoint refused at `Expect: 100-continue`)
/// may take to arrive, once tollgate asks the app for it to retry.
const EXPECT_GRACE: Duration = Duration::from_secs(1);

/// One request on its way through its attempts.
struct Call<'a, A> {
    up: &'a Upstream<A>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    deadline: Deadline,
    grpc: bool,
    upgrade: bool,
    want: Want,
    /// A listed method or an idempotency key: the request may be sent again.
    retryable: bool,
    body: BodySource<A>,
    /// Attempts started.
    attempts: u32,
    /// The endpoint that failed last.
    avoid: Option<usize>,
    /// Endpoints (by index, the first 64) whose TLS failed for this request: a
    /// verification failure is not retried on the same endpoint.
    tls_failed: u64,
    /// What the last attempt's failure had to say.
    detail: Option<String>,
    rng: Option<fastrand::Rng>,
    /// The app's own retry: numbered from 2, one attempt only.
    app_retry: bool,
    /// The failure the attempt in flight retries.
    previous: Option<Previous>,
}

/// Forwards `ex` to `up`, retrying as the policy allows.
pub async fn forward<A: AppBody>(up: &Upstream<A>, ex: Exchange<A>) -> Answer {
    let mut call = Call::new(up, ex);
    loop {
        let started = Instant::now();
        if call.deadline.expired(started) {
            up.metrics.denied(Denied::Deadline);
            return call.local(StatusCode::GATEWAY_TIMEOUT, Outcome::DeadlineExceeded);
        }
        call.attempts += 1;
        call.detail = None;
        let endpoint = call.pick();
        up.budget.record_attempt(started);
        let cfg = &up.config;
        let attempt = Attempt {
            up,
            endpoint,
            number: call.number(),
            want: call.want,
            started,
            by: (started + cfg.attempt_timeout).min(call.deadline.at()),
            grpc_deadline: call.deadline.caller_at().filter(|_| call.grpc),
            // Whether this attempt's request may have to be sent again after it is sent.
            keep: if call.retryable && call.attempts < call.limit() {
                cfg.retry.max_body
            } else {
                0
            },
        };
        let mut head = RequestHead {
            method: &call.method,
            uri: &call.uri,
            headers: &call.headers,
            fields: AttemptFields::default(),
            https: cfg.tls.is_some(),
            continue_wait: std::time::Duration::ZERO,
        };
        let (failure, response) = match attempt
            .run(&mut head, &mut call.body, &mut call.detail)
            .await
        {
            Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS && !call.upgrade => {
                // A switch nobody asked for: the connection speaks something else now,
                // and is closed with the response.
                drop(resp);
                let mut answer = call.local(StatusCode::BAD_GATEWAY, Outcome::NotRetryable);
                answer.detail = Some("the upstream switched protocols unasked (101)\n".into());
                return answer;
            }
            Ok(resp) => {
                let failure =
                    policy::classify_response(resp.status(), Fields::of(&resp), &cfg.retry.on);
                call.learn(failure, Some(&resp));
                if call.attempts > 1 && rejected::is_retry_rejected(&resp) {
                    return call.rejected(resp);
                }
                match failure {
                    None => return call.answer(resp, Outcome::Ok),
                    Some(f) => (f, Some(resp)),
                }
            }
            Err(AttemptError::Upstream(f)) => {
                call.learn(Some(f), None);
                (f, None)
            }
            Err(AttemptError::NotUpstream(why)) => return call.not_upstream(why),
        };
        if failure == Failure::Tls {
            call.tls_failed |= 1 << (endpoint % 64);
            if call.tls_failed.count_ones() as usize >= up.endpoints.len().min(64) {
                return call.give_up(Stop::NoOtherEndpoint, failure, None);
            }
        }
        match call.decide(failure, response.as_ref()).await {
            Ok(sleep) => {
                up.metrics.retried(failure.condition());
                call.previous = None;
                let kept = rejected::keep_while_sleeping(response, failure, sleep).await;
                call.previous = Some(kept);
                call.avoid = Some(endpoint);
            }
            Err(stop) => return call.give_up(stop, failure, response),
        }
    }
}

impl<'a, A: AppBody> Call<'a, A> {
    fn new(up: &'a Upstream<A>, ex: Exchange<A>) -> Self {
        let retry = &up.config.retry;
        // An upgrade changes the connection for good once it is answered: never sent
        // twice.
        let retryable = retry.max_attempts > 1
            && !ex.upgrade
            && (retry.method_allowed(&ex.method)
                || retry
                    .idempotency_header
                    .as_ref()
                    .is_some_and(|h| ex.headers.contains_key(h)));
        Call {
            up,
            want: if ex.upgrade {
                Want::Http1
            } else {
                want(&up.config, ex.version)
            },
            method: ex.method,
            uri: ex.uri,
            headers: ex.headers,
            deadline: ex.deadline,
            grpc: ex.grpc,
            upgrade: ex.upgrade,
            retryable,
            body: BodySource::new(ex.body),
            attempts: 0,
            avoid: None,
            tls_failed: 0,
            detail: None,
            rng: None,
            app_retry: ex.app_retry,
            previous: None,
        }
    }

    /// The number of the attempt in flight as sent upstream: an app's own retry is
    /// already the second.
    fn number(&self) -> u32 {
        self.attempts + u32::from(self.app_retry)
    }

    /// The attempts this request may make: one for an app's own retry.
    fn limit(&self) -> u32 {
        if self.app_retry {
            1
        } else {
            self.up.config.retry.max_attempts
        }
    }

    /// Tells what the attempt just ended showed to the parts that learn from it.
    fn learn(&self, failure: Option<Failure>, resp: Option<&Response<UpstreamBody>>) {
        let seen = Seen {
            number: self.number(),
            failure,
            response: resp.map(|r| (r.status(), Fields::of(r))),
        };
        learn::attempt_done(self.up, &seen, Instant::now());
    }

    /// The callee refused this retry: no further attempt, and the app gets the failure
    /// the retry retried, with outcome `retry-rejected`.
    fn rejected(&mut self, refusal: Response<UpstreamBody>) -> Answer {
        let Some(previous) = self.previous.take() else {
            return self.answer(refusal, Outcome::Ok);
        };
        discard(refusal);
        self.up.metrics.denied(Denied::UpstreamRejected);
        let failure = previous.failure();
        let mut answer = match previous {
            Previous::Response(resp, _) => self.answer(*resp, Outcome::RetryRejected),
            Previous::Failure(f) => self.local(Previous::local_status(f), Outcome::RetryRejected),
        };
        answer.outcome = Outcome::RetryRejected;
        answer.owned_elsewhere = false;
        answer.failure = Some(failure);
        answer
    }

    /// The endpoint for the next attempt: round-robin, away from the one that just
    /// failed and from any whose TLS failed for this request.
    fn pick(&self) -> usize {
        let endpoints = &self.up.endpoints;
        let mut i = endpoints.pick(self.avoid);
        for _ in 0..endpoints.len() {
            if self.tls_failed & (1 << (i % 64)) == 0 {
                break;
            }
            i = endpoints.pick(self.avoid);
        }
        i
    }

    /// Whether the failure of the last attempt is retried: `Ok(sleep)` with the budget
    /// already spent, or why not.
    async fn decide(
        &mut self,
        failure: Failure,
        response: Option<&Response<UpstreamBody>>,
    ) -> Result<Duration, Stop> {
        let retry = &self.up.config.retry;
        // The response came while the app's body was still arriving (an upstream that
        // refuses a call without reading it): give the rest a moment to arrive (the
        // backoff before the retry, at least `BODY_GRACE`), so it can be replayed.
        if self.body.recorded()
            && failure.maybe_sent()
            && self.retryable
            && self.attempts < self.limit()
        {
            let grace = if self.body.started() {
                BODY_GRACE
            } else {
                EXPECT_GRACE
            };
            let wait = retry
                .backoff
                .cap(self.attempts - 1)
                .max(grace)
                .min(self.deadline.remaining(Instant::now()) / 2);
            self.body.finish_within(wait).await;
        }
        let now = Instant::now();
        if failure == Failure::Timeout && self.deadline.expired(now) {
            return Err(Stop::Deadline);
        }
        let policy = Policy {
            retry,
            backoff: &Backoff::from(&retry.backoff),
            budget: &self.up.budget,
            median: self.up.median.get(),
        };
        let situation = Situation {
            failure,
            response: response.map(Fields::of),
            // An app's own retry has used every attempt: it is not retried again.
            attempts: self.attempts + retry.max_attempts.saturating_sub(self.limit()),
            request_retryable: self.retryable,
            deadline: self.deadline,
            now,
        };
        let rng = self.rng.get_or_insert_with(fastrand::Rng::new);
        policy.decide(&situation, &mut self.body, rng)
    }

    /// The upstream's response goes back: a success, or a failure that another tollgate
    /// already owned.
    fn answer(&self, resp: Response<UpstreamBody>, outcome: Outcome) -> Answer {
        let owned = owned_elsewhere(Fields::of(&resp));
        Answer {
            outcome: if owned {
                outcome_of(Fields::of(&resp))
            } else {
                outcome
            },
            reply: Reply::Upstream(resp),
            attempts: self.attempts,
            failure: None,
            detail: None,
            owned_elsewhere: owned,
            body_unread: self.body.unread(),
            body_untouched: !self.body.started(),
        }
    }

    /// No more attempts: the last failure goes back, the upstream's own response or
    /// tollgate's 502/504.
    fn give_up(
        &mut self,
        stop: Stop,
        failure: Failure,
        response: Option<Response<UpstreamBody>>,
    ) -> Answer {
        if let Some(d) = stop.denied() {
            self.up.metrics.denied(d);
        }
        let outcome = stop.outcome(failure);
        match response {
            Some(resp) if stop == Stop::Ownership => self.answer(resp, Outcome::Ok),
            Some(resp) => Answer {
                reply: Reply::Upstream(resp),
                attempts: self.attempts,
                outcome,
                failure: Some(failure),
                detail: None,
                owned_elsewhere: false,
                body_unread: self.body.unread(),
                body_untouched: !self.body.started(),
            },
            None => {
                let status = match failure {
                    Failure::Timeout => StatusCode::GATEWAY_TIMEOUT,
                    _ if outcome == Outcome::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                    _ => StatusCode::BAD_GATEWAY,
                };
                let mut answer = self.local(status, outcome);
                answer.failure = Some(failure);
                answer.detail = self.detail.take();
                answer
            }
        }
    }

    /// The attempt ended for a reason that was not the upstream's: nothing more is
    /// tried. A malformed body is the app's (400); a descriptor shortage is tollgate's
    /// own overload (503), and the attempt that never got a connection is not counted.
    fn not_upstream(&mut self, why: NotUpstream) -> Answer {
        match why {
            NotUpstream::AppBody => self.local(StatusCode::BAD_REQUEST, Outcome::NotRetryable),
            NotUpstream::NoDescriptors => {
                self.attempts -= 1;
                self.local(StatusCode::SERVICE_UNAVAILABLE, Outcome::Overloaded)
            }
        }
    }

    /// tollgate answers itself.
    fn local(&self, status: StatusCode, outcome: Outcome) -> Answer {
        Answer {
            reply: Reply::Local(status),
            attempts: self.attempts,
            outcome,
            failure: None,
            detail: None,
            owned_elsewhere: false,
            body_unread: self.body.unread(),
            body_untouched: !self.body.started(),
        }
    }
}

/// Drops a failed response that will be retried. A small complete body is read in the
/// background so its HTTP/1.1 connection can be reused: during an incident the same
/// upstream is asked again within milliseconds, and a fresh connection per failure
/// would add a handshake to every retry.
fn discard(resp: Response<UpstreamBody>) {
    let body = match resp.into_body() {
        crate::http::ByProtocol::Http1(b) => b,
        crate::http::ByProtocol::Http2(_) => return,
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
