//! The admin port's connections, bounded: at most [`ADMIN_CONNECTIONS`] at once (their
//! descriptors are reserved apart from the listener's, `crate::descriptors`), so a noisy
//! neighbour cannot fail the kubelet's probes. When all places are taken, a new
//! connection takes the place of the one idle longest (no request in flight: a
//! connection that has sent nothing, or half a head, is idle); when none is idle, the
//! new one is closed at once. An idle connection is closed after [`IDLE`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub use crate::descriptors::ADMIN_CONNECTIONS;

/// How long a connection with nothing in flight is kept.
pub const IDLE: Duration = Duration::from_secs(30);
/// How long a request head may take to arrive whole.
pub const HEAD: Duration = Duration::from_secs(5);

/// One admitted connection's state, shared with the registry.
pub struct Slot {
    busy: AtomicUsize,
    idle_since: Mutex<Instant>,
    evicted: AtomicBool,
    /// Woken when the connection is to close: evicted, or the admin port stopping.
    pub close: Notify,
}

/// A request in flight on a connection, until it is answered or dropped.
pub struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl Slot {
    /// A request of this connection began: in flight while the value lives.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.begin();
        Busy(self.clone())
    }

    fn begin(&self) {
        self.busy.fetch_add(1, Relaxed);
    }

    fn end(&self) {
        *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.busy.fetch_sub(1, Relaxed);
    }

    /// Since when it has had nothing in flight; `None` while a request is.
    pub fn idle_since(&self) -> Option<Instant> {
        if self.busy.load(Relaxed) > 0 {
            return None;
        }
        Some(*self.idle_since.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The connections the admin port holds.
#[derive(Default)]
pub struct Conns {
    open: Mutex<Vec<Arc<Slot>>>,
}

impl Conns {
    /// A place for a new connection: taken from the connection idle longest when all
    /// are taken; `None` when every one has a request in flight.
    pub fn admit(self: &Arc<Self>) -> Option<Held> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let counted = open.iter().filter(|s| !s.evicted.load(Relaxed)).count();
        if counted >= ADMIN_CONNECTIONS {
            let oldest = open
                .iter()
                .filter(|s| !s.evicted.load(Relaxed))
                .filter_map(|s| s.idle_since().map(|at| (at, s)))
                .min_by_key(|(at, _)| *at)
                .map(|(_, s)| s.clone())?;
            oldest.evicted.store(true, Relaxed);
            oldest.close.notify_one();
        }
        let slot = Arc::new(Slot {
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            evicted: AtomicBool::new(false),
            close: Notify::new(),
        });
        open.push(slot.clone());
        Some(Held {
            conns: self.clone(),
            slot,
        })
    }

    /// Connections open (evicted ones still closing included).
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A connection's place, given back when it closes.
pub struct Held {
    conns: Arc<Conns>,
    pub slot: Arc<Slot>,
}

impl Held {
    /// Resolves when the connection is to close: evicted, or idle for [`IDLE`].
    pub async fn closing(&self) {
        loop {
            let wake = match self.slot.idle_since() {
                Some(at) if at.elapsed() >= IDLE => return,
                Some(at) => at + IDLE,
                None => Instant::now() + IDLE,
            };
            tokio::select! {
                _ = self.slot.close.notified() => return,
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.conns.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|s| !Arc::ptr_eq(s, &self.slot));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_admin_port_evicts_the_longest_idle_and_refuses_when_all_are_busy() {
        let conns = Arc::new(Conns::default());
        let mut held: Vec<Held> = (0..ADMIN_CONNECTIONS)
            .map(|_| conns.admit().unwrap_or_else(|| unreachable!()))
            .collect();
        // All idle: the next takes the place of the first.
        let next = conns.admit();
        assert!(next.is_some());
        assert!(held[0].slot.evicted.load(Relaxed));
        drop(held.remove(0));
        assert_eq!(conns.open(), ADMIN_CONNECTIONS);
        // All busy: refused.
        for h in &held {
            h.slot.begin();
        }
        if let Some(n) = &next {
            n.slot.begin();
        }
        assert!(conns.admit().is_none());
    }
}
