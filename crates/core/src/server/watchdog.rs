//! What the watchdog of a client connection knows, and what it decides. Two limits a
//! server cannot tell apart on its own: a request head must arrive whole within
//! `header_read_timeout` of its first byte (slowloris), while a keep-alive connection
//! with nothing in flight may stay open for `idle_timeout`. Reads and requests update
//! the state with atomics; the connection's task asks what the watchdog finds when its
//! timer fires.
//!
//! The same allocation carries what the connection's task shares with its drain and its
//! timer: whether it is asked to close, and the waker of its timer and shutdown signal
//! ([`Wake`]). One allocation per connection rather than three: a connection's task
//! touches all of it on every wake-up, and at thousands of connections each separate
//! allocation is one more cache line fetched per wake-up.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::ListenerConfig;

/// What the watchdog knows of a connection; updated by reads and by requests.
pub struct ConnState {
    epoch: Instant,
    /// The client's address.
    peer: std::net::IpAddr,
    inflight: AtomicU32,
    /// Microseconds since `epoch` (+1) when the first byte of a request head arrived
    /// with nothing in flight; 0 when no head is being read.
    head_started: AtomicU64,
    /// Microseconds since `epoch` when the last request finished.
    idle_since: AtomicU64,
    track_heads: bool,
    /// Close after the response in flight, or at once when idle (drain, idle timeout).
    closing: AtomicBool,
    /// The shutdown signal or the watchdog's timer woke the task since it last looked.
    side_fired: AtomicBool,
    /// The connection's task, woken when they fire.
    task: Mutex<Option<Waker>>,
}

impl ConnState {
    /// The client's address (the caller, on the inbound side).
    pub fn peer(&self) -> std::net::IpAddr {
        self.peer
    }

    /// A connection from `peer`, for the tests of the services.
    #[cfg(test)]
    pub fn for_tests(peer: std::net::IpAddr) -> Self {
        ConnState::new(false, Instant::now(), peer)
    }

    pub(super) fn new(track_heads: bool, epoch: Instant, peer: std::net::IpAddr) -> Self {
        ConnState {
            epoch,
            peer,
            inflight: AtomicU32::new(0),
            head_started: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            track_heads,
            closing: AtomicBool::new(false),
            side_fired: AtomicBool::new(false),
            task: Mutex::new(None),
        }
    }

    /// Asks the connection to close after the response in flight, or at once when idle.
    pub(super) fn close_gracefully(&self) {
        self.closing.store(true, Release);
    }

    /// Whether the connection was asked to close.
    pub(super) fn closing(&self) -> bool {
        self.closing.load(Acquire)
    }

    /// The task to wake when the shutdown signal or the watchdog's timer fires.
    pub(super) fn set_task(&self, waker: &Waker) {
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker.clone());
    }

    /// Whether the shutdown signal or the timer fired since the last call; clears it.
    pub(super) fn take_side_fired(&self) -> bool {
        self.side_fired.swap(false, AcqRel)
    }

    /// Makes the next [`Self::take_side_fired`] true: the signal and the timer are to be
    /// polled (once, to register their wakers).
    pub(super) fn mark_side_fired(&self) {
        self.side_fired.store(true, Release);
    }

    /// A state for requests that did not come over a client connection (tests, lab).
    pub fn detached() -> Arc<Self> {
        Arc::new(Self::new(
            false,
            Instant::now(),
            std::net::Ipv4Addr::LOCALHOST.into(),
        ))
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

/// The waker of the shutdown signal and the watchdog's timer: notes that one of them
/// fired, then wakes the connection's task.
impl Wake for ConnState {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.mark_side_fired();
        if let Some(w) = self.task.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            w.wake_by_ref();
        }
    }
}

pub(super) enum Finding {
    /// Nothing to do before this instant.
    Fine(Instant),
    HeadTimeout,
    Idle,
}

pub(super) fn inspect(state: &ConnState, settings: &ListenerConfig) -> Finding {
    let now = Instant::now();
    let head = state.head_started.load(Acquire);
    if head != 0 {
        let by = state.at(head - 1) + settings.header_read_timeout;
        return if now >= by {
            Finding::HeadTimeout
        } else {
            Finding::Fine(by)
        };
    }
    if state.inflight.load(Acquire) == 0 {
        let by = state.at(state.idle_since.load(Acquire)) + settings.idle_timeout;
        return if now >= by {
            Finding::Idle
        } else {
            Finding::Fine(by)
        };
    }
    Finding::Fine(now + settings.idle_timeout)
}
