//! The clock of a sliding window cut into slots, shared by the retry budget and the
//! throttle: which slot an instant falls in, and moving the window forward.
//!
//! Counting into the current slot is a relaxed atomic add, done by the owner. Only
//! when the clock enters a new slot is a lock taken, so that exactly one caller retires
//! the slots that fall out of the window (at most once a slot, whatever the traffic);
//! everyone else reads the head and goes on.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::Duration;

use tokio::time::Instant;

pub(in crate::retry) struct SlotClock {
    origin: Instant,
    slot_nanos: u64,
    /// The newest slot the window has been moved to.
    head: AtomicU64,
    rotate: Mutex<()>,
}

impl SlotClock {
    /// A window of `window` cut into `slots` slots, starting at `now`.
    pub(in crate::retry) fn new(window: Duration, slots: u64, now: Instant) -> Self {
        let nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        SlotClock {
            origin: now,
            slot_nanos: (nanos / slots).max(1),
            head: AtomicU64::new(0),
            rotate: Mutex::new(()),
        }
    }

    fn slot_of(&self, now: Instant) -> u64 {
        let nanos = u64::try_from(now.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX);
        nanos / self.slot_nanos
    }

    /// Moves the window to `now`; returns the current slot. When that is a new one,
    /// `retire(head, slot)` runs first, under the lock, to empty what the slots
    /// `head + 1 ..= slot` push out of the window.
    pub(in crate::retry) fn advance(&self, now: Instant, retire: impl FnOnce(u64, u64)) -> u64 {
        let slot = self.slot_of(now);
        let head = self.head.load(Acquire);
        if slot <= head {
            return head;
        }
        let _guard = self.rotate.lock().unwrap_or_else(|p| p.into_inner());
        let head = self.head.load(Acquire);
        if slot <= head {
            return head;
        }
        retire(head, slot);
        self.head.store(slot, Release);
        slot
    }

    /// Runs `f` under the lock that retiring slots takes, with the current slot (which
    /// cannot move while `f` runs). The window must already be at `now`.
    pub(in crate::retry) fn exclusive<T>(&self, f: impl FnOnce(u64) -> T) -> T {
        let _guard = self.rotate.lock().unwrap_or_else(|p| p.into_inner());
        f(self.head.load(Acquire))
    }
}
