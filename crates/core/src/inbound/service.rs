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
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::answer;
use super::app::{AppWire, Connections, DeadlineFields};
use super::attempts::{is_kube_probe, is_retry};
use super::dedupe::claim::Claim;
use super::dedupe::{Answer, Begin, Fingerprinter};
use super::limit::Admitted;
use super::owned::{self, Carrying, MarkTrailers, OwnedCalls};
use super::{Inbound, State, keyed};
use crate::access_log::{Direction, Entry};
use crate::answer::{self as table, NO_RETRY, NO_RETRY_LINE, Refusal};
use crate::config::AccessLogConfig;
use crate::config::OwnedFailures;
use crate::contract::headers::{OUTCOME_HEADER, outcome_line};
use crate::contract::outcome::outcome_of;
use crate::deadline::Deadline;
use crate::fault::Fault;
use crate::http::fields::authority_of;
use crate::http::grpc::{GRPC_PUSHBACK, is_grpc};
use crate::http::response::Fields;
use crate::listen::Captures;
use crate::metrics::Outcome;
use crate::metrics::inbound::{InboundDenied, InboundMetrics, Kind};
use crate::served::{Served, Tally};
use crate::server::headers::{RequestFacts, prepare_request};
use crate::server::service::{AppRequest, AppResponse};
use crate::server::{AddedFields, Admission, AppBody, ConnState, ResponseBody, Service};
use crate::trace::{Arrival, Fleet, RequestTrace, Side, Tracer};
use crate::upstream::pool::Want;
use crate::upstream::request::{ContinueWait, RequestHead};
use crate::upstream::response::{UpstreamResponse, relayed};

/// The callers' requests to the app, carried to it by `wire`: the app's own
/// connections, or, in this service's tests, a script.
#[derive(Clone)]
pub struct InboundService<W = Connections> {
    pub(super) inbound: Arc<Inbound>,
    pub(super) wire: W,
}

/// A connection redirected to the inbound listener is a caller's HTTP to the app when
/// it was going to the app's port (or the inbound port itself: not redirected).
impl<W: AppWire> Captures for InboundService<W> {
    async fn redirected(&self, original: std::net::SocketAddr) -> Option<Self> {
        (original.port() == self.inbound.state().config.app.port).then(|| self.clone())
    }
}

impl<W: AppWire> Service for InboundService<W> {
    /// A request holds its place in `max_inflight` until the app's exchange ends, not
    /// until its caller goes away: one that sends and hangs up frees no place while the
    /// app works on it.
    const OUTLIVES_CALLER: bool = true;

