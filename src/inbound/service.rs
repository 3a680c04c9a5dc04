//! The inbound service: one request from a caller, start to finish, judged in the order
//! that spends the least on what will not be served: a deadline already spent (`504`),
//! then the concurrency limit (`503 overloaded`; a kubelet probe may be spared it,
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
use tokio::time::Instant;

use super::Inbound;
use super::answer::{self, Refusal};
use super::app::{self, DeadlineFields, Failed};
use super::attempts::{is_kube_probe, is_retry};
use super::owned;
use crate::access_log::{Direction, Entry};
use crate::answer::{NO_RETRY, NO_RETRY_LINE};
use crate::config::AccessLogConfig;
use crate::config::OwnedFailures;
use crate::deadline::Deadline;
use crate::http::grpc::GRPC_PUSHBACK;
use crate::http::grpc::is_grpc;
use crate::metrics::Outcome;
use crate::metrics::inbound::{InboundDenied, InboundMetrics, Kind};
use crate::retry::headers::{OUTCOME_HEADER, outcome_line, outcome_of};
use crate::server::headers::prepare_request;
use crate::server::service::{AppRequest, AppResponse};
use crate::server::{
    AddedFields, Admission, AppBody, ConnState, RequestGuard, ResponseBody, Service,
};
use crate::trace::{Arrival, Fleet, RequestTrace, Side, Tracer};
use crate::upstream::pool::Want;
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::{Fields, UpstreamResponse, relayed};

/// The callers' requests to the app.
#[derive(Clone)]
pub struct InboundService(pub Arc<Inbound>);

impl Service for InboundService {
    fn call(
        &self,
        req: AppRequest,
        conn: &Arc<ConnState>,
    ) -> impl Future<Output = AppResponse> + Send + use<> {
        let inbound = self.0.clone();
        let conn = conn.clone();
        async move { Box::new(handle(inbound, conn, *req).await) }
    }
}

/// What the request is, for the metrics, the access log and the answers.
struct Call<'a> {
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

impl Call<'_> {
    fn refuse(&mut self, r: &Refusal, mut guard: RequestGuard) -> Response<ResponseBody> {
        let status = r.status(self.grpc).as_u16();
        self.metrics.request(self.kind, status, r.outcome);
        self.logged(&mut guard, status, r.outcome, None);
        r.answer(self.grpc, self.unread, guard)
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

async fn handle(
    inbound: Arc<Inbound>,
    conn: Arc<ConnState>,
    req: Request<AppBody>,
) -> Response<ResponseBody> {
    let start = Instant::now();
    let caller = conn.peer();
    let mut guard = RequestGuard::new(conn, start);
    let state = inbound.state.load_full();
    let probe = is_kube_probe(
        req.method(),
        req.uri().path(),
        req.headers(),
        &state.config.probe_paths,
    );
    let retry = is_retry(req.headers());
    let mut call = Call {
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
        return call.refuse(&answer::CONNECT, guard);
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
        return call.deny(InboundDenied::Deadline, &answer::EXPIRED, guard);
    }
    // A probe may be exempt from shedding, without a place in the limit; an upgrade
    // becomes a tunnel for as long as it lasts: not a request the limit can learn from
    // or should refuse.
    let exempt = probe && !facts.upgrade && inbound.probes.try_take();
    let admitted = if exempt {
        None
    } else if facts.upgrade {
        Some(state.limit.enter())
    } else {
        match state.limit.try_enter() {
            Some(a) => Some(a),
            None => return call.deny(InboundDenied::Overloaded, &answer::OVERLOADED, guard),
        }
    };
    if retry {
        let granted = match &state.fair {
            Some(fair) => fair.try_retry(caller, &state.budget, start).is_ok(),
            None => state.budget.try_retry(start),
        };
        if let Some(t) = call.trace.as_mut() {
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
            return call.deny(InboundDenied::RetryBudget, &answer::RETRY_REJECTED, guard);
        }
    }
    if exempt {
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
    let head = RequestHead {
        method: &parts.method,
        uri: &uri,
        headers: &headers,
        fields: AttemptFields::default(),
        https: false,
        continue_wait: std::time::Duration::ZERO,
    };
    let want = match parts.version {
        _ if facts.upgrade => Want::Http1,
        Version::HTTP_2 => Want::PreferHttp2,
        _ => Want::Http1,
    };
    let fields = DeadlineFields {
        deadline: Deadline::new(start, facts.caller_timeout, state.config.request_timeout),
        header: &state.deadline.header,
        grpc: facts.grpc,
        traceparent: call.trace.as_ref().map(RequestTrace::traceparent),
    };
    let sent = Instant::now();
    let exhausted = inbound.metrics.exhausted(crate::metrics::Shortage::Connect);
    let result = app::send(&state.app, want, &head, body, &fields, exhausted).await;
    let now = Instant::now();
    if let Some(admitted) = admitted
        && !matches!(result, Err(Failed::Unreachable | Failed::NoDescriptors))
    {
        state.limit.sample(admitted, now - sent, now);
    }
    match result {
        Ok(resp) => {
            let mark = state.config.owned_failures == OwnedFailures::Mark
                && owned::retryable_failure(resp.status(), Fields::of(&resp))
                && inbound.owned.gave_up_since(&headers, start);
            relay(&mut call, resp, (parts.version, mark), guard, now - start)
        }
        Err(failed) => call.refuse(refusal(failed), guard),
    }
}

/// The request's trace, when `[tracing]` decides it is traced: its SERVER span begun at
/// `start`, with the caller's attempt number when it said.
fn begin_trace(tracer: &Tracer, req: &Request<AppBody>, start: Instant) -> Option<RequestTrace> {
    let arrival = Arrival {
        side: Side::Inbound,
        method: req.method(),
        authority: req
            .uri()
            .authority()
            .map(|a| a.as_str())
            .or_else(|| req.headers().get(HOST).and_then(|h| h.to_str().ok()))
            .unwrap_or_default(),
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
    let uri = req.uri();
    let path = if log.query {
        uri.path_and_query().map_or("/", |p| p.as_str())
    } else {
        uri.path()
    };
    let authority = uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| req.headers().get(HOST).and_then(|h| h.to_str().ok()))
        .unwrap_or_default();
    let mut e = Entry::new(
        log.format,
        Direction::Inbound,
        req.method().clone(),
        authority.to_string(),
        path.to_string(),
    );
    e.caller = Some(caller);
    e.kind = Some(if retry { "retry" } else { "first" });
    e
}

fn refusal(failed: Failed) -> &'static Refusal {
    match failed {
        Failed::Timeout => &answer::TIMED_OUT,
        Failed::Unreachable => &answer::UNREACHABLE,
        Failed::Reset => &answer::RESET,
        Failed::NoDescriptors => &answer::NO_DESCRIPTORS,
    }
}

/// The app's answer, as it goes back to the caller: its hop-by-hop fields dropped, and
/// nothing of tollgate's added, unless it is to be marked (`mark`) `downstream-owned`
/// with `grpc-retry-pushback-ms: -1` (ownership through the app).
fn relay(
    call: &mut Call<'_>,
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
