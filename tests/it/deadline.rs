//! Deadlines travel: the caller's deadline bounds the whole request, an expired one
//! makes no upstream call, and when the deadline passes or the app leaves, the attempt
//! in flight is cancelled and the upstream sees its connection close.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::config::Config;
use common::*;

fn slow_upstream(
    flag: &Arc<AtomicBool>,
) -> impl Fn(
    http::Request<hyper::body::Incoming>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = http::Response<BoxBody>> + Send>>
+ Send
+ Sync
+ 'static {
    let flag = flag.clone();
    move |_req| {
        let guard = Abandoned::new(&flag);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            guard.finish();
            respond(200, "too late")
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400ms_deadline_against_a_3s_upstream_answers_504_and_cancels_the_attempt() {
    let abandoned = Arc::new(AtomicBool::new(false));
    let up = Upstream::start(slow_upstream(&abandoned)).await;
    let config = Config::new().upstream("slow", |u| {
        u.authorities(["slow"])
            .endpoint(up.addr)
            .request_timeout("10s")
            .attempt_timeout("5s")
            .retry(|r| r.max_attempts(3))
            .budget(|b| b)
    });
    let tg = Tollgate::start(&config.to_toml()).await;
    let started = tokio::time::Instant::now();
    let req = request("GET", "/", "slow")
        .header("x-timeout-ms", "400")
        .body(empty())
        .unwrap();
    let r = send(tg.addr, req).await;
    let took = started.elapsed();
    assert_eq!(r.status, 504);
    assert_eq!(r.outcome(), Some("deadline-exceeded"));
    assert!(
        took >= Duration::from_millis(400),
        "answered before the deadline: {took:?}"
    );
    assert!(
        took < Duration::from_millis(2500),
        "the deadline was not honoured: {took:?}"
    );
    assert_eq!(
        up.hits(),
        1,
        "no retry fits in what is left of the deadline"
    );
    assert!(
        wait_until(Duration::from_secs(2), || abandoned.load(Ordering::SeqCst)).await,
        "the upstream never saw the attempt cancelled"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_deadline_makes_no_upstream_call() {
    let up = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let config = Config::new().upstream("api", |u| u.authorities(["api"]).endpoint(up.addr));
    let tg = Tollgate::start(&config.to_toml()).await;
    for (name, value) in [
        ("x-timeout-ms", "0"),
        ("grpc-timeout", "0m"),
        ("x-envoy-expected-rq-timeout-ms", "0"),
    ] {
        let req = request("GET", "/", "api")
            .header(name, value)
            .body(empty())
            .unwrap();
        let r = send(tg.addr, req).await;
        assert_eq!(r.status, 504, "{name}");
        assert_eq!(r.outcome(), Some("deadline-exceeded"));
        assert_eq!(r.attempts(), 0);
    }
    assert_eq!(up.hits(), 0);
    // Garbage is ignored (the request_timeout applies), not obeyed.
    let req = request("GET", "/", "api")
        .header("x-timeout-ms", "soon")
        .body(empty())
        .unwrap();
    assert_eq!(send(tg.addr, req).await.status, 200);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_app_leaves_the_upstream_attempt_is_cancelled() {
    let abandoned = Arc::new(AtomicBool::new(false));
    let up = Upstream::start(slow_upstream(&abandoned)).await;
    let config = Config::new().upstream("slow", |u| {
        u.authorities(["slow"])
            .endpoint(up.addr)
            .request_timeout("10s")
            .attempt_timeout("10s")
    });
    let tg = Tollgate::start(&config.to_toml()).await;
    // The app leaves with a reset: a plain close after a whole request is a
    // half-close, which still waits for its answer (tests/it/half_close.rs).
    let mut client = tokio::net::TcpStream::connect(tg.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut client, b"GET / HTTP/1.1\r\nHost: slow\r\n\r\n")
        .await
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || up.hits() == 1).await);
    client.set_zero_linger().unwrap();
    drop(client);
    assert!(
        wait_until(Duration::from_secs(2), || abandoned.load(Ordering::SeqCst)).await,
        "the upstream kept working for a caller that had left"
    );
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"cancelled\",upstream=\"slow\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caller_deadline_is_propagated_and_shrinks() {
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let ms = req.headers()["x-timeout-ms"].to_str().unwrap().to_string();
        let other = req
            .headers()
            .get("x-envoy-expected-rq-timeout-ms")
            .is_some();
        respond(
            200,
            if other {
                "stale header forwarded".to_string()
            } else {
                ms
            },
        )
    })
    .await;
    let config = Config::new().upstream("api", |u| {
        u.authorities(["api"])
            .endpoint(up.addr)
            .attempt_timeout("5s")
            .request_timeout("8s")
    });
    let tg = Tollgate::start(&config.to_toml()).await;
    let req = request("GET", "/", "api")
        .header("x-envoy-expected-rq-timeout-ms", "900")
        .body(empty())
        .unwrap();
    let r = send(tg.addr, req).await;
    let ms: u64 = std::str::from_utf8(&r.body).unwrap().parse().unwrap();
    assert!(ms <= 900 && ms > 500, "the upstream was told {ms} ms");
    // No deadline from the caller: the request_timeout's time left, not the attempt
    // timeout (tollgate waits past that, with a retry beside, and so should the callee).
    let r = get(tg.addr, "/", "api").await;
    let ms: u64 = std::str::from_utf8(&r.body).unwrap().parse().unwrap();
    assert!(ms <= 8000 && ms > 7000, "the upstream was told {ms} ms");
    tg.stop().await;
}