    fn call(
        &self,
        req: AppRequest,
        conn: &Arc<ConnState>,
    ) -> impl Future<Output = AppResponse> + Send + use<W> {
        let inbound = self.inbound.clone();
        let wire = self.wire.clone();
        let conn = conn.clone();
        // The answer is boxed where it is made: an answer is a few hundred bytes, and
        // each function it is returned through copies it.
        async move {
            let state = inbound.state.load_full();
            let h1 = req.version() < Version::HTTP_2;
            let mut resp = answer_request((&inbound, wire), &state, conn, *req).await;
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

/// Where the inbound side counts its answers: by kind, first attempt or retry.
struct InboundTally<'a> {
    metrics: &'a InboundMetrics,
    kind: Kind,
}

impl Tally for InboundTally<'_> {
    #[inline]
    fn answered(&self, status: u16, outcome: Outcome, _attempts: u32) {
        self.metrics.request(self.kind, status, outcome);
    }
}

/// The inbound side's refusal ([`answer`]): a failure of the app's is its endpoint's,
/// and the caller's next request should find another pod.
fn refuse(mut served: Served, r: &Refusal, tally: &InboundTally<'_>) -> AppResponse {
    if answer::about_the_app(r) {
        served.close_connection();
    }
    served.refuse(r, None, tally)
}

/// A refusal counted as a denial, and logged as one.
fn deny(
    mut served: Served,
    why: InboundDenied,
    r: &Refusal,
    tally: &InboundTally<'_>,
) -> AppResponse {
    tally.metrics.denied(why);
    if let Some(e) = served.log() {
        e.denied = Some(why.as_str());
    }
    refuse(served, r, tally)
}

async fn answer_request<W: AppWire>(
    (inbound, wire): (&Arc<Inbound>, W),
    state: &State,
    conn: Arc<ConnState>,
    req: Request<AppBody>,
) -> AppResponse {
    let (mut served, caller, tally) = arrive(inbound, state, conn, &req);
    let start = served.start();
    if req.method() == Method::CONNECT {
        return refuse(served, &table::INBOUND_CONNECT, &tally);
    }
    count_in_fleet(state, &caller, start);
    let (mut parts, body) = req.into_parts();
    let http1 = parts.version == Version::HTTP_11;
    let facts = prepare_request(&mut parts.headers, &state.deadline.accept, http1);
    // A probe is spared the deadline and the budget no more than any request.
    if facts.caller_timeout.is_some_and(|t| t.is_zero()) {
        return deny(served, InboundDenied::Deadline, &table::EXPIRED, &tally);
    }
    let deadline = Deadline::new(start, facts.caller_timeout, state.config.request_timeout);
    // Dedupe first: a replay or a join costs the app nothing, and spends no place in
    // the limit and no retry of the budget.
    let (claim, body) = match dedupe(state, &parts, facts, (body, deadline), &mut served).await {
        Ok(run) => run,
        Err(Early::Refused(r)) => return refuse(served, r, &tally),
        Err(Early::Duplicate(settled)) => {
            return duplicate(served, &settled, parts.version, &tally);
        }
    };
    // A refusal below drops the claim, which frees the key: the app never had it.
    let trace = served.trace();
    let admitted = match admit(inbound, state, &caller, start, facts.upgrade, trace) {
        Ok(admitted) => admitted,
        Err((why, refusal)) => return deny(served, why, refusal, &tally),
    };
    hold_place(inbound, state, admitted.is_none(), &mut served, &tally);
    let to = ToApp {
        inbound,
        wire,
        state,
        facts,
        deadline,
        traceparent: served.trace().map(|t| t.traceparent()),
        start,
        admitted,
    };
    to.answer(parts, (claim, body), served, &tally).await
}

/// Who sent a request, and as what.
struct Caller {
    addr: std::net::IpAddr,
    /// Its HTTP client or tollgate says it is a retry.
    retry: bool,
    /// A kubelet's probe.
    probe: bool,
}

/// The request's edge, its access log line and span begun, and who sent it.
fn arrive<'a>(
    inbound: &'a Inbound,
    state: &State,
    conn: Arc<ConnState>,
    req: &Request<AppBody>,
) -> (Served, Caller, InboundTally<'a>) {
    let addr = conn.peer();
    let mut served = Served::arrive(conn, Instant::now(), req);
    served.grpc_call(is_grpc(req.headers()));
    let start = served.start();
    let (method, path, headers) = (req.method(), req.uri().path(), req.headers());
    let caller = Caller {
        addr,
        retry: is_retry(headers),
        probe: is_kube_probe(method, path, headers, &state.config.probe_paths),
    };
    let tally = InboundTally {
        metrics: inbound.metrics.inbound(),
        kind: if caller.retry {
            Kind::Retry
        } else {
            Kind::First
        },
    };
    let log = state.access_log;
    served.begin_log(log.enabled.then(|| log_entry(req, log, addr, caller.retry)));
    let tracer = state.tracer.as_ref();
    served.begin_trace(tracer.and_then(|t| begin_trace(t, req, start)));
    (served, caller, tally)
}

/// Every caller's request is what the fleet sends; a first attempt also earns the
/// retries the budget allows.
fn count_in_fleet(state: &State, caller: &Caller, start: Instant) {
    if let Some(fair) = &state.fair {
        fair.see(caller.addr, start);
    }
    state.budget.record_attempt(start);
    if !caller.retry {
        state.budget.record_request(start);
    }
}

