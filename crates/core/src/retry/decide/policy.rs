//! What may be retried, and whether this failure will be: the decision made after every
//! failed attempt (its [`Fault`], or a response head read as one here), in one
//! function, so every refusal has exactly one reason ([`Stop`]).
//!
//! The order of the checks is the order of their cost and of their certainty:
//! ownership (another tollgate already decided), the failure kind, the request (method
//! or idempotency key), attempts left, a replayable body, the upstream's own pushback,
//! the deadline, and last the budget, because asking the budget spends it.

use std::time::{Duration, SystemTime};

use http::StatusCode;

use tokio::time::Instant;

use crate::config::{Ownership, RetryAfterMode, RetryConfig, RetryOn};
use crate::contract::outcome::Callee;
use crate::deadline::Deadline;
use crate::fault::Fault;
use crate::http::grpc::{GRPC_PUSHBACK, GRPC_STATUS};
use crate::http::response::Fields;
use crate::metrics::{Denied, Outcome};
use crate::retry::decide::backoff::Backoff;
use crate::retry::decide::budget::RetryBudget;
use crate::retry::decide::retry_after::{Pushback, parse_pushback_ms, parse_retry_after};

/// gRPC UNAVAILABLE.
const GRPC_UNAVAILABLE: &[u8] = b"14";

/// Classifies a response head, whose outcome (if any) says `callee`: `None` when it is
/// not a failure `retry.on` names.
///
/// A callee's inbound side speaks for its app: `app-unreachable` is that endpoint's
/// `reset` (the app refused, reset or closed: a retry is a retry, charged to the budget;
/// whether a keyed request may go again is its `ran=` parameter's, read by the loop) and
/// `app-timeout` its `timeout`. A
/// callee's `in-progress` is retried as a `503` would be: the request still runs there
/// and a retry only joins it.
#[inline]
pub fn classify_response(
    status: StatusCode,
    headers: Fields<'_>,
    callee: Callee,
    on: &RetryOn,
) -> Option<Fault> {
    match callee {
        Callee::AppUnreachable(_) => return on.reset.then_some(Fault::Reset),
        Callee::AppTimeout => return on.timeout.then_some(Fault::Timeout),
        Callee::InProgress => {
            let like = StatusCode::SERVICE_UNAVAILABLE;
            return on.status(like.as_u16()).then_some(Fault::Status(like));
        }
        Callee::Silent | Callee::Stray | Callee::Owned(_) => {}
    }
    if on.status(status.as_u16()) {
        return Some(Fault::Status(status));
    }
    if on.unavailable
        && headers
            .get(&GRPC_STATUS)
            .is_some_and(|v| v == GRPC_UNAVAILABLE)
    {
        return Some(Fault::Unavailable);
    }
    None
}

/// Whether `retry.on` lists `fault` (by its [`Fault::condition`] word): a fault that
/// is not the peer's never is.
fn listed(fault: Fault, on: &RetryOn) -> bool {
    match fault {
        Fault::ConnectFailure | Fault::Tls => on.connect_failure,
        Fault::Reset => on.reset,
        Fault::Timeout => on.timeout,
        Fault::Unavailable => on.unavailable,
        Fault::Status(s) => on.status(s.as_u16()),
        Fault::CallerBody | Fault::NoDescriptors | Fault::HeadTooLarge => false,
    }
}

/// Why a failure goes back to the app instead of being retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Another tollgate owned this failure: pass it back untouched.
    Ownership,
    /// The failure is not a condition `retry.on` lists.
    NotListed,
    Method,
    BodyTooLarge,
    Attempts,
    RetryAfter,
    Deadline,
    Budget,
    /// A TLS failure, and no endpoint left that has not failed one for this request.
    NoOtherEndpoint,
    /// The callee refused a retry of this request (`retry-rejected`) while this attempt
    /// still ran.
    Rejected,
}

impl Stop {
    /// The `tollgate_retries_denied_total` reason, when this is a refusal.
    pub fn denied(self) -> Option<Denied> {
        Some(match self {
            Stop::NotListed | Stop::NoOtherEndpoint => return None,
            Stop::Ownership => Denied::Ownership,
            Stop::Method => Denied::Method,
            Stop::BodyTooLarge => Denied::BodyTooLarge,
            Stop::Attempts => Denied::Attempts,
            Stop::RetryAfter => Denied::RetryAfter,
            Stop::Deadline => Denied::Deadline,
            Stop::Budget => Denied::Budget,
            Stop::Rejected => Denied::UpstreamRejected,
        })
    }

