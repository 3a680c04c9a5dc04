//! The race of a request's attempts in flight: the first attempt and, beside it, at
//! most one hedge, polled side by side in the request's own task, with no task or
//! channel of their own, and the timer that says when the hedge is due.
//!
//! Both live in boxes: the race is run only when a hedge may come, which is rare, and
//! the request's future need not keep room for it. A hedge dropped without having won
//! counts as lost.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Sleep;

use crate::metrics::{HedgeResult, health};

/// What the attempts in flight did.
pub(super) enum Event<T> {
    First(T),
    Hedge(T),
    /// The first attempt has not answered by the hedge delay.
    HedgeDue,
}

/// Polls the attempts in flight, then the hedge timer.
pub(super) fn race<F: Future>(
    cx: &mut Context<'_>,
    first: &mut Option<Pin<Box<F>>>,
    hedge: &mut Option<Hedge<'_, F>>,
    timer: Pin<&mut Option<Sleep>>,
) -> Poll<Event<F::Output>> {
    if let Some(f) = first
        && let Poll::Ready(ran) = f.as_mut().poll(cx)
    {
        return Poll::Ready(Event::First(ran));
    }
    if let Some(h) = hedge
        && let Poll::Ready(ran) = h.attempt.as_mut().poll(cx)
    {
        return Poll::Ready(Event::Hedge(ran));
    }
    if let Some(t) = timer.as_pin_mut()
        && t.poll(cx).is_ready()
    {
        return Poll::Ready(Event::HedgeDue);
    }
    Poll::Pending
}

/// A hedge in flight. Dropped without having won (it failed, or the other attempt
/// answered first and it was cancelled), it counts as lost.
pub(super) struct Hedge<'m, F> {
    pub(super) attempt: Pin<Box<F>>,
    metrics: &'m health::Handles,
    pub(super) won: bool,
}

impl<'m, F> Hedge<'m, F> {
    pub(super) fn new(attempt: F, metrics: &'m health::Handles) -> Self {
        Hedge {
            attempt: Box::pin(attempt),
            metrics,
            won: false,
        }
    }
}

impl<F> Drop for Hedge<'_, F> {
    fn drop(&mut self) {
        self.metrics.hedge(if self.won {
            HedgeResult::Won
        } else {
            HedgeResult::Lost
        });
    }
}
