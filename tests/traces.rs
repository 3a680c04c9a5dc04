//! Traces reach a real OTLP/HTTP receiver: a server on loopback that takes
//! `POST /v1/traces` and decodes each body with the official OTLP messages (the
//! `opentelemetry-proto` crate). A receiver that is down or never answers costs the
//! caller of the tracing API nothing: its spans are dropped and counted.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Tollgate, Upstream, dead_port, full, inbound_config, wait_until};
use http::{HeaderMap, HeaderValue, Method, Response};
use http_body_util::BodyExt;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use tokio::time::Instant;
use tollgate::config::{OtlpAddr, TracingConfig};
use tollgate::metrics::Metrics;
use tollgate::metrics::trace::SpanDrop;
use tollgate::metrics::{AttemptResult, Denied, Outcome};
use tollgate::trace::{
    AfterFailure, Arrival, AttemptEnd, AttemptStart, RetryReason, Side, TRACEPARENT, TraceParent,
    Tracer,
};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// What the receiver got: each export's spans, as decoded.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Vec<Span>>>>);

impl Received {
    fn spans(&self) -> Vec<Span> {
        self.0.lock().unwrap().iter().flatten().cloned().collect()
    }

    fn exports(&self) -> Vec<usize> {
        self.0.lock().unwrap().iter().map(Vec::len).collect()
    }
}

/// An OTLP/HTTP receiver: only `POST /v1/traces` with a protobuf body is taken.
async fn receiver() -> (Upstream, Received) {
    let received = Received::default();
    let into = received.clone();
    let server = Upstream::start(move |req| {
        let into = into.clone();
        async move {
            let typed = req.headers().get("content-type").map(HeaderValue::as_bytes)
                == Some(b"application/x-protobuf");
            if req.method() != Method::POST || req.uri().path() != "/v1/traces" || !typed {
                return Response::builder().status(404).body(full("")).unwrap();
            }
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let Ok(export) = ExportTraceServiceRequest::decode(body) else {
                return Response::builder().status(400).body(full("")).unwrap();
            };
            let spans = export
                .resource_spans
                .into_iter()
                .flat_map(|r| r.scope_spans)
                .flat_map(|s| s.spans)
                .collect();
            into.0.lock().unwrap().push(spans);
            Response::builder()
                .header("content-type", "application/x-protobuf")
                .body(full(""))
                .unwrap()
        }
    })
    .await;
    (server, received)
}

fn config(collector: SocketAddr, batch: usize, queue: usize, timeout: Duration) -> TracingConfig {
    TracingConfig {
        otlp: OtlpAddr::parse(&format!("http://{collector}")).unwrap(),
        sample: 0.0,
        batch,
        queue,
        timeout,
    }
}

fn with_parent() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(TRACEPARENT, HeaderValue::from_static(PARENT));
    h
}

/// One request as the request path records it: three attempts, the last refused a
/// retry by the budget. Returns the `traceparent` each attempt carried.
fn record_retried(tracer: &Tracer, headers: &HeaderMap) -> Vec<TraceParent> {
    let arrival = Arrival {
        side: Side::Outbound,
        method: &Method::GET,
        authority: "payments",
        path: "/charge",
        https: false,
        upstream: "payments",
        headers,
    };
    let t0 = Instant::now();
    let mut trace = tracer
        .request(&arrival, t0)
        .expect("a sampled parent is followed");
    let mut sent = Vec::new();
    for n in 1..=3u32 {
        let reason = (n > 1).then_some(RetryReason::Status(503));
        let start = AttemptStart {
            number: n,
            hedge: false,
            endpoint: Some(SocketAddr::from(([127, 0, 0, 1], 9000))),
            reason,
            deadline_left: Some(Duration::from_millis(900)),
        };
        let a = trace.attempt(start, Instant::now());
        sent.push(TraceParent::parse(trace.attempt_traceparent(a).as_bytes()).unwrap());
        let end = AttemptEnd {
            status: Some(503),
            result: AttemptResult::ServerError,
            callee_outcome: None,
            ejected: false,
        };
        trace.attempt_ended(a, end, Instant::now());
        let denied = (n == 3).then_some(Denied::Budget);
        let after = AfterFailure {
            denied,
            budget_available: Some(0.0),
        };
        trace.after_failure(a, after);
        if n < 3 {
            trace.backoff(Duration::from_millis(5), false, Instant::now());
        }
    }
    trace.finish(503, Outcome::BudgetExhausted, Instant::now());
    sent
}

