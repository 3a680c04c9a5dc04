//! Idempotency keys on the caller's side: the key minted for a request that has none
//! (`mint_idempotency_key`), and whether an upstream deduplicates keyed requests.
//!
//! A keyed request of a method that is not idempotent may be sent again after a
//! failure that shows it did not run. After one that may have run (a reset, a timeout
//! once its body went), a second copy runs it twice unless the callee deduplicates
//! the key; that is known only from the callee's own answers, which carry
//! `x-tollgate-dedupe: on; header=NAME; scope=…` while its `[inbound.dedupe]` is on,
//! and count only when NAME is this caller's own idempotency header (a callee reading
//! another header sees no key at all). The config alone is never taken for it: a
//! callee may be deployed without dedupe, or lose it. What each endpoint said is
//! remembered apart: a callee that keeps its keys in its own memory
//! (`scope=replica`) can only deduplicate a retry sent back to it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::time::Instant;

use crate::contract::dedupe::{DedupeAdvert, DedupeScope};
use crate::contract::headers::DEDUPE_HEADER;
use crate::http::response::Fields;

/// How long an answer saying `x-tollgate-dedupe: on` is believed.
pub const BELIEVED: Duration = Duration::from_secs(60);

/// Idempotent by RFC 9110 §9.2.2: sent twice, it does what it does once.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Whether `headers` carry a key in `name`: a field that is not empty (an empty one is
/// no key: minting replaces it).
#[inline]
pub fn carries_key(headers: &http::HeaderMap, name: &HeaderName) -> bool {
    headers
        .get_all(name)
        .iter()
        .any(|v| !v.as_bytes().trim_ascii().is_empty())
}

/// A new key: a random (version 4) UUID as a structured-field string, as the draft's
/// examples write it (`"0b6c…"`). `None` only when the system has no randomness to
/// give, and then the request goes without one.
pub fn mint() -> Option<HeaderValue> {
    let mut b = [0u8; 16];
    SystemRandom::new().fill(&mut b).ok()?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = Vec::with_capacity(38);
    out.push(b'"');
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push(b'-');
        }
        out.push(HEX[usize::from(byte >> 4)]);
        out.push(HEX[usize::from(byte & 0x0f)]);
    }
    out.push(b'"');
    HeaderValue::from_bytes(&out).ok()
}

/// What each endpoint's answers last said of its dedupe, and when.
///
/// Its answers are read for it only once it matters: from the first keyed request of a
/// method that is not idempotent (or when the upstream mints keys). An upstream that
/// only ever gets GETs pays one atomic load per answer, not a header lookup.
///
/// Endpoints are remembered by their index, in [`SLOTS`] places; two endpoints that
/// share a place (past 64 endpoints) push each other out, and then neither is
/// believed: a retry after a failure that may have run is refused, never sent to an
/// endpoint nobody vouched for.
#[derive(Debug)]
pub struct Dedupes {
    since: Instant,
    /// Answers are read for `x-tollgate-dedupe`.
    wanted: AtomicBool,
    /// Made when first wanted.
    slots: OnceLock<Box<[Mutex<Option<Said>>]>>,
}

/// How many endpoints are remembered apart.
pub const SLOTS: usize = 64;

/// What an endpoint's answer said.
#[derive(Clone, Copy, Debug)]
struct Said {
    endpoint: usize,
    /// Milliseconds after `since`.
    at: u64,
    scope: DedupeScope,
}

impl Default for Dedupes {
    fn default() -> Self {
        Dedupes {
            since: Instant::now(),
            wanted: AtomicBool::new(false),
            slots: OnceLock::new(),
        }
    }
}

impl Dedupes {
    /// Notes what an answer of `endpoint` says of its dedupe, for keys sent in `own`.
    /// Inlined: an upstream nobody sends keyed requests to pays one load and a branch.
    #[inline]
    pub fn saw(&self, endpoint: usize, fields: Fields<'_>, own: Option<&HeaderName>) {
        if self.wanted.load(Ordering::Relaxed) {
            self.read(endpoint, fields, own);
        }
    }

    #[cold]
    #[inline(never)]
    fn read(&self, endpoint: usize, fields: Fields<'_>, own: Option<&HeaderName>) {
        let scope = match (fields.get(&DEDUPE_HEADER), own) {
            (Some(v), Some(own)) => DedupeAdvert::scope_for(v, own),
            _ => None,
        };
        self.said_at(endpoint, scope, Instant::now());
    }

