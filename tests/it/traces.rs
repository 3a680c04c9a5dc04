//! Traces reach a real OTLP/HTTP receiver ([`otlp`]) as the tracing API records them:
//! one retried request is one trace; exports hold at most a batch; a receiver that is
//! down or never answers costs the caller nothing: its spans are dropped and counted.
//! (Through tollgate's request path: tests/it/traces_proxy.rs.)

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::otlp;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Upstream, dead_port, wait_until};
use http::{HeaderMap, HeaderValue, Method, Response};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use otlp::{PARENT, attr, receiver};
use tokio::time::Instant;
use tollgate_core::config::{OtlpAddr, TracingConfig};
use tollgate_core::fault::Fault;
use tollgate_core::metrics::Metrics;
use tollgate_core::metrics::trace::SpanDrop;
use tollgate_core::metrics::{Denied, Outcome};
use tollgate_core::trace::{
    AfterFailure, Arrival, AttemptEnd, AttemptStart, Side, TRACEPARENT, TraceParent, Tracer,
};

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
        let reason = (n > 1).then_some(Fault::Status(http::StatusCode::SERVICE_UNAVAILABLE));
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
            fault: None,
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
