//! Spans recorded, queued and encoded, then decoded with the official OTLP messages
//! (the `opentelemetry-proto` crate, generated from OpenTelemetry's .proto files): what
//! a collector would read is what tollgate meant to say.

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use prost::Message;
use tokio::time::Instant;

use super::encode::{self, Clock, Resource};
use super::queue::{self, Taken, Taker};
use super::*;
use crate::fault::Fault;
use crate::metrics::trace::SpanDrop;
use crate::metrics::{Denied, Metrics, Outcome};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn headers(tp: Option<&'static str>, state: Option<&'static str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(tp) = tp {
        h.insert(TRACEPARENT, HeaderValue::from_static(tp));
    }
    if let Some(s) = state {
        h.insert(TRACESTATE, HeaderValue::from_static(s));
    }
    h
}

fn arrival<'a>(side: Side, headers: &'a HeaderMap) -> Arrival<'a> {
    Arrival {
        side,
        method: &Method::GET,
        authority: "payments.internal:8080",
        path: "/charge?card=4111",
        https: false,
        upstream: if side == Side::Outbound {
            "payments"
        } else {
            ""
        },
        headers,
    }
}

fn pipeline(
    capacity: usize,
) -> (
    std::sync::Arc<queue::Queue<super::span::Spans>>,
    Taker<super::span::Spans>,
    Metrics,
) {
    let metrics = std::sync::Arc::try_unwrap(Metrics::new()).unwrap_or_else(|_| unreachable!());
    let (q, taker) = queue::queue(capacity, 512, metrics.trace_drops().clone());
    (q, taker, metrics)
}

fn start(
    q: &std::sync::Arc<queue::Queue<super::span::Spans>>,
    h: &HeaderMap,
    side: Side,
    now: Instant,
) -> RequestTrace {
    let context = Sampler::new(1.0).decide(h).context().unwrap();
    RequestTrace::new(q.clone(), context, &arrival(side, h), now)
}

/// What the collector would receive for what was queued.
fn decode(taker: &mut Taker<super::span::Spans>) -> Vec<Span> {
    let mut batch = Vec::new();
    while let Taken::Spans(s) = taker.take() {
        batch.push(s);
    }
    let resource = Resource {
        service_name: "checkout-sidecar".into(),
        host_name: Some("checkout-7d9f".into()),
    };
    let body = encode::export_request(&batch, &resource, Clock::now());
    let req = ExportTraceServiceRequest::decode(&body[..]).expect("valid OTLP");
    assert_eq!(req.resource_spans.len(), 1);
    let rs = &req.resource_spans[0];
    let res = rs.resource.as_ref().unwrap();
    let service = res
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .unwrap();
    assert_eq!(
        string(&service.value.as_ref().unwrap().value),
        "checkout-sidecar"
    );
    assert_eq!(rs.scope_spans.len(), 1);
    assert_eq!(rs.scope_spans[0].scope.as_ref().unwrap().name, "tollgate");
    rs.scope_spans[0].spans.clone()
}

fn string(v: &Option<Value>) -> &str {
    match v {
        Some(Value::StringValue(s)) => s,
        other => panic!("not a string: {other:?}"),
    }
}

fn attr<'s>(span: &'s Span, key: &str) -> Option<&'s Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn str_attr<'s>(span: &'s Span, key: &str) -> &'s str {
    match attr(span, key) {
        Some(Value::StringValue(s)) => s,
        other => panic!("{key}: {other:?} on {}", span.name),
    }
}

fn int_attr(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Value::IntValue(i)) => *i,
        other => panic!("{key}: {other:?} on {}", span.name),
    }
}

fn endpoint(port: u16) -> Option<SocketAddr> {
    Some(SocketAddr::from(([10, 0, 0, 5], port)))
}