/// Why a request ends before the app is called.
enum Early {
    Refused(&'static Refusal),
    /// A duplicate of a keyed request, settled.
    Duplicate(Answer),
}

/// Dedupe, for a keyed request while `[inbound.dedupe]` is on: the request runs
/// (`Ok`, with its claim on the key when it has one), or it is a duplicate, settled
/// here, or it is refused. Everything else runs without a claim.
async fn dedupe(
    state: &State,
    parts: &http::request::Parts,
    facts: RequestFacts,
    (body, deadline): (AppBody, Deadline),
    served: &mut Served,
) -> Result<(Option<Claim>, AppBody), Early> {
    let Some((dedupe, _)) = state.dedupe.as_ref().filter(|_| !facts.upgrade) else {
        return Ok((None, body));
    };
    let Some(scope) = dedupe.scope(&parts.method, &parts.uri, &parts.headers) else {
        return Ok((None, body));
    };
    if let Some(e) = served.log() {
        e.idempotency_key = parts
            .headers
            .get(dedupe.header())
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    // A retry meant for another replica's keys never runs here.
    if dedupe.foreign_store(facts.dedupe_store) {
        return Err(Early::Refused(&table::NOT_REPLAYABLE));
    }
    // Boxed, as every await of a keyed request's: the future of a request without a
    // key keeps no room for them, and is moved cheaper.
    match Box::pin(dedupe.begin(scope)).await {
        Begin::Run(claim) => Ok((Some(claim), body)),
        Begin::Duplicate(dup) => {
            let hasher = Fingerprinter::of_request(&parts.headers);
            let settled = Box::pin(dup.settle_body(body, hasher, deadline.at())).await;
            Err(Early::Duplicate(settled))
        }
        Begin::Unavailable => Err(Early::Refused(&table::DEDUPE_UNAVAILABLE)),
    }
}

/// The admitted request holds its place until its answer's head: a probe exempt from
/// shedding holds the probes' place, any other a place in the limit.
fn hold_place(
    inbound: &Inbound,
    state: &State,
    exempt: bool,
    served: &mut Served,
    tally: &InboundTally<'_>,
) {
    if exempt {
        tally.metrics.probes_exempt.inc();
        if let Some(e) = served.log() {
            e.kind = Some("probe");
        }
        served.guard().admitted(inbound.probes.clone());
    } else {
        served.guard().admitted(state.limit.clone());
    }
}

/// What the exchange with the app needs of the request, beyond its head and body.
struct ToApp<'a, W> {
    inbound: &'a Inbound,
    /// What carries the request to the app.
    wire: W,
    state: &'a State,
    facts: RequestFacts,
    deadline: Deadline,
    /// The request's SERVER span, the parent of what the app does.
    traceparent: Option<HeaderValue>,
    start: Instant,
    /// Its place in the limit (`None`: a probe exempt from shedding).
    admitted: Option<Admitted>,
}

impl<W: AppWire> ToApp<'_, W> {
    /// The app's answer, relayed to the caller; or the inbound side's own when the
    /// exchange with the app failed. The limit learns the app's latency from it.
    async fn answer(
        self,
        parts: http::request::Parts,
        (claim, body): (Option<Claim>, AppBody),
        served: Served,
        tally: &InboundTally<'_>,
    ) -> AppResponse {
        let (state, start, admitted) = (self.state, self.start, self.admitted);
        let version = parts.version;
        let sent = Instant::now();
        let (result, mark) = self.send(parts, claim, body).await;
        let now = Instant::now();
        // A request that never reached the app says nothing of its latency.
        if let Some(admitted) = admitted
            && result.as_ref().err().is_none_or(|f| f.maybe_sent())
        {
            state.limit.sample(admitted, now - sent, now);
        }
        match result {
            Ok(Answered::Plain(resp)) => relay(served, resp, (version, mark), tally, now - start),
            Ok(Answered::Keyed(head)) => relay_keyed(served, head, version, tally, now - start),
            Err(fault) => refuse(served, answer::refusal(fault), tally),
        }
    }

