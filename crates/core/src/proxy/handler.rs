//! The outbound service: one request from the app, start to finish. Route it, admit it,
//! fix its deadline, clean its headers, hand it to the retry engine, and dress the
//! answer with what the app must know (`x-tollgate-attempts`, and
//! `x-tollgate-outcome` when tollgate gave up). A gRPC call's answers are gRPC
//! answers ([`crate::answer`]). A first attempt may be rejected locally by the upstream's
//! throttle, and a request with evidence that the app repeats a call is its own retry
//! ([`super::app_retries`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::AcqRel;

use http::header::{CONTENT_TYPE, HOST};
use http::uri::Authority;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use tokio::time::Instant;

use super::app_retries::{self, AppRetry, RequestEnd, Sameness};
use super::{Shared, Upstream, unrouted};
use crate::access_log::{Direction, Entry};
use crate::answer::{
    self as grpc, EXPIRED, Local, NO_DESCRIPTORS, NO_ROUTE, OUTBOUND_CONNECT, Refusal, THROTTLED,
    UPSTREAM_OVERLOADED, announce_close,
};
use crate::config::{AccessLogConfig, UnknownAuthorities};
use crate::contract::headers::{
    ATTEMPTS_HEADER, OUTCOME_HEADER, OUTCOME_REMOVED_LINE, attempts_line, count_value, outcome_line,
};
use crate::contract::outcome::Callee;
use crate::deadline::Deadline;
use crate::http::fields::authority_of;
use crate::http::grpc::{GRPC_PUSHBACK, GRPC_STATUS, is_grpc, is_grpc_answer};
use crate::http::spare;
use crate::metrics::{Denied, Outcome};
use crate::retry::{self, Answer, BodyRead, Exchange, Head, Reply, learn};
use crate::served::{Served, Uncounted};
use crate::server::headers::{RequestFacts, prepare_request};
use crate::server::service::{AppRequest, AppResponse};
use crate::server::{
    AddedFields, Admission, AppBody, ConnState, RequestGuard, ResponseBody, Service,
};
use crate::trace::{Arrival, RequestTrace, Side, Tracer};
use crate::upstream::response::relayed;

/// The app's outbound requests, routed to upstreams by authority, or all to one
/// upstream on its dedicated `listen` port; each upstream's attempts carried by `wire`.
#[derive(Clone)]
pub struct Outbound<W = Endpoints> {
    pub shared: Arc<Shared>,
    /// The upstream of a dedicated listener.
    pub dedicated: Option<Arc<str>>,
    /// Where a redirected connection was going (its requests go there when its
    /// upstream has gone from the config and unknown authorities are passed).
    pub captured: Option<SocketAddr>,
    pub wire: W,
}

/// What carries an upstream's attempts: its endpoints, or, in the tests of this
/// service, a script ([`crate::retry::Transport`] is the seam).
pub trait Wire: Clone + Send + Sync + 'static {
    fn forward<'a>(
        &'a self,
        up: &'a Upstream,
        ex: Exchange<'a, AppBody>,
    ) -> impl Future<Output = Answer> + Send + 'a;
}

/// The upstream's own endpoints: connections, pools, health.
#[derive(Clone, Copy, Debug, Default)]
pub struct Endpoints;

impl Wire for Endpoints {
    #[inline]
    fn forward<'a>(
        &'a self,
        up: &'a Upstream,
        ex: Exchange<'a, AppBody>,
    ) -> impl Future<Output = Answer> + Send + 'a {
        retry::forward(up, ex)
    }
}

impl<W: Wire> Service for Outbound<W> {
    #[inline]
    fn call(
        &self,
        req: AppRequest,
        conn: &Arc<ConnState>,
    ) -> impl Future<Output = AppResponse> + Send + use<W> {
        handle(
            self.shared.clone(),
            (self.dedicated.clone(), self.captured),
            self.wire.clone(),
            conn.clone(),
            req,
        )
    }
}

