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
//! a lock taken only on a give-up and on an app's 502/503/504 (or gRPC `UNAVAILABLE`,
//! in its head or its trailers), never on a success. A
//! full map first forgets the keys older than [`KEEP`], then, if still full, all of
//! them: a forgotten key costs one failure left unmarked (its callers may retry it),
//! never a wrong mark.
//!
//! An id is the request's only while no other request carries it: a caller reusing
//! another's `x-request-id` or trace id must not stop that other request's failure
//! being retried. So the inbound side also counts, per key, the requests in flight that
//! carry it ([`Carrying`]); a request whose key another request in flight carried at
//! any moment of its lifetime is ambiguous and marks nothing. Accepted cost: one trace
//! fanning out to the same service at once gets no marking for those calls. That map
//! holds only the keys of requests in flight, and is locked once as a request with a
//! key arrives and once as it leaves (a request with neither header takes no lock).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderMap, HeaderName, StatusCode};
use tokio::time::Instant;

use crate::answer::NO_RETRY;
use crate::contract::headers::OUTCOME_HEADER;
use crate::http::grpc::{GRPC_PUSHBACK, GRPC_STATUS, is_grpc_answer};
use crate::http::response::Fields;
use crate::metrics::Outcome;
use crate::trace::{TRACEPARENT, TraceParent};

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
    /// The keys of the inbound requests in flight: how many carry each, and when two
    /// last did at once.
    carried: Mutex<HashMap<u64, Carried>>,
    hasher: RandomState,
}

#[derive(Default)]
struct Carried {
    inflight: u32,
    /// The latest arrival among the requests that carried the key while it was kept.
    latest: Option<Instant>,
    /// When a second request in flight carried the key, last: never before the arrival
    /// of any request then in flight, so each of them sees it, whatever order their
    /// arrival moments (taken before the lock) reached the lock in.
    shared_at: Option<Instant>,
}

impl Default for OwnedCalls {
    fn default() -> Self {
        OwnedCalls {
            given_up: Mutex::new(HashMap::new()),
            carried: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
        }
    }
}

/// An inbound request in flight, counted under its keys until it is dropped: by
/// reference while the app works on it, or (`Arc`) kept by an answer's body whose
/// gRPC status comes in its trailers.
pub struct Carrying<O: Deref<Target = OwnedCalls>> {
    owned: O,
    keys: Keys,
    since: Instant,
}

impl Carrying<&OwnedCalls> {
    /// The same request, kept past the app's head by the body that will read its
    /// trailers: `owned` is the map this one counts in.
    pub fn kept(self, owned: Arc<OwnedCalls>) -> Carrying<Arc<OwnedCalls>> {
        debug_assert!(std::ptr::eq(self.owned, &*owned));
        // Counted once: what this one would undo as it drops, the kept one undoes.
        let this = ManuallyDrop::new(self);
        Carrying {
            owned,
            keys: this.keys,
            since: this.since,
        }
    }

    /// Whether it carries a key at all: without one nothing is ever marked.
    pub fn keyed(&self) -> bool {
        self.keys.iter().any(Option::is_some)
    }
}

impl<O: Deref<Target = OwnedCalls>> Carrying<O> {
    /// Whether the app's failure for this request is marked `downstream-owned`: a call
    /// made for it was given up on, owned, since it arrived, and no other request in
    /// flight carried its keys meanwhile.
    pub fn marks(&self) -> bool {
        if self.keys.iter().all(Option::is_none) || self.ambiguous() {
            return false;
        }
        self.owned.gave_up_since_keys(self.keys, self.since)
    }

    /// Another request in flight carried one of its keys at some moment of its
    /// lifetime.
    fn ambiguous(&self) -> bool {
        let carried = self.owned.carried.lock().unwrap_or_else(|p| p.into_inner());
        self.keys.iter().flatten().any(|k| {
            carried
                .get(k)
                .and_then(|c| c.shared_at)
                .is_some_and(|at| at >= self.since)
        })
    }
}

