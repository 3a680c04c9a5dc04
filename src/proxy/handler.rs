//! One request, start to finish: route it, admit it, fix its deadline, clean its headers,
//! hand it to the retry engine, and dress the answer with what the app must know
//! (`x-tollgate-attempts`, and `x-tollgate-outcome` when tollgate gave up).

use std::convert::Infallible;
use std::sync::Arc;

use http::header::{CONNECTION, CONTENT_TYPE, HOST, RETRY_AFTER};
use http::uri::PathAndQuery;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use tokio::time::Instant;

use super::Shared;
use super::body::{AppBody, RequestGuard, ResponseBody, Stamp};
use super::conn::ConnState;
use super::headers::{prepare_request, strip};
use super::route::authority_of;
use crate::deadline::Deadline;
use crate::metrics::{Outcome, UpstreamMetrics};
use crate::retry::policy::{ATTEMPTS_HEADER, OUTCOME_HEADER};
use crate::retry::{self, Answer, Exchange, Reply, count_value};
use crate::upstream::pool::UpstreamBody;

pub async fn handle(
    shared: Arc<Shared>,
    fixed: Option<Arc<str>>,
    conn: Arc<ConnState>,
    req: Request<AppBody>,
) -> Result<Response<ResponseBody>, Infallible> {
    let start = Instant::now();
    let mut guard = RequestGuard::new(conn, start);
    // An HTTP/1.x body tollgate does not read to its end leaves the connection unable
    // to carry another request: the answer must say so, or the app's next request on
    // it meets a reset (and its HTTP client may retry that behind tollgate's back).
    let unread_if_refused = req.version() < Version::HTTP_2 && !req.body().is_end_stream();

    let upstream = {
        let snap = shared.snapshot.load();
        match &fixed {
            Some(name) => snap.by_name(name).cloned(),
            None => authority_of(&req)
                .and_then(|a| snap.routes.lookup(a))
                .and_then(|i| snap.upstreams.get(i).cloned()),
        }
    };
    let Some(up) = upstream else {
        shared.unrouted.inc();
        return Ok(closing(
            unread_if_refused,
            local(
                None,
                StatusCode::NOT_FOUND,
                Outcome::NoRoute,
                0,
                "no upstream is configured for this authority\n",
                None,
                guard,
            ),
        ));
    };
    if req.method() == Method::CONNECT {
        // Tunnels would carry anything anywhere; tollgate originates TLS itself.
        return Ok(closing(
            unread_if_refused,
            local(
                Some(&up.metrics),
                StatusCode::METHOD_NOT_ALLOWED,
                Outcome::NotRetryable,
                0,
                "CONNECT is not supported: send plain HTTP, tollgate speaks TLS upstream\n",
                None,
                guard,
            ),
        ));
    }
    if !guard.admit(&up) {
        return Ok(closing(
            unread_if_refused,
            local(
                Some(&up.metrics),
                StatusCode::SERVICE_UNAVAILABLE,
                Outcome::Overloaded,
                0,
                "too many requests in flight to this upstream\n",
                Some(HeaderValue::from_static("1")),
                guard,
            ),
        ));
    }

    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    let facts = prepare_request(&mut headers, &up.deadline.accept);
    if facts.caller_timeout.is_some_and(|c| c.is_zero()) {
        up.metrics.denied(crate::metrics::Denied::Deadline);
        return Ok(closing(
            unread_if_refused,
            local(
                Some(&up.metrics),
                StatusCode::GATEWAY_TIMEOUT,
                Outcome::DeadlineExceeded,
                0,
                "the deadline had expired on arrival\n",
                None,
                guard,
            ),
        ));
    }
    let deadline = Deadline::new(start, facts.caller_timeout, up.config.request_timeout);
    up.budget.record_request(start);

    // The Host sent upstream: the configured one, else the authority the app called,
    // which for an origin-form HTTP/1.1 request is already the Host header.
    match (&up.config.host, parts.uri.authority()) {
        (Some(h), _) => {
            headers.insert(HOST, h.clone());
        }
        (None, Some(a)) => {
            if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                headers.insert(HOST, v);
            }
        }
        (None, None) => {}
    }
    let version = parts.version;
    let uri = origin_form(&parts.uri);

    let answer = retry::forward(
        &up,
        Exchange {
            method: parts.method,
            uri,
            version,
            headers,
            body,
            deadline,
            grpc: facts.grpc,
        },
    )
    .await;
    let close = version < Version::HTTP_2
        && answer.body_unread
        && (answer.outcome != Outcome::Ok || matches!(answer.reply, Reply::Local(_)));
    Ok(closing(close, respond(&up.metrics, answer, version, guard)))
}

