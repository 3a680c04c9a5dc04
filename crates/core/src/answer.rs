//! The answers tollgate makes itself, on either side: plain text with
//! `x-tollgate-outcome`, or for a gRPC call the same in gRPC's own words.
//!
//! A gRPC client reads a gRPC answer, not an HTTP status: to it a `502` is UNAVAILABLE,
//! which its own retry policy retries, behind tollgate's back. So every answer tollgate
//! makes itself to a gRPC call is a trailers-only gRPC answer (HTTP 200, `grpc-status`,
//! `grpc-message`) carrying `x-tollgate-outcome` (and, outbound, `x-tollgate-attempts`),
//! and `grpc-retry-pushback-ms: -1` ("do not retry") on every answer that is owned: all
//! but the inbound side's `app-unreachable` and `app-timeout`, which are its endpoint's
//! failures for the caller to retry elsewhere. An upstream's own gRPC failure that
//! tollgate gave up on gets the pushback added too. The status says why, by [`code`];
//! `tollgate_requests_total{code}` stays the HTTP status (200), the `outcome` label
//! tells.

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::contract::headers::{ATTEMPTS_HEADER, OUTCOME_HEADER, count_value};
use crate::contract::outcome::{Ran, outcome_value};
use crate::fault::Fault;
use crate::http::grpc::{Code, GRPC_PUSHBACK, trailers_only};
use crate::metrics::Outcome;
use crate::server::{RequestGuard, ResponseBody};

/// `grpc-retry-pushback-ms: -1`: the client must not retry.
pub const NO_RETRY: HeaderValue = HeaderValue::from_static("-1");
/// The same, as a whole HTTP/1.1 head line.
pub const NO_RETRY_LINE: &str = "grpc-retry-pushback-ms: -1";

/// Adds `Connection: close` when the app's HTTP/1.x body was left unread.
pub fn announce_close(resp: &mut Response<ResponseBody>) {
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

/// Told of each answer the outbound side gives its app that is not `ok`, with the
/// fields of the app's call: how the inbound side learns which of the app's calls were
/// given up on and owned (`owned_failures`), without either side naming the other.
pub trait OutboundAnswers: Send + Sync {
    fn outbound_answered(&self, outcome: Outcome, headers: &HeaderMap);
}

/// An answer tollgate makes itself, and why.
pub struct Local<'a> {
    pub status: StatusCode,
    pub outcome: Outcome,
    /// The attempts it took, said in `x-tollgate-attempts` (outbound); `None`: not said
    /// (the inbound side makes none).
    pub attempts: Option<u32>,
    /// The failure tollgate gave up on, if any.
    pub failure: Option<Fault>,
    pub text: &'a str,
    pub retry_after: Option<HeaderValue>,
    /// Whether the app ran the request (`; ran=no`, `; ran=maybe` after the outcome).
    pub ran: Option<Ran>,
}

/// The gRPC status of an answer tollgate makes itself: by the reason it stopped, else
/// by the fault it gave up on ([`Fault::grpc_code`]), else by the HTTP status it would
/// have answered.
pub fn code(outcome: Outcome, failure: Option<Fault>, status: StatusCode) -> Code {
    match outcome {
        Outcome::DeadlineExceeded | Outcome::AppTimeout => Code::DeadlineExceeded,
        Outcome::Overloaded | Outcome::Throttled | Outcome::RetryRejected => {
            Code::ResourceExhausted
        }
        Outcome::NoRoute => Code::Unimplemented,
        Outcome::UpstreamUnreachable | Outcome::AppUnreachable => Code::Unavailable,
        _ => failure.map_or_else(|| Code::of_http(status), |f| f.grpc_code()),
    }
}

/// Whether an answer with `outcome` is owned: no tollgate retries it. All are but an
/// inbound side's answers about its own app.
pub fn owned(outcome: Outcome) -> bool {
    !matches!(outcome, Outcome::AppUnreachable | Outcome::AppTimeout)
}

/// The head of tollgate's own answer to a gRPC call (its HTTP status is 200).
pub fn grpc_head(
    code: Code,
    message: &str,
    outcome: Outcome,
    attempts: Option<u32>,
    ran: Option<Ran>,
) -> HeaderMap {
    let mut h = trailers_only(code, message);
    if let Some(n) = attempts {
        h.insert(ATTEMPTS_HEADER, count_value(n));
    }
    if outcome != Outcome::Ok {
        h.insert(OUTCOME_HEADER, outcome_value(outcome, ran));
    }
    if owned(outcome) {
        h.insert(GRPC_PUSHBACK, NO_RETRY);
    }
    h
}

