//! What another tollgate's `x-tollgate-outcome` on a response means to this one: the
//! ownership rule (a failure another tollgate owned passes straight back) and its
//! closed list of exceptions, and the outcome read for this one's own metrics.

use http::{HeaderValue, StatusCode};

use super::headers::OUTCOME_HEADER;
use crate::http::grpc::GRPC_STATUS;
use crate::http::response::Fields;
use crate::metrics::Outcome;

/// What another tollgate's `x-tollgate-outcome` on a response means to this one: the
/// ownership rule and its closed list of exceptions, read once per response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callee {
    /// No outcome: the endpoint's own answer.
    Silent,
    /// An outcome on a `1xx`-`3xx` response that is not a gRPC answer: no tollgate
    /// sends one there, so it is removed and means nothing.
    Stray,
    /// Another tollgate owned the failure (retried it, or deliberately did not): it
    /// passes straight back. An outcome this build does not know counts as owned, as
    /// `ok` in the metrics.
    Owned(Outcome),
    /// A callee's inbound side could not reach its app (`app-unreachable`): that
    /// endpoint's connect failure or reset, and whether the app may have run it.
    AppUnreachable(Ran),
    /// A callee's inbound side waited for its app until the deadline (`app-timeout`):
    /// that endpoint's timeout.
    AppTimeout,
    /// A callee's dedupe still runs the same keyed request (`in-progress`): a retry
    /// joins it, so it is retried like a `503`.
    InProgress,
}

/// Whether the app behind a callee's inbound side ran a request it could not answer, as
/// its `app-unreachable` says: `; ran=no` when the app refused the connection, `; ran=maybe`
/// when it reset or closed after the request reached it. Without the parameter (an older
/// callee) it may have run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ran {
    No,
    Maybe,
}

impl Ran {
    /// The parameter as it follows the outcome in `x-tollgate-outcome`.
    pub const fn param(self) -> &'static str {
        match self {
            Ran::No => "ran=no",
            Ran::Maybe => "ran=maybe",
        }
    }

    /// `ran=no` among an outcome's parameters (`; ran=no`, spaces allowed): anything
    /// else may have run.
    fn of(params: &[u8]) -> Ran {
        let no = params
            .split(|b| *b == b';')
            .any(|p| p.trim_ascii() == Ran::No.param().as_bytes());
        if no { Ran::No } else { Ran::Maybe }
    }
}

/// The value of `x-tollgate-outcome` for `o`, with `ran` after it when said
/// (`app-unreachable; ran=no`).
pub fn outcome_value(o: Outcome, ran: Option<Ran>) -> HeaderValue {
    let Some(ran) = ran else {
        return o.header_value();
    };
    HeaderValue::try_from(format!("{}; {}", o.as_str(), ran.param()))
        .unwrap_or_else(|_| o.header_value())
}

impl Callee {
    /// Reads the response's outcome, if any.
    #[inline]
    pub fn of(status: StatusCode, fields: Fields<'_>) -> Callee {
        let Some(v) = fields.get(&OUTCOME_HEADER) else {
            return Callee::Silent;
        };
        // tollgate's own gRPC answers are HTTP 200 with their status in the head.
        if status.as_u16() < 400 && !fields.contains(&GRPC_STATUS) {
            return Callee::Stray;
        }
        // The outcome, then its parameters (only `app-unreachable` has one today).
        let (word, params) = match v.iter().position(|b| *b == b';') {
            Some(i) => (v[..i].trim_ascii(), &v[i + 1..]),
            None => (v, &[][..]),
        };
        match known(word) {
            Some(Outcome::AppUnreachable) => Callee::AppUnreachable(Ran::of(params)),
            Some(Outcome::AppTimeout) => Callee::AppTimeout,
            Some(Outcome::InProgress) => Callee::InProgress,
            o => Callee::Owned(o.unwrap_or(Outcome::Ok)),
        }
    }

    /// Another tollgate owned it: no retry, and it passes back as it came.
    pub fn owned(self) -> bool {
        matches!(self, Callee::Owned(_))
    }

    /// The outcome the response goes back to the app with when this tollgate adds none
    /// of its own (`ok` for a silent or stray one).
    pub fn outcome(self) -> Outcome {
        match self {
            Callee::Silent | Callee::Stray => Outcome::Ok,
            Callee::Owned(o) => o,
            Callee::AppUnreachable(_) => Outcome::AppUnreachable,
            Callee::AppTimeout => Outcome::AppTimeout,
            Callee::InProgress => Outcome::InProgress,
        }
    }

    /// Whether the response says its endpoint failed, for outlier ejection: a 5xx of
    /// the endpoint's own (no outcome), another tollgate shedding load in front of it
    /// (`overloaded`), or a callee's inbound side that could not get an answer from its
    /// app. Any other outcome is another layer's verdict, not the endpoint's fault.
    pub fn endpoint_failed(self, status: StatusCode) -> bool {
        match self {
            Callee::Silent => status.is_server_error(),
            Callee::Owned(o) => o == Outcome::Overloaded,
            Callee::AppUnreachable(_) | Callee::AppTimeout => true,
            Callee::Stray | Callee::InProgress => false,
        }
    }

