//! Ownership through the app: the calls this pod's outbound side gave up on with an
//! owned outcome, remembered by what ties them to the request the app was serving when
//! it made them (the trace id of `traceparent`, `x-request-id`), so that the inbound
//! side can mark the app's failure for that request `downstream-owned` and no caller
//! retries what a layer below already owned.
//!
//! Only what the app passes on is used: a call with neither header is not remembered,
//! and an app's failure whose request had neither is never marked (no guessing). Each
//! key is kept with the moment of its last give-up, and a failure is marked only when
//! that moment falls within its own request's lifetime.
//!
//! Bounded: at most [`CAPACITY`] keys (16 bytes each, hashed) in one small map behind
//! a lock taken only on a give-up and on an app's 502/503/504, never on a success. A
//! full map first forgets the keys older than [`KEEP`], then, if still full, all of
//! them: a forgotten key costs one failure left unmarked (its callers may retry it),
//! never a wrong mark.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::Duration;

use http::{HeaderMap, HeaderName, StatusCode};
use tokio::time::Instant;

use crate::http::grpc::{GRPC_STATUS, is_grpc_answer};
use crate::metrics::Outcome;
use crate::retry::headers::OUTCOME_HEADER;
use crate::trace::{TRACEPARENT, TraceParent};
use crate::upstream::response::Fields;

/// Keys remembered at most.
pub const CAPACITY: usize = 4096;
/// A give-up older than this is forgotten first when the map is full: no request the
/// app serves lasts that long in practice.
pub const KEEP: Duration = Duration::from_secs(60);

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A request id longer than this is not a request id.
const MAX_REQUEST_ID: usize = 256;

/// The give-ups of this pod's outbound side, by request.
pub struct OwnedCalls {
    given_up: Mutex<HashMap<u64, Instant>>,
    hasher: RandomState,
}

impl Default for OwnedCalls {
    fn default() -> Self {
        OwnedCalls {
            given_up: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
        }
    }
}

impl std::fmt::Debug for OwnedCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedCalls").finish_non_exhaustive()
    }
}

/// Who a request is, as [`OwnedCalls`] remembers give-ups: its trace id and its
/// request id, hashed.
pub type Keys = [Option<u64>; 2];

/// Whether an outcome the outbound side answered its app with is owned: every one but
/// `ok` and the closed list a caller retries (SPEC, the ownership rule).
pub fn owned(outcome: Outcome) -> bool {
    !matches!(
        outcome,
        Outcome::Ok | Outcome::AppUnreachable | Outcome::AppTimeout | Outcome::InProgress
    )
}

/// Whether the app's answer to a call (`grpc`: a gRPC call) is a failure its callers
/// would retry: `502`, `503`, `504`, or a gRPC `UNAVAILABLE` in the head (a
/// trailers-only answer). An answer that already says who owns it is left as it is.
/// The status is looked at first: a good answer's fields are never searched.
#[inline]
pub fn retryable_failure(status: StatusCode, fields: Fields<'_>, grpc: bool) -> bool {
    let failed = match status.as_u16() {
        502..=504 => true,
        200 if grpc => {
            is_grpc_answer(
                status,
                fields.get(&http::header::CONTENT_TYPE),
                fields.contains(&GRPC_STATUS),
            ) && fields.get(&GRPC_STATUS) == Some(&b"14"[..])
        }
        _ => false,
    };
    failed && !fields.contains(&OUTCOME_HEADER)
}

impl OwnedCalls {
    /// The outbound side gave up, owned, at `now`, on a call with these header fields.
    pub fn gave_up(&self, headers: &HeaderMap, now: Instant) {
        let keys = self.keys(headers);
        if keys.iter().all(Option::is_none) {
            return;
        }
        let mut map = self.given_up.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() + 2 > CAPACITY {
            map.retain(|_, at| now.saturating_duration_since(*at) < KEEP);
            if map.len() + 2 > CAPACITY {
                map.clear();
            }
        }
        for k in keys.into_iter().flatten() {
            map.insert(k, now);
        }
    }

    /// Whether a call made for the request with these header fields was given up on
    /// since `since` (when the request arrived).
    pub fn gave_up_since(&self, headers: &HeaderMap, since: Instant) -> bool {
        self.gave_up_since_keys(self.keys(headers), since)
    }

    /// As [`Self::gave_up_since`], for keys read before the headers were sent on.
    pub fn gave_up_since_keys(&self, keys: Keys, since: Instant) -> bool {
        if keys.iter().all(Option::is_none) {
            return false;
        }
        let map = self.given_up.lock().unwrap_or_else(|p| p.into_inner());
        keys.iter()
            .flatten()
            .any(|k| map.get(k).is_some_and(|at| *at >= since))
    }

    /// The request's keys: its trace id, its request id.
    pub fn keys(&self, headers: &HeaderMap) -> Keys {
        let trace = headers
            .get(TRACEPARENT)
            .and_then(|v| TraceParent::parse(v.as_bytes()))
            .map(|tp| self.hasher.hash_one((b't', tp.trace_id.to_bytes())));
        let request = headers
            .get(REQUEST_ID)
            .map(|v| v.as_bytes())
            .filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID)
            .map(|v| self.hasher.hash_one((b'r', v)));
        [trace, request]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::testing::fields as headers;
    use http::HeaderValue;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

    #[tokio::test(start_paused = true)]
    async fn a_give_up_marks_only_requests_of_the_same_trace_or_id_that_began_before_it() {
        let owned = OwnedCalls::default();
        let arrived = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        // The app's call passes the trace on, with another parent (its own span).
        let call = headers(&[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01",
        )]);
        owned.gave_up(&call, Instant::now());
        assert!(owned.gave_up_since(&headers(&[("traceparent", TP)]), arrived));
        let later = Instant::now() + Duration::from_millis(1);
        assert!(
            !owned.gave_up_since(&headers(&[("traceparent", TP)]), later),
            "a request that arrived after the give-up is not its"
        );
        let other = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
        assert!(!owned.gave_up_since(&headers(&[("traceparent", other)]), arrived));
        assert!(
            !owned.gave_up_since(&HeaderMap::new(), arrived),
            "no guessing"
        );

        owned.gave_up(&headers(&[("x-request-id", "r-1")]), Instant::now());
        assert!(owned.gave_up_since(&headers(&[("x-request-id", "r-1")]), arrived));
        assert!(!owned.gave_up_since(&headers(&[("x-request-id", "r-2")]), arrived));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_map_forgets_old_give_ups_first_and_never_grows_past_its_bound() {
        let owned = OwnedCalls::default();
        let start = Instant::now();
        for i in 0..CAPACITY * 2 {
            let mut h = HeaderMap::new();
            h.insert(REQUEST_ID, HeaderValue::from(i));
            owned.gave_up(&h, Instant::now());
            if i == 10 {
                tokio::time::advance(KEEP).await;
            }
            assert!(owned.given_up.lock().unwrap().len() <= CAPACITY);
        }
        let mut recent = HeaderMap::new();
        recent.insert(REQUEST_ID, HeaderValue::from(CAPACITY * 2 - 1));
        assert!(owned.gave_up_since(&recent, start));
    }
}
