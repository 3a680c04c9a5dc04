//! Client-side throttling of first attempts (`[upstreams.NAME.throttle]`) over loopback:
//! never a rejection while the upstream accepts what it is sent, errors such as 500
//! included (only overload is a rejection); against an upstream that rejects most of
//! it, some requests are answered at once with `503 throttled` (a gRPC call in gRPC's
//! words) and never sent; and once it accepts again, the throttling ends.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::config::Config;
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

/// `[upstreams.api]` over HTTP/1.1, throttled with k = 2 over 5 s, and what `f` adds.
fn throttled_with(
    addr: std::net::SocketAddr,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> String {
    Config::new()
        .upstream("api", |u| {
            f(u.authorities(["api"])
                .endpoint(addr)
                .protocol("http1")
                .throttle(|t| t.k(2.0).window("5s")))
        })
        .to_toml()
}

fn throttled(addr: std::net::SocketAddr) -> String {
    throttled_with(addr, |u| u)
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

/// An upstream that answers `status` to `share` of the requests, at random, else 200.
async fn failing_with(status: u16, share: f64) -> Upstream {
    Upstream::start(move |_req| async move {
        if fastrand::f64() < share {
            respond(status, "no")
        } else {
            respond(200, "ok")
        }
    })
    .await
}

/// Throttled, with 500 listed in `retry.on` and 503 not: what the throttle counts
/// does not follow what is retried.
fn listing_500(addr: std::net::SocketAddr) -> String {
    throttled_with(addr, |u| {
        u.retry(|r| r.max_attempts(1).on(["connect-failure", "500"]))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_answers_and_only_overload_is_throttled() {
    // 80% of the answers are 500s: answers, not overload.
    let up = failing_with(500, 0.8).await;
    let tg = Tollgate::start(&listing_500(up.addr)).await;
    for i in 0..300 {
        let r = get(tg.addr, &format!("/{i}"), "api").await;
        assert_ne!(r.outcome(), Some("throttled"), "request {i}");
    }
    assert_eq!(up.hits(), 300, "every request was sent");
    assert_eq!(probability(&tg.metrics().await), 0.0);
    tg.stop().await;

    // 80% of 503s, listed in retry.on or not: overload, throttled.
    let up = failing_with(503, 0.8).await;
    let tg = Tollgate::start(&listing_500(up.addr)).await;
    let mut throttled = 0;
    for i in 0..300 {
        if get(tg.addr, &format!("/{i}"), "api").await.outcome() == Some("throttled") {
            throttled += 1;
        }
    }
    assert!(throttled > 0, "no request throttled");
    assert_eq!(up.hits(), 300 - throttled);
    assert!(probability(&tg.metrics().await) > 0.0);
    tg.stop().await;
}
