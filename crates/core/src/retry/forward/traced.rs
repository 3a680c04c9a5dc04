//! What the attempt loop tells a traced request's spans ([`crate::trace`]): each
//! attempt's CLIENT span as it starts (with the `traceparent` it carries upstream) and
//! ends, the decision after a failure (retried, or refused and by what, with the budget
//! left), and the backoff sleeps. A request that is not traced has no trace here, and
//! every call returns at its first line.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::HeaderValue;
use http::header::RETRY_AFTER;
use tokio::time::Instant;

use crate::deadline::Deadline;
use crate::fault::Fault;
use crate::http::grpc::GRPC_PUSHBACK;
use crate::http::response::Fields;
use crate::metrics::{Denied, Outcome};
use crate::retry::forward::attempt::Ran;
use crate::retry::forward::replay::ReplayBody;
use crate::retry::upstream::Upstream;
use crate::trace::{AfterFailure, AttemptEnd, AttemptId, AttemptStart, RequestTrace};
use crate::upstream::pool::Endpoint;
use crate::upstream::response::UpstreamResponse;

/// A request's trace, as the loop fills it in: boxed, so that a request that is not
/// traced (nearly every one) carries a word for it.
pub(super) struct Traced<'t>(Option<Box<State<'t>>>);

struct State<'t> {
    trace: &'t mut RequestTrace,
    /// The spans of the attempts in the race's two places (alone or first; beside).
    slots: [Option<AttemptId>; 2],
    /// The attempt whose failure is being decided on.
    last: Option<AttemptId>,
    /// What the retry budget would grant as that attempt ended, before the decision
    /// spends from it.
    available: Option<f64>,
}

/// An attempt about to start, as the loop knows it.
pub(super) struct Starting<'e, A> {
    pub number: u32,
    pub hedge: bool,
    /// It runs beside another attempt.
    pub beside: bool,
    pub endpoint: &'e Endpoint<ReplayBody<A>>,
    /// The condition the retry retries, for a retry.
    pub reason: Option<Fault>,
    pub deadline: Deadline,
}

impl<'t> Traced<'t> {
    pub fn new(trace: Option<&'t mut RequestTrace>) -> Self {
        Traced(trace.map(|trace| {
            Box::new(State {
                trace,
                slots: [None; 2],
                last: None,
                available: None,
            })
        }))
    }

    /// The request is traced.
    #[inline]
    pub fn on(&self) -> bool {
        self.0.is_some()
    }

    /// A CLIENT span for the attempt starting `now`: the `traceparent` it carries.
    pub fn start<A>(&mut self, a: Starting<'_, A>, now: Instant) -> Option<HeaderValue> {
        let s = self.0.as_deref_mut()?;
        let start = AttemptStart {
            number: a.number,
            hedge: a.hedge,
            endpoint: address(a.endpoint),
            reason: a.reason.filter(|_| !a.hedge),
            deadline_left: a.deadline.remaining(now),
        };
        let id = s.trace.attempt(start, now);
        s.slots[usize::from(a.beside)] = Some(id);
        Some(s.trace.attempt_traceparent(id))
    }

    /// The attempt in place `beside` (or not) ended as `ran` says.
    pub fn ended<A>(&mut self, up: &Upstream<A>, ran: &Ran<A>, beside: bool) {
        let Some(s) = self.0.as_deref_mut() else {
            return;
        };
        let Some(id) = s.slots[usize::from(beside)] else {
            return;
        };
        let (status, fault, callee_outcome) = match &ran.result {
            Ok(resp) => {
                let status = resp.status();
                let outcome = crate::contract::outcome::outcome_of(status, Fields::of(resp));
                (
                    Some(status.as_u16()),
                    None,
                    (outcome != Outcome::Ok).then_some(outcome),
                )
            }
            Err(f) => (None, Some(*f), None),
        };
        let end = AttemptEnd {
            status,
            fault,
            callee_outcome,
            ejected: ran.ejected,
        };
        let now = Instant::now();
        if ran.moved_from.is_some() {
            let carried = up.endpoints.by_id(ran.endpoint);
            s.trace
                .attempt_moved(id, carried.as_deref().and_then(address));
        }
        s.trace.attempt_ended(id, end, now);
        s.last = Some(id);
        s.available = up.config.budget.as_ref().map(|_| up.budget.available(now));
    }

    /// The last failure is retried after `sleep`; `response` is the failed answer, if
    /// one came (its `Retry-After` or gRPC pushback set the sleep).
    pub fn retried(&mut self, sleep: Duration, response: Option<&UpstreamResponse>) {
        let Some(s) = self.0.as_deref_mut() else {
            return;
        };
        s.decided(None);
        let asked = response.is_some_and(|r| {
            let f = Fields::of(r);
            f.contains(&RETRY_AFTER) || f.contains(&GRPC_PUSHBACK)
        });
        s.trace.backoff(sleep, asked, Instant::now());
    }

    /// The last failure is not retried: refused by `denied`, or given up on for a
    /// reason that is not a refusal (`None`: not retryable, owned elsewhere).
    pub fn refused(&mut self, denied: Option<Denied>) {
        if let Some(s) = self.0.as_deref_mut() {
            s.decided(denied);
        }
    }

    /// The request has its answer: what still runs beside it is cancelled.
    pub fn answered(&mut self) {
        if let Some(s) = self.0.as_deref_mut() {
            s.trace.cancel_open(Instant::now());
        }
    }
}

impl State<'_> {
    fn decided(&mut self, denied: Option<Denied>) {
        let Some(id) = self.last else {
            return;
        };
        let after = AfterFailure {
            denied,
            budget_available: self.available,
        };
        self.trace.after_failure(id, after);
    }
}

/// The address of `endpoint`, when it is one (not a name).
fn address<A>(endpoint: &Endpoint<ReplayBody<A>>) -> Option<SocketAddr> {
    let addr = &endpoint.addr;
    let ip = addr.host.parse::<IpAddr>().ok()?;
    Some(SocketAddr::new(ip, addr.port))
}