/// A request retried twice and refused a fourth attempt by the budget; the
/// `traceparent` each attempt carried.
fn retried_twice(
    q: &std::sync::Arc<queue::Queue<super::span::Spans>>,
    h: &HeaderMap,
) -> Vec<TraceParent> {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut t = start(q, h, Side::Outbound, t0);
    let mut sent = Vec::new();
    let s503 = Fault::Status(http::StatusCode::SERVICE_UNAVAILABLE);
    let results = [
        (Some(503), None, None),
        (None, Some(Fault::Reset), Some(s503)),
        (Some(503), None, Some(Fault::Reset)),
    ];
    for (n, (status, fault, reason)) in (1u32..).zip(results) {
        let at = t0 + ms(40 * u64::from(n));
        let a = t.attempt(
            AttemptStart {
                number: n,
                hedge: false,
                endpoint: endpoint(8080 + n as u16),
                reason,
                deadline_left: Some(ms(1000 - 40 * u64::from(n))),
            },
            at,
        );
        sent.push(TraceParent::parse(t.attempt_traceparent(a).as_bytes()).unwrap());
        let end = AttemptEnd {
            status,
            fault,
            callee_outcome: None,
            ejected: n == 2,
        };
        t.attempt_ended(a, end, at + ms(10));
        t.after_failure(
            a,
            AfterFailure {
                denied: (n == 3).then_some(Denied::Budget),
                budget_available: Some(if n == 3 { 0.0 } else { 3.5 }),
            },
        );
        if n < 3 {
            t.backoff(ms(15), false, at + ms(10));
        }
    }
    t.finish(503, Outcome::BudgetExhausted, t0 + ms(200));
    sent
}

