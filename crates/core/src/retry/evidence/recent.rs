//! The failures tollgate owned in the last [`REMEMBER`], per upstream, by fingerprint
//! (a request's method, authority and target with the identity of its call or of the
//! app's incoming request): what lets it see the app retrying behind its back.
//!
//! # The bound
//!
//! A fixed table of [`ENTRIES`] slots of two words (64 KiB per upstream), made at the
//! first failure remembered and never grown. A fingerprint has [`PROBE`] slots it may
//! live in; a new one takes a free or expired slot among them, else the oldest. So
//! under more distinct failures than the table holds within two seconds, the oldest
//! are forgotten first, and some app retries go unseen; a request is never taken for
//! a retry it is not (but for a collision of 64-bit fingerprints).
//!
//! # Cost
//!
//! Nothing is read while no failure was recorded in the last two seconds: one atomic
//! load says so. Recording and looking up are a few atomic loads and stores, no lock.
//! Fingerprints are keyed with a random key per table, so what an app sends cannot
//! aim at one slot.

use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::Duration;

use tokio::time::Instant;

/// How long a failure is remembered.
pub const REMEMBER: Duration = Duration::from_secs(2);
/// Slots in one upstream's table.
pub const ENTRIES: usize = 4096;
/// Slots one fingerprint may live in.
pub const PROBE: usize = 4;

// The value word: when (ms since the table's origin, plus 1) | HTTP status | gRPC
// code plus 1 | a tag of the fingerprint, to tell a value from a slot being rewritten.
const TIME_BITS: u32 = 36;
const STATUS_SHIFT: u32 = TIME_BITS;
const CODE_SHIFT: u32 = STATUS_SHIFT + 10;
const TAG_SHIFT: u32 = CODE_SHIFT + 5;

#[derive(Default)]
struct Entry {
    key: AtomicU64,
    value: AtomicU64,
}

/// What the app was answered, remembered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remembered {
    /// The HTTP status of the answer.
    pub status: u16,
    /// For a gRPC call, the `grpc-status` of the answer.
    pub grpc: Option<u8>,
}

pub struct RecentFailures {
    origin: Instant,
    keys: RandomState,
    table: OnceLock<Box<[Entry]>>,
    /// When the newest failure was recorded (ms since origin, plus 1); 0: never.
    newest: AtomicU64,
}

