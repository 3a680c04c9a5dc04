//! What one attempt shows about its upstream, handed to the parts that learn from it:
//! the throttle of first attempts counts what was accepted, and the budget's adaptive
//! share hears about retries that succeeded or failed, overload and slowness.
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

use http::StatusCode;
use http::header::RETRY_AFTER;
use tokio::time::Instant;

use super::headers::{GRPC_PUSHBACK, GRPC_STATUS, OUTCOME_HEADER};
use super::policy::Failure;
use super::retry_after::{Pushback, parse_pushback_ms};
use super::upstream::Upstream;
use crate::metrics::Outcome;
use crate::upstream::response::Fields;

/// One attempt's result, as the learning parts see it.
pub(crate) struct Seen<'a> {
    /// The attempt number as sent (`x-tollgate-attempt`): 2 and up are retries.
    pub number: u32,
    /// The failure `retry.on` lists, if the attempt failed.
    pub failure: Option<Failure>,
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
    let owned_by_another = telling.is_some_and(|(_, f)| {
        f.get(&OUTCOME_HEADER)
            .is_some_and(|o| !callee_overloaded(o))
    });
    if let Some(t) = up.throttle.as_ref().filter(|_| !owned_by_another) {
        match seen.failure {
            None => t.accepted(now),
            Some(_) => t.failed(),
        }
    }
    let Some(share) = share else {
        return;
    };
    if telling.is_some_and(|(status, fields)| overload(status, fields)) {
        share.overloaded(now);
    } else if seen.failure == Some(Failure::Timeout) {
        share.slow(now);
    }
    if seen.number >= 2 {
        match seen.failure {
            None => share.retry_succeeded(now),
            Some(_) => share.retry_failed(),
        }
    }
}

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