impl Local<'_> {
    /// The HTTP status the answer goes out with: 200 for a gRPC call.
    pub fn status(&self, grpc: bool) -> StatusCode {
        if grpc { StatusCode::OK } else { self.status }
    }

    /// The answer: plain text, or a trailers-only gRPC answer.
    pub fn answer(self, grpc: bool, guard: RequestGuard) -> Response<ResponseBody> {
        if grpc {
            let code = code(self.outcome, self.failure, self.status);
            let mut resp = Response::new(ResponseBody::full(Bytes::new(), Some(guard)));
            *resp.headers_mut() = grpc_head(code, self.text, self.outcome, self.attempts, self.ran);
            return resp;
        }
        let text = Bytes::copy_from_slice(self.text.as_bytes());
        let mut resp = Response::new(ResponseBody::full(text, Some(guard)));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(n) = self.attempts {
            h.insert(ATTEMPTS_HEADER, count_value(n));
        }
        if self.outcome != Outcome::Ok {
            h.insert(OUTCOME_HEADER, outcome_value(self.outcome, self.ran));
        }
        if let Some(ra) = self.retry_after {
            h.insert(RETRY_AFTER, ra);
        }
        resp
    }
}

/// An answer tollgate makes itself in the place of an upstream's or an app's, and why:
/// one of the named refusals below. Each side says how many attempts it took.
#[derive(Clone, Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub outcome: Outcome,
    pub text: &'static str,
    pub retry_after: Option<HeaderValue>,
    /// Whether the app ran the request, said after an inbound side's `app-unreachable`.
    pub ran: Option<Ran>,
}

impl Refusal {
    /// The answer, with the attempts it took said (`Some`, outbound) or not (`None`).
    pub fn local(&self, attempts: Option<u32>) -> Local<'static> {
        Local {
            status: self.status,
            outcome: self.outcome,
            attempts,
            failure: None,
            text: self.text,
            retry_after: self.retry_after.clone(),
            ran: self.ran,
        }
    }

    /// The HTTP status the answer goes out with: 200 for a gRPC call.
    pub fn status(&self, grpc: bool) -> StatusCode {
        if grpc { StatusCode::OK } else { self.status }
    }
}

// Either side's.

pub static EXPIRED: Refusal = Refusal {
    status: StatusCode::GATEWAY_TIMEOUT,
    outcome: Outcome::DeadlineExceeded,
    text: "the deadline had expired on arrival\n",
    retry_after: None,
    ran: None,
};

/// This process is out of file descriptors (inbound, and a pass-through's connect).
pub static NO_DESCRIPTORS: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::Overloaded,
    text: "tollgate is out of file descriptors; try again shortly\n",
    retry_after: Some(HeaderValue::from_static("1")),
    ran: None,
};

// The outbound side's, before any upstream call.

/// No upstream for the authority; a pass-through's request that names no usable
/// destination is answered with its status and outcome, in its own words.
pub static NO_ROUTE: Refusal = Refusal {
    status: StatusCode::NOT_FOUND,
    outcome: Outcome::NoRoute,
    text: "no upstream is configured for this authority\n",
    retry_after: None,
    ran: None,
};

/// Tunnels would carry anything anywhere; tollgate originates TLS itself.
pub static OUTBOUND_CONNECT: Refusal = Refusal {
    status: StatusCode::METHOD_NOT_ALLOWED,
    outcome: Outcome::NotRetryable,
    text: "CONNECT is not supported: send plain HTTP, tollgate speaks TLS upstream\n",
    retry_after: None,
    ran: None,
};

pub static UPSTREAM_OVERLOADED: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::Overloaded,
    text: "too many requests in flight to this upstream\n",
    retry_after: Some(HeaderValue::from_static("1")),
    ran: None,
};

pub static THROTTLED: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::Throttled,
    text: "throttled: the upstream has lately been rejecting most requests, so some are \
           not sent\n",
    retry_after: None,
    ran: None,
};

// The outbound side's when it passes a request through: one attempt, never retried.

/// The destination is one of tollgate's own listeners.
pub static PASS_LOOP: Refusal = Refusal {
    status: StatusCode::LOOP_DETECTED,
    outcome: Outcome::Loop,
    text: "the destination is tollgate's own listener: passing the request on would loop\n",
    retry_after: None,
    ran: None,
};

/// No connection to the destination (refused, no answer in time, name unknown).
pub static PASS_UNREACHABLE: Refusal = Refusal {
    status: StatusCode::BAD_GATEWAY,
    outcome: Outcome::UpstreamUnreachable,
    text: "the destination could not be reached\n",
    retry_after: None,
    ran: None,
};

/// The connection broke before the destination answered.
pub static PASS_RESET: Refusal = Refusal {
    status: StatusCode::BAD_GATEWAY,
    outcome: Outcome::AttemptsExhausted,
    text: "the destination broke the connection before it answered\n",
    retry_after: None,
    ran: None,
};

// The inbound side's, before or instead of the app's answer.

pub static RETRY_REJECTED: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::RetryRejected,
    text: "the app's retry budget for all its callers is spent: this retry was not sent\n",
    retry_after: None,
    ran: None,
};

pub static APP_OVERLOADED: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::Overloaded,
    text: "the app is at its concurrency limit\n",
    retry_after: Some(HeaderValue::from_static("1")),
    ran: None,
};