fn attr<'s>(span: &'s Span, key: &str) -> Option<&'s Value> {
    let kv = span.attributes.iter().find(|kv| kv.key == key)?;
    kv.value.as_ref()?.value.as_ref()
}

#[tokio::test]
async fn a_retried_request_arrives_as_one_trace() {
    let (collector, received) = receiver().await;
    let metrics = Metrics::new();
    let cfg = config(collector.addr, 512, 8192, Duration::from_secs(2));
    let tracer = Tracer::new(&cfg, metrics.trace_drops().clone()).unwrap();
    let sent = record_retried(&tracer, &with_parent());

    let arrived = wait_until(Duration::from_secs(10), || received.spans().len() == 4).await;
    assert!(arrived, "spans at the receiver: {}", received.spans().len());
    let spans = received.spans();
    let server = &spans[0];
    let parent = TraceParent::parse(PARENT.as_bytes()).unwrap();
    assert_eq!(
        server.trace_id,
        parent.trace_id.to_bytes(),
        "the app's trace, continued"
    );
    assert_eq!(server.parent_span_id, parent.parent_id.to_bytes());
    assert_eq!(server.events.len(), 2, "the two backoff sleeps");
    for (client, tp) in spans[1..].iter().zip(&sent) {
        assert_eq!(client.parent_span_id, server.span_id);
        assert_eq!(
            client.span_id,
            tp.parent_id.to_bytes(),
            "the id sent upstream"
        );
    }
    assert_eq!(
        attr(&spans[3], "tollgate.denied"),
        Some(&Value::StringValue("budget".into())),
        "the fourth attempt, refused by the budget"
    );
    assert_eq!(metrics.trace_drops().get(SpanDrop::ExportFailed), 0);
    assert_eq!(metrics.trace_drops().get(SpanDrop::QueueFull), 0);
}

#[tokio::test]
async fn exports_hold_at_most_batch_spans_and_unsampled_requests_send_nothing() {
    let (collector, received) = receiver().await;
    let metrics = Metrics::new();
    let cfg = config(collector.addr, 4, 8192, Duration::from_secs(2));
    let tracer = Tracer::new(&cfg, metrics.trace_drops().clone()).unwrap();
    let mut unsampled = HeaderMap::new();
    unsampled.insert(
        TRACEPARENT,
        HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
    );
    let arrival = Arrival {
        side: Side::Outbound,
        method: &Method::GET,
        authority: "payments",
        path: "/",
        https: false,
        upstream: "payments",
        headers: &unsampled,
    };
    assert!(
        tracer.request(&arrival, Instant::now()).is_none(),
        "not sampled: never"
    );
    let none = HeaderMap::new();
    let arrival = Arrival {
        headers: &none,
        ..arrival
    };
    assert!(
        tracer.request(&arrival, Instant::now()).is_none(),
        "sample = 0"
    );

    for _ in 0..3 {
        record_retried(&tracer, &with_parent());
    }
    let arrived = wait_until(Duration::from_secs(10), || received.spans().len() == 12).await;
    assert!(arrived, "spans at the receiver: {:?}", received.exports());
    assert!(
        received.exports().iter().all(|n| *n <= 4),
        "{:?}",
        received.exports()
    );
}

#[tokio::test]
async fn a_collector_that_is_down_costs_spans_counted_never_the_caller() {
    let metrics = Metrics::new();
    let cfg = config(dead_port().await, 512, 8192, Duration::from_secs(2));
    let tracer = Tracer::new(&cfg, metrics.trace_drops().clone()).unwrap();
    for _ in 0..50 {
        record_retried(&tracer, &with_parent());
    }
    let drops = metrics.trace_drops();
    let counted = wait_until(Duration::from_secs(10), || {
        drops.get(SpanDrop::ExportFailed) == 200
    })
    .await;
    assert!(
        counted,
        "export-failed: {}",
        drops.get(SpanDrop::ExportFailed)
    );
    assert_eq!(drops.get(SpanDrop::QueueFull), 0);
    let text = String::from_utf8(metrics.encode()).unwrap();
    assert!(
        text.contains("tollgate_trace_spans_dropped_total{reason=\"export-failed\"} 200\n"),
        "{text}"
    );
}

