//! Why a request (or one attempt of it) got no answer it can use: one type for both
//! sides, saying where it happened and whose it is, and the one place each of its
//! meanings is written down.
//!
//! A [`Fault`] is made where a failure is seen (an exchange that broke, in
//! `upstream::exchange`; a response head `retry.on` lists, in `retry::decide::policy`)
//! and read everywhere after: the retry policy asks whether `retry.on` lists it and
//! whether the request may have run, the attempt records its metric label and the
//! endpoint's health, a traced attempt its `error.type`, and tollgate's own answer its
//! status and gRPC code (the inbound side's refusal for it is
//! `inbound::answer::refusal`). Why retrying stopped is not a fault but a decision
//! (`retry::decide::policy::Stop`): it takes the fault it gave up on.
//!
//! Whose a fault is decides what it may do: a peer's (the upstream's, or on the inbound
//! side the app's) may be retried and is held against its endpoint; the caller's own
//! (its body broke as it was sent) and this process's (out of file descriptors) are
//! neither, and end the request at once.
//!
//! Small and `Copy` (four bytes): it is made and moved on the request path, and a
//! request keeps up to nine of them (the conditions of its retries).

use http::StatusCode;

use crate::http::grpc::Code;
use crate::metrics::{AttemptResult, Outcome};

/// Why an attempt ended without an answer it can use, by where it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// No connection could be made: the request was never sent.
    #[error("no connection could be made")]
    ConnectFailure,
    /// The TLS handshake failed, or the server refused the connection right after it
    /// (a client certificate it does not accept): the request was never served. Retried
    /// as a connect failure, but never on the endpoint that failed.
    #[error("the TLS handshake failed")]
    Tls,
    /// The connection broke after the request may have been sent.
    #[error("the connection broke before a response")]
    Reset,
    /// The response head was larger than tollgate takes (64 KiB): the answer cannot be
    /// passed on, and the same request would get the same answer. The peer's, never
    /// retried (no `retry.on` word lists it).
    #[error("the response head was too large")]
    HeadTooLarge,
    /// No response head within the time the request had.
    #[error("no response in time")]
    Timeout,
    /// A response with a status `retry.on` lists.
    #[error("a response with status {0}")]
    Status(StatusCode),
    /// gRPC UNAVAILABLE in a trailers-only response.
    #[error("gRPC UNAVAILABLE")]
    Unavailable,
    /// The caller's own body broke (malformed, or its connection failed) as it was
    /// sent: the app's, on the outbound side.
    #[error("the request body is malformed or broke off")]
    CallerBody,
    /// This process was out of file descriptors when it needed a connection.
    #[error("out of file descriptors")]
    NoDescriptors,
}

/// Whose doing a [`Fault`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whose {
    /// The endpoint's: the upstream, or on the inbound side the app. Retried as
    /// `retry.on` says, and held against the endpoint.
    Peer,
    /// The caller's: nothing is gained by sending its request again.
    Caller,
    /// This process's own: nobody else is to blame.
    Ours,
}

impl Fault {
    /// Whose doing it is.
    pub fn whose(&self) -> Whose {
        match self {
            Fault::CallerBody => Whose::Caller,
            Fault::NoDescriptors => Whose::Ours,
            _ => Whose::Peer,
        }
    }

    /// The endpoint's doing: the only faults a retry or the endpoint's health hears of.
    pub fn is_peers(&self) -> bool {
        self.whose() == Whose::Peer
    }

    /// The `retry.on` word, also the `reason` label of `tollgate_retries_total` and a
    /// traced retry's `tollgate.retry.reason` (whether `retry.on` lists it is the
    /// policy's to say). A fault that is not the peer's is never retried: its word is
    /// one no `retry.on` has.
    pub fn condition(&self) -> &str {
        match self {
            Fault::ConnectFailure | Fault::Tls => "connect-failure",
            Fault::Reset => "reset",
            Fault::HeadTooLarge => "head-too-large",
            Fault::Timeout => "timeout",
            Fault::Unavailable => "unavailable",
            Fault::Status(s) => s.as_str(),
            Fault::CallerBody => "caller-body",
            Fault::NoDescriptors => "no-descriptors",
        }
    }

    /// Whether the request may have reached the peer (and run there).
    pub fn maybe_sent(&self) -> bool {
        !matches!(
            self,
            Fault::ConnectFailure | Fault::Tls | Fault::NoDescriptors
        )
    }

    /// Whether the peer showed or said that the request did not run: it never got it,
    /// or answered a status that says so (`425`, `429`, `503`).
    pub fn did_not_run(&self) -> bool {
        match self {
            Fault::Status(s) => matches!(s.as_u16(), 425 | 429 | 503),
            _ => !self.maybe_sent(),
        }
    }

    /// No connection to the peer carried the request: connect and TLS failures.
    pub fn unreachable(&self) -> bool {
        matches!(self, Fault::ConnectFailure | Fault::Tls)
    }

    /// The `result` label of `tollgate_attempts_total` for an attempt that ended so;
    /// `None`: not counted as an attempt (it never got a connection). A fault read from
    /// an answer counts as the answer's status: a listed status as itself, gRPC
    /// UNAVAILABLE as the `200` of a trailers-only answer.
    pub fn attempt_result(&self) -> Option<AttemptResult> {
        Some(match self {
            Fault::ConnectFailure => AttemptResult::ConnectFailure,
            Fault::Tls => AttemptResult::Tls,
            Fault::Reset | Fault::HeadTooLarge => AttemptResult::Reset,
            Fault::Timeout => AttemptResult::Timeout,
            Fault::Status(s) => AttemptResult::of_status(s.as_u16()),
            Fault::Unavailable => AttemptResult::Success,
            Fault::CallerBody => AttemptResult::Cancelled,
            Fault::NoDescriptors => return None,
        })
    }