    /// From now on, answers are read for what they say.
    pub fn want(&self) {
        if !self.wanted.load(Ordering::Relaxed) {
            self.wanted.store(true, Ordering::Relaxed);
        }
    }

    fn slot(&self, endpoint: usize) -> &Mutex<Option<Said>> {
        let slots = self
            .slots
            .get_or_init(|| (0..SLOTS).map(|_| Mutex::new(None)).collect());
        &slots[endpoint % SLOTS]
    }

    /// `scope`: what the answer said (`None`: that it does not deduplicate keys sent in
    /// this caller's header, or said nothing).
    fn said_at(&self, endpoint: usize, scope: Option<DedupeScope>, now: Instant) {
        let slot = self.slot(endpoint);
        let mut said = slot.lock().unwrap_or_else(|p| p.into_inner());
        match scope {
            Some(scope) => {
                *said = Some(Said {
                    endpoint,
                    at: self.at(now),
                    scope,
                })
            }
            // It says no more: forgotten, if it is the one remembered here.
            None if said.is_some_and(|s| s.endpoint == endpoint) => *said = None,
            None => {}
        }
    }

    /// What `endpoint`'s answers said within the last [`BELIEVED`], if they said it
    /// deduplicates.
    pub fn believed(&self, endpoint: usize, now: Instant) -> Option<DedupeScope> {
        let slots = self.slots.get()?;
        let said = *slots[endpoint % SLOTS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        said.filter(|s| s.endpoint == endpoint && self.at(now) < s.at + BELIEVED.as_millis() as u64)
            .map(|s| s.scope)
    }

    fn at(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.since).as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_key_is_a_quoted_version_4_uuid_and_never_the_same() {
        let a = mint().map(|v| v.to_str().map(str::to_string));
        let b = mint().map(|v| v.to_str().map(str::to_string));
        let (Some(Ok(a)), Some(Ok(b))) = (a, b) else {
            panic!("no key minted");
        };
        assert_ne!(a, b);
        assert_eq!(a.len(), 38);
        assert!(a.starts_with('"') && a.ends_with('"'));
        let parts: Vec<&str> = a.trim_matches('"').split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_saying_dedupe_is_believed_for_a_minute_for_its_endpoint() {
        let d = Dedupes::default();
        let own = HeaderName::from_static("idempotency-key");
        let value = |v: &'static str| {
            let mut h = http::HeaderMap::new();
            h.insert(DEDUPE_HEADER, HeaderValue::from_static(v));
            h
        };
        let shared = value("on; header=idempotency-key; scope=shared");
        let now = Instant::now();
        assert_eq!(d.believed(0, now), None);
        d.saw(0, Fields::from(&shared), Some(&own));
        assert_eq!(
            d.believed(0, now),
            None,
            "not read before a keyed request wanted it"
        );
        d.want();
        d.saw(0, Fields::from(&http::HeaderMap::new()), Some(&own));
        assert_eq!(d.believed(0, now), None);
        d.saw(0, Fields::from(&shared), Some(&own));
        assert_eq!(
            d.believed(0, now + Duration::from_secs(59)),
            Some(DedupeScope::Shared)
        );
        assert_eq!(d.believed(0, now + Duration::from_secs(61)), None);
        assert_eq!(d.believed(1, now), None, "another endpoint said nothing");
        assert_eq!(
            d.believed(SLOTS, now),
            None,
            "nor one that shares its place"
        );
        d.said_at(0, Some(DedupeScope::Shared), now + Duration::from_secs(30));
        assert!(d.believed(0, now + Duration::from_secs(89)).is_some());
        assert!(d.believed(0, now + Duration::from_secs(91)).is_none());
        // Another header, a bare `on`, or nothing said: not believed, and forgotten.
        for v in ["on; header=x-idempotency-key; scope=shared", "on"] {
            d.saw(0, Fields::from(&shared), Some(&own));
            d.saw(0, Fields::from(&value(v)), Some(&own));
            assert_eq!(d.believed(0, Instant::now()), None, "{v}");
        }
        // A replica's store is remembered with it.
        let replica = value("on; header=idempotency-key; scope=replica; store=00000000000000ab");
        d.saw(2, Fields::from(&replica), Some(&own));
        let Some(DedupeScope::Replica(id)) = d.believed(2, Instant::now()) else {
            panic!("a replica's dedupe not believed");
        };
        assert_eq!(id.value(), "00000000000000ab");
    }
}