#[tokio::test]
async fn a_collector_that_never_answers_fills_the_queue_and_the_rest_is_dropped() {
    // Takes the connection and the request, and never answers.
    let collector =
        Upstream::start(|_req| std::future::pending::<Response<common::BoxBody>>()).await;
    let metrics = Metrics::new();
    let cfg = config(collector.addr, 4, 8, Duration::from_secs(3));
    let tracer = Tracer::new(&cfg, metrics.trace_drops().clone()).unwrap();
    let drops = metrics.trace_drops();

    // A whole batch: the exporter takes it and waits on the collector.
    record_retried(&tracer, &with_parent());
    let stuck = wait_until(Duration::from_secs(10), || {
        collector.hits.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    assert!(stuck, "the export reached the collector");
    assert_eq!(tracer.waiting(), 0);

    // Meanwhile requests go on: two traces fill the queue (8 spans), the third is
    // dropped at once, and none of them waits.
    for _ in 0..3 {
        record_retried(&tracer, &with_parent());
    }
    assert_eq!(tracer.waiting(), 8);
    assert_eq!(drops.get(SpanDrop::QueueFull), 4);

    // The stuck export ends at its timeout, counted; the queue drains behind it.
    let failed = wait_until(Duration::from_secs(15), || {
        drops.get(SpanDrop::ExportFailed) >= 4
    })
    .await;
    assert!(
        failed,
        "export-failed: {}",
        drops.get(SpanDrop::ExportFailed)
    );
    let drained = wait_until(Duration::from_secs(15), || tracer.waiting() == 0).await;
    assert!(drained, "waiting: {}", tracer.waiting());
}

// ---- Through tollgate: the spans the request path makes ------------------------------

/// `[tracing]` for a tollgate exporting to `collector`, sending at once.
fn tracing_section(collector: SocketAddr, sample: f64) -> String {
    format!("[tracing]\notlp = \"http://{collector}\"\nsample = {sample}\nbatch = 4\n")
}

/// What an app behind tollgate saw of `traceparent`, one entry per request.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Option<String>>>>);

impl Seen {
    fn all(&self) -> Vec<Option<String>> {
        self.0.lock().unwrap().clone()
    }
}

/// An app that answers `status` after `delay`, noting the `traceparent` it got.
async fn app(status: u16, delay: Duration) -> (Upstream, Seen) {
    let seen = Seen::default();
    let into = seen.clone();
    let server = Upstream::start(move |req| {
        let tp = req
            .headers()
            .get("traceparent")
            .map(|v| v.to_str().unwrap().to_string());
        into.0.lock().unwrap().push(tp);
        async move {
            tokio::time::sleep(delay).await;
            common::respond(status, "")
        }
    })
    .await;
    (server, seen)
}

/// The trace as a tree, as a trace viewer lays it out: for the messages of failed
/// assertions (and docs/tracing.md's example).
fn render(spans: &[Span]) -> String {
    fn value(v: Option<&Value>) -> String {
        match v {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::DoubleValue(d)) => format!("{d:.1}"),
            Some(Value::BoolValue(b)) => b.to_string(),
            other => format!("{other:?}"),
        }
    }
    fn walk(spans: &[Span], parent: &[u8], t0: u64, depth: usize, out: &mut String) {
        let mut children: Vec<&Span> = spans
            .iter()
            .filter(|s| s.parent_span_id == parent)
            .collect();
        children.sort_by_key(|s| s.start_time_unix_nano);
        for s in children {
            let pad = "   ".repeat(depth);
            let ms = |t: u64| t.saturating_sub(t0) as f64 / 1e6;
            out.push_str(&format!(
                "{pad}{} {:?} at {:.1} ms, took {:.1} ms\n",
                s.name,
                kind(s),
                ms(s.start_time_unix_nano),
                ms(s.end_time_unix_nano) - ms(s.start_time_unix_nano),
            ));
            for kv in &s.attributes {
                let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                out.push_str(&format!("{pad}   {}={}\n", kv.key, value(v)));
            }
            for e in &s.events {
                out.push_str(&format!(
                    "{pad}   event {} at {:.1} ms",
                    e.name,
                    ms(e.time_unix_nano)
                ));
                for kv in &e.attributes {
                    let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                    out.push_str(&format!(" {}={}", kv.key, value(v)));
                }
                out.push('\n');
            }
            walk(spans, &s.span_id, t0, depth + 1, out);
        }
    }
    let ids: Vec<&[u8]> = spans.iter().map(|s| s.span_id.as_slice()).collect();
    let t0 = spans
        .iter()
        .map(|s| s.start_time_unix_nano)
        .min()
        .unwrap_or(0);
    let mut out = String::new();
    for root in spans
        .iter()
        .filter(|s| !ids.contains(&s.parent_span_id.as_slice()))
    {
        let parent = &root.parent_span_id;
        if !out.contains(&format!("{parent:?}")) {
            out.push_str(&format!("under {parent:?}\n"));
            walk(spans, parent, t0, 1, &mut out);
        }
    }
    out
}

fn kind(span: &Span) -> SpanKind {
    SpanKind::try_from(span.kind).unwrap()
}

fn string_attr(span: &Span, key: &str) -> Option<String> {
    match attr(span, key) {
        Some(Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn double_attr(span: &Span, key: &str) -> Option<f64> {
    match attr(span, key) {
        Some(Value::DoubleValue(d)) => Some(*d),
        _ => None,
    }
}

/// checkout's tollgate calls payments through payments' own tollgate (its inbound
/// side); payments answers 503, slowly enough that each retry decision falls in a slot
/// of its own of the retry budget (which allows two retries in its window); the fourth
/// attempt is refused by that budget.
#[tokio::test]
async fn a_request_retried_through_two_tollgates_is_one_trace() {
    let (collector, received) = receiver().await;
    let (payments, seen) = app(503, Duration::from_millis(550)).await;
    let callee = Tollgate::start(&inbound_config(
        payments.addr,
        &format!(
            "[inbound.retries]\nratio = 1.0\nmin_per_sec = 100\n{}",
            tracing_section(collector.addr, 0.0)
        ),
    ))
    .await;
    let caller = Tollgate::start(&common::config(&format!(
        "[upstreams.payments]\nauthorities = [\"payments\"]\nendpoints = [\"{}\"]\n\
         [upstreams.payments.retry]\nmax_attempts = 4\n\
         [upstreams.payments.budget]\nratio = 0.0\nmin_per_sec = 0.2\nwindow = \"10s\"\n{}",
        callee.inbound(),
        tracing_section(collector.addr, 0.0)
    )))
    .await;

    let req = common::request("GET", "/charge?card=4242", "payments")
        .header("traceparent", PARENT)
        .header("x-timeout-ms", "5000")
        .body(common::empty())
        .unwrap();
    let got = common::send(caller.addr, req).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.attempts(), 3);
    assert_eq!(got.outcome(), Some("budget-exhausted"));

    // The caller's SERVER span and three CLIENT spans; the callee's three SERVER spans.
    let arrived = wait_until(Duration::from_secs(10), || received.spans().len() >= 7).await;
    let spans = received.spans();
    assert!(arrived, "spans at the receiver: {}", spans.len());
    assert_eq!(spans.len(), 7, "{}", render(&spans));
    if std::env::var_os("TRACE_RENDER").is_some() {
        eprintln!("{}", render(&spans));
    }
    let parent = TraceParent::parse(PARENT.as_bytes()).unwrap();
    for s in &spans {
        assert_eq!(
            s.trace_id,
            parent.trace_id.to_bytes(),
            "one trace: {}",
            s.name
        );
    }
    let outbound: Vec<&Span> = spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Server && s.name == "GET payments")
        .collect();
    assert_eq!(outbound.len(), 1, "{spans:#?}");
    let server = outbound[0];
    assert_eq!(
        server.parent_span_id,
        parent.parent_id.to_bytes(),
        "the app's span"
    );
    assert_eq!(int_attr(server, "http.response.status_code"), Some(503));
    assert_eq!(
        string_attr(server, "tollgate.outcome").as_deref(),
        Some("budget-exhausted")
    );
    assert_eq!(server.events.len(), 2, "the two backoff sleeps");
    assert!(server.events.iter().all(|e| e.name == "backoff"));

    let mut clients: Vec<&Span> = spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Client)
        .collect();
    clients.sort_by_key(|s| int_attr(s, "tollgate.attempt"));
    assert_eq!(clients.len(), 3);
    for (n, c) in (1..).zip(&clients) {
        assert_eq!(
            c.parent_span_id, server.span_id,
            "attempt {n} under the request"
        );
        assert_eq!(int_attr(c, "tollgate.attempt"), Some(n));
        assert_eq!(
            string_attr(c, "url.full").as_deref(),
            Some("http://payments/charge"),
            "no query"
        );
        assert_eq!(
            string_attr(c, "server.address").as_deref(),
            Some("payments")
        );
        assert_eq!(
            string_attr(c, "http.request.method").as_deref(),
            Some("GET")
        );
        assert_eq!(int_attr(c, "http.response.status_code"), Some(503));
        assert_eq!(string_attr(c, "error.type").as_deref(), Some("503"));
        assert_eq!(
            string_attr(c, "tollgate.upstream").as_deref(),
            Some("payments")
        );
        assert_eq!(attr(c, "tollgate.hedge"), Some(&Value::BoolValue(false)));
        assert!(double_attr(c, "tollgate.budget.available").is_some());
        let left = int_attr(c, "tollgate.deadline.left_ms").expect("the deadline's time left");
        assert!(left <= 5000 - (n - 1) * 500, "attempt {n}: {left} ms left");
        if n == 1 {
            assert_eq!(int_attr(c, "http.request.resend_count"), None);
            assert_eq!(string_attr(c, "tollgate.retry.reason"), None);
        } else {
            assert_eq!(int_attr(c, "http.request.resend_count"), Some(n - 1));
            assert_eq!(
                string_attr(c, "tollgate.retry.reason").as_deref(),
                Some("503")
            );
        }
    }
    assert_eq!(string_attr(clients[0], "tollgate.denied"), None, "retried");
    assert_eq!(string_attr(clients[1], "tollgate.denied"), None, "retried");
    assert_eq!(
        string_attr(clients[2], "tollgate.denied").as_deref(),
        Some("budget"),
        "the fourth attempt, refused by the budget"
    );
    assert_eq!(
        double_attr(clients[0], "tollgate.budget.available"),
        Some(1.0)
    );
    assert_eq!(
        double_attr(clients[2], "tollgate.budget.available"),
        Some(0.0)
    );

    // Each attempt reached the callee's inbound side, whose span hangs under it.
    for (n, c) in (1..).zip(&clients) {
        let under: Vec<&Span> = spans
            .iter()
            .filter(|s| kind(s) == SpanKind::Server && s.parent_span_id == c.span_id)
            .collect();
        assert_eq!(under.len(), 1, "the callee's span under attempt {n}");
        let inbound = under[0];
        assert_eq!(inbound.name, "GET inbound");
        assert_eq!(int_attr(inbound, "tollgate.caller.attempt"), Some(n));
        assert_eq!(int_attr(inbound, "http.response.status_code"), Some(503));
        let fleet = string_attr(inbound, "tollgate.fleet");
        if n == 1 {
            assert_eq!(fleet, None, "a first attempt asks the fleet budget nothing");
        } else {
            assert_eq!(fleet.as_deref(), Some("granted"));
            assert!(double_attr(inbound, "tollgate.budget.available").is_some());
        }
    }

    // The app behind the callee got the trace, its parent the callee's SERVER span.
    let inbound_ids: Vec<Vec<u8>> = spans
        .iter()
        .filter(|s| s.name == "GET inbound")
        .map(|s| s.span_id.clone())
        .collect();
    let got: Vec<Option<String>> = seen.all();
    assert_eq!(got.len(), 3);
    for tp in got {
        let tp = TraceParent::parse(tp.expect("traceparent to the app").as_bytes()).unwrap();
        assert_eq!(tp.trace_id, parent.trace_id);
        assert!(inbound_ids.contains(&tp.parent_id.to_bytes().to_vec()));
    }
    caller.stop().await;
    callee.stop().await;
    drop(payments);
    drop(collector);
}

/// Without `[tracing]` the header passes as it came; with it, an unsampled one passes
/// as it came too, and a request without one (and `sample = 0`) is sent without one:
/// nothing reaches the collector.
#[tokio::test]
async fn untraced_requests_pass_traceparent_untouched_and_send_nothing() {
    let (collector, received) = receiver().await;
    let (up, seen) = app(200, Duration::ZERO).await;
    let upstream = format!(
        "[upstreams.api]\nauthorities = [\"api\"]\nendpoints = [\"{}\"]\n",
        up.addr
    );
    const UNSAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let send = |addr, tp: Option<&'static str>| async move {
        let mut req = common::request("GET", "/", "api");
        if let Some(tp) = tp {
            req = req.header("traceparent", tp);
        }
        common::send(addr, req.body(common::empty()).unwrap()).await
    };

    let plain = Tollgate::start(&common::config(&upstream)).await;
    assert_eq!(send(plain.addr, Some(PARENT)).await.status, 200);
    assert_eq!(send(plain.addr, Some(UNSAMPLED)).await.status, 200);
    plain.stop().await;

    let traced = Tollgate::start(&common::config(&format!(
        "{upstream}{}",
        tracing_section(collector.addr, 0.0)
    )))
    .await;
    assert_eq!(send(traced.addr, Some(UNSAMPLED)).await.status, 200);
    assert_eq!(send(traced.addr, None).await.status, 200);
    assert_eq!(
        seen.all(),
        vec![
            Some(PARENT.to_string()),
            Some(UNSAMPLED.to_string()),
            Some(UNSAMPLED.to_string()),
            None
        ]
    );
    // A traced request after them: once its spans are in, nothing else came.
    assert_eq!(send(traced.addr, Some(PARENT)).await.status, 200);
    let arrived = wait_until(Duration::from_secs(10), || received.spans().len() >= 2).await;
    assert!(arrived);
    assert_eq!(received.spans().len(), 2, "one SERVER and one CLIENT span");
    traced.stop().await;
    drop(up);
    drop(collector);
}

