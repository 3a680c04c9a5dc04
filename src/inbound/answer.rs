//! The answers the inbound side makes itself, before or instead of the app's: a
//! refused retry, an overload, a deadline, an app that could not be reached. Each
//! carries `x-tollgate-outcome`. Most are owned, so a caller's tollgate does not retry
//! them; `app-unreachable` and `app-timeout` are not: the inbound side never retries,
//! so its app's failures are its endpoint's failures, for the caller to retry on
//! another endpoint. A gRPC call gets them in gRPC's words (a trailers-only answer,
//! HTTP 200, with `grpc-retry-pushback-ms: -1` on the owned ones), made as the outbound
//! side's answers to its app are ([`crate::answer`]).

use http::header::CONNECTION;
use http::{HeaderValue, Response, StatusCode};

use crate::answer::Local;
use crate::fault::Fault;
use crate::metrics::Outcome;
use crate::server::{RequestGuard, ResponseBody};

/// An answer the inbound side gives in the app's place, and why.
#[derive(Clone, Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub outcome: Outcome,
    pub text: &'static str,
    pub retry_after: Option<HeaderValue>,
}

pub static RETRY_REJECTED: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::RetryRejected,
    text: "the app's retry budget for all its callers is spent: this retry was not sent\n",
    retry_after: None,
};

pub static OVERLOADED: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::Overloaded,
    text: "the app is at its concurrency limit\n",
    retry_after: Some(HeaderValue::from_static("1")),
};

pub static EXPIRED: Refusal = Refusal {
    status: StatusCode::GATEWAY_TIMEOUT,
    outcome: Outcome::DeadlineExceeded,
    text: "the deadline had expired on arrival\n",
    retry_after: None,
};

pub static TIMED_OUT: Refusal = Refusal {
    status: StatusCode::GATEWAY_TIMEOUT,
    outcome: Outcome::AppTimeout,
    text: "no response from the app in time\n",
    retry_after: None,
};

pub static UNREACHABLE: Refusal = Refusal {
    status: StatusCode::BAD_GATEWAY,
    outcome: Outcome::AppUnreachable,
    text: "the app could not be reached\n",
    retry_after: None,
};

/// The app took the request and broke the connection before answering.
pub static RESET: Refusal = Refusal {
    status: StatusCode::BAD_GATEWAY,
    outcome: Outcome::AppUnreachable,
    text: "the app closed the connection without an answer\n",
    retry_after: None,
};

pub static NO_DESCRIPTORS: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::Overloaded,
    text: "tollgate is out of file descriptors; try again shortly\n",
    retry_after: Some(HeaderValue::from_static("1")),
};

/// The answer for a [`Fault`] of the exchange with the app: the fault's own status
/// ([`Fault::status`]) and gRPC code, with the app's outcome (`app-timeout`,
/// `app-unreachable`: its endpoint's failures, for the caller to retry elsewhere), or
/// `overloaded` for a descriptor shortage of this process. The exchange with the app
/// meets no other fault (a caller's body that breaks breaks the exchange: a reset);
/// any other is answered as the reset it would be.
pub fn refusal(fault: Fault) -> &'static Refusal {
    match fault {
        Fault::Timeout => &TIMED_OUT,
        Fault::ConnectFailure | Fault::Tls => &UNREACHABLE,
        Fault::NoDescriptors => &NO_DESCRIPTORS,
        Fault::Reset
        | Fault::HeadTooLarge
        | Fault::Status(_)
        | Fault::Unavailable
        | Fault::CallerBody => &RESET,
    }
}

/// A duplicate of a keyed request still running when its deadline came (the draft's
/// answer).
pub static IN_PROGRESS: Refusal = Refusal {
    status: StatusCode::CONFLICT,
    outcome: Outcome::InProgress,
    text: "a request with this idempotency key is still running: retry later\n",
    retry_after: Some(HeaderValue::from_static("1")),
};

pub static KEY_MISMATCH: Refusal = Refusal {
    status: StatusCode::UNPROCESSABLE_ENTITY,
    outcome: Outcome::KeyMismatch,
    text: "this idempotency key was used for another request body\n",
    retry_after: None,
};

pub static NOT_REPLAYABLE: Refusal = Refusal {
    status: StatusCode::INTERNAL_SERVER_ERROR,
    outcome: Outcome::NotReplayable,
    text: "the request with this idempotency key may have run, and its answer was not kept\n",
    retry_after: None,
};

pub static DEDUPE_UNAVAILABLE: Refusal = Refusal {
    status: StatusCode::SERVICE_UNAVAILABLE,
    outcome: Outcome::DedupeUnavailable,
    text: "the dedupe store is unavailable: a keyed request cannot be made safe now\n",
    retry_after: Some(HeaderValue::from_static("1")),
};

pub static CONNECT: Refusal = Refusal {
    status: StatusCode::METHOD_NOT_ALLOWED,
    outcome: Outcome::NotRetryable,
    text: "CONNECT is not supported\n",
    retry_after: None,
};

impl Refusal {
    /// The HTTP status the answer goes out with: 200 for a gRPC call.
    pub fn status(&self, grpc: bool) -> StatusCode {
        self.local().status(grpc)
    }

    fn local(&self) -> Local<'static> {
        Local {
            status: self.status,
            outcome: self.outcome,
            attempts: None,
            failure: None,
            text: self.text,
            retry_after: self.retry_after.clone(),
        }
    }

    /// The answer ([`crate::answer`]). `close` adds `Connection: close` (an HTTP/1.x
    /// body was left unread).
    pub fn answer(&self, grpc: bool, close: bool, guard: RequestGuard) -> Response<ResponseBody> {
        let mut resp = self.local().answer(grpc, guard);
        // The app's failure is this endpoint's: a caller behind a Service's virtual IP
        // that keeps this connection comes back to the same pod; on a new one,
        // kube-proxy picks again.
        let about_the_app = matches!(self.outcome, Outcome::AppUnreachable | Outcome::AppTimeout);
        if close || about_the_app {
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_of_the_app_is_answered_with_its_own_status_and_code() {
        for fault in [
            Fault::ConnectFailure,
            Fault::Timeout,
            Fault::Reset,
            Fault::NoDescriptors,
        ] {
            let r = refusal(fault);
            assert_eq!(r.status, fault.status(), "{fault:?}");
            let code = crate::answer::code(r.outcome, None, r.status);
            assert_eq!(code, fault.grpc_code(), "{fault:?}");
        }
        assert_eq!(refusal(Fault::Timeout).outcome, Outcome::AppTimeout);
        assert_eq!(refusal(Fault::Reset).outcome, Outcome::AppUnreachable);
        assert_eq!(refusal(Fault::NoDescriptors).outcome, Outcome::Overloaded);
    }
}
