//! Client-side throttling of first attempts (`[upstreams.NAME.throttle]`) over loopback:
//! never a rejection while the upstream accepts what it is sent; against an upstream
//! that rejects most of it, some requests are answered at once with `503 throttled`
//! (a gRPC call in gRPC's words) and never sent; and once it accepts again, the
//! throttling ends.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;

/// An upstream that answers 200, or 503 while `failing`.
async fn switchable(failing: Arc<AtomicBool>) -> Upstream {
    Upstream::start(move |_req| {
        let failing = failing.load(Ordering::SeqCst);
        async move {
            if failing {
                respond(503, "down")
            } else {
                respond(200, "ok")
            }
        }
    })
    .await
}

fn throttled(addr: std::net::SocketAddr) -> String {
    config(&format!(
        "[upstreams.api]\nauthorities = [\"api\"]\nendpoints = [\"{addr}\"]\nprotocol = \"http1\"\n\
         [upstreams.api.throttle]\nk = 2.0\nwindow = \"5s\"\n"
    ))
}

fn probability(m: &str) -> f64 {
    metric(m, "tollgate_throttle_probability{upstream=\"api\"}").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_upstream_is_never_throttled() {
    let up = switchable(Arc::new(AtomicBool::new(false))).await;
    let tg = Tollgate::start(&throttled(up.addr)).await;
    let addr = tg.addr;
    let mut tasks = tokio::task::JoinSet::new();
    // Bursts of concurrent requests: those in flight are not held against the upstream.
    for w in 0..25 {
        tasks.spawn(async move {
            for i in 0..40 {
                let r = get(addr, &format!("/{w}/{i}"), "api").await;
                assert_eq!(r.status, 200, "{:?}", r.outcome());
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    assert_eq!(up.hits(), 1000);
    let m = tg.metrics().await;
    assert_eq!(probability(&m), 0.0);
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"503\",outcome=\"throttled\",upstream=\"api\"}"
        ),
        None
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejecting_upstream_is_throttled_locally_until_it_accepts_again() {
    let failing = Arc::new(AtomicBool::new(true));
    let up = switchable(failing.clone()).await;
    let tg = Tollgate::start(&throttled(up.addr)).await;
    // Every request fails; sooner or later the throttle answers in its place.
    let mut throttled = None;
    for i in 0..500 {
        let before = up.hits();
        let r = get(tg.addr, &format!("/{i}"), "api").await;
        assert_eq!(r.status, 503);
        if r.outcome() == Some("throttled") {
            throttled = Some((r, before, up.hits()));
            break;
        }
    }
    let (r, before, after) = throttled.expect("no request throttled in 500 failures");
    assert_eq!(r.attempts(), 0);
    assert_eq!(
        before, after,
        "a throttled request never reaches the upstream"
    );
    let m = tg.metrics().await;
    let p = probability(&m);
    assert!(p > 0.5 && p <= 0.9, "probability {p}");
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"503\",outcome=\"throttled\",upstream=\"api\"}"
        ),
        Some(1.0)
    );

    // It accepts again: the first few requests that get through end the throttling.
    failing.store(false, Ordering::SeqCst);
    let mut in_a_row = 0;
    for i in 0..1000 {
        let r = get(tg.addr, &format!("/back/{i}"), "api").await;
        in_a_row = if r.status == 200 { in_a_row + 1 } else { 0 };
        if in_a_row == 100 {
            break;
        }
    }
    assert_eq!(
        in_a_row, 100,
        "still throttled after the upstream came back"
    );
    assert_eq!(probability(&tg.metrics().await), 0.0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_grpc_call_is_answered_in_grpc_words() {
    let up = switchable(Arc::new(AtomicBool::new(true))).await;
    let tg = Tollgate::start(&throttled(up.addr)).await;
    let call = |i: usize| {
        request("POST", &format!("/pkg.Svc/Call{i}"), "api")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(empty())
            .unwrap()
    };
    let mut found = None;
    for i in 0..500 {
        let r = tokio::time::timeout(Duration::from_secs(10), send_h2(tg.addr, call(i)))
            .await
            .unwrap();
        if r.outcome() == Some("throttled") {
            found = Some(r);
            break;
        }
    }
    let r = found.expect("no call throttled in 500 failures");
    assert_eq!(r.status, 200, "a trailers-only gRPC answer");
    assert_eq!(r.header("grpc-status"), Some("8"), "RESOURCE_EXHAUSTED");
    assert_eq!(r.header("grpc-retry-pushback-ms"), Some("-1"));
    assert_eq!(r.attempts(), 0);
    tg.stop().await;
}