/// A collector that is down: the app's requests are answered as ever, and the spans
/// that never arrived are counted in the metric.
#[tokio::test]
async fn a_collector_that_is_down_costs_requests_nothing_and_drops_are_counted() {
    let (up, _) = app(200, Duration::ZERO).await;
    let tg = Tollgate::start(&common::config(&format!(
        "[upstreams.api]\nauthorities = [\"api\"]\nendpoints = [\"{}\"]\n{}",
        up.addr,
        tracing_section(dead_port().await, 1.0)
    )))
    .await;
    for _ in 0..20 {
        let got = common::get(tg.addr, "/", "api").await;
        assert_eq!(got.status, 200);
    }
    let mut dropped = 0.0;
    for _ in 0..100 {
        let text = tg.metrics().await;
        dropped = common::metric(
            &text,
            "tollgate_trace_spans_dropped_total{reason=\"export-failed\"}",
        )
        .unwrap_or(0.0);
        if dropped >= 40.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dropped, 40.0, "two spans for each of the 20 requests");
    tg.stop().await;
    drop(up);
}

/// A hedge is an attempt like any other: its own CLIENT span, marked, and the slow
/// attempt it beat ends `cancelled` when the hedge's answer wins.
#[tokio::test]
async fn a_hedge_and_the_attempt_it_beat_have_spans_of_their_own() {
    let (collector, received) = receiver().await;
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let endpoint = |seen: Arc<std::sync::atomic::AtomicUsize>| {
        Upstream::start(move |_req| {
            let first = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            async move {
                if first {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                common::respond(200, "")
            }
        })
    };
    let (a, b) = (endpoint(seen.clone()).await, endpoint(seen.clone()).await);
    let tg = Tollgate::start(&common::config(&format!(
        "[upstreams.api]\nauthorities = [\"api\"]\nendpoints = [\"{}\", \"{}\"]\n\
         request_timeout = \"5s\"\n\
         [upstreams.api.retry]\nmax_attempts = 2\n\
         [upstreams.api.budget]\nratio = 0.5\nmin_per_sec = 10\n\
         [upstreams.api.hedge]\nafter = \"50ms\"\nmax_extra = 1.0\n{}",
        a.addr,
        b.addr,
        tracing_section(collector.addr, 1.0)
    )))
    .await;
    let got = common::get(tg.addr, "/", "api").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.attempts(), 2);

    let arrived = wait_until(Duration::from_secs(10), || received.spans().len() >= 3).await;
    let spans = received.spans();
    assert!(arrived, "{}", render(&spans));
    let client = |hedge: bool| {
        spans
            .iter()
            .find(|s| {
                kind(s) == SpanKind::Client
                    && attr(s, "tollgate.hedge") == Some(&Value::BoolValue(hedge))
            })
            .unwrap_or_else(|| panic!("hedge={hedge}:\n{}", render(&spans)))
    };
    let (slow, hedge) = (client(false), client(true));
    assert_eq!(
        string_attr(slow, "error.type").as_deref(),
        Some("cancelled")
    );
    assert_eq!(int_attr(slow, "http.response.status_code"), None);
    assert_eq!(int_attr(hedge, "tollgate.attempt"), Some(2));
    assert_eq!(int_attr(hedge, "http.request.resend_count"), Some(1));
    assert_eq!(int_attr(hedge, "http.response.status_code"), Some(200));
    assert_eq!(
        string_attr(hedge, "tollgate.retry.reason"),
        None,
        "not a retry"
    );
    tg.stop().await;
    drop((a, b, collector));
}