    /// Whether the callee says the request did not run: its app refused the connection
    /// (`app-unreachable; ran=no`), so a keyed request may go again where it would
    /// otherwise need a callee that deduplicates.
    pub fn did_not_run(self) -> bool {
        self == Callee::AppUnreachable(Ran::No)
    }
}

/// The outcome an `x-tollgate-outcome` value names, if this build knows it.
fn known(v: &[u8]) -> Option<Outcome> {
    Outcome::ALL
        .iter()
        .copied()
        .find(|o| o.as_str().as_bytes() == v)
}

/// Whether a callee's inbound side refused the attempt from its fleet-wide retry
/// budget (`503` with `x-tollgate-outcome: retry-rejected`; to a gRPC call, its
/// trailers-only answer: HTTP 200 with the status and the outcome in the head).
pub fn refused_as_retry(status: StatusCode, fields: Fields<'_>) -> bool {
    fields.get(&OUTCOME_HEADER) == Some(Outcome::RetryRejected.as_str().as_bytes())
        && (status == StatusCode::SERVICE_UNAVAILABLE
            || (status == StatusCode::OK && fields.contains(&GRPC_STATUS)))
}

/// The outcome another tollgate put on a response, for our own metrics (`ok` when it
/// carries none, or one that means nothing on its status).
pub fn outcome_of(status: StatusCode, fields: Fields<'_>) -> Outcome {
    Callee::of(status, fields).outcome()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn callee(status: u16, pairs: &[(&'static str, &'static str)]) -> Callee {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        Callee::of(StatusCode::from_u16(status).unwrap(), (&h).into())
    }

    #[test]
    fn the_ownership_rule_and_its_exceptions() {
        let outcome = |v| [("x-tollgate-outcome", v)];
        assert_eq!(callee(503, &[]), Callee::Silent);
        assert_eq!(
            callee(503, &outcome("attempts-exhausted")),
            Callee::Owned(Outcome::AttemptsExhausted)
        );
        assert_eq!(
            callee(503, &outcome("overloaded")),
            Callee::Owned(Outcome::Overloaded)
        );
        assert_eq!(
            callee(503, &outcome("from-the-future")),
            Callee::Owned(Outcome::Ok),
            "an outcome this build does not know is still owned"
        );
        assert_eq!(
            callee(502, &outcome("app-unreachable")),
            Callee::AppUnreachable(Ran::Maybe),
            "an older callee says nothing of its app: it may have run"
        );
        assert_eq!(callee(504, &outcome("app-timeout")), Callee::AppTimeout);
        assert_eq!(callee(409, &outcome("in-progress")), Callee::InProgress);
        for status in [101, 200, 204, 302] {
            assert_eq!(callee(status, &outcome("budget-exhausted")), Callee::Stray);
        }
        // A trailers-only gRPC answer is HTTP 200: its outcome counts.
        assert_eq!(
            callee(
                200,
                &[
                    ("grpc-status", "14"),
                    ("x-tollgate-outcome", "app-unreachable")
                ]
            ),
            Callee::AppUnreachable(Ran::Maybe)
        );
        assert_eq!(
            callee(
                200,
                &[("grpc-status", "8"), ("x-tollgate-outcome", "throttled")]
            ),
            Callee::Owned(Outcome::Throttled)
        );
        assert!(!callee(502, &outcome("app-unreachable")).owned());
        assert!(callee(502, &outcome("app-unreachable")).endpoint_failed(StatusCode::BAD_GATEWAY));
        assert!(
            !callee(503, &outcome("budget-exhausted"))
                .endpoint_failed(StatusCode::SERVICE_UNAVAILABLE)
        );
        assert!(!callee(409, &outcome("in-progress")).endpoint_failed(StatusCode::CONFLICT));
    }

    #[test]
    fn an_app_that_refused_the_connection_did_not_run_and_one_that_broke_it_may_have() {
        let outcome = |v| [("x-tollgate-outcome", v)];
        for (value, ran) in [
            ("app-unreachable; ran=no", Ran::No),
            ("app-unreachable;ran=no", Ran::No),
            ("app-unreachable ; ran=no ", Ran::No),
            ("app-unreachable; ran=maybe", Ran::Maybe),
            ("app-unreachable; ran=perhaps", Ran::Maybe),
            ("app-unreachable; x=1; ran=no", Ran::No),
        ] {
            let c = callee(502, &outcome(value));
            assert_eq!(c, Callee::AppUnreachable(ran), "{value}");
            assert_eq!(c.did_not_run(), ran == Ran::No, "{value}");
            assert!(!c.owned(), "{value}");
            assert_eq!(c.outcome(), Outcome::AppUnreachable, "{value}");
        }
        // Parameters on another outcome change nothing: still owned, still that outcome.
        assert_eq!(
            callee(503, &outcome("budget-exhausted; ran=no")),
            Callee::Owned(Outcome::BudgetExhausted)
        );
        assert!(!callee(503, &outcome("budget-exhausted; ran=no")).did_not_run());
        assert!(!callee(504, &outcome("app-timeout")).did_not_run());
    }
}