    /// The request goes to the app: a keyed one through the task that keeps its
    /// answer, any other as it is. With whether the app's failure is to be marked
    /// `downstream-owned` (ownership through the app).
    async fn send(
        self,
        parts: http::request::Parts,
        claim: Option<Claim>,
        body: AppBody,
    ) -> (Result<Answered, Fault>, Mark) {
        let (state, facts) = (self.state, self.facts);
        let mut headers = parts.headers;
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
        let exhausted = self
            .inbound
            .metrics
            .exhausted(crate::metrics::Shortage::Connect);
        if let (Some(claim), Some((_, keyed_app))) = (claim, &state.dedupe) {
            let exchange = keyed::HeadForApp {
                method: parts.method,
                uri,
                headers,
                want,
                deadline: self.deadline,
                header: state.deadline.header.clone(),
                grpc: facts.grpc,
                traceparent: self.traceparent,
            };
            // Boxed, as every await of a keyed request's: the future of a request
            // without a key keeps no room for them.
            let exchange = (exchange, &self.inbound.exchanges);
            let app = (keyed_app.clone(), self.wire);
            let run = keyed::run(claim, app, exchange, body, exhausted.clone());
            return (Box::pin(run).await.map(Answered::Keyed), Mark::No);
        }
        // A request without a claimed key goes to the app as it is.
        let request = RequestHead::as_is(&parts.method, &uri, &headers, ContinueWait::ZERO);
        let fields = DeadlineFields {
            deadline: self.deadline,
            header: &state.deadline.header,
            grpc: facts.grpc,
            traceparent: self.traceparent,
        };
        // Ownership through the app: the request is counted under its ids while the app
        // works on it, so an id two requests carry at once marks neither.
        let marking = (state.config.owned_failures == OwnedFailures::Mark)
            .then(|| self.inbound.owned.arrive(&headers, self.start));
        let result = self
            .wire
            .send(&state.app, want, &request, body, &fields, exhausted)
            .await
            .map_err(|no| no.fault);
        let mark = match (marking, &result) {
            (Some(carrying), Ok(resp)) => {
                let owned = &self.inbound.owned;
                Mark::of((carrying, owned), resp, facts.grpc, parts.version)
            }
            _ => Mark::No,
        };
        (result.map(Answered::Plain), mark)
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
    caller: &Caller,
    start: Instant,
    upgrade: bool,
    trace: Option<&mut RequestTrace>,
) -> Result<Option<Admitted>, (InboundDenied, &'static Refusal)> {
    let (probe, retry) = (caller.probe, caller.retry);
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
            Some(fair) => fair.try_retry(caller.addr, &state.budget, start).is_ok(),
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
    mut served: Served,
    settled: &Answer,
    version: Version,
    tally: &InboundTally<'_>,
) -> AppResponse {
    match settled {
        Answer::Replay(kept) => {
            let guard = served.answered((kept.status.as_u16(), Outcome::Ok, 0), tally);
            Box::new(keyed::replay(kept, version, guard))
        }
        other => {
            // Its body was read to its end, but when the deadline came first.
            if !matches!(other, Answer::InProgress | Answer::BodyError) {
                served.keep_connection();
            }
            let refusal = keyed::refusal(other).unwrap_or(&table::APP_RESET);
            refuse(served, refusal, tally)
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

/// Whether the app's answer is marked `downstream-owned` with `grpc-retry-pushback-ms:
/// -1` (ownership through the app), and where.
enum Mark {
    No,
    /// In its head: a 502, 503 or 504, or a trailers-only gRPC `UNAVAILABLE`.
    Head,
    /// In its trailers if they say `UNAVAILABLE`: a gRPC answer whose status comes last,
    /// with the request it answers, counted under its keys until then.
    Trailers(Carrying<Arc<OwnedCalls>>),
}

impl Mark {
    /// Where the app's answer `resp` to the request `carrying` counts in `owned` (a gRPC
    /// call when `grpc`, answered to its caller in `version`) is marked, if it is.
    fn of(
        (carrying, owned): (Carrying<&OwnedCalls>, &Arc<OwnedCalls>),
        resp: &UpstreamResponse,
        grpc: bool,
        version: Version,
    ) -> Mark {
        if !carrying.keyed() {
            return Mark::No;
        }
        let (status, fields) = (resp.status(), Fields::of(resp));
        if owned::retryable_failure(status, fields, grpc) {
            return if carrying.marks() {
                Mark::Head
            } else {
                Mark::No
            };
        }
        if version == Version::HTTP_2 && owned::status_in_trailers(status, fields, grpc) {
            // Its status comes in its trailers: the request stays counted under its keys
            // until they come.
            return Mark::Trailers(carrying.kept(owned.clone()));
        }
        Mark::No
    }
}

/// The app's answer, as it goes back to the caller: its hop-by-hop fields dropped, and
/// nothing of tollgate's added, unless it is to be marked (`mark`).
fn relay(
    mut served: Served,
    resp: UpstreamResponse,
    (version, mark): (Version, Mark),
    tally: &InboundTally<'_>,
    app: std::time::Duration,
) -> AppResponse {
    let head = matches!(mark, Mark::Head);
    // `ok`, or another tollgate's verdict the app passed on.
    let outcome = if head {
        tally.metrics.owned_failures.inc();
        Outcome::DownstreamOwned
    } else {
        outcome_of(resp.status(), Fields::of(&resp))
    };
    if let Some(e) = served.log() {
        e.upstream_time = Some(app);
    }
    let guard = served.answered((resp.status().as_u16(), outcome, 1), tally);
    let (mut parts, body) = relayed(resp, version);
    if let Mark::Trailers(carrying) = mark {
        let marked = MarkTrailers::new(body, carrying, tally.metrics.owned_failures.clone());
        return Box::new(Response::from_parts(
            parts,
            ResponseBody::boxed(marked.boxed(), guard),
        ));
    }
    let mut added = AddedFields::default();
    if head && version < Version::HTTP_2 {
        // Written straight into the head by the HTTP/1.1 writer.
        added = AddedFields([
            Some(outcome_line(Outcome::DownstreamOwned)),
            Some(NO_RETRY_LINE),
            None,
        ]);
    } else if head {
        parts
            .headers
            .insert(OUTCOME_HEADER, Outcome::DownstreamOwned.header_value());
        parts.headers.insert(GRPC_PUSHBACK, NO_RETRY);
    }
    Box::new(Response::from_parts(
        parts,
        ResponseBody::upstream(body, guard, added),
    ))
}

/// The app's answer to a keyed first arrival, as the task that keeps it relays it.
fn relay_keyed(
    mut served: Served,
    head: keyed::Head,
    version: Version,
    tally: &InboundTally<'_>,
    app: std::time::Duration,
) -> AppResponse {
    if let Some(e) = served.log() {
        e.upstream_time = Some(app);
    }
    let guard = served.answered((head.parts.status.as_u16(), head.outcome, 1), tally);
    let mut parts = head.parts;
    parts.version = version;
    Box::new(Response::from_parts(
        parts,
        ResponseBody::boxed(head.body.boxed(), guard),
    ))
}
