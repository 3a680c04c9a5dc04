//! The answers the loop gives: the upstream's, the one that ends the request when a
//! retry is refused or there is none left, and tollgate's own. `Forwarding::finish` is
//! the one way an [`Answer`] is made.

use http::StatusCode;

use super::{Forwarding, discard};
use crate::contract::outcome::Callee;
use crate::fault::Fault;
use crate::http::response::Fields;
use crate::metrics::{Denied, Outcome};
use crate::retry::decide::policy::Stop;
use crate::retry::forward::handoff::{Answer, BodyRead, Reply};
use crate::retry::forward::rejected::Previous;
use crate::retry::forward::replay::RetriedBody;
use crate::upstream::response::UpstreamResponse;

impl<'a, A: RetriedBody> Forwarding<'a, A> {
    /// The callee refused this retry: no further attempt, and the app gets the failure
    /// the retry retried, with outcome `retry-rejected`.
    pub(super) fn rejected(&mut self, refusal: UpstreamResponse) -> Answer {
        let Some(previous) = self.previous.take() else {
            let callee = Callee::of(refusal.status(), Fields::of(&refusal));
            return self.answer(refusal, Outcome::Ok, callee);
        };
        discard(refusal);
        self.up.metrics().denied(Denied::UpstreamRejected);
        let failure = previous.failure();
        let mut answer = match previous {
            Previous::Response(resp, _) => {
                let callee = Callee::of(resp.status(), Fields::of(&resp));
                self.answer(resp, Outcome::RetryRejected, callee)
            }
            Previous::Fault(f) => self.local(f.status(), Outcome::RetryRejected),
        };
        answer.outcome = Outcome::RetryRejected;
        answer.callee = Callee::Silent;
        answer.failure = Some(failure);
        answer
    }

    /// The answer for the app, of this request as it stands: the one way an [`Answer`]
    /// is made.
    pub(super) fn finish(
        &mut self,
        reply: Reply,
        outcome: Outcome,
        failure: Option<Fault>,
        callee: Callee,
    ) -> Answer {
        Answer {
            reply,
            trail: std::mem::take(&mut self.trail),
            attempts: self.attempts,
            outcome,
            failure,
            detail: None,
            callee,
            // An empty body is read whole before anything was taken from it.
            body: if !self.body.unread() {
                BodyRead::Whole
            } else if !self.body.started() {
                BodyRead::Untouched
            } else {
                BodyRead::Partly
            },
            hedge: self.hedge,
        }
    }

    /// The upstream's response goes back: a success, a failure that another tollgate
    /// already owned, or one that a callee's outcome (`callee`) names and this tollgate
    /// does not retry.
    pub(super) fn answer(
        &mut self,
        resp: UpstreamResponse,
        outcome: Outcome,
        callee: Callee,
    ) -> Answer {
        let outcome = match callee {
            Callee::Silent | Callee::Stray => outcome,
            c => c.outcome(),
        };
        self.finish(Reply::Upstream(resp), outcome, None, callee)
    }

    /// No more attempts: the last failure goes back, the upstream's own response or
    /// tollgate's own answer for the fault (502, 504).
    pub(super) fn give_up(
        &mut self,
        stop: Stop,
        failure: Fault,
        response: Option<UpstreamResponse>,
    ) -> Answer {
        self.traced.refused(stop.denied());
        if let Some(d) = stop.denied() {
            self.up.metrics().denied(d);
            self.trail.denied = Some(d);
        }
        let outcome = stop.outcome_after(failure, self.connected);
        match response {
            Some(resp) if stop == Stop::Ownership => {
                let callee = Callee::of(resp.status(), Fields::of(&resp));
                self.answer(resp, Outcome::Ok, callee)
            }
            Some(resp) => self.finish(
                Reply::Upstream(resp),
                outcome,
                Some(failure),
                Callee::Silent,
            ),
            None => {
                // Stopped by the deadline, the answer says so whatever the fault was.
                let status = if outcome == Outcome::DeadlineExceeded {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    failure.status()
                };
                let mut answer = self.local(status, outcome);
                answer.failure = Some(failure);
                answer.detail = self.detail.take().map(String::from);
                answer
            }
        }
    }

    /// The attempt ended by a fault that was not the upstream's ([`Fault::whose`]):
    /// nothing more is tried, and the fault says the answer. A malformed body is the
    /// app's (400); a descriptor shortage is tollgate's own overload (503), and the
    /// attempt that never got a connection is not counted.
    pub(super) fn not_the_peers(&mut self, fault: Fault) -> Answer {
        if fault.attempt_result().is_none() {
            self.attempts -= 1;
        }
        let outcome = fault.outcome().unwrap_or(Outcome::NotRetryable);
        self.local(fault.status(), outcome)
    }

    /// tollgate answers itself.
    pub(super) fn local(&mut self, status: StatusCode, outcome: Outcome) -> Answer {
        self.finish(Reply::Local(status), outcome, None, Callee::Silent)
    }
}
