//! The inbound service: one request from a caller, start to finish, judged in the order
//! that spends the least on what will not be served: a deadline already spent (`504`),
//! then, for a keyed request while `[inbound.dedupe]` is on, dedupe (a duplicate is
//! answered here, the app never called: see [`super::keyed`]), then the concurrency limit (`503 overloaded`; a kubelet probe may be spared it,
//! without holding a place), then, for a retry, the fleet's retry budget
//! (`503 retry-rejected`). What passes goes to the app with the deadline rewritten to
//! the time left, and the app's answer goes back as it came, unless it is a failure
//! this pod's own outbound side already owned ([`owned`](super::owned): marked
//! `downstream-owned`). A traced request gets a SERVER span, with the fleet budget's
//! decision on a retry, and the app gets its id as the parent in `traceparent`.

use std::sync::Arc;

use http::header::HOST;
use http::{HeaderValue, Method, Request, Response, Version};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::answer;
use super::app::{self, DeadlineFields};
use super::attempts::{is_kube_probe, is_retry};
use super::dedupe::{Answer, Begin, Fingerprinter};
use super::limit::Admitted;
use super::owned;
use super::{Inbound, State, keyed};
use crate::access_log::{Direction, Entry};
use crate::answer::{self as table, NO_RETRY, NO_RETRY_LINE, Refusal};
use crate::config::AccessLogConfig;
use crate::config::OwnedFailures;
use crate::contract::headers::{OUTCOME_HEADER, outcome_line};
use crate::contract::outcome::outcome_of;
use crate::deadline::Deadline;
use crate::http::fields::authority_of;
use crate::http::grpc::GRPC_PUSHBACK;
use crate::http::grpc::is_grpc;
use crate::http::response::Fields;
use crate::listen::Captures;
use crate::metrics::Outcome;
use crate::metrics::inbound::{InboundDenied, InboundMetrics, Kind};
use crate::server::headers::prepare_request;
use crate::server::service::{AppRequest, AppResponse};
use crate::server::{
    AddedFields, Admission, AppBody, ConnState, RequestGuard, ResponseBody, Service,
};
use crate::trace::{Arrival, Fleet, RequestTrace, Side, Tracer};
use crate::upstream::pool::Want;
use crate::upstream::request::{ContinueWait, RequestHead};
use crate::upstream::response::{UpstreamResponse, relayed};

/// The callers' requests to the app.
#[derive(Clone)]
pub struct InboundService(pub Arc<Inbound>);

/// A connection redirected to the inbound listener is a caller's HTTP to the app when
/// it was going to the app's port (or the inbound port itself: not redirected).
impl Captures for InboundService {
    async fn redirected(&self, original: std::net::SocketAddr) -> Option<Self> {
        (original.port() == self.0.state().config.app.port).then(|| self.clone())
    }
}

impl Service for InboundService {
    /// A request holds its place in `max_inflight` until the app's exchange ends, not
    /// until its caller goes away: one that sends and hangs up frees no place while the
    /// app works on it.
    const OUTLIVES_CALLER: bool = true;

    fn call(
        &self,
        req: AppRequest,
        conn: &Arc<ConnState>,
    ) -> impl Future<Output = AppResponse> + Send + use<> {
        let inbound = self.0.clone();
        let conn = conn.clone();
        // The answer is boxed where it is made: an answer is a few hundred bytes, and
        // each function it is returned through copies it.
        async move {
            let state = inbound.state.load_full();
            let h1 = req.version() < Version::HTTP_2;
            let mut resp = Box::new(answer_request(&inbound, &state, conn, *req).await);
            // Every answer says the callee deduplicates while it does, which header it
            // reads and where it keeps keys: to an HTTP/1.1 caller in a line written
            // straight into the head.
            if let Some((dedupe, _)) = &state.dedupe {
                let (value, line) = dedupe.advert();
                if !(h1 && resp.body_mut().add_line(line)) {
                    let value = HeaderValue::from_static(value);
                    resp.headers_mut().insert(keyed::DEDUPE_HEADER, value);
                }
            }
            resp
        }
    }
}

/// What the request is, for the metrics, the access log and the answers.
struct InboundCall<'a> {
    metrics: &'a InboundMetrics,
    kind: Kind,
    grpc: bool,
    /// An HTTP/1.x body not read to its end: the connection cannot carry another
    /// request after an answer made without reading it.
    unread: bool,
    /// The access log's line, when it is on.
    log: Option<Box<Entry>>,
    /// The request's SERVER span, when it is traced.
    trace: Option<RequestTrace>,
}

