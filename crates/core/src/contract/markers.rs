//! The counts other HTTP clients put on their own retries, read strictly: gRPC's
//! `grpc-previous-rpc-attempts` (0 on the first try), Envoy's `x-envoy-attempt-count`
//! (1 on the first try), the AWS SDKs' `amz-sdk-request: attempt=N; max=M` (1 on the
//! first try) and `retry-attempt` (0 on the first try). A count is one to nine ASCII
//! digits and nothing else: a value that is not one says nothing, so nobody is taken
//! for a retry by a malformed header it could as well have left out.
//!
//! The outbound side reads them as evidence that the app's client is retrying behind
//! tollgate's back; the inbound side reads the first two, after `x-tollgate-attempt`,
//! to tell a caller's retries from its first attempts.

use http::{HeaderName, HeaderValue};

/// gRPC's count of the attempts before this one (gRFC A6).
pub const GRPC_PREVIOUS_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");
/// Envoy's count of attempts, this one included.
pub const ENVOY_ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");
/// The AWS SDKs' attempt number and limit: `attempt=2; max=3`.
pub const AMZ_SDK_REQUEST: HeaderName = HeaderName::from_static("amz-sdk-request");
/// The count of retries before this attempt, as some SDKs send it.
pub const RETRY_ATTEMPT: HeaderName = HeaderName::from_static("retry-attempt");

/// A count in a header value: one to nine ASCII digits, nothing else.
pub fn parse_count(value: &[u8]) -> Option<u32> {
    if value.is_empty() || value.len() > 9 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')))
}

/// The attempt number of an `amz-sdk-request` value (`attempt=N` among its
/// `;`-separated parameters).
fn amz_attempt(value: &[u8]) -> Option<u32> {
    value
        .split(|b| *b == b';')
        .find_map(|p| p.trim_ascii().strip_prefix(b"attempt="))
        .and_then(parse_count)
}

/// Whether the field `name: value` is a client's mark of a retry. Called for every
/// field of every request the app sends: four comparisons of names, which for a
/// standard field (`Host`, `Accept`) stop at its kind, and the value read only for a
/// marker.
#[inline]
pub fn marks_retry(name: &HeaderName, value: &HeaderValue) -> bool {
    let at_least = |from| parse_count(value.as_bytes()).is_some_and(|n| n >= from);
    if *name == GRPC_PREVIOUS_ATTEMPTS || *name == RETRY_ATTEMPT {
        at_least(1)
    } else if *name == ENVOY_ATTEMPT_COUNT {
        at_least(2)
    } else if *name == AMZ_SDK_REQUEST {
        amz_attempt(value.as_bytes()).is_some_and(|n| n >= 2)
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(name: &'static str, value: &'static str) -> bool {
        marks_retry(
            &HeaderName::from_static(name),
            &HeaderValue::from_static(value),
        )
    }

    #[test]
    fn each_marker_says_retry_from_its_own_first_count() {
        assert!(!marks("grpc-previous-rpc-attempts", "0"));
        assert!(marks("grpc-previous-rpc-attempts", "1"));
        assert!(!marks("x-envoy-attempt-count", "1"));
        assert!(marks("x-envoy-attempt-count", "2"));
        assert!(!marks("amz-sdk-request", "attempt=1; max=3"));
        assert!(marks("amz-sdk-request", "attempt=2; max=3"));
        assert!(marks("amz-sdk-request", "max=3;attempt=3"));
        assert!(!marks("retry-attempt", "0"));
        assert!(marks("retry-attempt", "1"));
    }

    #[test]
    fn anything_else_says_nothing() {
        for (name, value) in [
            ("grpc-previous-rpc-attempts", "one"),
            ("x-envoy-attempt-count", "+3"),
            ("amz-sdk-request", "attempt=two"),
            ("amz-sdk-request", "attempts=4"),
            ("amz-sdk-request", "max=3"),
            ("retry-attempt", "1.0"),
            // Same lengths, other names.
            ("x-envoy-retry-on-xyz1", "5"),
            ("idempotency-key", "attempt=2"),
            ("x-request-idxx", "3"),
            ("x-tollgate-attempt", "2"),
        ] {
            assert!(!marks(name, value), "{name}: {value}");
        }
    }
}