    /// A traced attempt's `error.type` when it ended so: the attempt's result, with a
    /// descriptor shortage shown as the connect failure it was to the span.
    pub fn error_type(&self) -> &str {
        match self {
            Fault::ConnectFailure | Fault::NoDescriptors => "connect-failure",
            Fault::Tls => "tls",
            Fault::Reset => "reset",
            Fault::HeadTooLarge => "head-too-large",
            Fault::Timeout => "timeout",
            Fault::Status(s) => s.as_str(),
            Fault::Unavailable => "unavailable",
            Fault::CallerBody => "cancelled",
        }
    }

    /// The status of the answer tollgate makes itself for it: `504` for no response in
    /// time, `400` for the caller's broken body, `503` for a descriptor shortage (this
    /// process overloaded), else `502`.
    pub fn status(&self) -> StatusCode {
        match self {
            Fault::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Fault::CallerBody => StatusCode::BAD_REQUEST,
            Fault::NoDescriptors => StatusCode::SERVICE_UNAVAILABLE,
            Fault::ConnectFailure
            | Fault::Tls
            | Fault::Reset
            | Fault::HeadTooLarge
            | Fault::Status(_)
            | Fault::Unavailable => StatusCode::BAD_GATEWAY,
        }
    }

    /// The outcome of a request this fault ends by itself: one not the peer's, for which
    /// there is nothing to decide (`not-retryable` for the caller's body, `overloaded`
    /// for a descriptor shortage). A peer's fault ends a request by a decision, which
    /// names the outcome (`Stop::outcome`; the inbound side's refusal): `None`.
    pub fn outcome(&self) -> Option<Outcome> {
        match self.whose() {
            Whose::Peer => None,
            Whose::Caller => Some(Outcome::NotRetryable),
            Whose::Ours => Some(Outcome::Overloaded),
        }
    }

    /// The gRPC status of tollgate's own answer for it, when the reason it stopped does
    /// not say more (`crate::answer::code`).
    pub fn grpc_code(&self) -> Code {
        match self {
            Fault::Timeout => Code::DeadlineExceeded,
            Fault::ConnectFailure | Fault::Tls | Fault::Reset | Fault::Unavailable => {
                Code::Unavailable
            }
            Fault::HeadTooLarge => Code::Internal,
            Fault::Status(s) => Code::of_http(*s),
            Fault::CallerBody => Code::Internal,
            Fault::NoDescriptors => Code::ResourceExhausted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Fault; 8] = [
        Fault::ConnectFailure,
        Fault::Tls,
        Fault::Reset,
        Fault::Timeout,
        Fault::Status(StatusCode::SERVICE_UNAVAILABLE),
        Fault::Unavailable,
        Fault::CallerBody,
        Fault::NoDescriptors,
    ];

    #[test]
    fn it_is_small_enough_to_move_as_a_word() {
        assert!(size_of::<Fault>() <= 4);
        assert!(size_of::<Option<Fault>>() <= 4);
    }

    #[test]
    fn only_a_peers_fault_leaves_its_outcome_to_a_decision() {
        for f in ALL {
            assert_eq!(f.outcome().is_none(), f.is_peers(), "{f:?}");
        }
        assert_eq!(Fault::CallerBody.whose(), Whose::Caller);
        assert_eq!(Fault::NoDescriptors.whose(), Whose::Ours);
    }

    #[test]
    fn a_request_never_sent_did_not_run() {
        for f in ALL {
            assert_eq!(
                f.maybe_sent(),
                !matches!(f, Fault::ConnectFailure | Fault::Tls | Fault::NoDescriptors),
                "{f:?}"
            );
            if !f.maybe_sent() {
                assert!(f.did_not_run(), "{f:?}");
            }
        }
        assert!(Fault::Status(StatusCode::TOO_MANY_REQUESTS).did_not_run());
        assert!(!Fault::Status(StatusCode::BAD_GATEWAY).did_not_run());
        assert!(!Fault::Reset.did_not_run());
    }

    #[test]
    fn each_fault_has_its_words_and_its_answer() {
        for (f, condition, result, error, status, code) in [
            (
                Fault::ConnectFailure,
                "connect-failure",
                Some(AttemptResult::ConnectFailure),
                "connect-failure",
                502,
                Code::Unavailable,
            ),
            (
                Fault::Tls,
                "connect-failure",
                Some(AttemptResult::Tls),
                "tls",
                502,
                Code::Unavailable,
            ),
            (
                Fault::Reset,
                "reset",
                Some(AttemptResult::Reset),
                "reset",
                502,
                Code::Unavailable,
            ),
            (
                Fault::Timeout,
                "timeout",
                Some(AttemptResult::Timeout),
                "timeout",
                504,
                Code::DeadlineExceeded,
            ),
            (
                Fault::Status(StatusCode::SERVICE_UNAVAILABLE),
                "503",
                Some(AttemptResult::ServerError),
                "503",
                502,
                Code::Unavailable,
            ),
            (
                Fault::CallerBody,
                "caller-body",
                Some(AttemptResult::Cancelled),
                "cancelled",
                400,
                Code::Internal,
            ),
            (
                Fault::NoDescriptors,
                "no-descriptors",
                None,
                "connect-failure",
                503,
                Code::ResourceExhausted,
            ),
        ] {
            assert_eq!(f.condition(), condition, "{f:?}");
            assert_eq!(f.attempt_result(), result, "{f:?}");
            assert_eq!(f.error_type(), error, "{f:?}");
            assert_eq!(f.status().as_u16(), status, "{f:?}");
            assert_eq!(f.grpc_code(), code, "{f:?}");
        }
    }
}