#[test]
fn a_retried_request_is_one_server_span_over_its_attempts() {
    let (q, mut taker, _m) = pipeline(100);
    let h = headers(Some(PARENT), Some("vendor=abc,other=1"));
    let sent = retried_twice(&q, &h);
    let spans = decode(&mut taker);
    assert_eq!(spans.len(), 4, "a SERVER span and three CLIENT spans");
    let server = &spans[0];
    let incoming = TraceParent::parse(PARENT.as_bytes()).unwrap();
    assert_eq!(server.kind, SpanKind::Server as i32);
    assert_eq!(server.name, "GET payments");
    assert_eq!(server.trace_id, incoming.trace_id.to_bytes());
    assert_eq!(
        server.parent_span_id,
        incoming.parent_id.to_bytes(),
        "under the app's span"
    );
    assert_eq!(server.trace_state, "vendor=abc,other=1");
    assert_eq!(server.flags, 0x301, "sampled, with a remote parent");
    assert_eq!(str_attr(server, "http.request.method"), "GET");
    assert_eq!(str_attr(server, "url.path"), "/charge", "no query");
    assert_eq!(str_attr(server, "server.address"), "payments.internal");
    assert_eq!(int_attr(server, "server.port"), 8080);
    assert_eq!(int_attr(server, "http.response.status_code"), 503);
    assert_eq!(str_attr(server, "error.type"), "503");
    assert_eq!(str_attr(server, "tollgate.outcome"), "budget-exhausted");
    assert_eq!(str_attr(server, "tollgate.upstream"), "payments");
    assert_eq!(int_attr(server, "tollgate.attempts"), 3);
    assert_eq!(
        server.status.as_ref().unwrap().code,
        StatusCode::Error as i32
    );
    assert_eq!(server.events.len(), 2, "two backoff sleeps");
    let sleep = &server.events[0];
    assert_eq!(sleep.name, "backoff");
    assert!(sleep.time_unix_nano > server.start_time_unix_nano);
    assert!(server.end_time_unix_nano - server.start_time_unix_nano == 200_000_000);

    for (n, (client, tp)) in (1..).zip(spans[1..].iter().zip(&sent)) {
        assert_eq!(client.kind, SpanKind::Client as i32);
        assert_eq!(client.trace_id, server.trace_id);
        assert_eq!(
            client.parent_span_id, server.span_id,
            "attempt {n} under the SERVER span"
        );
        assert_eq!(
            client.span_id,
            tp.parent_id.to_bytes(),
            "the id sent upstream is the attempt's"
        );
        assert_eq!(tp.trace_id.to_bytes()[..], server.trace_id[..]);
        assert!(tp.sampled());
        assert_eq!(client.flags, 0x101, "sampled, a local parent");
        assert_eq!(
            str_attr(client, "url.full"),
            "http://payments.internal:8080/charge"
        );
        assert_eq!(str_attr(client, "server.address"), "payments.internal");
        assert_eq!(str_attr(client, "network.peer.address"), "10.0.0.5");
        assert_eq!(int_attr(client, "network.peer.port"), 8080 + n);
        assert_eq!(int_attr(client, "tollgate.attempt"), n);
        assert_eq!(str_attr(client, "tollgate.upstream"), "payments");
        assert_eq!(
            attr(client, "tollgate.hedge"),
            Some(&Value::BoolValue(false))
        );
        assert_eq!(int_attr(client, "tollgate.deadline.left_ms"), 1000 - 40 * n);
        assert_eq!(
            client.end_time_unix_nano - client.start_time_unix_nano,
            10_000_000
        );
        assert_eq!(
            client.status.as_ref().unwrap().code,
            StatusCode::Error as i32
        );
        match n {
            1 => assert!(attr(client, "http.request.resend_count").is_none()),
            _ => assert_eq!(int_attr(client, "http.request.resend_count"), n - 1),
        }
    }
    let [first, second, third] = [&spans[1], &spans[2], &spans[3]];
    assert_eq!(int_attr(first, "http.response.status_code"), 503);
    assert_eq!(str_attr(first, "error.type"), "503");
    assert!(attr(first, "tollgate.retry.reason").is_none());
    assert!(attr(first, "tollgate.denied").is_none(), "retried");
    assert_eq!(
        attr(first, "tollgate.budget.available"),
        Some(&Value::DoubleValue(3.5))
    );
    assert_eq!(str_attr(second, "error.type"), "reset");
    assert!(attr(second, "http.response.status_code").is_none());
    assert_eq!(str_attr(second, "tollgate.retry.reason"), "503");
    assert_eq!(
        attr(second, "tollgate.endpoint.ejected"),
        Some(&Value::BoolValue(true))
    );
    assert_eq!(str_attr(third, "tollgate.retry.reason"), "reset");
    assert_eq!(
        str_attr(third, "tollgate.denied"),
        "budget",
        "the fourth attempt refused"
    );
    assert_eq!(
        attr(third, "tollgate.budget.available"),
        Some(&Value::DoubleValue(0.0))
    );
}

#[test]
fn a_request_without_traceparent_starts_a_trace_of_its_own() {
    let (q, mut taker, _m) = pipeline(100);
    // A tracestate without a traceparent belongs to no trace tollgate continues.
    let h = headers(None, Some("vendor=abc"));
    let t = start(&q, &h, Side::Outbound, Instant::now());
    let id = t.trace_id();
    t.finish(200, Outcome::Ok, Instant::now());
    let spans = decode(&mut taker);
    let server = &spans[0];
    assert_eq!(server.trace_id, id.to_bytes());
    assert!(server.parent_span_id.is_empty(), "a root");
    assert_eq!(server.trace_state, "");
    assert_eq!(server.flags, 0x101);
    assert!(attr(server, "error.type").is_none());
    assert!(server.status.is_none(), "unset: not an error");
    assert_eq!(str_attr(server, "tollgate.outcome"), "ok");
}

