//! Traces through tollgate's request path, at a real OTLP/HTTP receiver ([`otlp`]): a
//! request retried through two tollgates is one trace, each attempt's span with the
//! callee's inbound span under it; hedges, the fleet budget's refusals and reloads;
//! requests that are not traced pass `traceparent` untouched and send nothing; a
//! collector that is down costs requests nothing.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::otlp;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::config::Config;
use common::{Tollgate, Upstream, dead_port, wait_until};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use otlp::{PARENT, attr, double_attr, int_attr, kind, receiver, render, string_attr};
use tollgate_core::trace::TraceParent;

/// `[tracing]` for a tollgate exporting to `collector`, sending at once.
/// `config` with spans sent to `collector`, `sample` of the traces a caller did not
/// sample, 4 to a batch.
fn tracing_to(config: Config, collector: SocketAddr, sample: f64) -> Config {
    config.tracing(|t| {
        t.otlp(format!("http://{collector}"))
            .sample(sample)
            .batch(4)
    })
}

/// `[upstreams.api]` to `addr`, nothing else.
fn api(addr: SocketAddr) -> Config {
    Config::new().upstream("api", |u| u.authorities(["api"]).endpoint(addr))
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

/// checkout's tollgate calls payments through payments' own tollgate (its inbound
/// side); payments answers 503, slowly enough that each retry decision falls in a slot
/// of its own of the retry budget (which allows two retries in its window, strictly below
/// 0.25/s × 10 s); the fourth
/// attempt is refused by that budget.
#[tokio::test]
async fn a_request_retried_through_two_tollgates_is_one_trace() {
    let (collector, received) = receiver().await;
    let (payments, seen) = app(503, Duration::from_millis(550)).await;
    let callee = Tollgate::start(
        &tracing_to(
            Config::new().inbound(payments.addr, |i| {
                i.retries(|r| r.ratio(1.0).min_per_sec(100))
            }),
            collector.addr,
            0.0,
        )
        .to_toml(),
    )
    .await;
    let caller = Tollgate::start(
        &tracing_to(
            Config::new().upstream("payments", |u| {
                u.authorities(["payments"])
                    .endpoint(callee.inbound())
                    .retry(|r| r.max_attempts(4))
                    .budget(|b| b.ratio(0.0).min_per_sec(0.25).window("10s"))
            }),
            collector.addr,
            0.0,
        )
        .to_toml(),
    )
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
    const UNSAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let send = |addr, tp: Option<&'static str>| async move {
        let mut req = common::request("GET", "/", "api");
        if let Some(tp) = tp {
            req = req.header("traceparent", tp);
        }
        common::send(addr, req.body(common::empty()).unwrap()).await
    };

    let plain = Tollgate::start(&api(up.addr).to_toml()).await;
    assert_eq!(send(plain.addr, Some(PARENT)).await.status, 200);
    assert_eq!(send(plain.addr, Some(UNSAMPLED)).await.status, 200);
    plain.stop().await;

    let traced = Tollgate::start(&tracing_to(api(up.addr), collector.addr, 0.0).to_toml()).await;
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
    let tg = Tollgate::start(&tracing_to(api(up.addr), dead_port().await, 1.0).to_toml()).await;
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
    let tg = Tollgate::start(
        &tracing_to(
            Config::new().upstream("api", |u| {
                u.authorities(["api"])
                    .endpoint(a.addr)
                    .endpoint(b.addr)
                    .request_timeout("5s")
                    .retry(|r| r.max_attempts(2))
                    .budget(|b| b.ratio(0.5).min_per_sec(10))
                    .hedge(|h| h.after("50ms").max_extra(1.0))
            }),
            collector.addr,
            1.0,
        )
        .to_toml(),
    )
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
    let upstream = api(up.addr).to_toml();
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

    let with = tracing_to(api(up.addr), collector.addr, 0.0).to_toml();
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
    let tg = Tollgate::start(
        &tracing_to(
            Config::new().inbound(app.addr, |i| i.retries(|r| r.ratio(0.0).min_per_sec(0))),
            collector.addr,
            0.0,
        )
        .to_toml(),
    )
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
