//! What one attempt shows about its upstream, handed to the parts that learn from it:
//! the throttle of first attempts counts what was accepted, and the budget's adaptive
//! share hears about retries that succeeded or failed, overload and slowness.
//!
//! The throttle counts as accepted every attempt not rejected for overload. Rejections
//! are only what says "too much": a `429` or `503`, an overload as below, a refused (or
//! timed-out) connect, an attempt that ran out of its time, a callee's inbound side
//! that could not get an answer from its app (`app-unreachable`, `app-timeout`: the
//! endpoint's connect failure and timeout), and a gRPC `UNAVAILABLE` or
//! `RESOURCE_EXHAUSTED` (gRPC's 503 and 429). Any other answer is an answer: an upstream
//! that answers `500` to most requests is not helped by fewer of them.
//!
//! Overload is what the upstream (or a tollgate in front of it) says about itself: a
//! `503` whose `x-tollgate-outcome` is `overloaded` or `retry-rejected`, a
//! `Retry-After` on a `429` or `5xx`, or a non-negative `grpc-retry-pushback-ms`. A
//! pushback of `-1` says "do not retry this call", which is about the call, not about
//! load. Slowness is an attempt that ran out of its time.
//!
//! A failure another tollgate owned (its `x-tollgate-outcome` says why it gave up:
//! `attempts-exhausted`, `budget-exhausted`, `throttled`, ...) is that tollgate's to
//! throttle: it is nearer the failure and already does. Counted here too, the layers'
//! throttles would multiply, and the upstream's return would be seen through both, a
//! window late at each. So the throttle counts neither it nor the request it answers;
//! an outcome that says the callee itself is overloaded (`overloaded`,
//! `retry-rejected`) counts as the failure it is.
//!
//! The parts that learn, in this folder: the budget's adaptive share ([`adaptive`]), the
//! throttle of first attempts ([`throttle`]), and the recent attempt latency, a
//! percentile for hedging and the median a retry must have time for ([`quantile`]).

pub mod adaptive;
pub mod quantile;
pub mod throttle;

use http::StatusCode;
use http::header::RETRY_AFTER;
use tokio::time::Instant;

use crate::contract::headers::OUTCOME_HEADER;
use crate::contract::outcome::Callee;
use crate::fault::Fault;
use crate::http::grpc::{GRPC_PUSHBACK, GRPC_STATUS};
use crate::http::response::Fields;
use crate::metrics::Outcome;
use crate::retry::decide::retry_after::{Pushback, parse_pushback_ms};
use crate::retry::upstream::Upstream;

/// One attempt's result, as the learning parts see it.
pub(crate) struct Seen<'a> {
    /// The attempt number as sent (`x-tollgate-attempt`): 2 and up are retries.
    pub number: u32,
    /// The failure `retry.on` lists, if the attempt failed.
    pub failure: Option<Fault>,
    /// The response head, when there was one.
    pub response: Option<(StatusCode, Fields<'a>)>,
}

/// Whether anything learns from `up`'s attempts: a throttle or an adaptive share. When
/// nothing does, an attempt's result is not looked at (nor the clock read).
pub(crate) fn listening<A>(up: &Upstream<A>) -> bool {
    up.throttle.is_some() || up.budget.adaptive().is_some()
}

/// Tells the upstream's throttle and adaptive share what an attempt showed; called only
/// when one of them is [`listening`].
pub(crate) fn attempt_done<A>(up: &Upstream<A>, seen: &Seen<'_>, now: Instant) {
    let share = up.budget.adaptive();
    // Only a failure or a gRPC answer can say anything about load or ownership: a plain
    // success's fields are not searched.
    let telling = seen.response.filter(|(status, fields)| {
        seen.failure.is_some() || !status.is_success() || fields.contains(&GRPC_STATUS)
    });
    let callee = telling.map(|(status, fields)| Callee::of(status, fields));
    let owned_by_another = callee.is_some_and(|c| match c {
        Callee::Owned(o) => !matches!(o, Outcome::Overloaded | Outcome::RetryRejected),
        _ => false,
    });
    if let Some(t) = up.throttle.as_ref().filter(|_| !owned_by_another) {
        if rejected(seen.failure, telling, callee) {
            t.rejected();
        } else {
            t.accepted(now);
        }
    }
    let Some(share) = share else {
        return;
    };
    if telling.is_some_and(|(status, fields)| overload(status, fields)) {
        share.overloaded(now);
    } else if seen.failure == Some(Fault::Timeout) {
        share.slow(now);
    }
    match (seen.number >= 2, seen.failure) {
        (true, None) => share.retry_succeeded(now),
        (true, Some(_)) => share.retry_failed(),
        (false, None) => share.first_succeeded(),
        (false, Some(_)) => {}
    }
}