#[test]
fn the_inbound_side_records_its_decisions_and_its_app_hangs_under_it() {
    let (q, mut taker, _m) = pipeline(100);
    let h = headers(Some(PARENT), None);
    let mut t = start(&q, &h, Side::Inbound, Instant::now());
    t.caller_attempt(2);
    t.fleet(Fleet::Granted, Some(4.0));
    t.dedupe(Dedupe::Replayed);
    let to_app = TraceParent::parse(t.traceparent().as_bytes()).unwrap();
    assert_eq!(
        to_app.parent_id,
        t.span_id(),
        "the app's spans go under the SERVER span"
    );
    t.finish(200, Outcome::Ok, Instant::now());
    let spans = decode(&mut taker);
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(s.name, "GET inbound");
    assert_eq!(int_attr(s, "tollgate.caller.attempt"), 2);
    assert_eq!(str_attr(s, "tollgate.fleet"), "granted");
    assert_eq!(
        attr(s, "tollgate.budget.available"),
        Some(&Value::DoubleValue(4.0))
    );
    assert_eq!(str_attr(s, "tollgate.dedupe"), "replayed");
    assert!(attr(s, "tollgate.upstream").is_none());
}

#[test]
fn a_request_dropped_unfinished_is_exported_cancelled() {
    let (q, mut taker, _m) = pipeline(100);
    let h = headers(Some(PARENT), None);
    let mut t = start(&q, &h, Side::Outbound, Instant::now());
    let start_of = AttemptStart {
        number: 1,
        hedge: false,
        endpoint: endpoint(80),
        reason: None,
        deadline_left: None,
    };
    t.attempt(start_of, Instant::now());
    let hedge = t.attempt(
        AttemptStart {
            number: 2,
            hedge: true,
            ..start_of
        },
        Instant::now(),
    );
    assert_ne!(t.attempt_traceparent(hedge), t.traceparent());
    drop(t);
    let spans = decode(&mut taker);
    assert_eq!(spans.len(), 3);
    assert_eq!(str_attr(&spans[0], "error.type"), "cancelled");
    assert!(attr(&spans[0], "http.response.status_code").is_none());
    for client in &spans[1..] {
        assert_eq!(str_attr(client, "error.type"), "cancelled");
        assert!(attr(client, "tollgate.deadline.left_ms").is_none());
    }
    assert_eq!(
        attr(&spans[2], "tollgate.hedge"),
        Some(&Value::BoolValue(true))
    );
}

#[test]
fn a_full_queue_drops_and_counts_whole_traces_without_waiting() {
    let (q, mut taker, m) = pipeline(5);
    let h = headers(Some(PARENT), None);
    // 4 spans each: the first fits, the second would make 8 of 5.
    for _ in 0..2 {
        retried_twice(&q, &h);
    }
    assert_eq!(q.waiting(), 4);
    assert_eq!(m.trace_drops().get(SpanDrop::QueueFull), 4);
    assert_eq!(decode(&mut taker).len(), 4);
    assert_eq!(q.waiting(), 0, "taken spans no longer count");
    retried_twice(&q, &h);
    assert_eq!(q.waiting(), 4, "room again");
}

#[test]
fn an_unknown_method_is_other_with_the_original_beside_it() {
    let (q, mut taker, _m) = pipeline(100);
    let h = headers(Some(PARENT), None);
    let purge = Method::from_bytes(b"PURGE").unwrap();
    let a = Arrival {
        method: &purge,
        ..arrival(Side::Outbound, &h)
    };
    let context = Sampler::new(1.0).decide(&h).context().unwrap();
    RequestTrace::new(q.clone(), context, &a, Instant::now()).finish(
        204,
        Outcome::Ok,
        Instant::now(),
    );
    let spans = decode(&mut taker);
    assert_eq!(str_attr(&spans[0], "http.request.method"), "_OTHER");
    assert_eq!(str_attr(&spans[0], "http.request.method_original"), "PURGE");
    assert_eq!(spans[0].name, "PURGE payments");
}

#[test]
fn a_large_batch_encodes_every_span() {
    let (q, mut taker, _m) = pipeline(100_000);
    let h = headers(Some(PARENT), Some("vendor=abc"));
    for _ in 0..500 {
        retried_twice(&q, &h);
    }
    assert_eq!(decode(&mut taker).len(), 2000);
}