/// The path and query alone, as HTTP/1.1 origin-form.
fn origin_form(uri: &Uri) -> Uri {
    if uri.scheme().is_none() && uri.authority().is_none() {
        return uri.clone();
    }
    let pq = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Uri::from(pq)
}

fn respond(
    metrics: &UpstreamMetrics,
    answer: Answer,
    version: http::Version,
    guard: RequestGuard,
) -> Response<ResponseBody> {
    match answer.reply {
        Reply::Upstream(resp) => {
            let (mut parts, body) = resp.into_parts();
            match &body {
                UpstreamBody::Http2(_) => strip(&mut parts.headers),
                // An HTTP/1.1 response lost its hop-by-hop fields as it was parsed and
                // keeps the rest in its head, from where they go to an HTTP/1.1 app as
                // they are; an HTTP/2 app needs them in the map.
                UpstreamBody::Http1(b) if version == Version::HTTP_2 => {
                    b.fields().append_to(&mut parts.headers);
                }
                UpstreamBody::Http1(_) => {}
            }
            parts.version = version;
            let outcome = (answer.outcome != Outcome::Ok && !answer.owned_elsewhere)
                .then_some(answer.outcome);
            metrics.request(parts.status.as_u16(), answer.outcome, answer.attempts);
            let body = ResponseBody::upstream(body, guard);
            if version < Version::HTTP_2 {
                // Written straight into the head by the HTTP/1.1 writer; an upstream's
                // own count goes (an HTTP/1.1 one's went as its head was read).
                if !parts.headers.is_empty() {
                    parts.headers.remove(ATTEMPTS_HEADER);
                }
                let stamp = Stamp {
                    attempts: answer.attempts,
                    outcome,
                };
                return Response::from_parts(parts, body.stamped(stamp));
            }
            parts
                .headers
                .insert(ATTEMPTS_HEADER, count_value(answer.attempts));
            if let Some(o) = outcome {
                parts.headers.insert(OUTCOME_HEADER, o.header_value());
            }
            Response::from_parts(parts, body)
        }
        Reply::Local(status) => {
            let text = match status {
                StatusCode::GATEWAY_TIMEOUT => "no response from the upstream in time\n",
                _ => "the upstream could not be reached\n",
            };
            local(
                Some(metrics),
                status,
                answer.outcome,
                answer.attempts,
                text,
                None,
                guard,
            )
        }
    }
}

/// Adds `Connection: close` when the app's HTTP/1.x body was left unread.
fn closing(close: bool, mut resp: Response<ResponseBody>) -> Response<ResponseBody> {
    if close {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

fn local(
    metrics: Option<&UpstreamMetrics>,
    status: StatusCode,
    outcome: Outcome,
    attempts: u32,
    text: &'static str,
    retry_after: Option<HeaderValue>,
    guard: RequestGuard,
) -> Response<ResponseBody> {
    if let Some(m) = metrics {
        m.request(status.as_u16(), outcome, attempts);
    }
    let mut resp = Response::new(ResponseBody::full(text, Some(guard)));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(ATTEMPTS_HEADER, count_value(attempts));
    if outcome != Outcome::Ok {
        h.insert(OUTCOME_HEADER, outcome.header_value());
    }
    if let Some(ra) = retry_after {
        h.insert(RETRY_AFTER, ra);
    }
    resp
}