pub static APP_TIMED_OUT: Refusal = Refusal {
    status: StatusCode::GATEWAY_TIMEOUT,
    outcome: Outcome::AppTimeout,
    text: "no response from the app in time\n",
    retry_after: None,
    ran: None,
};

pub static APP_UNREACHABLE: Refusal = Refusal {
    status: StatusCode::BAD_GATEWAY,
    outcome: Outcome::AppUnreachable,
    text: "the app could not be reached\n",
    retry_after: None,
    ran: Some(Ran::No),
};

/// The app took the request and broke the connection before answering.
pub static APP_RESET: Refusal = Refusal {
    status: StatusCode::BAD_GATEWAY,
    outcome: Outcome::AppUnreachable,
    text: "the app closed the connection without an answer\n",
    retry_after: None,
    ran: Some(Ran::Maybe),
};

/// A duplicate of a keyed request still running when its deadline came (the draft's
/// answer).
pub static IN_PROGRESS: Refusal = Refusal {
    status: StatusCode::CONFLICT,
    outcome: Outcome::InProgress,
    text: "a request with this idempotency key is still running: retry later\n",
    retry_after: Some(HeaderValue::from_static("1")),
    ran: None,
};

pub static KEY_MISMATCH: Refusal = Refusal {
    status: StatusCode::UNPROCESSABLE_ENTITY,
    outcome: Outcome::KeyMismatch,
    text: "this idempotency key was used for another request body\n",
    retry_after: None,
    ran: None,
};

pub static NOT_REPLAYABLE: Refusal = Refusal {
    status: StatusCode::INTERNAL_SERVER_ERROR,
    outcome: Outcome::NotReplayable,
    text: "the request with this idempotency key may have run, and its answer was not kept\n",
    retry_after: None,
    ran: None,
};

pub static DEDUPE_UNAVAILABLE: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::DedupeUnavailable,
    text: "the dedupe store is unavailable: a keyed request cannot be made safe now\n",
    retry_after: Some(HeaderValue::from_static("1")),
    ran: None,
};

pub static INBOUND_CONNECT: Refusal = Refusal {
    status: StatusCode::METHOD_NOT_ALLOWED,
    outcome: Outcome::NotRetryable,
    text: "CONNECT is not supported\n",
    retry_after: None,
    ran: None,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_status() {
        let gw = StatusCode::BAD_GATEWAY;
        for (outcome, failure, want) in [
            (Outcome::DeadlineExceeded, None, Code::DeadlineExceeded),
            (
                Outcome::AttemptsExhausted,
                Some(Fault::Timeout),
                Code::DeadlineExceeded,
            ),
            (Outcome::Overloaded, None, Code::ResourceExhausted),
            (Outcome::Throttled, None, Code::ResourceExhausted),
            (
                Outcome::RetryRejected,
                Some(Fault::Reset),
                Code::ResourceExhausted,
            ),
            (
                Outcome::AppRetry,
                Some(Fault::Status(StatusCode::SERVICE_UNAVAILABLE)),
                Code::Unavailable,
            ),
            (Outcome::NoRoute, None, Code::Unimplemented),
            (
                Outcome::UpstreamUnreachable,
                Some(Fault::Tls),
                Code::Unavailable,
            ),
            (
                Outcome::AttemptsExhausted,
                Some(Fault::Reset),
                Code::Unavailable,
            ),
            (
                Outcome::BudgetExhausted,
                Some(Fault::ConnectFailure),
                Code::Unavailable,
            ),
            (
                Outcome::NotRetryable,
                Some(Fault::Status(StatusCode::SERVICE_UNAVAILABLE)),
                Code::Unavailable,
            ),
        ] {
            assert_eq!(code(outcome, failure, gw), want, "{outcome:?} {failure:?}");
        }
        assert_eq!(
            code(Outcome::Ok, None, StatusCode::BAD_REQUEST),
            Code::Internal,
            "a malformed request"
        );
        let h = grpc_head(
            Code::Unavailable,
            "down",
            Outcome::AttemptsExhausted,
            Some(3),
            None,
        );
        assert_eq!(h["grpc-status"], "14");
        assert_eq!(h["grpc-retry-pushback-ms"], "-1");
        assert_eq!(h["x-tollgate-outcome"], "attempts-exhausted");
        assert_eq!(h["x-tollgate-attempts"], "3");
        let h = grpc_head(
            Code::Unavailable,
            "app down",
            Outcome::AppUnreachable,
            None,
            Some(Ran::No),
        );
        assert!(
            h.get("grpc-retry-pushback-ms").is_none(),
            "not owned: retried elsewhere"
        );
        assert_eq!(h["x-tollgate-outcome"], "app-unreachable; ran=no");
        assert!(h.get("x-tollgate-attempts").is_none());
        assert_eq!(
            code(Outcome::AppTimeout, None, StatusCode::GATEWAY_TIMEOUT),
            Code::DeadlineExceeded
        );
    }
}
