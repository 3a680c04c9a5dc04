//! The attempt loop: one request in, one answer out, with every retry tollgate makes on
//! the app's behalf in between, and the attempt beside a slow one.
//!
//! Each turn picks an endpoint (a different one after a failure), starts an [`Attempt`]
//! and waits for it, until the request's deadline if it has one, else for as long as it
//! takes: tollgate never cuts off a healthy answer the app would have waited for. A
//! request that may be sent again gets at most one attempt beside a slow one, on another
//! endpoint: a hedge when it has not answered by the hedge delay ([`Hedging`], charged to
//! `max_extra`), or a retry once it has run past `attempt_timeout` (charged to the retry
//! budget and `max_attempts`). The slow attempt is not abandoned: it may still be the one
//! that answers. The first answer that is neither a failure `retry.on` lists nor
//! `retry-rejected` wins, and the other attempt is dropped at once (its HTTP/1.1
//! connection closed, its HTTP/2 stream reset; a slow one dropped so counts as a
//! `timeout`); a failure that comes while the other attempt still runs is put aside.
//! When the last attempt in flight has failed, [`Policy::decide`] either names the
//! reason to stop or grants a retry from the budget with a full-jitter sleep. The app's
//! body across attempts is the [`BodySource`]'s to keep. When the caller leaves or the
//! deadline passes, the future is dropped: every attempt in flight is cancelled and its
//! connection closed, never returned to the pool.
//!
//! The two attempts are polled side by side in this task, with no task or channel of
//! their own, each in a box (hedging and attempt timeouts are configured for few
//! upstreams). An attempt that can get nothing beside it (neither configured, or no
//! attempt left to ask for), nearly every attempt, is simply awaited in this future.
//!
//! What each attempt showed goes to the parts that learn from the upstream
//! ([`learn`]) and, for a traced request, to its spans (`traced.rs`); the failure a retry
//! retries is kept while it runs, in case the callee refuses the retry (`rejected.rs`).
//!
//! Beside the loop, in this folder: what it takes and gives back ([`handoff`]), the
//! answers it makes (`answers.rs`), one attempt ([`attempt`]) on a [`Transport`], the
//! real one ([`transport`]) or, in the loop's tests, a script, the app's body sent
//! again ([`replay`]), and the race of two attempts in flight (`race.rs`).
//!
//! [`Hedging`]: crate::retry::decide::hedge::Hedging

mod answers;
pub mod attempt;
pub mod handoff;
mod race;
mod rejected;
pub mod replay;
#[cfg(test)]
pub mod script;
#[cfg(test)]
mod tests;
mod traced;
pub mod transport;

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode};
use http_body::Body;
use tokio::time::{Instant, Sleep};

use crate::contract::dedupe::{DedupeScope, StoreId};
use crate::contract::headers::DEDUPE_STORE_HEADER;
use crate::contract::outcome::{Callee, refused_as_retry};
use crate::deadline::Deadline;
use crate::fault::Fault;
use crate::http::response::Fields;
use crate::metrics::{Denied, HedgeResult, Outcome};
use crate::retry::decide::backoff::Backoff;
use crate::retry::decide::policy::{self, Policy, Situation, Stop};
use crate::retry::evidence::keys;
use crate::retry::learn::{self, Seen};
use crate::retry::upstream::Upstream;
use crate::upstream::pool::{Endpoint, Want};
use crate::upstream::request::RareFields;
use crate::upstream::response::UpstreamResponse;
use crate::upstream::want;
use attempt::Transport;
use attempt::{Attempt, Head, Ran, TRACEPARENT_NAME};
use handoff::{Answer, Exchange, HedgeState, Reply, Trail};
use race::{Beside, Event, Second, race};
use rejected::Previous;
use replay::{BodySource, ReplayBody, RetriedBody};
use traced::{Starting, Traced};

/// `x-tollgate-dedupe-store`, borrowed by the attempts that carry it.
static DEDUPE_STORE_NAME: HeaderName = DEDUPE_STORE_HEADER;

/// The most endpoints one attempt tries when their connects are refused.
const WALK: u8 = 3;
/// How long a body still arriving when a retryable failure came may take to finish.
const BODY_GRACE: Duration = Duration::from_millis(50);
/// How long a body not sent at all (the endpoint refused at `Expect: 100-continue`)
/// may take to arrive, once tollgate asks the app for it to retry.
const EXPECT_GRACE: Duration = Duration::from_secs(1);