/// Whether an attempt was rejected for overload, for the throttle: a refused or
/// timed-out connect, no head in time, or an answer that says so.
fn rejected(
    failure: Option<Fault>,
    response: Option<(StatusCode, Fields<'_>)>,
    callee: Option<Callee>,
) -> bool {
    if matches!(failure, Some(Fault::ConnectFailure | Fault::Timeout)) {
        return true;
    }
    let Some((status, fields)) = response else {
        return false;
    };
    if matches!(callee, Some(Callee::AppUnreachable(_) | Callee::AppTimeout)) {
        return true;
    }
    status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::SERVICE_UNAVAILABLE
        || fields
            .get(&GRPC_STATUS)
            .is_some_and(|v| v == GRPC_UNAVAILABLE || v == GRPC_RESOURCE_EXHAUSTED)
        || overload(status, fields)
}

/// gRPC's 503 and 429.
const GRPC_UNAVAILABLE: &[u8] = b"14";
const GRPC_RESOURCE_EXHAUSTED: &[u8] = b"8";

/// Whether an answer with outcome `outcome` counts in the throttle: one from another
/// tollgate does only when it says the callee itself is overloaded.
pub fn counts_for_throttle(outcome: Outcome, owned_elsewhere: bool) -> bool {
    !owned_elsewhere || matches!(outcome, Outcome::Overloaded | Outcome::RetryRejected)
}

/// An `x-tollgate-outcome` that says the callee itself is overloaded.
fn callee_overloaded(outcome: &[u8]) -> bool {
    [Outcome::Overloaded, Outcome::RetryRejected]
        .iter()
        .any(|o| o.as_str().as_bytes() == outcome)
}

/// Whether a response says its upstream is overloaded.
pub fn overload(status: StatusCode, fields: Fields<'_>) -> bool {
    if status == StatusCode::SERVICE_UNAVAILABLE
        && fields.get(&OUTCOME_HEADER).is_some_and(callee_overloaded)
    {
        return true;
    }
    if let Some(v) = fields.get(&GRPC_PUSHBACK) {
        return matches!(parse_pushback_ms(v), Pushback::After(_));
    }
    (status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error())
        && fields.contains(&RETRY_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn said(status: u16, pairs: &[(&'static str, &'static str)]) -> bool {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        overload(StatusCode::from_u16(status).unwrap(), (&h).into())
    }

    #[test]
    fn overload_is_what_the_upstream_says_about_its_load() {
        assert!(said(503, &[("x-tollgate-outcome", "overloaded")]));
        assert!(said(503, &[("x-tollgate-outcome", "retry-rejected")]));
        assert!(said(503, &[("retry-after", "1")]));
        assert!(said(429, &[("retry-after", "2")]));
        assert!(said(200, &[("grpc-retry-pushback-ms", "100")]));
        assert!(said(200, &[("grpc-retry-pushback-ms", "0")]));
    }

    /// Whether the throttle takes an attempt with this failure and answer as rejected.
    fn rejects(
        failure: Option<Fault>,
        status: u16,
        pairs: &[(&'static str, &'static str)],
    ) -> bool {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        let status = StatusCode::from_u16(status).unwrap();
        let fields = (&h).into();
        rejected(
            failure,
            Some((status, fields)),
            Some(Callee::of(status, fields)),
        )
    }

    #[test]
    fn only_overload_is_a_rejection_for_the_throttle() {
        let s500 = Some(Fault::Status(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(
            !rejects(s500, 500, &[]),
            "a 500 is an answer, listed or not"
        );
        assert!(!rejects(None, 500, &[]));
        assert!(!rejects(
            Some(Fault::Status(StatusCode::BAD_GATEWAY)),
            502,
            &[]
        ));
        assert!(!rejects(None, 404, &[]));
        assert!(!rejects(None, 200, &[("grpc-status", "13")]), "INTERNAL");
        assert!(rejects(None, 503, &[]), "503, listed or not");
        assert!(rejects(None, 429, &[]));
        assert!(rejects(None, 500, &[("retry-after", "1")]));
        assert!(rejects(None, 200, &[("grpc-status", "14")]), "UNAVAILABLE");
        assert!(
            rejects(None, 200, &[("grpc-status", "8")]),
            "RESOURCE_EXHAUSTED"
        );
        assert!(rejects(
            None,
            502,
            &[("x-tollgate-outcome", "app-unreachable")]
        ));
        assert!(rejects(None, 504, &[("x-tollgate-outcome", "app-timeout")]));
        assert!(rejected(Some(Fault::ConnectFailure), None, None));
        assert!(rejected(Some(Fault::Timeout), None, None));
        assert!(!rejected(Some(Fault::Reset), None, None));
        assert!(!rejected(Some(Fault::Tls), None, None));
    }

    #[test]
    fn failures_that_say_nothing_about_load_are_not_overload() {
        assert!(!said(503, &[]));
        assert!(!said(503, &[("x-tollgate-outcome", "attempts-exhausted")]));
        assert!(!said(502, &[("x-tollgate-outcome", "overloaded")]));
        assert!(!said(200, &[("retry-after", "5")]));
        // "Do not retry this call" is about the call.
        assert!(!said(200, &[("grpc-retry-pushback-ms", "-1")]));
        assert!(!said(
            503,
            &[("grpc-retry-pushback-ms", "-1"), ("retry-after", "1")]
        ));
    }
}