async fn handle<W: Wire>(
    shared: Arc<Shared>,
    (dedicated, captured): (Option<Arc<str>>, Option<SocketAddr>),
    wire: W,
    conn: Arc<ConnState>,
    req: AppRequest,
) -> AppResponse {
    let peer = conn.peer();
    let mut served = Served::arrive(conn, Instant::now(), &req);
    let (upstream, log, unknown, tracer) = route(&shared, dedicated.as_deref(), &req);
    // The access log's line, begun when it is on: the request is taken apart below.
    served.begin_log(
        log.enabled
            .then(|| access_log_entry(&req, log, upstream.as_deref())),
    );
    let Some(up) = upstream else {
        // A dedicated port is one upstream's: what it no longer has is not passed on.
        if unknown == UnknownAuthorities::Pass && (dedicated.is_none() || captured.is_some()) {
            return unrouted::pass(shared, captured, req, served).await;
        }
        served.grpc_call(is_grpc(req.headers()));
        return no_route(&shared, dedicated.as_deref(), &req, served);
    };
    if req.method() == Method::CONNECT {
        served.grpc_call(is_grpc(req.headers()));
        return connect((shared, wire), &up, &req, peer, served);
    }
    let (parts, body) = (*req).into_parts();
    let version = parts.version;
    let (head, facts, called) = outbound_head(&up, parts, &mut served);
    let called = called.as_ref().map(Called::as_str);
    let same = Sameness::new(&up, &head, called, facts.retry_marker);
    let again = match admit(&up, &same, facts.caller_timeout, &mut served) {
        Ok(again) => again,
        Err(stop) => return stopped(&shared, (&up, &same, &head), stop, served),
    };
    served.begin_trace(tracer.and_then(|t| begin_trace(&t, &up, &head, served.start())));
    let request = (&head, body, version);
    let exchange = exchange(&up, request, (facts, again.as_ref()), &mut served);
    let answer = wire.forward(&up, exchange).await;
    let resp = answered(
        &shared,
        (&up, &same, &head),
        (answer, again),
        version,
        served,
    );
    spare::give_header_map(head.headers);
    resp
}

/// What the retry engine is handed: the request, its deadline, whether it is the app's
/// own retry, and the idempotency key minted for it, if any (logged, with the app's).
#[inline]
fn exchange<'a>(
    up: &Upstream,
    (head, body, version): (&'a Head, AppBody, Version),
    (facts, again): (RequestFacts, Option<&AppRetry>),
    served: &'a mut Served,
) -> Exchange<'a, AppBody> {
    let minted = mint_key(up, head);
    if let Some(e) = served.log() {
        e.idempotency_key = idempotency_key(up, head, minted.as_ref());
    }
    let start = served.start();
    Exchange {
        minted: minted.map(Box::new),
        head,
        version,
        body,
        deadline: Deadline::new(start, facts.caller_timeout, up.config().request_timeout),
        arrived: start,
        grpc: facts.grpc,
        upgrade: facts.upgrade,
        app_retry: AppRetry::charged(again),
        trace: served.trace(),
    }
}

