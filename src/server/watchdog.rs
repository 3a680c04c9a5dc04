//! What the watchdog of a client connection knows, and what it decides. Two limits a
//! server cannot tell apart on its own: a request head must arrive whole within
//! `header_read_timeout` of its first byte (slowloris), while a keep-alive connection
//! with nothing in flight may stay open for `idle_timeout`. Reads and requests update
//! the state with atomics; the connection's task asks for a verdict when its timer
//! fires.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::ListenerConfig;

/// What the watchdog knows of a connection; updated by reads and by requests.
pub struct ConnState {
    epoch: Instant,
    inflight: AtomicU32,
    /// Microseconds since `epoch` (+1) when the first byte of a request head arrived
    /// with nothing in flight; 0 when no head is being read.
    head_started: AtomicU64,
    /// Microseconds since `epoch` when the last request finished.
    idle_since: AtomicU64,
    track_heads: bool,
}

impl ConnState {
    pub(super) fn new(track_heads: bool, epoch: Instant) -> Self {
        ConnState {
            epoch,
            inflight: AtomicU32::new(0),
            head_started: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            track_heads,
        }
    }

    /// A state for requests that did not come over a client connection (tests, lab).
    pub fn detached() -> Arc<Self> {
        Arc::new(Self::new(false, Instant::now()))
    }

    fn micros(&self) -> u64 {
        self.micros_at(Instant::now())
    }

    fn micros_at(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    fn at(&self, micros: u64) -> Instant {
        self.epoch + Duration::from_micros(micros)
    }

    pub fn request_started(&self) {
        self.inflight.fetch_add(1, AcqRel);
        self.head_started.store(0, Release);
    }

    /// A request was answered, `now`.
    pub fn request_finished(&self, now: Instant) {
        if self.inflight.fetch_sub(1, AcqRel) == 1 {
            self.idle_since.store(self.micros_at(now), Release);
        }
    }

    /// The first request head began with the connection's first byte, the epoch.
    pub(super) fn head_began_at_epoch(&self) {
        if self.track_heads {
            self.head_started.store(1, Release);
        }
    }

    pub(super) fn bytes_read(&self) {
        if self.track_heads
            && self.head_started.load(Relaxed) == 0
            && self.inflight.load(Relaxed) == 0
        {
            self.head_started.store(self.micros() + 1, Release);
        }
    }
}

pub(super) enum Verdict {
    /// Nothing to do before this instant.
    Fine(Instant),
    HeadTimeout,
    Idle,
}

pub(super) fn verdict(state: &ConnState, settings: &ListenerConfig) -> Verdict {
    let now = Instant::now();
    let head = state.head_started.load(Acquire);
    if head != 0 {
        let by = state.at(head - 1) + settings.header_read_timeout;
        return if now >= by {
            Verdict::HeadTimeout
        } else {
            Verdict::Fine(by)
        };
    }
    if state.inflight.load(Acquire) == 0 {
        let by = state.at(state.idle_since.load(Acquire)) + settings.idle_timeout;
        return if now >= by {
            Verdict::Idle
        } else {
            Verdict::Fine(by)
        };
    }
    Verdict::Fine(now + settings.idle_timeout)
}
