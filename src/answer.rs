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
pub fn grpc_head(code: Code, message: &str, outcome: Outcome, attempts: Option<u32>) -> HeaderMap {
    let mut h = trailers_only(code, message);
    if let Some(n) = attempts {
        h.insert(ATTEMPTS_HEADER, count_value(n));
    }
    if outcome != Outcome::Ok {
        h.insert(OUTCOME_HEADER, outcome.header_value());
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
            *resp.headers_mut() = grpc_head(code, self.text, self.outcome, self.attempts);
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
            h.insert(OUTCOME_HEADER, self.outcome.header_value());
        }
        if let Some(ra) = self.retry_after {
            h.insert(RETRY_AFTER, ra);
        }
        resp
    }
}

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
        );
        assert_eq!(h["grpc-status"], "14");
        assert_eq!(h["grpc-retry-pushback-ms"], "-1");
        assert_eq!(h["x-tollgate-outcome"], "attempts-exhausted");
        assert_eq!(h["x-tollgate-attempts"], "3");
        let h = grpc_head(Code::Unavailable, "app down", Outcome::AppUnreachable, None);
        assert!(
            h.get("grpc-retry-pushback-ms").is_none(),
            "not owned: retried elsewhere"
        );
        assert!(h.get("x-tollgate-attempts").is_none());
        assert_eq!(
            code(Outcome::AppTimeout, None, StatusCode::GATEWAY_TIMEOUT),
            Code::DeadlineExceeded
        );
    }
}
