//! tollgate's own headers, by which the hops of a chain tell each other what happened:
//! the attempt number an upstream receives, and the attempt count and outcome the app
//! receives. Names and the values written on every request, made without formatting;
//! what an outcome on a response means is read in [`super::outcome`], and what a
//! callee's `x-tollgate-dedupe` says in [`super::dedupe`].

use http::{HeaderName, HeaderValue};

use crate::metrics::Outcome;

/// Why tollgate stopped, on a response it made or a failure it gave up on.
pub const OUTCOME_HEADER: HeaderName = HeaderName::from_static("x-tollgate-outcome");
/// Which attempt this is: 1 for the first try (tollgate -> upstream).
pub const ATTEMPT_HEADER: HeaderName = HeaderName::from_static("x-tollgate-attempt");
/// How many attempts the response took (tollgate -> app).
pub const ATTEMPTS_HEADER: HeaderName = HeaderName::from_static("x-tollgate-attempts");
/// On an attempt sent beside another one still running (tollgate -> upstream).
pub const HEDGE_HEADER: HeaderName = HeaderName::from_static("x-tollgate-hedge");
/// The value of [`HEDGE_HEADER`].
pub const HEDGE_VALUE: HeaderValue = HeaderValue::from_static("1");
/// On every answer of a callee's inbound side while `[inbound.dedupe]` is on (callee ->
/// caller): keyed requests run there once; which header carries the key, and where the
/// keys are remembered ([`super::dedupe::DedupeAdvert`]).
pub const DEDUPE_HEADER: HeaderName = HeaderName::from_static("x-tollgate-dedupe");
/// On a retry that may only run where the attempt before it may have run (caller ->
/// callee): the store ID that callee named, which must still be its own.
pub const DEDUPE_STORE_HEADER: HeaderName = HeaderName::from_static("x-tollgate-dedupe-store");
/// `true` on an answer a callee's dedupe replayed from its store.
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Counts up to 10, as header values, so no attempt formats its number.
static COUNT_VALUES: [HeaderValue; 10] = [
    HeaderValue::from_static("1"),
    HeaderValue::from_static("2"),
    HeaderValue::from_static("3"),
    HeaderValue::from_static("4"),
    HeaderValue::from_static("5"),
    HeaderValue::from_static("6"),
    HeaderValue::from_static("7"),
    HeaderValue::from_static("8"),
    HeaderValue::from_static("9"),
    HeaderValue::from_static("10"),
];

/// A count as a header value.
pub fn count_value(n: u32) -> HeaderValue {
    match COUNT_VALUES.get((n as usize).wrapping_sub(1)) {
        Some(v) => v.clone(),
        None => HeaderValue::from(n),
    }
}

/// `x-tollgate-attempts: N` as a whole head line, for counts up to 16 (a request
/// makes at most 10 attempts); made once.
pub fn attempts_line(n: u32) -> Option<&'static str> {
    static LINES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let lines = LINES.get_or_init(|| {
        (1..=16)
            .map(|i| format!("{}: {i}", ATTEMPTS_HEADER.as_str()))
            .collect()
    });
    lines.get((n as usize).wrapping_sub(1)).map(String::as_str)
}

/// `x-tollgate-outcome: OUTCOME` as a whole head line; made once.
pub fn outcome_line(o: Outcome) -> &'static str {
    static LINES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let lines = LINES.get_or_init(|| {
        Outcome::ALL
            .iter()
            .map(|o| format!("{}: {}", OUTCOME_HEADER.as_str(), o.as_str()))
            .collect()
    });
    Outcome::ALL
        .iter()
        .position(|x| *x == o)
        .and_then(|i| lines.get(i))
        .map_or("", String::as_str)
}

/// `x-tollgate-outcome:` with no value: in the fields a hop adds to an HTTP/1.1 head,
/// it drops the response's own field of that name and writes nothing.
pub const OUTCOME_REMOVED_LINE: &str = "x-tollgate-outcome:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_lines_are_the_header_and_its_value() {
        assert_eq!(attempts_line(3), Some("x-tollgate-attempts: 3"));
        assert_eq!(attempts_line(0), None);
        for o in Outcome::ALL {
            assert_eq!(
                outcome_line(o),
                format!("x-tollgate-outcome: {}", o.as_str())
            );
        }
    }
}
