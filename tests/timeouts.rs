//! Timeouts and admission: attempt and request timeouts answer 504 with the outcome,
//! `max_inflight` sheds at once with 503 and Retry-After.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::sync::Semaphore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_timeout_without_retries_is_a_504() {
    let up = Upstream::start(|_req| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        respond(200, "late")
    })
    .await;
    let tg = Tollgate::start(&config(&format!(
        "[upstreams.slow]\nauthorities = [\"slow\"]\nendpoints = [\"{}\"]\nattempt_timeout = \"200ms\"\nrequest_timeout = \"3s\"\n",
        up.addr
    )))
    .await;
    let started = tokio::time::Instant::now();
    let r = get(tg.addr, "/", "slow").await;
    assert_eq!(r.status, 504);
    assert_eq!(
        r.outcome(),
        Some("not-retryable"),
        "a timeout with retries off is not retried"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the slow answer was waited for"
    );
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"timeout\",upstream=\"slow\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_is_a_504_deadline_exceeded() {
    let up = Upstream::start(|_req| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        respond(200, "late")
    })
    .await;
    let tg = Tollgate::start(&config(&format!(
        "[upstreams.slow]\nauthorities = [\"slow\"]\nendpoints = [\"{}\"]\nattempt_timeout = \"10s\"\nrequest_timeout = \"300ms\"\n",
        up.addr
    )))
    .await;
    let started = tokio::time::Instant::now();
    let r = get(tg.addr, "/", "slow").await;
    assert_eq!(r.status, 504);
    assert_eq!(r.outcome(), Some("deadline-exceeded"));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "answered before the deadline: {took:?}"
    );
    assert!(took < Duration::from_secs(5));
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_inflight_sheds_at_once_with_retry_after() {
    // Each permit lets one held request finish.
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let up = Upstream::start(move |_req| {
        let g = g.clone();
        async move {
            g.acquire().await.unwrap().forget();
            respond(200, "done")
        }
    })
    .await;
    let tg = Tollgate::start(&config(&format!(
        "[upstreams.busy]\nauthorities = [\"busy\"]\nendpoints = [\"{}\"]\nmax_inflight = 2\nrequest_timeout = \"10s\"\nattempt_timeout = \"10s\"\n",
        up.addr
    )))
    .await;
    let addr = tg.addr;
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { get(addr, "/", "busy").await }))
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || up.hits() == 2).await,
        "two requests should be in flight"
    );

    let r = get(tg.addr, "/", "busy").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.outcome(), Some("overloaded"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(up.hits(), 2, "the shed request never reached the upstream");

    gate.add_permits(2);
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    // Capacity is back once the held requests finished.
    let waiter = tokio::spawn(async move { get(addr, "/", "busy").await });
    assert!(wait_until(Duration::from_secs(5), || up.hits() == 3).await);
    gate.add_permits(1);
    assert_eq!(waiter.await.unwrap().status, 200);
    tg.stop().await;
}