/// Whether, and how, a request may be sent again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Never: one attempt allowed, an upgrade, or a method neither listed nor keyed.
    Never,
    /// A listed method, or a keyed idempotent one: retried and hedged as the policy
    /// allows.
    Freely,
    /// Keyed, of a method that is not idempotent (listed in `methods` or not: nothing
    /// is taken on trust from the config alone): never hedged, no retry beside it (at a
    /// callee that deduplicates, a second copy would only join the first), and after a
    /// failure that may have run, sent again only to an upstream whose answers say it
    /// deduplicates.
    WhereDeduped,
    /// Whatever it was: the callee refused a retry of it (`retry-rejected`) while another
    /// attempt still ran, so no attempt follows that one, and if it fails, the request
    /// ends with the refusal's failure.
    Refused,
}

impl Resend {
    /// Whether the request may, at least in some cases, be sent again.
    fn ever(self) -> bool {
        !matches!(self, Resend::Never | Resend::Refused)
    }
}

/// One request on its way through its attempts.
struct Forwarding<'a, A> {
    up: &'a Upstream<A>,
    deadline: Deadline,
    grpc: bool,
    upgrade: bool,
    want: Want,
    resend: Resend,
    minted: Option<Box<HeaderValue>>,
    /// After a failure that may have run on an endpoint whose dedupe is its replica's
    /// own: that endpoint and its store, where every later attempt goes (and names the
    /// store), since only there is the key known.
    stuck: Option<(usize, StoreId)>,
    body: BodySource<A>,
    /// Attempts started (hedges included).
    attempts: u32,
    /// When the request arrived.
    arrived: Instant,
    trail: Trail,
    /// The endpoint that failed last (its number).
    avoid: Option<usize>,
    /// Endpoints (by index, the first 64) whose TLS failed for this request: a
    /// verification failure is not retried on the same endpoint.
    tls_failed: u64,
    /// What the last attempt's failure had to say (rare; a box is two words, a string
    /// three).
    detail: Option<Box<str>>,
    rng: Option<fastrand::Rng>,
    /// The request's hedge: one per request.
    hedge: HedgeState,
    /// The app's own retry: numbered from 2, one attempt only.
    app_retry: bool,
    /// The failure the attempt in flight retries.
    previous: Option<Previous>,
    /// The endpoint the attempt in flight moves to after a refused connect, and how
    /// many endpoints it has moved past ([`Forwarding::walk`]).
    walk_to: Option<Arc<Endpoint<ReplayBody<A>>>>,
    walked: u8,
    /// Whether any attempt got a connection: `upstream-unreachable` only when none did.
    connected: bool,
    traced: Traced<'a>,
}

/// Forwards `ex` to `up`, retrying and hedging as the policy allows.
pub async fn forward<'a, A: RetriedBody>(up: &'a Upstream<A>, ex: Exchange<'a, A>) -> Answer {
    forward_on(up, up, ex).await
}

