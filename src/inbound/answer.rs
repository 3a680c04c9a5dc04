//! The answers the inbound side makes itself, before or instead of the app's: a
//! refused retry, an overload, a deadline, an app that could not be reached. Each
//! carries `x-tollgate-outcome`. Most are owned, so a caller's tollgate does not retry
//! them; `app-unreachable` and `app-timeout` are not: the inbound side never retries,
//! so its app's failures are its endpoint's failures, for the caller to retry on
//! another endpoint. A gRPC call gets them in gRPC's words (a trailers-only answer,
//! HTTP 200, with `grpc-retry-pushback-ms: -1` on the owned ones), as the outbound side
//! answers its app.

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use crate::http::grpc::{Code, GRPC_PUSHBACK, trailers_only};
use crate::metrics::Outcome;
use crate::retry::headers::OUTCOME_HEADER;
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

pub static CONNECT: Refusal = Refusal {
    status: StatusCode::METHOD_NOT_ALLOWED,
    outcome: Outcome::NotRetryable,
    text: "CONNECT is not supported\n",
    retry_after: None,
};

impl Refusal {
    /// The gRPC status of this answer.
    fn code(&self) -> Code {
        match self.outcome {
            Outcome::DeadlineExceeded | Outcome::AppTimeout => Code::DeadlineExceeded,
            Outcome::Overloaded | Outcome::RetryRejected => Code::ResourceExhausted,
            Outcome::AppUnreachable => Code::Unavailable,
            _ => Code::of_http(self.status),
        }
    }

    /// Whether a caller's tollgate takes the answer as owned (not retried by anyone):
    /// all but the app's own failures, which are the endpoint's.
    fn owned(&self) -> bool {
        !matches!(self.outcome, Outcome::AppUnreachable | Outcome::AppTimeout)
    }

    /// The HTTP status the answer goes out with: 200 for a gRPC call.
    pub fn status(&self, grpc: bool) -> StatusCode {
        if grpc { StatusCode::OK } else { self.status }
    }

    /// The answer: plain text, or a trailers-only gRPC answer. `close` adds
    /// `Connection: close` (an HTTP/1.x body was left unread).
    pub fn answer(&self, grpc: bool, close: bool, guard: RequestGuard) -> Response<ResponseBody> {
        let mut resp = if grpc {
            let mut resp = Response::new(ResponseBody::full(Bytes::new(), Some(guard)));
            *resp.headers_mut() = trailers_only(self.code(), self.text);
            if self.owned() {
                resp.headers_mut()
                    .insert(GRPC_PUSHBACK, HeaderValue::from_static("-1"));
            }
            resp
        } else {
            let text = Bytes::from_static(self.text.as_bytes());
            let mut resp = Response::new(ResponseBody::full(text, Some(guard)));
            *resp.status_mut() = self.status;
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            if let Some(ra) = &self.retry_after {
                resp.headers_mut().insert(RETRY_AFTER, ra.clone());
            }
            resp
        };
        let h = resp.headers_mut();
        h.insert(OUTCOME_HEADER, self.outcome.header_value());
        if close {
            h.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}