impl<O: Deref<Target = OwnedCalls>> Drop for Carrying<O> {
    fn drop(&mut self) {
        if self.keys.iter().all(Option::is_none) {
            return;
        }
        let mut carried = self.owned.carried.lock().unwrap_or_else(|p| p.into_inner());
        for k in self.keys.iter().flatten() {
            if let Some(c) = carried.get_mut(k) {
                c.inflight = c.inflight.saturating_sub(1);
                if c.inflight == 0 {
                    carried.remove(k);
                }
            }
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
/// trailers-only answer; one in the trailers is [`MarkTrailers`]'s). An answer that
/// already says who owns it is left as it is.
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

/// Whether the app's answer to a gRPC call says its status only in its trailers: a gRPC
/// head without `grpc-status`, and without a verdict of its own. Its trailers are where
/// a failure is marked ([`MarkTrailers`]).
pub fn status_in_trailers(status: StatusCode, fields: Fields<'_>, grpc: bool) -> bool {
    grpc && !fields.contains(&GRPC_STATUS)
        && is_grpc_answer(status, fields.get(&http::header::CONTENT_TYPE), false)
        && !fields.contains(&OUTCOME_HEADER)
}

/// An answer's body whose gRPC status comes in its trailers, on its way to the caller:
/// trailers of `UNAVAILABLE` for a request whose call this pod's outbound side gave up
/// on, owned, are marked `downstream-owned` with `grpc-retry-pushback-ms: -1`, as a head
/// would be. The request is counted under its keys until the body ends.
pub struct MarkTrailers<B> {
    inner: B,
    carrying: Option<Carrying<Arc<OwnedCalls>>>,
    marked: prometheus::IntCounter,
}

impl<B> MarkTrailers<B> {
    /// `marked` counts the answers marked (`tollgate_inbound_owned_failures_total`).
    pub fn new(
        inner: B,
        carrying: Carrying<Arc<OwnedCalls>>,
        marked: prometheus::IntCounter,
    ) -> Self {
        MarkTrailers {
            inner,
            carrying: Some(carrying),
            marked,
        }
    }

    fn mark(&mut self, trailers: &mut HeaderMap) {
        let Some(carrying) = self.carrying.take() else {
            return;
        };
        let unavailable = trailers.get(GRPC_STATUS).map(|v| v.as_bytes()) == Some(&b"14"[..]);
        if unavailable && !trailers.contains_key(OUTCOME_HEADER) && carrying.marks() {
            trailers.insert(OUTCOME_HEADER, Outcome::DownstreamOwned.header_value());
            trailers.insert(GRPC_PUSHBACK, NO_RETRY);
            self.marked.inc();
        }
    }
}

impl<B> http_body::Body for MarkTrailers<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match frame {
            Some(Ok(frame)) => match frame.into_trailers() {
                Ok(mut trailers) => {
                    self.mark(&mut trailers);
                    Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => {
                // The end, or a break: no trailers will come, and the request leaves.
                self.carrying = None;
                Poll::Ready(other)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
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

    /// An inbound request with these header fields arrived at `now`: counted under its
    /// keys while the returned value lives.
    pub fn arrive(&self, headers: &HeaderMap, now: Instant) -> Carrying<&OwnedCalls> {
        let keys = self.keys(headers);
        if keys.iter().any(Option::is_some) {
            let mut carried = self.carried.lock().unwrap_or_else(|p| p.into_inner());
            for k in keys.iter().flatten() {
                let c = carried.entry(*k).or_default();
                c.inflight += 1;
                let latest = c.latest.map_or(now, |l| l.max(now));
                c.latest = Some(latest);
                if c.inflight >= 2 {
                    c.shared_at = Some(latest);
                }
            }
        }
        Carrying {
            owned: self,
            keys,
            since: now,
        }
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
    async fn an_id_two_requests_in_flight_carry_at_once_marks_neither() {
        let owned = OwnedCalls::default();
        let id = headers(&[("x-request-id", "shared")]);
        let first = owned.arrive(&id, Instant::now());
        tokio::time::advance(Duration::from_millis(5)).await;
        // A second caller reuses the id while the first is in flight.
        let second = owned.arrive(&id, Instant::now());
        drop(second);
        tokio::time::advance(Duration::from_millis(5)).await;
        owned.gave_up(&id, Instant::now());
        assert!(!first.marks(), "the id was ambiguous during its lifetime");
        drop(first);
        assert!(owned.carried.lock().unwrap().is_empty(), "nothing kept");

        // Alone, one after the other: each is its own.
        let alone = owned.arrive(&id, Instant::now());
        tokio::time::advance(Duration::from_millis(5)).await;
        owned.gave_up(&id, Instant::now());
        assert!(alone.marks());
        drop(alone);
        let none = owned.arrive(&HeaderMap::new(), Instant::now());
        assert!(!none.marks(), "no guessing");
    }

    /// Two requests' arrival moments are taken before the lock: the later moment can
    /// reach it first. Both are still ambiguous.
    #[tokio::test(start_paused = true)]
    async fn an_id_shared_by_requests_whose_arrivals_reach_the_lock_out_of_order_marks_neither() {
        let owned = OwnedCalls::default();
        let id = headers(&[("x-request-id", "shared")]);
        let earlier = Instant::now();
        tokio::time::advance(Duration::from_millis(5)).await;
        let later = owned.arrive(&id, Instant::now());
        let first = owned.arrive(&id, earlier);
        tokio::time::advance(Duration::from_millis(5)).await;
        owned.gave_up(&id, Instant::now());
        assert!(!later.marks(), "the later arrival shared its id");
        assert!(!first.marks(), "the earlier arrival shared its id");
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