/// [`forward`], each attempt carried by `wire` (the upstream's endpoints, or a script).
pub async fn forward_on<'a, A: RetriedBody, T: Transport<A>>(
    up: &'a Upstream<A>,
    wire: &T,
    ex: Exchange<'a, A>,
) -> Answer {
    let head = ex.head;
    let mut call = Forwarding::new(up, ex);
    if let Some(h) = &up.hedge {
        h.record_request(call.arrived);
    }
    let mut first = None;
    let mut second: Option<Second<'_, _>> = None;
    let mut timer = pin!(None::<Sleep>);
    loop {
        // The first attempt starts as the request arrived (a few microseconds ago):
        // no clock read of its own.
        let now = if call.attempts == 0 {
            call.arrived
        } else {
            Instant::now()
        };
        if call.deadline.expired(now) {
            up.metrics().denied(Denied::Deadline);
            call.trail.denied = Some(Denied::Deadline);
            call.traced.refused(Some(Denied::Deadline));
            return call.local(StatusCode::GATEWAY_TIMEOUT, Outcome::DeadlineExceeded);
        }
        // No endpoint at all: a Service without a ready pod, as a direct call to it
        // fails.
        let walking = call.walk_to.take();
        let Some(endpoint) = walking.or_else(|| call.pick(call.avoid)) else {
            return call.local(StatusCode::BAD_GATEWAY, Outcome::UpstreamUnreachable);
        };
        call.attempts += 1;
        let endpoint_id = endpoint.id;
        let keep = if call.resend.ever() && call.attempts < call.limit() {
            up.config.retry.max_body
        } else {
            0
        };
        // An attempt that can get nothing beside it runs alone: awaited where it is
        // made, rather than moved into the race's slot. (In a block of its own, so that
        // the request's future keeps no room for it across the awaits.)
        let mut due = None;
        let mut alone = {
            let body = call.body.take(keep);
            let attempt = call.attempt(head, endpoint, None, body, now);
            match call.next_due(&attempt) {
                Some((at, what)) => {
                    timer.set(Some(tokio::time::sleep_until(at)));
                    due = Some((what, attempt.started));
                    first = Some(Box::pin(attempt.run(wire)));
                    None
                }
                None => Some(attempt),
            }
        };
        // Until an answer, or until every attempt in flight has failed.
        let (failure, response, failed_on) = loop {
            let event = match alone.take() {
                Some(attempt) => Event::First(attempt.run(wire).await),
                None => {
                    std::future::poll_fn(|cx| race(cx, &mut first, &mut second, timer.as_mut()))
                        .await
                }
            };
            // Each arm judges its own result: no tuple to move it through.
            let mut finished = None;
            let step = match event {
                Event::Due => {
                    timer.set(None);
                    let Some((what, started)) = due.take() else {
                        continue;
                    };
                    if let Some(a) = call.beside(head, endpoint_id, what) {
                        second = Some(Second::new(a.run(wire), what, &up.metrics().health));
                    } else if what == Beside::Hedge
                        && let Some(at) = call.slow_at(started)
                    {
                        // No hedge: the attempt may still get a retry beside it once it
                        // is slow.
                        timer.set(Some(tokio::time::sleep_until(at)));
                        due = Some((Beside::Retry, started));
                    }
                    continue;
                }
                Event::First(ran) => {
                    first = None;
                    call.judge(ran, Slot::First, second.is_some())
                }
                Event::Second(ran) => {
                    finished = second.take();
                    call.judge(ran, Slot::Second, first.is_some())
                }
            };
            match step {
                Step::Answer(answer) => {
                    call.traced.answered();
                    if let Some(mut s) = finished {
                        s.won = matches!(answer.reply, Reply::Upstream(_));
                    }
                    return answer;
                }
                Step::Wait => {}
                Step::Failed(f, resp, on) => break (f, resp, on),
            }
        };
        // Every attempt in flight has ended: what was due for them is not.
        timer.set(None);
        if call.resend == Resend::Refused {
            return call.give_up(Stop::Rejected, failure, response);
        }
        if failure == Fault::ConnectFailure && call.walk(failed_on) {
            continue;
        }
        call.walked = 0;
        if failure == Fault::Tls
            && call.tls_failed.count_ones() as usize >= up.endpoints.len().min(64)
        {
            return call.give_up(Stop::NoOtherEndpoint, failure, None);
        }
        match call.decide(failure, response.as_ref(), failed_on).await {
            Ok(sleep) => {
                call.traced.retried(sleep, response.as_ref());
                up.metrics().retried(failure.condition());
                call.trail.retried(failure);
                call.previous = None;
                let kept = rejected::keep_while_sleeping(response, failure, sleep).await;
                call.previous = Some(kept);
                call.avoid = Some(failed_on);
            }
            Err(stop) => return call.give_up(stop, failure, response),
        }
    }
}

/// Which of the race's two places an attempt ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// The attempt that started alone: its body is the request's own.
    First,
    /// A hedge or a retry beside it: its body is a copy.
    Second,
}

/// What a finished attempt means for the request.
enum Step {
    /// The answer for the app; whatever else is in flight is dropped.
    Answer(Answer),
    /// Put aside: another attempt is still running.
    Wait,
    /// The last attempt in flight failed (on this endpoint), with the response when
    /// there was one.
    Failed(Fault, Option<UpstreamResponse>, usize),
}

