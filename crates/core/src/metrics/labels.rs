//! The label values tollgate's families are counted by: why a request ended as it did
//! (`outcome`, also the `x-tollgate-outcome` header), what became of an attempt
//! (`result`), why a retry was refused (`reason`), and where descriptors ran out (`at`).
//! Each is an enum with every value listed, so a family's series can all be made at
//! start and resolved once per upstream.

/// Why tollgate did not simply deliver the upstream's answer: the `x-tollgate-outcome`
/// header and the `outcome` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    AttemptsExhausted,
    BudgetExhausted,
    DeadlineExceeded,
    RetryAfterTooLong,
    NotRetryable,
    BodyTooLarge,
    Overloaded,
    NoRoute,
    UpstreamUnreachable,
    /// Rejected locally by the client-side throttle, before any upstream call.
    Throttled,
    /// A callee's inbound side refused the retry: the previous failure went back.
    RetryRejected,
    /// The app retried a failure tollgate had owned; refused without an upstream call.
    AppRetry,
    /// A request passed through would have come back into tollgate (`508`).
    Loop,
    /// A callee's inbound side could not reach its app (refused, reset or closed before
    /// its head): that endpoint's failure, not owned.
    AppUnreachable,
    /// A callee's inbound side gave up waiting for its app's head: that endpoint's
    /// timeout, not owned.
    AppTimeout,
    /// A callee's dedupe is still running the same keyed request: retried like a 503.
    InProgress,
    /// A callee's dedupe saw the key with another body: `422`, the app not called.
    KeyMismatch,
    /// A callee's dedupe: the keyed request may have run and its answer is gone (`500`).
    NotReplayable,
    /// A callee's dedupe store failed with `on_store_error = "closed"` (`503`).
    DedupeUnavailable,
    /// A callee's inbound side marked its app's failure: the app's own call for the
    /// request had been given up on, owned, by that pod's outbound side.
    DownstreamOwned,
}

impl Outcome {
    pub const ALL: [Outcome; 21] = [
        Outcome::Ok,
        Outcome::AttemptsExhausted,
        Outcome::BudgetExhausted,
        Outcome::DeadlineExceeded,
        Outcome::RetryAfterTooLong,
        Outcome::NotRetryable,
        Outcome::BodyTooLarge,
        Outcome::Overloaded,
        Outcome::NoRoute,
        Outcome::UpstreamUnreachable,
        Outcome::Throttled,
        Outcome::RetryRejected,
        Outcome::AppRetry,
        Outcome::Loop,
        Outcome::AppUnreachable,
        Outcome::AppTimeout,
        Outcome::InProgress,
        Outcome::KeyMismatch,
        Outcome::NotReplayable,
        Outcome::DedupeUnavailable,
        Outcome::DownstreamOwned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::AttemptsExhausted => "attempts-exhausted",
            Outcome::BudgetExhausted => "budget-exhausted",
            Outcome::DeadlineExceeded => "deadline-exceeded",
            Outcome::RetryAfterTooLong => "retry-after-too-long",
            Outcome::NotRetryable => "not-retryable",
            Outcome::BodyTooLarge => "body-too-large",
            Outcome::Overloaded => "overloaded",
            Outcome::NoRoute => "no-route",
            Outcome::UpstreamUnreachable => "upstream-unreachable",
            Outcome::Throttled => "throttled",
            Outcome::RetryRejected => "retry-rejected",
            Outcome::AppRetry => "app-retry",
            Outcome::Loop => "loop",
            Outcome::AppUnreachable => "app-unreachable",
            Outcome::AppTimeout => "app-timeout",
            Outcome::InProgress => "in-progress",
            Outcome::KeyMismatch => "key-mismatch",
            Outcome::NotReplayable => "not-replayable",
            Outcome::DedupeUnavailable => "dedupe-unavailable",
            Outcome::DownstreamOwned => "downstream-owned",
        }
    }

    pub fn header_value(self) -> http::HeaderValue {
        http::HeaderValue::from_static(self.as_str())
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// What showed a request to be the app's own retry: the `evidence` label of
/// `tollgate_app_retries_total` and the access log's `app_retry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// A retry count the app's HTTP client set (`grpc-previous-rpc-attempts`, ...).
    Marker,
    /// The same per-call identity (idempotency key, `amz-sdk-invocation-id`) as a
    /// failure tollgate answered in the last 2 s.
    Key,
    /// The same trace id or `x-request-id` as such a failure: counted only.
    Trace,
}

impl Evidence {
    pub const ALL: [Evidence; 3] = [Evidence::Marker, Evidence::Key, Evidence::Trace];

    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Marker => "marker",
            Evidence::Key => "key",
            Evidence::Trace => "trace",
        }
    }
}

/// The `result` label of `tollgate_attempts_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptResult {
    Informational,
    Success,
    Redirect,
    ClientError,
    ServerError,
    ConnectFailure,
    /// The TLS handshake failed, or the server refused the connection right after it.
    Tls,
    Reset,
    Timeout,
    Cancelled,
}

impl AttemptResult {
    pub(super) const ALL: [AttemptResult; 10] = [
        AttemptResult::Informational,
        AttemptResult::Success,
        AttemptResult::Redirect,
        AttemptResult::ClientError,
        AttemptResult::ServerError,
        AttemptResult::ConnectFailure,
        AttemptResult::Tls,
        AttemptResult::Reset,
        AttemptResult::Timeout,
        AttemptResult::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AttemptResult::Informational => "1xx",
            AttemptResult::Success => "2xx",
            AttemptResult::Redirect => "3xx",
            AttemptResult::ClientError => "4xx",
            AttemptResult::ServerError => "5xx",
            AttemptResult::ConnectFailure => "connect-failure",
            AttemptResult::Tls => "tls",
            AttemptResult::Reset => "reset",
            AttemptResult::Timeout => "timeout",
            AttemptResult::Cancelled => "cancelled",
        }
    }

    pub fn of_status(status: u16) -> Self {
        match status {
            100..=199 => AttemptResult::Informational,
            200..=299 => AttemptResult::Success,
            300..=399 => AttemptResult::Redirect,
            400..=499 => AttemptResult::ClientError,
            _ => AttemptResult::ServerError,
        }
    }
}

/// Where the process found itself out of file descriptors: the `at` label of
/// `tollgate_descriptors_exhausted_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shortage {
    Accept,
    Connect,
}

impl Shortage {
    pub fn as_str(self) -> &'static str {
        match self {
            Shortage::Accept => "accept",
            Shortage::Connect => "connect",
        }
    }
}

/// The `reason` label of `tollgate_retries_denied_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    Budget,
    Deadline,
    Attempts,
    RetryAfter,
    Method,
    BodyTooLarge,
    Ownership,
    /// The callee's inbound side answered the retry `retry-rejected`.
    UpstreamRejected,
}

impl Denied {
    pub(super) const ALL: [Denied; 8] = [
        Denied::Budget,
        Denied::Deadline,
        Denied::Attempts,
        Denied::RetryAfter,
        Denied::Method,
        Denied::BodyTooLarge,
        Denied::Ownership,
        Denied::UpstreamRejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Denied::Budget => "budget",
            Denied::Deadline => "deadline",
            Denied::Attempts => "attempts",
            Denied::RetryAfter => "retry-after",
            Denied::Method => "method",
            Denied::BodyTooLarge => "body-too-large",
            Denied::Ownership => "ownership",
            Denied::UpstreamRejected => "upstream-rejected",
        }
    }
}