    /// [`Stop::outcome`], knowing whether any attempt of the request got a connection:
    /// `upstream-unreachable` only when none did (an earlier attempt may have run it).
    pub fn outcome_after(self, failure: Fault, connected: bool) -> Outcome {
        match self.outcome(failure) {
            Outcome::UpstreamUnreachable if connected => match self {
                Stop::NotListed => Outcome::NotRetryable,
                _ => Outcome::AttemptsExhausted,
            },
            o => o,
        }
    }

    /// The `x-tollgate-outcome` for giving up on `failure` for this reason.
    pub fn outcome(self, failure: Fault) -> Outcome {
        match self {
            Stop::Ownership => Outcome::Ok,
            Stop::NotListed | Stop::Attempts | Stop::NoOtherEndpoint if failure.unreachable() => {
                Outcome::UpstreamUnreachable
            }
            Stop::NoOtherEndpoint => Outcome::UpstreamUnreachable,
            Stop::NotListed | Stop::Method => Outcome::NotRetryable,
            Stop::Attempts => Outcome::AttemptsExhausted,
            Stop::BodyTooLarge => Outcome::BodyTooLarge,
            Stop::RetryAfter => Outcome::RetryAfterTooLong,
            Stop::Deadline => Outcome::DeadlineExceeded,
            Stop::Budget => Outcome::BudgetExhausted,
            Stop::Rejected => Outcome::RetryRejected,
        }
    }
}

/// Whether the request's body can be sent again. Asked only when everything before it
/// in the decision allows a retry: making the body ready for a replay reads what has
/// arrived of it.
pub trait Replayable {
    fn ready_for_retry(&mut self) -> Result<(), BodyState>;
}

/// Everything the decision reads about the request so far.
pub struct Situation<'a> {
    pub failure: Fault,
    /// The failed response's headers, when there was a response.
    pub response: Option<Fields<'a>>,
    /// The response carries another tollgate's verdict ([`Callee::owned`]).
    pub owned: bool,
    /// Attempts made, the failed one included.
    pub attempts: u32,
    /// Method listed or idempotency key present.
    pub request_retryable: bool,
    pub deadline: Deadline,
    pub now: Instant,
}

/// Why a request's body cannot be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyState {
    /// Larger than `max_body`.
    TooLarge,
    /// Its end had not arrived (or the app's upload failed) when the answer came.
    Incomplete,
}

/// The retry machinery one upstream decides with.
pub struct Policy<'a> {
    pub retry: &'a RetryConfig,
    pub backoff: Backoff,
    pub budget: &'a RetryBudget,
    pub median: Option<Duration>,
}

impl Policy<'_> {
    /// `Ok(sleep)`: retry after sleeping that long (the budget is already spent).
    pub fn decide(
        &self,
        s: &Situation<'_>,
        body: &mut impl Replayable,
        rng: &mut fastrand::Rng,
    ) -> Result<Duration, Stop> {
        if self.retry.ownership == Ownership::Honor && s.owned {
            return Err(Stop::Ownership);
        }
        self.may_send_again(s)?;
        if s.failure.maybe_sent() && body.ready_for_retry().is_err() {
            return Err(Stop::BodyTooLarge);
        }
        let left = s.deadline.remaining(s.now);
        let pushback = match (self.retry.retry_after, s.response) {
            (RetryAfterMode::Honor, Some(h)) => pushback(h),
            _ => None,
        };
        let wait_at_least = match pushback {
            None => Duration::ZERO,
            Some(Pushback::Never) => return Err(Stop::RetryAfter),
            Some(Pushback::After(d))
                if d > self.retry.max_retry_after || left.is_some_and(|l| d >= l) =>
            {
                return Err(Stop::RetryAfter);
            }
            Some(Pushback::After(d)) => d,
        };
        let jitter = self.backoff.draw(s.attempts - 1, rng);
        let mut sleep = wait_at_least + jitter;
        if let Some(left) = left {
            if sleep >= left && wait_at_least < left {
                // The upstream's wait fits but not with jitter on top: keep the wait.
                sleep = wait_at_least;
            }
            if sleep >= left {
                return Err(Stop::Deadline);
            }
        }
        self.worth_starting(s, sleep)?;
        if !self.budget.try_retry(s.now) {
            return Err(Stop::Budget);
        }
        Ok(sleep)
    }

    /// Whether a retry may start beside an attempt that has run past its attempt
    /// timeout (`s.failure` is [`Fault::Timeout`], and the attempt goes on): what
    /// [`Policy::decide`] asks but the body and the wait, since the retry starts at once
    /// with a copy of a body already whole, and its first attempt still may answer.
    /// `Ok` has taken the retry from the budget.
    pub fn decide_beside(&self, s: &Situation<'_>) -> Result<(), Stop> {
        self.may_send_again(s)?;
        self.worth_starting(s, Duration::ZERO)?;
        if !self.budget.try_retry(s.now) {
            return Err(Stop::Budget);
        }
        Ok(())
    }

    /// The failure is one `retry.on` lists, an attempt is left, and the request may be
    /// sent again. Attempts first: with none left (`max_attempts = 1` too) the answer is
    /// `attempts-exhausted`, whatever the method.
    fn may_send_again(&self, s: &Situation<'_>) -> Result<(), Stop> {
        if !listed(s.failure, &self.retry.on) {
            return Err(Stop::NotListed);
        }
        if s.attempts >= self.retry.max_attempts {
            return Err(Stop::Attempts);
        }
        if s.failure.maybe_sent() && !s.request_retryable {
            return Err(Stop::Method);
        }
        Ok(())
    }

    /// An attempt that cannot finish in the time left after `sleep` only adds load.
    fn worth_starting(&self, s: &Situation<'_>, sleep: Duration) -> Result<(), Stop> {
        let Some(left) = s.deadline.remaining(s.now) else {
            return Ok(());
        };
        if sleep >= left {
            return Err(Stop::Deadline);
        }
        if let Some(typical) = self.median
            && left - sleep < typical
        {
            return Err(Stop::Deadline);
        }
        Ok(())
    }
}

