//! The race of a request's attempts in flight: the first attempt and, beside it, at
//! most one more (a hedge, or a retry started beside an attempt past its attempt
//! timeout), polled side by side in the request's own task, with no task or channel of
//! their own, and the timer that says when the next one is due.
//!
//! Both live in boxes: the race is run only when a second attempt may come (hedging or
//! an attempt timeout configured), and the request's future need not keep room for it.
//! A hedge dropped without having won counts as lost.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Sleep;

use crate::metrics::{HedgeResult, health};

/// What the attempts in flight did.
pub(super) enum Event<T> {
    First(T),
    Second(T),
    /// The timer went off: what it was set for is due.
    Due,
}

/// Why a second attempt runs beside the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Beside {
    /// The first had not answered by the hedge delay: charged to `max_extra`.
    Hedge,
    /// The first ran past its attempt timeout: a retry, charged to the retry budget.
    Retry,
}

/// Polls the attempts in flight, then the timer.
pub(super) fn race<F: Future>(
    cx: &mut Context<'_>,
    first: &mut Option<Pin<Box<F>>>,
    second: &mut Option<Second<'_, F>>,
    timer: Pin<&mut Option<Sleep>>,
) -> Poll<Event<F::Output>> {
    if let Some(f) = first
        && let Poll::Ready(ran) = f.as_mut().poll(cx)
    {
        return Poll::Ready(Event::First(ran));
    }
    if let Some(s) = second
        && let Poll::Ready(ran) = s.attempt.as_mut().poll(cx)
    {
        return Poll::Ready(Event::Second(ran));
    }
    if let Some(t) = timer.as_pin_mut()
        && t.poll(cx).is_ready()
    {
        return Poll::Ready(Event::Due);
    }
    Poll::Pending
}

/// The attempt beside the first. A hedge dropped without having won (it failed, or the
/// other attempt answered first and it was cancelled) counts as lost.
pub(super) struct Second<'m, F> {
    pub(super) attempt: Pin<Box<F>>,
    pub(super) kind: Beside,
    metrics: &'m health::Handles,
    pub(super) won: bool,
}

impl<'m, F> Second<'m, F> {
    pub(super) fn new(attempt: F, kind: Beside, metrics: &'m health::Handles) -> Self {
        Second {
            attempt: Box::pin(attempt),
            kind,
            metrics,
            won: false,
        }
    }
}

impl<F> Drop for Second<'_, F> {
    fn drop(&mut self) {
        if self.kind == Beside::Hedge {
            self.metrics.hedge(if self.won {
                HedgeResult::Won
            } else {
                HedgeResult::Lost
            });
        }
    }
}