impl<'a, A: RetriedBody> Forwarding<'a, A> {
    fn new(up: &'a Upstream<A>, ex: Exchange<'a, A>) -> Self {
        let retry = &up.config.retry;
        // An upgrade changes the connection for good once it is answered: never sent
        // twice.
        let listed = retry.method_allowed(&ex.head.method);
        let idempotent = keys::is_idempotent(&ex.head.method);
        // A key changes nothing for a listed idempotent method (a GET): not looked for.
        // An empty key is no key.
        let keyed = (!listed || !idempotent)
            && (ex.minted.is_some()
                || retry
                    .idempotency_header
                    .as_ref()
                    .is_some_and(|h| keys::carries_key(&ex.head.headers, h)));
        let keyed_once = keyed && !idempotent;
        if keyed_once {
            up.dedupes.want();
        }
        let resend = match (
            retry.max_attempts > 1 && !ex.upgrade && (listed || keyed),
            keyed_once,
        ) {
            (false, _) => Resend::Never,
            (true, false) => Resend::Freely,
            (true, true) => Resend::WhereDeduped,
        };
        Forwarding {
            resend,
            minted: ex.minted,
            stuck: None,
            up,
            want: if ex.upgrade {
                Want::Http1
            } else {
                want(&up.config, ex.version)
            },
            deadline: ex.deadline,
            grpc: ex.grpc,
            upgrade: ex.upgrade,
            body: BodySource::new(ex.body),
            attempts: 0,
            arrived: ex.arrived,
            trail: Trail::default(),
            avoid: None,
            tls_failed: 0,
            detail: None,
            rng: None,
            hedge: HedgeState::NotAsked,
            app_retry: ex.app_retry,
            previous: None,
            walk_to: None,
            walked: 0,
            connected: false,
            traced: Traced::new(ex.trace),
        }
    }

    /// After a refused connect on endpoint `failed_on` (the request never left), whether
    /// the same attempt moves on to another endpoint at once, as a client that tries the
    /// addresses of a name in turn does (RFC 8305): no retry, no backoff, nothing from
    /// the budget, and at most [`WALK`] endpoints per attempt. The refusal counted
    /// against its endpoint already (its skip timer, its health). Not for a request held
    /// to one endpoint (its key is known only there), nor where no other endpoint is.
    fn walk(&mut self, failed_on: usize) -> bool {
        if self.walked + 1 >= WALK || self.stuck.is_some() || !self.body.at_hand() {
            return false;
        }
        let Some(next) = self.up.endpoints.pick(Some(failed_on)) else {
            return false;
        };
        if next.id == failed_on || self.tls_failed & (1 << (next.id % 64)) != 0 {
            return false;
        }
        self.walked += 1;
        self.attempts -= 1;
        self.walk_to = Some(next);
        true
    }

    /// The number of the attempt in flight as sent upstream: an app's own retry is
    /// already the second.
    fn number(&self) -> u32 {
        self.attempts + u32::from(self.app_retry)
    }

    /// The attempts this request may make: one for an app's own retry.
    fn limit(&self) -> u32 {
        if self.app_retry {
            1
        } else {
            self.up.config.retry.max_attempts
        }
    }