/// The wait a response asks for: `grpc-retry-pushback-ms` first (it is the more
/// specific), else `Retry-After`. An unreadable `Retry-After` is ignored.
pub fn pushback(headers: Fields<'_>) -> Option<Pushback> {
    if let Some(v) = headers.get(&GRPC_PUSHBACK) {
        return Some(parse_pushback_ms(v));
    }
    let v = headers.get(&http::header::RETRY_AFTER)?;
    parse_retry_after(v, SystemTime::now()).map(Pushback::After)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BudgetConfig;
    use crate::contract::headers::OUTCOME_HEADER;
    use http::{HeaderMap, HeaderValue};

    /// A body whose readiness is given.
    impl Replayable for Result<(), BodyState> {
        fn ready_for_retry(&mut self) -> Result<(), BodyState> {
            *self
        }
    }

    struct Fixture {
        retry: RetryConfig,
        backoff: Backoff,
        budget: RetryBudget,
        now: Instant,
    }

    impl Fixture {
        fn new() -> Self {
            let now = Instant::now();
            Fixture {
                retry: RetryConfig::default(),
                backoff: Backoff::default(),
                budget: RetryBudget::new(
                    Some(&BudgetConfig {
                        ratio: 0.1,
                        min_per_sec: 10.0,
                        window: Duration::from_secs(10),
                        max_ratio: None,
                    }),
                    now,
                ),
                now,
            }
        }

        fn decide(
            &self,
            s: &mut Situation<'_>,
            median: Option<Duration>,
        ) -> Result<Duration, Stop> {
            self.decide_with_body(s, median, Ok(()))
        }

        fn decide_with_body(
            &self,
            s: &mut Situation<'_>,
            median: Option<Duration>,
            mut body: Result<(), BodyState>,
        ) -> Result<Duration, Stop> {
            let p = Policy {
                retry: &self.retry,
                backoff: Backoff::from(&self.retry.backoff),
                budget: &self.budget,
                median,
            };
            p.decide(s, &mut body, &mut fastrand::Rng::with_seed(1))
        }

        fn policy(&self, median: Option<Duration>) -> Policy<'_> {
            Policy {
                retry: &self.retry,
                backoff: self.backoff,
                budget: &self.budget,
                median,
            }
        }

        fn situation<'a>(&self, failure: Fault, response: Option<Fields<'a>>) -> Situation<'a> {
            let status = match failure {
                Fault::Status(s) => s,
                _ => StatusCode::OK,
            };
            Situation {
                failure,
                response,
                owned: response.is_some_and(|f| Callee::of(status, f).owned()),
                attempts: 1,
                request_retryable: true,
                deadline: Deadline::new(self.now, None, Some(Duration::from_secs(2))),
                now: self.now,
            }
        }
    }

    fn s503() -> Fault {
        Fault::Status(StatusCode::SERVICE_UNAVAILABLE)
    }

    #[test]
    fn a_listed_failure_is_retried_after_a_jittered_sleep() {
        let f = Fixture::new();
        let sleep = f.decide(&mut f.situation(s503(), None), None).unwrap();
        assert!(sleep <= f.retry.backoff.cap(0));
    }

    #[test]
    fn every_refusal_has_its_reason() {
        let f = Fixture::new();
        let mut owned = HeaderMap::new();
        owned.insert(OUTCOME_HEADER, HeaderValue::from_static("budget-exhausted"));
        assert_eq!(
            f.decide(&mut f.situation(s503(), Some((&owned).into())), None),
            Err(Stop::Ownership)
        );

        let f500 = Fault::Status(StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            f.decide(&mut f.situation(f500, None), None),
            Err(Stop::NotListed)
        );

        let mut s = f.situation(s503(), None);
        s.request_retryable = false;
        assert_eq!(f.decide(&mut s, None), Err(Stop::Method));

        let mut s = f.situation(Fault::ConnectFailure, None);
        s.request_retryable = false;
        assert!(
            f.decide(&mut s, None).is_ok(),
            "a request never sent may go to another endpoint"
        );

        let mut s = f.situation(s503(), None);
        s.attempts = 3;
        assert_eq!(f.decide(&mut s, None), Err(Stop::Attempts));

        let mut s = f.situation(Fault::Reset, None);
        assert_eq!(
            f.decide_with_body(&mut s, None, Err(BodyState::TooLarge)),
            Err(Stop::BodyTooLarge)
        );

        let mut s = f.situation(Fault::Timeout, None);
        assert_eq!(
            f.decide(&mut s, Some(Duration::from_secs(5))),
            Err(Stop::Deadline),
            "an attempt that typically takes longer than the time left is not started"
        );
    }

    #[test]
    fn retry_after_is_waited_for_when_it_fits() {
        let f = Fixture::new();
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        let sleep = f
            .decide(&mut f.situation(s503(), Some((&h).into())), None)
            .unwrap();
        assert!(sleep >= Duration::from_secs(1) && sleep < Duration::from_secs(2));

        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("30"));
        assert_eq!(
            f.decide(&mut f.situation(s503(), Some((&h).into())), None),
            Err(Stop::RetryAfter)
        );

        // Fits max_retry_after (5 s) but not the deadline (2 s).
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(
            f.decide(&mut f.situation(s503(), Some((&h).into())), None),
            Err(Stop::RetryAfter)
        );
    }

    #[test]
    fn grpc_pushback_negative_means_never() {
        let f = Fixture::new();
        let mut h = HeaderMap::new();
        h.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        h.insert(GRPC_PUSHBACK, HeaderValue::from_static("-1"));
        assert_eq!(
            f.decide(
                &mut f.situation(Fault::Unavailable, Some((&h).into())),
                None
            ),
            Err(Stop::RetryAfter)
        );
        h.insert(GRPC_PUSHBACK, HeaderValue::from_static("100"));
        let sleep = f
            .decide(
                &mut f.situation(Fault::Unavailable, Some((&h).into())),
                None,
            )
            .unwrap();
        assert!(sleep >= Duration::from_millis(100));
    }

    #[test]
    fn ignoring_retry_after_uses_the_backoff_alone() {
        let mut f = Fixture::new();
        f.retry.retry_after = RetryAfterMode::Ignore;
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("30"));
        assert!(
            f.decide(&mut f.situation(s503(), Some((&h).into())), None)
                .is_ok()
        );
    }

    #[test]
    fn the_budget_is_asked_last_and_refuses_when_spent() {
        let f = Fixture::new();
        // The floor allows 10 * 10 s = 100 retries with no traffic at all, at most a
        // tenth of them in one instant (the budget paces them).
        for _ in 0..10 {
            assert!(f.decide(&mut f.situation(s503(), None), None).is_ok());
        }
        assert_eq!(
            f.decide(&mut f.situation(s503(), None), None),
            Err(Stop::Budget)
        );
    }

    #[test]
    fn a_retry_beside_a_slow_attempt_needs_all_but_a_body_and_a_wait() {
        let f = Fixture::new();
        let mut s = f.situation(Fault::Timeout, None);
        assert_eq!(f.policy(None).decide_beside(&s), Ok(()));
        s.request_retryable = false;
        assert_eq!(f.policy(None).decide_beside(&s), Err(Stop::Method));
        s.request_retryable = true;
        s.attempts = 3;
        assert_eq!(f.policy(None).decide_beside(&s), Err(Stop::Attempts));
        s.attempts = 1;
        assert_eq!(
            f.policy(Some(Duration::from_secs(5))).decide_beside(&s),
            Err(Stop::Deadline),
            "the typical attempt does not fit in the 2 s left"
        );
        let mut off = Fixture::new();
        off.retry.on.timeout = false;
        assert_eq!(off.policy(None).decide_beside(&s), Err(Stop::NotListed));
        // The budget is asked last, and spent.
        for _ in 0..9 {
            assert_eq!(f.policy(None).decide_beside(&s), Ok(()));
        }
        assert_eq!(f.policy(None).decide_beside(&s), Err(Stop::Budget));
    }

    #[test]
    fn without_a_deadline_no_retry_is_refused_for_time() {
        let f = Fixture::new();
        let mut s = f.situation(s503(), None);
        s.deadline = Deadline::new(f.now, None, None);
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("3"));
        s.response = Some((&h).into());
        let sleep = f.decide(&mut s, Some(Duration::from_secs(60))).unwrap();
        assert!(
            sleep >= Duration::from_secs(3),
            "the wait is kept: {sleep:?}"
        );
    }

    #[test]
    fn grpc_unavailable_in_a_trailers_only_response_is_a_failure() {
        let on = RetryOn::default();
        let mut h = HeaderMap::new();
        h.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        let classify = |status, h: &HeaderMap, on: &RetryOn| {
            classify_response(status, h.into(), Callee::of(status, h.into()), on)
        };
        assert_eq!(classify(StatusCode::OK, &h, &on), Some(Fault::Unavailable));
        h.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        assert_eq!(classify(StatusCode::OK, &h, &on), None);
        assert_eq!(
            classify(StatusCode::BAD_GATEWAY, &HeaderMap::new(), &on),
            Some(Fault::Status(StatusCode::BAD_GATEWAY))
        );
    }

    #[test]
    fn a_callees_word_about_its_own_app_is_the_endpoints_failure() {
        let said = |status: u16, outcome: &'static str, on: &RetryOn| {
            let mut h = HeaderMap::new();
            h.insert(OUTCOME_HEADER, HeaderValue::from_static(outcome));
            let status = StatusCode::from_u16(status).unwrap();
            classify_response(status, (&h).into(), Callee::of(status, (&h).into()), on)
        };
        let on = RetryOn::default();
        assert_eq!(said(502, "app-unreachable", &on), Some(Fault::Reset));
        assert_eq!(said(504, "app-timeout", &on), Some(Fault::Timeout));
        assert_eq!(
            said(409, "in-progress", &on),
            Some(Fault::Status(StatusCode::SERVICE_UNAVAILABLE)),
            "retried like a 503"
        );
        let mut statuses_only = RetryOn::none();
        statuses_only.add_status(502);
        statuses_only.add_status(504);
        assert_eq!(
            said(502, "app-unreachable", &statuses_only),
            None,
            "needs reset"
        );
        assert_eq!(
            said(504, "app-timeout", &statuses_only),
            None,
            "needs timeout"
        );
        assert_eq!(said(409, "in-progress", &statuses_only), None, "needs 503");

        // Not owned: the policy retries them.
        let f = Fixture::new();
        let mut h = HeaderMap::new();
        h.insert(OUTCOME_HEADER, HeaderValue::from_static("app-unreachable"));
        assert!(
            f.decide(&mut f.situation(Fault::Reset, Some((&h).into())), None)
                .is_ok()
        );
    }

    #[test]
    fn only_a_peers_fault_is_ever_listed() {
        let mut every = RetryOn::none();
        every.connect_failure = true;
        every.reset = true;
        every.timeout = true;
        every.unavailable = true;
        every.add_status(503);
        for f in [
            Fault::ConnectFailure,
            Fault::Tls,
            Fault::Reset,
            Fault::Timeout,
            s503(),
            Fault::Unavailable,
            Fault::CallerBody,
            Fault::NoDescriptors,
        ] {
            assert_eq!(listed(f, &every), f.is_peers(), "{f:?}");
            assert!(!listed(f, &RetryOn::none()), "{f:?}");
        }
    }

    #[test]
    fn outcomes_name_the_reason_for_giving_up() {
        assert_eq!(Stop::Attempts.outcome(s503()), Outcome::AttemptsExhausted);
        assert_eq!(
            Stop::Attempts.outcome(Fault::ConnectFailure),
            Outcome::UpstreamUnreachable
        );
        assert_eq!(
            Stop::Budget.outcome(Fault::ConnectFailure),
            Outcome::BudgetExhausted
        );
        assert_eq!(Stop::Method.outcome(s503()), Outcome::NotRetryable);
    }
}