/// The retry engine's answer goes back to the app, after the upstream's state and the
/// inbound side (ownership through the app) have learnt from it.
#[inline]
fn answered(
    shared: &Shared,
    (up, same, head): (&Upstream, &Sameness<'_>, &Head),
    (answer, again): (Answer, Option<AppRetry>),
    version: Version,
    served: Served,
) -> AppResponse {
    if answer.outcome != Outcome::Ok
        && let Some(told) = &shared.answers
    {
        told.outbound_answered(answer.outcome, &head.headers);
    }
    learn_from(up, same, &answer, served.grpc(), again.is_some());
    answer_app(up, answer, version, served)
}

/// The head the upstream gets: its headers cleaned (what they said kept as
/// [`RequestFacts`]), its target in origin-form, its Host the upstream's; with the
/// authority the app called when that Host replaced it. The request is a gRPC call
/// when its headers say so.
// Always inline: a request's parts and its head are a few hundred bytes each, and a
// call would copy both.
#[inline(always)]
fn outbound_head(
    up: &Upstream,
    parts: http::request::Parts,
    served: &mut Served,
) -> (Head, RequestFacts, Option<Called>) {
    let mut headers = parts.headers;
    let http1 = parts.version == Version::HTTP_11;
    let facts = prepare_request(&mut headers, &up.deadline().accept, http1);
    served.grpc_call(facts.grpc);
    let called = set_upstream_host(up, &parts.uri, &mut headers);
    let head = Head {
        method: parts.method,
        uri: crate::http::request::origin_form(parts.uri),
        headers,
    };
    (head, facts, called)
}

/// Why a request goes no further than tollgate.
enum Stop {
    /// One of the refusals of the table ([`crate::answer`]).
    Refused(&'static Refusal),
    /// An app's own retry, refused or with no room in the budget.
    AppRetry(app_retries::Stopped),
}

/// The request's admission, in the order that spends least on what will not go: a
/// place in `max_inflight`, a deadline not already spent, the app's own retry (its
/// evidence logged), and for a first attempt the throttle. `Ok`: the app's retry, if
/// it is one.
#[inline]
fn admit(
    up: &Arc<Upstream>,
    same: &Sameness<'_>,
    caller_timeout: Option<std::time::Duration>,
    served: &mut Served,
) -> Result<Option<AppRetry>, Stop> {
    let start = served.start();
    if !take_place(up, served.guard()) {
        return Err(Stop::Refused(&UPSTREAM_OVERLOADED));
    }
    if let Some(e) = served.log() {
        e.deadline = caller_timeout;
    }
    if caller_timeout.is_some_and(|c| c.is_zero()) {
        up.metrics().denied(Denied::Deadline);
        if let Some(e) = served.log() {
            e.denied = Some(Denied::Deadline.as_str());
        }
        return Err(Stop::Refused(&EXPIRED));
    }
    let again = app_retries::recall(up, same, start);
    if let (Some(a), Some(e)) = (&again, served.log()) {
        e.app_retry = Some(a.evidence);
    }
    if let Some(stop) = again.as_ref().and_then(|a| app_retries::stop(up, a, start)) {
        return Err(Stop::AppRetry(stop));
    }
    // An app's retry is a retry: the throttle is for first attempts.
    if let Some(t) = up.throttle().filter(|_| !AppRetry::charged(again.as_ref()))
        && !t.admit(start, &mut fastrand::Rng::new())
    {
        return Err(Stop::Refused(&THROTTLED));
    }
    Ok(again)
}

/// The answer to a request that goes no further: a refusal is remembered as the
/// request's end (an app's retry of it is its retry); an app's retry that is stopped is
/// not.
fn stopped(
    shared: &Shared,
    (up, same, head): (&Upstream, &Sameness<'_>, &Head),
    stop: Stop,
    mut served: Served,
) -> AppResponse {
    // Refused before any attempt is a give-up too: owned, the inbound side learns of it.
    if let Some(told) = &shared.answers {
        let outcome = match &stop {
            Stop::Refused(r) => r.outcome,
            Stop::AppRetry(s) => s.outcome,
        };
        told.outbound_answered(outcome, &head.headers);
    }
    match stop {
        Stop::Refused(r) => {
            let end = RequestEnd::refused(r.status, r.outcome, served.grpc());
            app_retries::remember(up, same, end, served.start());
            served.refuse(r, Some(0), up.metrics())
        }
        Stop::AppRetry(stop) => {
            if let Some(e) = served.log() {
                e.denied =
                    (stop.outcome == Outcome::BudgetExhausted).then_some(Denied::Budget.as_str());
            }
            let local = Local {
                status: stop.status,
                outcome: stop.outcome,
                attempts: Some(0),
                failure: None,
                text: stop.text,
                retry_after: None,
                ran: None,
            };
            let mut resp = served.answer(local, up.metrics());
            app_retries::with_grpc_status(&mut resp, stop.grpc);
            resp
        }
    }
}

/// A `CONNECT` to an upstream's authority: an HTTP/1.1 tunnel whose requests are
/// served as this upstream's, one by one; over HTTP/2 it is refused.
fn connect<W: Wire>(
    (shared, wire): (Arc<Shared>, W),
    up: &Upstream,
    req: &Request<AppBody>,
    peer: std::net::IpAddr,
    served: Served,
) -> AppResponse {
    if req.version() != Version::HTTP_11 {
        return served.refuse(&OUTBOUND_CONNECT, Some(0), up.metrics());
    }
    let inside = Outbound {
        shared: shared.clone(),
        dedicated: Some(Arc::from(up.name())),
        captured: None,
        wire,
    };
    super::connect::serve_connect(shared, inside, req, peer, served.tunnel())
}

/// A key for a request of a method in `mint_idempotency_key` that came without one.
#[inline]
fn mint_key(up: &Upstream, head: &Head) -> Option<HeaderValue> {
    let retry = &up.config().retry;
    // Nearly every upstream mints none: that is the first thing known.
    if retry.mint_idempotency_key.is_empty() || !retry.mint_idempotency_key.contains(&head.method) {
        return None;
    }
    let name = retry.idempotency_header.as_ref()?;
    // An empty key is no key: the minted one replaces it.
    if crate::retry::evidence::keys::carries_key(&head.headers, name) {
        return None;
    }
    let key = crate::retry::evidence::keys::mint()?;
    if let Some(c) = up.keys_minted() {
        c.inc();
    }
    Some(key)
}

/// The request's idempotency key, the app's own or minted, for the access log.
fn idempotency_key(up: &Upstream, head: &Head, minted: Option<&HeaderValue>) -> Option<String> {
    let name = up.config().retry.idempotency_header.as_ref()?;
    let v = minted.or_else(|| head.headers.get(name).filter(|v| !v.is_empty()))?;
    Some(String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// The upstream of `req` (the dedicated listener's, or by authority) in the config in
/// force, and its access log settings.
fn route(
    shared: &Shared,
    dedicated: Option<&str>,
    req: &Request<AppBody>,
) -> (
    Option<Arc<Upstream>>,
    AccessLogConfig,
    UnknownAuthorities,
    Option<Arc<Tracer>>,
) {
    let snap = shared.snapshot.load();
    let up = match dedicated {
        Some(name) => snap.by_name(name).cloned(),
        None => authority_of(req)
            .and_then(|a| snap.routes.lookup(a))
            .and_then(|i| snap.upstreams.get(i).cloned()),
    };
    (
        up,
        snap.config.access_log,
        snap.config.listener.unknown_authorities,
        snap.tracer.clone(),
    )
}

/// The request's trace, when `[tracing]` decides it is traced: its SERVER span begun
/// at `start`.
fn begin_trace(
    tracer: &Tracer,
    up: &Upstream,
    head: &Head,
    start: Instant,
) -> Option<RequestTrace> {
    let arrival = Arrival {
        side: Side::Outbound,
        method: &head.method,
        authority: head
            .headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default(),
        path: head.uri.path(),
        https: up.config().tls.is_some(),
        upstream: up.name(),
        headers: &head.headers,
    };
    tracer.request(&arrival, start)
}

/// The answer to a request for which no upstream is configured: named, so a typo in
/// the app's Host or a missing authority shows at once.
fn no_route(
    shared: &Shared,
    dedicated: Option<&str>,
    req: &Request<AppBody>,
    served: Served,
) -> AppResponse {
    shared.unrouted[usize::from(served.grpc())].inc();
    let text = match dedicated {
        Some(name) => format!("upstream {name} is not in the config any more\n"),
        None => match authority_of(req) {
            Some(a) => format!("no upstream is configured for the authority {a:?}\n"),
            None => "the request names no authority (no Host)\n".to_string(),
        },
    };
    let local = Local {
        text: &text,
        ..NO_ROUTE.local(Some(0))
    };
    served.answer(local, &Uncounted)
}

/// The access log's line for `req`, before it is answered.
fn access_log_entry(
    req: &Request<AppBody>,
    log: AccessLogConfig,
    up: Option<&Upstream>,
) -> Box<Entry> {
    let mut e = Entry::of_request(req, log, Direction::Outbound);
    e.upstream = up.map(|u| u.name().to_string());
    e
}

/// What the access log's line of a request the retry engine answered says beyond its
/// status, outcome and attempts.
fn log_answer(e: &mut Entry, up: &Upstream, answer: &Answer, start: Instant) {
    e.retries = answer.trail.retries().collect();
    if answer.attempts > 0 {
        let endpoints = up.endpoints();
        e.peers = answer
            .trail
            .peers()
            .map(|id| endpoints.address_of(id))
            .collect();
    }
    e.denied = answer.trail.denied.map(Denied::as_str);
    e.upstream_time = Some(start.elapsed());
}

/// What an answer teaches: the throttle counts the request as answered (unless
/// another tollgate owned its failure), and the memory of failures remembers it, or
/// forgets the failure an app's retry (`again`) has now succeeded past. The clock is
/// read only when one of them needs it.
fn learn_from(up: &Upstream, same: &Sameness<'_>, answer: &Answer, grpc: bool, again: bool) {
    if let Some(t) = up.throttle()
        && learn::counts_for_throttle(answer.outcome, answer.owned_elsewhere())
    {
        t.answered(Instant::now());
    }
    let end = RequestEnd::of(answer, grpc, again);
    let refuse = up.config().app_retries == crate::config::AppRetries::Refuse;
    if refuse || !matches!(end, RequestEnd::Succeeded { again: false }) {
        app_retries::remember(up, same, end, Instant::now());
    }
}

/// The Host sent upstream: the configured one, else the authority the app called,
/// which for an origin-form HTTP/1.1 request is already the Host header. Returns the
/// authority the app called when the configured Host replaced it.
fn set_upstream_host(up: &Upstream, uri: &Uri, headers: &mut http::HeaderMap) -> Option<Called> {
    match (&up.config().host, uri.authority()) {
        (Some(h), Some(a)) => {
            headers.insert(HOST, h.clone());
            Some(Called::Uri(a.clone()))
        }
        (Some(h), None) => headers.insert(HOST, h.clone()).map(Called::Host),
        (None, Some(a)) => {
            if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                headers.insert(HOST, v);
            }
            None
        }
        (None, None) => None,
    }
}

/// The authority the app called (as [`authority_of`] reads it), kept when the Host
/// sent upstream is not it.
enum Called {
    /// An absolute-form target's.
    Uri(Authority),
    /// The app's Host.
    Host(HeaderValue),
}

impl Called {
    fn as_str(&self) -> &str {
        match self {
            Called::Uri(a) => a.as_str(),
            Called::Host(h) => h.to_str().unwrap_or(""),
        }
    }
}

/// Counts the request against the upstream's `max_inflight`; `false` (and nothing
/// counted) when it is full.
fn take_place(up: &Arc<Upstream>, guard: &mut RequestGuard) -> bool {
    let before = up.inflight().fetch_add(1, AcqRel);
    if before >= up.config().max_inflight {
        up.inflight().fetch_sub(1, AcqRel);
        return false;
    }
    guard.admitted(up.clone());
    true
}

/// An admitted request has its response head: it leaves the in-flight count; once
/// answered, its duration is observed.
impl Admission for Upstream {
    fn leave(&self) {
        self.inflight().fetch_sub(1, AcqRel);
    }

    fn finished(&self, took: std::time::Duration) {
        self.metrics().request_duration.observe(took.as_secs_f64());
    }
}

/// The answer as it goes back to the app, with this hop's fields, through the request's
/// one way out.
fn answer_app(up: &Upstream, answer: Answer, version: Version, mut served: Served) -> AppResponse {
    // A body still streaming to the upstream may yet be read to its end; one that was
    // never touched (an answer at `Expect: 100-continue`) will not.
    if served.unread_closes()
        && answer.body != BodyRead::Whole
        && (answer.outcome != Outcome::Ok
            || answer.body == BodyRead::Untouched
            || matches!(answer.reply, Reply::Local(_)))
    {
        served.close_connection();
    } else {
        served.keep_connection();
    }
    let grpc = served.grpc();
    let start = served.start();
    if let Some(e) = served.log() {
        log_answer(e, up, &answer, start);
    }
    let resp = match answer.reply {
        Reply::Upstream(resp) => resp,
        Reply::Local(status) => {
            let (text, retry_after) = local_words(answer.detail.as_deref(), status);
            let local = Local {
                status,
                outcome: answer.outcome,
                attempts: Some(answer.attempts),
                failure: answer.failure,
                text,
                retry_after,
                ran: None,
            };
            return served.answer(local, up.metrics());
        }
    };
    // Given up on: a failure listed in `retry.on` that no other tollgate owned.
    let outcome =
        (answer.outcome != Outcome::Ok && !answer.callee.owned()).then_some(answer.outcome);
    if grpc && outcome.is_some() && !is_grpc_answer_head(&resp) {
        // Not a gRPC answer (an HTTP 503 from a proxy in front of the server, say): a
        // gRPC client would make UNAVAILABLE of it and retry it. tollgate answers in
        // its place.
        let status = resp.status();
        drop(resp);
        let text = format!("the upstream answered HTTP {}", status.as_u16());
        let local = Local {
            status,
            outcome: answer.outcome,
            attempts: Some(answer.attempts),
            failure: answer.failure,
            text: &text,
            retry_after: None,
            ran: None,
        };
        return served.answer(local, up.metrics());
    }
    let pushback = grpc && outcome.is_some();
    let (mut parts, body) = relayed(resp, version);
    let close = served.closes();
    let said = (parts.status.as_u16(), answer.outcome, answer.attempts);
    let guard = served.answered(said, up.metrics());
    let mut resp = if let (true, Some(attempts)) =
        (version < Version::HTTP_2, attempts_line(answer.attempts))
    {
        // Written straight into the head by the HTTP/1.1 writer, in place of an
        // upstream's own fields of the same names.
        let added = AddedFields([
            Some(attempts),
            match outcome {
                Some(o) => Some(outcome_line(o)),
                None => (answer.callee == Callee::Stray).then_some(OUTCOME_REMOVED_LINE),
            },
            pushback.then_some(grpc::NO_RETRY_LINE),
        ]);
        Box::new(Response::from_parts(
            parts,
            ResponseBody::upstream(body, guard, added),
        ))
    } else {
        let body = ResponseBody::upstream(body, guard, AddedFields::default());
        parts
            .headers
            .insert(ATTEMPTS_HEADER, count_value(answer.attempts));
        if let Some(o) = outcome {
            parts.headers.insert(OUTCOME_HEADER, o.header_value());
        } else if answer.callee == Callee::Stray {
            parts.headers.remove(OUTCOME_HEADER);
        }
        if pushback {
            parts.headers.insert(GRPC_PUSHBACK, grpc::NO_RETRY);
        }
        Box::new(Response::from_parts(parts, body))
    };
    if close {
        announce_close(&mut resp);
    }
    resp
}

/// What tollgate says when no upstream answered: the detail worth telling (a TLS
/// failure's reason), else words for the status it answers with.
fn local_words(detail: Option<&str>, status: StatusCode) -> (&str, Option<HeaderValue>) {
    match (detail, status) {
        (Some(d), _) => (d, None),
        (None, StatusCode::GATEWAY_TIMEOUT) => ("no response from the upstream in time\n", None),
        (None, StatusCode::BAD_REQUEST) => ("the request body is malformed or broke off\n", None),
        (None, StatusCode::SERVICE_UNAVAILABLE) => {
            (NO_DESCRIPTORS.text, NO_DESCRIPTORS.retry_after.clone())
        }
        (None, _) => ("the upstream could not be reached\n", None),
    }
}

/// Whether an upstream's response head is a gRPC answer.
fn is_grpc_answer_head(resp: &Response<crate::upstream::response::UpstreamBody>) -> bool {
    let fields = crate::http::response::Fields::of(resp);
    is_grpc_answer(
        resp.status(),
        fields.get(&CONTENT_TYPE),
        fields.contains(&GRPC_STATUS),
    )
}
