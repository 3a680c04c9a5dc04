//! tollgate's own headers, by which the hops of a chain tell each other what happened:
//! the attempt number an upstream receives, and the attempt count and outcome the app
//! receives. Names and the values written on every request, made without formatting.

use http::{HeaderName, HeaderValue, StatusCode};

use crate::metrics::Outcome;
use crate::upstream::response::Fields;

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
pub use crate::http::grpc::{GRPC_PUSHBACK, GRPC_STATUS};

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

/// Whether a response was already given up on by another tollgate nearer the failure.
pub fn owned_elsewhere(fields: Fields<'_>) -> bool {
    fields.contains(&OUTCOME_HEADER)
}

/// Whether a callee's inbound side refused the attempt from its fleet-wide retry
/// budget (`503` with `x-tollgate-outcome: retry-rejected`).
pub fn refused_as_retry(status: StatusCode, fields: Fields<'_>) -> bool {
    status == StatusCode::SERVICE_UNAVAILABLE
        && fields.get(&OUTCOME_HEADER) == Some(Outcome::RetryRejected.as_str().as_bytes())
}

/// Whether a response says its endpoint failed, for outlier ejection: a 5xx of the
/// endpoint's own (no `x-tollgate-outcome`), or another tollgate shedding load in
/// front of it (`overloaded`). Any other outcome is another layer's verdict, not the
/// endpoint's fault.
pub fn endpoint_failed(status: u16, fields: Fields<'_>) -> bool {
    match fields.get(&OUTCOME_HEADER) {
        None => status >= 500,
        Some(v) => v == Outcome::Overloaded.as_str().as_bytes(),
    }
}

/// The outcome another tollgate put on a response, for our own metrics.
pub fn outcome_of(fields: Fields<'_>) -> Outcome {
    fields
        .get(&OUTCOME_HEADER)
        .and_then(|v| {
            Outcome::ALL
                .iter()
                .copied()
                .find(|o| o.as_str().as_bytes() == v)
        })
        .unwrap_or(Outcome::Ok)
}

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
