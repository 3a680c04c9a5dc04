//! Idempotency keys on the caller's side: the key minted for a request that has none
//! (`mint_idempotency_key`), and whether an upstream deduplicates keyed requests.
//!
//! A keyed request of a method that is not idempotent may be sent again after a
//! failure that shows it did not run. After one that may have run (a reset, a timeout
//! once its body went), a second copy runs it twice unless the callee deduplicates;
//! that is known only from the callee's own answers, which carry
//! `x-tollgate-dedupe: on` while its `[inbound.dedupe]` is on. The config alone is
//! never taken for it: a callee may be deployed without dedupe, or lose it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderValue, Method};
use ring::rand::{SecureRandom, SystemRandom};
use tokio::time::Instant;

use super::headers::DEDUPE_HEADER;
use crate::upstream::response::Fields;

/// How long an answer saying `x-tollgate-dedupe: on` is believed.
pub const BELIEVED: Duration = Duration::from_secs(60);

/// Idempotent by RFC 9110 §9.2.2: sent twice, it does what it does once.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
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

/// When an upstream's answer last said it deduplicates.
///
/// Its answers are read for it only once it matters: from the first keyed request of a
/// method that is not idempotent (or when the upstream mints keys). An upstream that
/// only ever gets GETs pays one atomic load per answer, not a header lookup.
#[derive(Debug)]
pub struct Dedupes {
    since: Instant,
    /// Milliseconds after `since` of the last such answer, plus one; 0: never.
    last: AtomicU64,
    /// Answers are read for `x-tollgate-dedupe`.
    wanted: AtomicBool,
}

impl Default for Dedupes {
    fn default() -> Self {
        Dedupes {
            since: Instant::now(),
            last: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
        }
    }
}

impl Dedupes {
    /// Notes an answer's say, if it has one (the clock is read only then). Inlined: an
    /// upstream nobody sends keyed requests to pays one load and a branch.
    #[inline]
    pub fn saw(&self, fields: Fields<'_>) {
        if self.wanted.load(Ordering::Relaxed) {
            self.read(fields);
        }
    }

    #[cold]
    #[inline(never)]
    fn read(&self, fields: Fields<'_>) {
        if fields.get(&DEDUPE_HEADER) == Some(b"on") {
            self.saw_at(Instant::now());
        }
    }

    /// From now on, answers are read for what they say.
    pub fn want(&self) {
        if !self.wanted.load(Ordering::Relaxed) {
            self.wanted.store(true, Ordering::Relaxed);
        }
    }

    fn saw_at(&self, now: Instant) {
        self.last.store(self.at(now), Ordering::Relaxed);
    }

    /// Whether an answer said so within the last [`BELIEVED`].
    pub fn believed(&self, now: Instant) -> bool {
        let last = self.last.load(Ordering::Relaxed);
        last != 0 && self.at(now) < last + BELIEVED.as_millis() as u64
    }

    fn at(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.since).as_millis() as u64 + 1
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
    async fn an_answer_saying_dedupe_is_believed_for_a_minute() {
        let d = Dedupes::default();
        let mut on = http::HeaderMap::new();
        on.insert(DEDUPE_HEADER, HeaderValue::from_static("on"));
        let now = Instant::now();
        assert!(!d.believed(now));
        d.saw(Fields::from(&on));
        assert!(
            !d.believed(now),
            "not read before a keyed request wanted it"
        );
        d.want();
        d.saw(Fields::from(&http::HeaderMap::new()));
        assert!(!d.believed(now));
        d.saw(Fields::from(&on));
        assert!(d.believed(now + Duration::from_secs(59)));
        assert!(!d.believed(now + Duration::from_secs(61)));
        d.saw_at(now + Duration::from_secs(30));
        assert!(d.believed(now + Duration::from_secs(89)));
        assert!(!d.believed(now + Duration::from_secs(91)));
    }
}
