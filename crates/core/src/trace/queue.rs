//! The export queue between the request path and the exporter's thread: bounded in
//! spans, never blocking, and counting what it drops.
//!
//! A request hands its spans over once, when it ends: one counter add and one push on
//! a lock-free channel. Past `[tracing] queue` spans waiting, the spans are dropped and
//! counted (`queue-full`) instead: a collector that is slow or down costs traces,
//! never a request's time or tollgate's memory. The exporter is woken when a batch is
//! ready (once per batch, not per request); otherwise it wakes on its own timer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc};

use crate::metrics::trace::{SpanDrop, TraceDrops};

/// What the queue carries: a request's spans, counted as the spans they are.
pub(super) trait Counted {
    fn count(&self) -> usize;
}

/// The request path's end: every traced request holds one (an `Arc`).
pub(super) struct Queue<T> {
    tx: mpsc::UnboundedSender<Box<T>>,
    shared: Arc<Shared>,
    capacity: usize,
    batch: usize,
    pub drops: TraceDrops,
}

/// The exporter's end. When every [`Queue`] is gone, what is left is taken and then
/// [`Taker::take`] says so.
pub(super) struct Taker<T> {
    rx: mpsc::UnboundedReceiver<Box<T>>,
    shared: Arc<Shared>,
}

struct Shared {
    /// Spans handed over and not yet taken by the exporter.
    waiting: AtomicUsize,
    /// A batch is ready.
    ready: Notify,
}

pub(super) fn queue<T>(
    capacity: usize,
    batch: usize,
    drops: TraceDrops,
) -> (Arc<Queue<T>>, Taker<T>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        waiting: AtomicUsize::new(0),
        ready: Notify::new(),
    });
    let queue = Queue {
        tx,
        shared: shared.clone(),
        capacity,
        batch: batch.max(1),
        drops,
    };
    (Arc::new(queue), Taker { rx, shared })
}

impl<T: Counted> Queue<T> {
    /// Hands a request's spans to the exporter, or drops and counts them when the queue
    /// is full. Never waits.
    pub fn push(&self, spans: Box<T>) {
        let n = spans.count();
        let before = self.shared.waiting.fetch_add(n, Ordering::Relaxed);
        if before + n > self.capacity {
            self.shared.waiting.fetch_sub(n, Ordering::Relaxed);
            self.drops.dropped(SpanDrop::QueueFull, n);
            return;
        }
        if self.tx.send(spans).is_err() {
            // The exporter is gone (its thread could not start): nothing will take them.
            self.shared.waiting.fetch_sub(n, Ordering::Relaxed);
            self.drops.dropped(SpanDrop::ExportFailed, n);
            return;
        }
        if before < self.batch && before + n >= self.batch {
            self.shared.ready.notify_one();
        }
    }

    /// Spans waiting now.
    pub fn waiting(&self) -> usize {
        self.shared.waiting.load(Ordering::Relaxed)
    }
}

/// What [`Taker::take`] found.
pub(super) enum Taken<T> {
    Spans(Box<T>),
    /// Nothing waiting now.
    Empty,
    /// Nothing waiting, and nothing ever will: every [`Queue`] is gone.
    Closed,
}

impl<T: Counted> Taker<T> {
    pub fn take(&mut self) -> Taken<T> {
        match self.rx.try_recv() {
            Ok(spans) => {
                self.shared
                    .waiting
                    .fetch_sub(spans.count(), Ordering::Relaxed);
                Taken::Spans(spans)
            }
            Err(mpsc::error::TryRecvError::Empty) => Taken::Empty,
            Err(mpsc::error::TryRecvError::Disconnected) => Taken::Closed,
        }
    }

    /// Waits until a batch is ready or `timer` ends, whichever comes first.
    pub async fn ready(&self, timer: tokio::time::Sleep) {
        tokio::select! {
            _ = self.shared.ready.notified() => {}
            _ = timer => {}
        }
    }

    /// Spans waiting now.
    pub fn waiting(&self) -> usize {
        self.shared.waiting.load(Ordering::Relaxed)
    }
}