impl std::fmt::Debug for RecentFailures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecentFailures")
            .field("newest", &self.newest.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl RecentFailures {
    pub fn new(now: Instant) -> Self {
        RecentFailures {
            origin: now,
            keys: RandomState::new(),
            table: OnceLock::new(),
            newest: AtomicU64::new(0),
        }
    }

    /// The fingerprint of what identifies a request (never 0).
    pub fn fingerprint(&self, what: impl Hash) -> u64 {
        self.keys.hash_one(what).max(1)
    }

    /// Milliseconds since the origin, plus 1 (so 0 means "never").
    fn stamp(&self, now: Instant) -> u64 {
        let ms = now.saturating_duration_since(self.origin).as_millis();
        (u64::try_from(ms).unwrap_or(u64::MAX) + 1).min((1 << TIME_BITS) - 1)
    }

    fn fresh(&self, stamp: u64, now: Instant) -> bool {
        stamp != 0 && self.stamp(now).saturating_sub(stamp) < REMEMBER.as_millis() as u64
    }

    /// Whether any failure was recorded within [`REMEMBER`]: when not, nothing needs to
    /// be looked up.
    pub fn active(&self, now: Instant) -> bool {
        self.fresh(self.newest.load(Relaxed), now)
    }

    fn slots(&self, fingerprint: u64) -> Option<impl Iterator<Item = &Entry>> {
        let table = self.table.get()?;
        let first = (fingerprint as usize) % ENTRIES;
        Some((0..PROBE).map(move |i| &table[(first + i) % ENTRIES]))
    }

    /// The failure remembered for `fingerprint`, if it is fresh.
    pub fn lookup(&self, fingerprint: u64, now: Instant) -> Option<Remembered> {
        if !self.active(now) {
            return None;
        }
        for e in self.slots(fingerprint)? {
            if e.key.load(Acquire) != fingerprint {
                continue;
            }
            let v = e.value.load(Acquire);
            if v >> TAG_SHIFT == fingerprint >> TAG_SHIFT && self.fresh(v & time_mask(), now) {
                let code = ((v >> CODE_SHIFT) & 0x1f) as u8;
                return Some(Remembered {
                    status: ((v >> STATUS_SHIFT) & 0x3ff) as u16,
                    grpc: code.checked_sub(1),
                });
            }
        }
        None
    }

    /// Remembers that the request `fingerprint` was answered with a failure tollgate
    /// owned.
    pub fn record(&self, fingerprint: u64, answer: Remembered, now: Instant) {
        let stamp = self.stamp(now);
        let table = self
            .table
            .get_or_init(|| (0..ENTRIES).map(|_| Entry::default()).collect());
        let first = (fingerprint as usize) % ENTRIES;
        let probe = (0..PROBE).map(|i| &table[(first + i) % ENTRIES]);
        // Its own slot, else a free or expired one, else the oldest.
        let mut best: Option<(&Entry, u64)> = None;
        for e in probe {
            let at = e.value.load(Relaxed) & time_mask();
            if e.key.load(Relaxed) == fingerprint {
                best = Some((e, 0));
                break;
            }
            let age = if self.fresh(at, now) { at } else { 0 };
            if best.is_none_or(|(_, b)| age < b) {
                best = Some((e, age));
            }
        }
        if let Some((e, _)) = best {
            let code = answer.grpc.map_or(0, |c| u64::from(c.min(30)) + 1);
            let value = (fingerprint >> TAG_SHIFT) << TAG_SHIFT
                | code << CODE_SHIFT
                | u64::from(answer.status.min(999)) << STATUS_SHIFT
                | stamp;
            e.key.store(fingerprint, Release);
            e.value.store(value, Release);
        }
        self.newest.fetch_max(stamp, Relaxed);
    }

    /// The request `fingerprint` succeeded: it is no longer a failure to retry.
    pub fn forget(&self, fingerprint: u64) {
        let Some(slots) = self.slots(fingerprint) else {
            return;
        };
        for e in slots {
            if e.key.load(Acquire) == fingerprint {
                e.value.store(0, Release);
            }
        }
    }
}

fn time_mask() -> u64 {
    (1 << TIME_BITS) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAILED: Remembered = Remembered {
        status: 503,
        grpc: None,
    };

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_remembered_for_two_seconds() {
        let r = RecentFailures::new(Instant::now());
        let fp = r.fingerprint(("GET", "api", "/x", None::<&[u8]>));
        assert!(!r.active(Instant::now()));
        assert_eq!(r.lookup(fp, Instant::now()), None);
        r.record(fp, FAILED, Instant::now());
        assert!(r.active(Instant::now()));
        assert_eq!(r.lookup(fp, Instant::now()), Some(FAILED));
        let other = r.fingerprint(("GET", "api", "/y", None::<&[u8]>));
        assert_eq!(r.lookup(other, Instant::now()), None);
        tokio::time::advance(Duration::from_millis(1_990)).await;
        assert_eq!(r.lookup(fp, Instant::now()), Some(FAILED));
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(r.lookup(fp, Instant::now()), None);
        assert!(!r.active(Instant::now()), "nothing to look at any more");
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_is_kept_and_a_success_forgets_it() {
        let r = RecentFailures::new(Instant::now());
        let fp = r.fingerprint("a");
        let grpc = Remembered {
            status: 200,
            grpc: Some(14),
        };
        r.record(fp, grpc, Instant::now());
        assert_eq!(r.lookup(fp, Instant::now()), Some(grpc));
        r.forget(fp);
        assert_eq!(r.lookup(fp, Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_never_grows_and_forgets_the_oldest_first() {
        let r = RecentFailures::new(Instant::now());
        let fps: Vec<u64> = (0..3 * ENTRIES).map(|i| r.fingerprint(i)).collect();
        for fp in &fps {
            r.record(*fp, FAILED, Instant::now());
            tokio::time::advance(Duration::from_micros(100)).await;
        }
        let now = Instant::now();
        let remembered = fps
            .iter()
            .filter(|fp| r.lookup(**fp, now).is_some())
            .count();
        assert!(remembered <= ENTRIES, "{remembered}");
        let newest = fps[2 * ENTRIES..]
            .iter()
            .filter(|fp| r.lookup(**fp, now).is_some())
            .count();
        let oldest = fps[..ENTRIES]
            .iter()
            .filter(|fp| r.lookup(**fp, now).is_some())
            .count();
        // Full, the table keeps the newest: most of the last ENTRIES, few of the first.
        assert!(
            newest > ENTRIES * 3 / 4,
            "{newest} of the newest remembered"
        );
        assert!(oldest < ENTRIES / 10, "{oldest} of the oldest remembered");
        assert_eq!(r.table.get().map(|t| t.len()), Some(ENTRIES));
    }
}