/// `[tracing]` is applied by a reload, added and removed alike, with no restart.
#[tokio::test]
async fn a_reload_adds_and_removes_tracing() {
    let (collector, received) = receiver().await;
    let (up, seen) = app(200, Duration::ZERO).await;
    let upstream = common::config(&format!(
        "[upstreams.api]\nauthorities = [\"api\"]\nendpoints = [\"{}\"]\n",
        up.addr
    ));
    let dir = common::tempdir::TempDir::new("traces-reload");
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, &upstream).unwrap();
    let tg = Tollgate::start_file(&path).await;
    let traced = || {
        common::request("GET", "/", "api")
            .header("traceparent", PARENT)
            .body(common::empty())
            .unwrap()
    };
    assert_eq!(common::send(tg.addr, traced()).await.status, 200);

    let with = format!("{upstream}{}", tracing_section(collector.addr, 0.0));
    std::fs::write(&path, with).unwrap();
    tg.wait_reloads("ok", 1.0).await;
    assert_eq!(common::send(tg.addr, traced()).await.status, 200);
    let arrived = wait_until(Duration::from_secs(10), || received.spans().len() >= 2).await;
    assert!(arrived, "the traced request's spans");

    std::fs::write(&path, &upstream).unwrap();
    tg.wait_reloads("ok", 2.0).await;
    assert_eq!(common::send(tg.addr, traced()).await.status, 200);
    let got = seen.all();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].as_deref(), Some(PARENT), "passed as it came");
    let attempt = TraceParent::parse(got[1].as_deref().unwrap().as_bytes()).unwrap();
    assert_ne!(
        got[1].as_deref(),
        Some(PARENT),
        "the attempt's own span as the parent"
    );
    assert_eq!(
        attempt.trace_id,
        TraceParent::parse(PARENT.as_bytes()).unwrap().trace_id
    );
    assert_eq!(got[2].as_deref(), Some(PARENT), "passed as it came again");
    tg.stop().await;
    drop((up, collector));
}