impl InboundCall<'_> {
    fn refuse(&mut self, r: &Refusal, mut guard: RequestGuard) -> Response<ResponseBody> {
        let status = r.status(self.grpc).as_u16();
        self.metrics.request(self.kind, status, r.outcome);
        self.logged(&mut guard, status, r.outcome, None);
        answer::answer(r, self.grpc, self.unread, guard)
    }

    fn deny(
        &mut self,
        why: InboundDenied,
        r: &Refusal,
        guard: RequestGuard,
    ) -> Response<ResponseBody> {
        self.metrics.denied(why);
        if let Some(e) = self.log.as_mut() {
            e.denied = Some(why.as_str());
        }
        self.refuse(r, guard)
    }

    /// Finishes the access log's line, if any: it is written when the answer has gone.
    fn logged(
        &mut self,
        guard: &mut RequestGuard,
        status: u16,
        outcome: Outcome,
        app: Option<std::time::Duration>,
    ) {
        if let Some(t) = self.trace.take() {
            t.finish(status, outcome, Instant::now());
        }
        if let Some(mut e) = self.log.take() {
            e.status = status;
            e.outcome = outcome;
            e.attempts = u32::from(app.is_some());
            e.upstream_time = app;
            guard.on_finish(e);
        }
    }
}

async fn answer_request(
    inbound: &Arc<Inbound>,
    state: &State,
    conn: Arc<ConnState>,
    req: Request<AppBody>,
) -> Response<ResponseBody> {
    let start = Instant::now();
    let caller = conn.peer();
    let mut guard = RequestGuard::new(conn, start);
    let probe = is_kube_probe(
        req.method(),
        req.uri().path(),
        req.headers(),
        &state.config.probe_paths,
    );
    let retry = is_retry(req.headers());
    let mut call = InboundCall {
        metrics: inbound.metrics.inbound(),
        kind: if retry { Kind::Retry } else { Kind::First },
        grpc: is_grpc(req.headers()),
        unread: req.version() < Version::HTTP_2 && !req.body().is_end_stream(),
        log: state
            .access_log
            .enabled
            .then(|| log_entry(&req, state.access_log, caller, retry)),
        trace: state
            .tracer
            .as_ref()
            .and_then(|t| begin_trace(t, &req, start)),
    };
    if let (Some(t), Some(e)) = (&call.trace, call.log.as_mut()) {
        e.trace_id = Some(t.trace_id());
    }
    if req.method() == Method::CONNECT {
        return call.refuse(&table::INBOUND_CONNECT, guard);
    }
    // Every caller's request is what the fleet sends; a first attempt also earns the
    // retries the budget allows.
    if let Some(fair) = &state.fair {
        fair.see(caller, start);
    }
    state.budget.record_attempt(start);
    if !retry {
        state.budget.record_request(start);
    }
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    let facts = prepare_request(
        &mut headers,
        &state.deadline.accept,
        parts.version == Version::HTTP_11,
    );
    // A probe is spared the deadline and the budget no more than any request.
    if facts.caller_timeout.is_some_and(|t| t.is_zero()) {
        return call.deny(InboundDenied::Deadline, &table::EXPIRED, guard);
    }
    let deadline = Deadline::new(start, facts.caller_timeout, state.config.request_timeout);
    // Dedupe first: a replay or a join costs the app nothing, and spends no place in
    // the limit and no retry of the budget.
    let scope = match &state.dedupe {
        Some((dedupe, _)) if !facts.upgrade => dedupe.scope(&parts.method, &parts.uri, &headers),
        _ => None,
    };
    if let (Some(_), Some(e), Some((dedupe, _))) = (&scope, call.log.as_mut(), &state.dedupe) {
        e.idempotency_key = headers
            .get(dedupe.header())
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    // A retry meant for another replica's keys never runs here.
    if scope.is_some()
        && let Some((dedupe, _)) = &state.dedupe
        && dedupe.foreign_store(facts.dedupe_store)
    {
        return call.refuse(&table::NOT_REPLAYABLE, guard);
    }
    let claim = match scope {
        None => None,
        Some(scope) => match state.dedupe.as_ref().map(|(d, _)| d.begin(scope)) {
            None => None,
            // Boxed, as every await of a keyed request's: the future of a request
            // without a key keeps no room for them, and is moved cheaper.
            Some(begin) => match Box::pin(begin).await {
                Begin::Run(claim) => Some(claim),
                Begin::Duplicate(dup) => {
                    let hasher = Fingerprinter::of_request(&headers);
                    let settled = Box::pin(dup.settle_body(body, hasher, deadline.at())).await;
                    return duplicate(&mut call, settled, parts.version, guard);
                }
                Begin::Unavailable => return call.refuse(&table::DEDUPE_UNAVAILABLE, guard),
            },
        },
    };
    // A refusal below drops the claim, which frees the key: the app never had it.
    let admitted = match admit(
        inbound,
        state,
        (caller, start),
        (probe, retry),
        facts.upgrade,
        call.trace.as_mut(),
    ) {
        Ok(admitted) => admitted,
        Err((why, refusal)) => return call.deny(why, refusal, guard),
    };
    if admitted.is_none() {
        call.metrics.probes_exempt.inc();
        if let Some(e) = call.log.as_mut() {
            e.kind = Some("probe");
        }
        guard.admitted(inbound.probes.clone());
    } else {
        guard.admitted(state.limit.clone());
    }
    if !headers.contains_key(HOST)
        && let Some(a) = parts.uri.authority()
        && let Ok(v) = HeaderValue::from_str(a.as_str())
    {
        headers.insert(HOST, v);
    }
    let uri = crate::http::request::origin_form(parts.uri);
    let want = match parts.version {
        _ if facts.upgrade => Want::Http1,
        Version::HTTP_2 => Want::PreferHttp2,
        _ => Want::Http1,
    };
    let sent = Instant::now();
    let exhausted = inbound.metrics.exhausted(crate::metrics::Shortage::Connect);
    let traceparent = call.trace.as_ref().map(RequestTrace::traceparent);
    let (result, mark) = match (claim, &state.dedupe) {
        (Some(claim), Some((_, keyed_app))) => {
            let exchange = keyed::HeadForApp {
                method: parts.method,
                uri,
                headers,
                want,
                deadline,
                header: state.deadline.header.clone(),
                grpc: facts.grpc,
                traceparent,
            };
            // Boxed, as every await of a keyed request's: the future of a request
            // without a key keeps no room for them.
            let exchange = (exchange, &inbound.exchanges);
            let run = keyed::run(claim, keyed_app.clone(), exchange, body, exhausted.clone());
            (Box::pin(run).await.map(Answered::Keyed), false)
        }
        _ => {
            // A request without a claimed key goes to the app as it is.
            let request = RequestHead::as_is(&parts.method, &uri, &headers, ContinueWait::ZERO);
            let fields = DeadlineFields {
                deadline,
                header: &state.deadline.header,
                grpc: facts.grpc,
                traceparent,
            };
            // Ownership through the app: the request is counted under its ids while the
            // app works on it, so an id two requests carry at once marks neither.
            let marking = (state.config.owned_failures == OwnedFailures::Mark)
                .then(|| inbound.owned.arrive(&headers, start));
            let result = app::send(&state.app, want, &request, body, &fields, exhausted)
                .await
                .map_err(|no| no.fault);
            let mark = marking.is_some_and(|carrying| {
                result.as_ref().is_ok_and(|resp| {
                    owned::retryable_failure(resp.status(), Fields::of(resp), facts.grpc)
                        && carrying.marks()
                })
            });
            (result.map(Answered::Plain), mark)
        }
    };
    let now = Instant::now();
    // A request that never reached the app says nothing of its latency.
    if let Some(admitted) = admitted
        && result.as_ref().err().is_none_or(|f| f.maybe_sent())
    {
        state.limit.sample(admitted, now - sent, now);
    }
    match result {
        Ok(Answered::Plain(resp)) => {
            relay(&mut call, resp, (parts.version, mark), guard, now - start)
        }
        Ok(Answered::Keyed(head)) => {
            relay_keyed(&mut call, head, parts.version, guard, now - start)
        }
        Err(fault) => call.refuse(answer::refusal(fault), guard),
    }
}

/// The app's answer: as it came, or through the task that keeps it.
enum Answered {
    Plain(UpstreamResponse),
    Keyed(keyed::Head),
}

/// A place in the concurrency limit and, for a retry, one from the fleet's budget.
/// `Ok(None)`: a probe exempt from shedding, holding no place.
fn admit(
    inbound: &Inbound,
    state: &State,
    (caller, start): (std::net::IpAddr, Instant),
    (probe, retry): (bool, bool),
    upgrade: bool,
    trace: Option<&mut RequestTrace>,
) -> Result<Option<Admitted>, (InboundDenied, &'static Refusal)> {
    // A probe may be exempt from shedding, without a place in the limit; an upgrade
    // becomes a tunnel for as long as it lasts: not a request the limit can learn from
    // or should refuse.
    let exempt = probe && !upgrade && inbound.probes.try_take();
    let admitted = if exempt {
        None
    } else if upgrade {
        Some(state.limit.enter())
    } else {
        match state.limit.try_enter() {
            Some(a) => Some(a),
            None => return Err((InboundDenied::Overloaded, &table::APP_OVERLOADED)),
        }
    };
    if retry {
        let granted = match &state.fair {
            Some(fair) => fair.try_retry(caller, &state.budget, start).is_ok(),
            None => state.budget.try_retry(start),
        };
        if let Some(t) = trace {
            let available = state
                .config
                .retries
                .as_ref()
                .map(|_| state.budget.available(start));
            let decision = if granted {
                Fleet::Granted
            } else {
                Fleet::Rejected
            };
            t.fleet(decision, available);
        }
        if !granted {
            if exempt {
                Admission::leave(&*inbound.probes);
            } else {
                state.limit.leave();
            }
            return Err((InboundDenied::RetryBudget, &table::RETRY_REJECTED));
        }
    }
    Ok(admitted)
}

/// A duplicate's answer: the kept one, or dedupe's own.
fn duplicate(
    call: &mut InboundCall<'_>,
    settled: Answer,
    version: Version,
    mut guard: RequestGuard,
) -> Response<ResponseBody> {
    match &settled {
        Answer::Replay(kept) => {
            let status = kept.status.as_u16();
            call.metrics.request(call.kind, status, Outcome::Ok);
            call.logged(&mut guard, status, Outcome::Ok, None);
            keyed::replay(kept, version, guard)
        }
        other => {
            // Its body was read to its end, but when the deadline came first.
            call.unread &= matches!(other, Answer::InProgress | Answer::BodyError);
            let refusal = keyed::refusal(other).unwrap_or(&table::APP_RESET);
            call.refuse(refusal, guard)
        }
    }
}

/// The request's trace, when `[tracing]` decides it is traced: its SERVER span begun at
/// `start`, with the caller's attempt number when it said.
fn begin_trace(tracer: &Tracer, req: &Request<AppBody>, start: Instant) -> Option<RequestTrace> {
    let arrival = Arrival {
        side: Side::Inbound,
        method: req.method(),
        authority: authority_of(req).unwrap_or_default(),
        path: req.uri().path(),
        https: false,
        upstream: "",
        headers: req.headers(),
    };
    let mut trace = tracer.request(&arrival, start)?;
    if let Some(n) = super::attempts::attempt_number(req.headers()) {
        trace.caller_attempt(n);
    }
    Some(trace)
}

/// The access log's line of a caller's request, begun as it arrives.
fn log_entry(
    req: &Request<AppBody>,
    log: AccessLogConfig,
    caller: std::net::IpAddr,
    retry: bool,
) -> Box<Entry> {
    let mut e = Entry::of_request(req, log, Direction::Inbound);
    e.caller = Some(caller);
    e.kind = Some(if retry { "retry" } else { "first" });
    e
}

/// The app's answer, as it goes back to the caller: its hop-by-hop fields dropped, and
/// nothing of tollgate's added, unless it is to be marked (`mark`) `downstream-owned`
/// with `grpc-retry-pushback-ms: -1` (ownership through the app).
fn relay(
    call: &mut InboundCall<'_>,
    resp: UpstreamResponse,
    (version, mark): (Version, bool),
    mut guard: RequestGuard,
    app: std::time::Duration,
) -> Response<ResponseBody> {
    // `ok`, or another tollgate's verdict the app passed on.
    let outcome = if mark {
        call.metrics.owned_failures.inc();
        Outcome::DownstreamOwned
    } else {
        outcome_of(resp.status(), Fields::of(&resp))
    };
    let status = resp.status().as_u16();
    call.metrics.request(call.kind, status, outcome);
    call.logged(&mut guard, status, outcome, Some(app));
    let (mut parts, body) = relayed(resp, version);
    let mut added = AddedFields::default();
    if mark && version < Version::HTTP_2 {
        // Written straight into the head by the HTTP/1.1 writer.
        added = AddedFields([
            Some(outcome_line(Outcome::DownstreamOwned)),
            Some(NO_RETRY_LINE),
            None,
        ]);
    } else if mark {
        parts
            .headers
            .insert(OUTCOME_HEADER, Outcome::DownstreamOwned.header_value());
        parts.headers.insert(GRPC_PUSHBACK, NO_RETRY);
    }
    Response::from_parts(parts, ResponseBody::upstream(body, guard, added))
}

/// The app's answer to a keyed first arrival, as the task that keeps it relays it.
fn relay_keyed(
    call: &mut InboundCall<'_>,
    head: keyed::Head,
    version: Version,
    mut guard: RequestGuard,
    app: std::time::Duration,
) -> Response<ResponseBody> {
    let status = head.parts.status.as_u16();
    call.metrics.request(call.kind, status, head.outcome);
    call.logged(&mut guard, status, head.outcome, Some(app));
    let mut parts = head.parts;
    parts.version = version;
    Response::from_parts(parts, ResponseBody::boxed(head.body.boxed(), guard))
}
