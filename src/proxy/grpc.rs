//! tollgate's answers to gRPC calls, in gRPC's own words.
//!
//! A gRPC client reads a gRPC answer, not an HTTP status: to it a `502` is
//! UNAVAILABLE, which its own retry policy retries, behind tollgate's back. So every
//! answer tollgate makes itself to a gRPC call is a trailers-only gRPC answer (HTTP
//! 200, `grpc-status`, `grpc-message`) carrying `x-tollgate-outcome`,
//! `x-tollgate-attempts` and `grpc-retry-pushback-ms: -1` ("do not retry"), and an
//! upstream's own gRPC failure that tollgate gave up on gets the pushback added. The
//! status says why, by [`code`]; `tollgate_requests_total{code}` stays the HTTP status
//! (200), the `outcome` label tells.

use http::{HeaderMap, HeaderValue, StatusCode};

use crate::http::grpc::{Code, GRPC_PUSHBACK, trailers_only};
use crate::metrics::Outcome;
use crate::retry::headers::{ATTEMPTS_HEADER, OUTCOME_HEADER, count_value};
use crate::retry::policy::Failure;

/// `grpc-retry-pushback-ms: -1`: the client must not retry.
pub const NO_RETRY: HeaderValue = HeaderValue::from_static("-1");
/// The same, as a whole HTTP/1.1 head line.
pub const NO_RETRY_LINE: &str = "grpc-retry-pushback-ms: -1";

/// The gRPC status of an answer tollgate makes itself: by the reason it stopped, else
/// by the failure it gave up on, else by the HTTP status it would have answered.
pub fn code(outcome: Outcome, failure: Option<Failure>, status: StatusCode) -> Code {
    match outcome {
        Outcome::DeadlineExceeded => Code::DeadlineExceeded,
        Outcome::Overloaded | Outcome::Throttled | Outcome::RetryRejected => {
            Code::ResourceExhausted
        }
        Outcome::NoRoute => Code::Unimplemented,
        Outcome::UpstreamUnreachable => Code::Unavailable,
        _ => match failure {
            Some(Failure::Timeout) => Code::DeadlineExceeded,
            Some(
                Failure::ConnectFailure | Failure::Tls | Failure::Reset | Failure::Unavailable,
            ) => Code::Unavailable,
            Some(Failure::Status(s)) => Code::of_http(s),
            None => Code::of_http(status),
        },
    }
}

/// The head of tollgate's own answer to a gRPC call (its HTTP status is 200).
pub fn answer_head(code: Code, message: &str, outcome: Outcome, attempts: u32) -> HeaderMap {
    let mut h = trailers_only(code, message);
    h.insert(ATTEMPTS_HEADER, count_value(attempts));
    if outcome != Outcome::Ok {
        h.insert(OUTCOME_HEADER, outcome.header_value());
    }
    h.insert(GRPC_PUSHBACK, NO_RETRY);
    h
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
                Some(Failure::Timeout),
                Code::DeadlineExceeded,
            ),
            (Outcome::Overloaded, None, Code::ResourceExhausted),
            (Outcome::Throttled, None, Code::ResourceExhausted),
            (
                Outcome::RetryRejected,
                Some(Failure::Reset),
                Code::ResourceExhausted,
            ),
            (
                Outcome::AppRetry,
                Some(Failure::Status(StatusCode::SERVICE_UNAVAILABLE)),
                Code::Unavailable,
            ),
            (Outcome::NoRoute, None, Code::Unimplemented),
            (
                Outcome::UpstreamUnreachable,
                Some(Failure::Tls),
                Code::Unavailable,
            ),
            (
                Outcome::AttemptsExhausted,
                Some(Failure::Reset),
                Code::Unavailable,
            ),
            (
                Outcome::BudgetExhausted,
                Some(Failure::ConnectFailure),
                Code::Unavailable,
            ),
            (
                Outcome::NotRetryable,
                Some(Failure::Status(StatusCode::SERVICE_UNAVAILABLE)),
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
        let h = answer_head(Code::Unavailable, "down", Outcome::AttemptsExhausted, 3);
        assert_eq!(h["grpc-status"], "14");
        assert_eq!(h["grpc-retry-pushback-ms"], "-1");
        assert_eq!(h["x-tollgate-outcome"], "attempts-exhausted");
        assert_eq!(h["x-tollgate-attempts"], "3");
    }
}