/// The inbound side's span of a retry the fleet budget refused: the app never saw it,
/// and the span says why.
#[tokio::test]
async fn a_retry_the_fleet_budget_refuses_shows_the_decision() {
    let (collector, received) = receiver().await;
    let (app, seen) = app(200, Duration::ZERO).await;
    let tg = Tollgate::start(&inbound_config(
        app.addr,
        &format!(
            "[inbound.retries]\nratio = 0.0\nmin_per_sec = 0\n{}",
            tracing_section(collector.addr, 0.0)
        ),
    ))
    .await;
    let req = common::request("GET", "/charge", "payments")
        .header("traceparent", PARENT)
        .header("x-tollgate-attempt", "2")
        .body(common::empty())
        .unwrap();
    let got = common::send(tg.inbound(), req).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.outcome(), Some("retry-rejected"));
    let arrived = wait_until(Duration::from_secs(10), || !received.spans().is_empty()).await;
    assert!(arrived);
    let spans = received.spans();
    let span = &spans[0];
    assert_eq!(span.name, "GET inbound");
    assert_eq!(
        string_attr(span, "tollgate.fleet").as_deref(),
        Some("rejected")
    );
    assert_eq!(int_attr(span, "tollgate.caller.attempt"), Some(2));
    assert_eq!(
        string_attr(span, "tollgate.outcome").as_deref(),
        Some("retry-rejected")
    );
    assert!(seen.all().is_empty(), "the app never saw it");
    tg.stop().await;
    drop((app, collector));
}