    /// The retry policy of the upstream, as it stands now.
    fn policy(&self) -> Policy<'a> {
        let retry = &self.up.config.retry;
        Policy {
            retry,
            backoff: Backoff::from(&retry.backoff),
            budget: &self.up.budget,
            median: self.up.median.get(),
        }
    }

    /// The attempts made, as the policy counts them: an app's own retry has used them
    /// all, so it is not retried again.
    fn attempts_used(&self) -> u32 {
        self.attempts
            + self
                .up
                .config
                .retry
                .max_attempts
                .saturating_sub(self.limit())
    }

    /// Tells what the attempt just ended showed to the parts that learn from it.
    fn learn(&self, number: u32, failure: Option<Fault>, resp: Option<&UpstreamResponse>) {
        if !learn::listening(self.up) {
            return;
        }
        let seen = Seen {
            number,
            failure,
            response: resp.map(|r| (r.status(), Fields::of(r))),
        };
        learn::attempt_done(self.up, &seen, Instant::now());
    }

    /// An endpoint for the next attempt: round-robin, away from `avoid` and from any
    /// whose TLS failed for this request.
    #[inline]
    fn pick(&self, avoid: Option<usize>) -> Option<Arc<Endpoint<ReplayBody<A>>>> {
        if let Some((endpoint, _)) = self.stuck {
            // Gone (the pod was removed): nowhere the key is known.
            return self.up.endpoints.by_id(endpoint);
        }
        let endpoints = &self.up.endpoints;
        let mut e = endpoints.pick(avoid)?;
        if self.tls_failed != 0 {
            for _ in 0..endpoints.len() {
                if self.tls_failed & (1 << (e.id % 64)) == 0 {
                    break;
                }
                e = endpoints.pick(avoid)?;
            }
        }
        Some(e)
    }

    /// Attempt number `self.attempts` on `endpoint`, starting at `started` (now);
    /// `beside`: why it runs beside another attempt, if it does.
    fn attempt<'h>(
        &mut self,
        head: &'h Head,
        endpoint: Arc<Endpoint<ReplayBody<A>>>,
        beside: Option<Beside>,
        body: ReplayBody<A>,
        started: Instant,
    ) -> Attempt<'h, A>
    where
        'a: 'h,
    {
        // An app's own retry is a retry: counted in the budget's retries, not as a
        // request. An attempt moved past a refused connect was counted already.
        if self.walked == 0 {
            if self.attempts == 1 && !self.app_retry {
                self.up.budget.record_first_attempt(started);
            } else {
                self.up.budget.record_attempt(started);
            }
        }
        let traceparent = if self.traced.on() {
            let starting = Starting {
                number: self.number(),
                hedge: beside == Some(Beside::Hedge),
                beside: beside.is_some(),
                endpoint: &endpoint,
                reason: self.trail.retries().last(),
                deadline: self.deadline,
            };
            self.traced.start(starting, started)
        } else {
            None
        };
        // A retry that comes back to the endpoint that just failed it goes on a
        // connection of its own: behind a Service's virtual IP, the pooled one reaches
        // the same pod, a new one lets kube-proxy pick again.
        let own_connection = self.avoid == Some(endpoint.id) && self.attempts > 1;
        self.trail
            .went_to(endpoint.id, self.attempts <= 1 && self.walked == 0);
        Attempt {
            up: self.up,
            endpoint: endpoint.id,
            peer: endpoint,
            own_connection,
            held: self.stuck.is_some(),
            number: self.number(),
            hedge: beside == Some(Beside::Hedge),
            want: self.want,
            started,
            by: self.deadline.at(),
            slow_after: self.up.config.attempt_timeout,
            grpc_deadline: self.deadline.caller_at().filter(|_| self.grpc),
            head,
            body,
            rare: self.rare_fields(traceparent),
        }
    }

    /// The rare fields of an attempt carrying `traceparent` (when traced): the minted
    /// key, it, and the store a retry goes back to; `None` (nothing allocated) without
    /// any.
    #[inline]
    fn rare_fields(&self, traceparent: Option<HeaderValue>) -> Option<Box<RareFields<'a>>> {
        if self.minted.is_none() && traceparent.is_none() && self.stuck.is_none() {
            return None;
        }
        let minted = self.minted.as_ref().and_then(|v| {
            let name = self.up.config.retry.idempotency_header.as_ref()?;
            Some((name, HeaderValue::clone(v)))
        });
        Some(Box::new([
            minted,
            traceparent.map(|v| (&TRACEPARENT_NAME, v)),
            self.stuck.map(|(_, id)| (&DEDUPE_STORE_NAME, id.value())),
        ]))
    }

    /// Whether another attempt may ever run beside this one: the request may be sent
    /// again and has an attempt left.
    fn may_add(&self) -> bool {
        self.resend == Resend::Freely && self.attempts < self.limit()
    }

    /// Whether the request may be sent again after a failure on `endpoint` that may
    /// have run it (`maybe_ran`) or showed it did not: a keyed request of a method that
    /// is not idempotent, after a failure that may have run, only when that
    /// endpoint deduplicates its key (its answers said so within
    /// the last minute, naming this caller's idempotency header). Where it keeps its keys
    /// in its own memory (`scope=replica`), only back to that endpoint, which then takes
    /// every later attempt; an upstream of one address (a Service VIP: the next
    /// connection may reach another pod) is never sent it.
    fn may_resend(&mut self, maybe_ran: bool, endpoint: usize, now: Instant) -> bool {
        match self.resend {
            Resend::Never | Resend::Refused => return false,
            Resend::Freely => return true,
            Resend::WhereDeduped if !maybe_ran => return true,
            Resend::WhereDeduped => {}
        }
        if self.stuck.is_some_and(|(e, _)| e != endpoint) {
            return false;
        }
        match self.up.dedupes.believed(endpoint, now) {
            None => false,
            Some(DedupeScope::Shared) => self.stuck.is_none(),
            Some(DedupeScope::Replica(id)) => {
                let ok = self.up.endpoints.len() > 1 && self.up.endpoints.by_id(endpoint).is_some();
                if ok {
                    self.stuck = Some((endpoint, id));
                }
                ok
            }
        }
    }

    /// When `attempt` may get a second attempt beside it if it has not answered, and
    /// which: a hedge at the hedge delay, else a retry once it has run past its attempt
    /// timeout. `None` when it can get neither, and then it runs alone.
    fn next_due(&self, attempt: &Attempt<'_, A>) -> Option<(Instant, Beside)> {
        if !self.may_add() {
            return None;
        }
        let before_deadline = |at: Instant| attempt.by.is_none_or(|by| at < by);
        let slow = self.slow_at(attempt.started);
        let hedge = self
            .up
            .hedge
            .as_ref()
            .filter(|_| self.hedge == HedgeState::NotAsked)
            .and_then(|h| h.delay())
            .map(|d| attempt.started + d)
            .filter(|at| before_deadline(*at) && slow.is_none_or(|s| *at < s));
        match (hedge, slow) {
            (Some(h), _) => Some((h, Beside::Hedge)),
            (None, Some(s)) => Some((s, Beside::Retry)),
            (None, None) => None,
        }
    }

    /// When an attempt started at `started` runs past its attempt timeout, if a retry
    /// beside it may then be asked for (timeouts listed in `retry.on`, time left).
    fn slow_at(&self, started: Instant) -> Option<Instant> {
        let t = self.up.config.attempt_timeout?;
        if !self.up.config.retry.on.timeout || !self.may_add() {
            return None;
        }
        let at = started + t;
        self.deadline.at().is_none_or(|by| at < by).then_some(at)
    }

    /// The second attempt beside the one on `endpoint`, now that it is due: sent only
    /// with the whole body in hand (it must not read ahead of the attempt still sending
    /// it), and with room in `max_extra` for a hedge, in the retry budget for a retry.
    fn beside<'h>(&mut self, head: &'h Head, endpoint: usize, why: Beside) -> Option<Attempt<'h, A>>
    where
        'a: 'h,
    {
        let now = Instant::now();
        if self.deadline.expired(now) || !self.may_add() {
            return None;
        }
        match why {
            Beside::Hedge => {
                let h = self.up.hedge.as_ref()?;
                let body = self.body.fork()?;
                let endpoint = self.pick(Some(endpoint))?;
                if !h.try_hedge(now) {
                    self.hedge = HedgeState::Denied;
                    self.up.metrics().health.hedge(HedgeResult::Denied);
                    return None;
                }
                self.hedge = HedgeState::Sent;
                self.attempts += 1;
                Some(self.attempt(head, endpoint, Some(why), body, now))
            }
            Beside::Retry => {
                let body = self.body.fork()?;
                let endpoint = self.pick(Some(endpoint))?;
                let policy = self.policy();
                let situation = Situation {
                    failure: Fault::Timeout,
                    response: None,
                    owned: false,
                    attempts: self.attempts_used(),
                    request_retryable: self.resend.ever(),
                    deadline: self.deadline,
                    now,
                };
                if let Err(stop) = policy.decide_beside(&situation) {
                    if let Some(d) = stop.denied() {
                        self.up.metrics().denied(d);
                        self.trail.denied = Some(d);
                    }
                    return None;
                }
                self.up.metrics().retried(Fault::Timeout.condition());
                self.trail.retried(Fault::Timeout);
                self.attempts += 1;
                Some(self.attempt(head, endpoint, Some(why), body, now))
            }
        }
    }

    /// What a finished attempt means: the answer, a failure to decide on, or, while
    /// `others` are in flight, a failure (or a `retry-rejected`) put aside.
    fn judge(&mut self, ran: Ran<A>, slot: Slot, others: bool) -> Step {
        if let Some(from) = ran.moved_from {
            self.trail.moved(from, ran.endpoint);
        }
        self.traced.ended(self.up, &ran, slot == Slot::Second);
        if let Some(unsent) = ran.unsent.filter(|_| slot == Slot::First) {
            self.body.give_back(unsent);
        }
        self.detail = ran.detail.map(String::into_boxed_str);
        let (failure, response) = match ran.result {
            Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS && !self.upgrade => {
                // A switch nobody asked for: the connection speaks something else now,
                // and is closed with the response.
                drop(resp);
                let mut answer = self.local(StatusCode::BAD_GATEWAY, Outcome::NotRetryable);
                answer.detail = Some("the upstream switched protocols unasked (101)\n".into());
                return Step::Answer(answer);
            }
            Ok(resp) => {
                let on = &self.up.config.retry.on;
                let fields = Fields::of(&resp);
                let own = self.up.config.retry.idempotency_header.as_ref();
                self.up.dedupes.saw(ran.endpoint, fields, own);
                let callee = ran.callee;
                let failure = policy::classify_response(resp.status(), fields, callee, on);
                self.learn(ran.number, failure, Some(&resp));
                if ran.number > 1 && refused_as_retry(resp.status(), fields) {
                    if others {
                        // Put aside; but the callee will take no more retries of this
                        // request, so if the other attempt fails, that is the end.
                        self.resend = Resend::Refused;
                        discard(resp);
                        return Step::Wait;
                    }
                    return Step::Answer(self.rejected(resp));
                }
                match failure {
                    Some(f) => (f, Some(resp)),
                    None => return Step::Answer(self.answer(resp, Outcome::Ok, callee)),
                }
            }
            Err(f) if f.is_peers() => {
                self.learn(ran.number, Some(f), None);
                (f, None)
            }
            Err(f) if others && f.attempt_result().is_none() => {
                // Never got a connection: not an attempt.
                self.attempts -= 1;
                return Step::Wait;
            }
            Err(f) => return Step::Answer(self.not_the_peers(f)),
        };
        self.connected |= response.is_some() || !failure.unreachable();
        if failure == Fault::Tls {
            self.tls_failed |= 1 << (ran.endpoint % 64);
        }
        if others {
            if let Some(resp) = response {
                discard(resp);
            }
            return Step::Wait;
        }
        Step::Failed(failure, response, ran.endpoint)
    }

    /// Whether the failure of the last attempt is retried: `Ok(sleep)` with the budget
    /// already spent, or why not.
    async fn decide(
        &mut self,
        failure: Fault,
        response: Option<&UpstreamResponse>,
        failed_on: usize,
    ) -> Result<Duration, Stop> {
        let retry = &self.up.config.retry;
        // The response came while the app's body was still arriving (an upstream that
        // refuses a call without reading it): give the rest a moment to arrive (the
        // backoff before the retry, at least `BODY_GRACE`), so it can be replayed.
        if self.body.recorded()
            && failure.maybe_sent()
            && self.resend.ever()
            && self.attempts < self.limit()
        {
            let grace = if self.body.started() {
                BODY_GRACE
            } else {
                EXPECT_GRACE
            };
            let wait = retry.backoff.cap(self.attempts - 1).max(grace);
            let wait = self
                .deadline
                .remaining(Instant::now())
                .map_or(wait, |left| wait.min(left / 2));
            self.body.finish_within(wait).await;
        }
        let now = Instant::now();
        if failure == Fault::Timeout && self.deadline.expired(now) {
            return Err(Stop::Deadline);
        }
        let policy = self.policy();
        let callee = response.map(|r| Callee::of(r.status(), Fields::of(r)));
        // A callee's app that refused the connection did not run it (`ran=no`).
        let maybe_ran = !failure.did_not_run() && !callee.is_some_and(Callee::did_not_run);
        let situation = Situation {
            failure,
            response: response.map(|r| Fields::of(r)),
            owned: callee.is_some_and(Callee::owned),
            attempts: self.attempts_used(),
            request_retryable: self.may_resend(maybe_ran, failed_on, now),
            deadline: self.deadline,
            now,
        };
        let rng = self.rng.get_or_insert_with(fastrand::Rng::new);
        policy.decide(&situation, &mut self.body, rng)
    }
}

/// Drops a failed response that will be retried. A small complete body is read in the
/// background so its HTTP/1.1 connection can be reused: during an incident the same
/// upstream is asked again within milliseconds, and a fresh connection per failure
/// would add a handshake to every retry.
fn discard(resp: UpstreamResponse) {
    let body = match resp.into_body() {
        crate::http::ByProtocol::Http1(b) => b,
        crate::http::ByProtocol::Http2(_) => return,
    };
    // A body already at its end has released its connection.
    if body.is_end_stream() {
        return;
    }
    if body.size_hint().exact().is_some_and(|n| n <= 64 * 1024) {
        tokio::spawn(async move {
            use http_body_util::BodyExt;
            // Read to the end, the body releases its connection itself.
            let _ = tokio::time::timeout(Duration::from_secs(1), body.collect()).await;
        });
    }
}
