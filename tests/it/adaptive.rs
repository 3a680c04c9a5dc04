//! The adaptive budget (`max_ratio`) over loopback: the share grows while retries
//! succeed, falls back to `ratio` at once on an overload signal (but not on a gRPC
//! pushback of -1), sinks below `ratio` against a dead dependency, and never lets the
//! upstream get more than the fixed rule with `max_ratio` allows. The gauge
//! `tollgate_retry_budget_ratio` says where it is.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use common::config::{Budget, Config, Retry};
use common::*;

/// How the upstream answers a first attempt; retries always succeed.
const FAIL_PLAIN: u8 = 0;
const FAIL_RETRY_AFTER: u8 = 1;
const FAIL_PUSHBACK_NEVER: u8 = 2;

/// An upstream whose first attempts fail as `mode` says and whose retries succeed.
async fn first_attempts_fail(mode: Arc<AtomicU8>) -> Upstream {
    Upstream::start(move |req| {
        let mode = mode.load(Ordering::SeqCst);
        async move {
            if req
                .headers()
                .get("x-tollgate-attempt")
                .is_some_and(|v| v != "1")
            {
                return respond(200, "ok");
            }
            let mut r = respond(503, "busy");
            match mode {
                FAIL_RETRY_AFTER => {
                    r.headers_mut().insert("retry-after", "0".parse().unwrap());
                }
                FAIL_PUSHBACK_NEVER => {
                    r.headers_mut()
                        .insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
                }
                _ => {}
            }
            r
        }
    })
    .await
}

fn adaptive(addr: std::net::SocketAddr, budget: impl FnOnce(Budget) -> Budget) -> String {
    adaptive_with(addr, |r| r, budget)
}

/// As [`adaptive`], with what `retry` adds to the retry section.
fn adaptive_with(
    addr: std::net::SocketAddr,
    retry: impl FnOnce(Retry) -> Retry,
    budget: impl FnOnce(Budget) -> Budget,
) -> String {
    Config::new()
        .upstream("api", |u| {
            u.authorities(["api"])
                .endpoint(addr)
                .retry(|r| retry(r.max_attempts(2).backoff_base("1ms").backoff_max("1ms")))
                .budget(budget)
        })
        .to_toml()
}

fn share(m: &str) -> f64 {
    metric(m, "tollgate_retry_budget_ratio{upstream=\"api\"}").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_share_grows_while_retries_succeed_and_resets_on_overload() {
    let mode = Arc::new(AtomicU8::new(FAIL_PLAIN));
    let up = first_attempts_fail(mode.clone()).await;
    let tg = Tollgate::start(&adaptive(
        up.addr,
        // A long window: the hold after an overload signal (a tenth of it) outlasts
        // the test.
        |b| b.ratio(0.1).max_ratio(0.5).min_per_sec(100).window("60s"),
    ))
    .await;
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_retry_budget_ratio{upstream=\"api\"}"),
        None,
        "no request yet, no series"
    );
    for i in 0..10 {
        let r = get(tg.addr, &format!("/{i}"), "api").await;
        assert_eq!((r.status.as_u16(), r.attempts()), (200, 2));
        if i == 0 {
            let first = share(&tg.metrics().await);
            assert!(
                (first - 0.12).abs() < 1e-9,
                "it starts at ratio, one step up after a retry that succeeds: {first}"
            );
        }
    }
    let grown = share(&tg.metrics().await);
    assert!(
        (grown - 0.3).abs() < 1e-9,
        "ten retries that succeed add ten steps of (0.5 - 0.1) / 20: {grown}"
    );
    for i in 10..40 {
        get(tg.addr, &format!("/{i}"), "api").await;
    }
    assert_eq!(share(&tg.metrics().await), 0.5, "never above max_ratio");

    // "Do not retry this call" is not overload: the share stays.
    mode.store(FAIL_PUSHBACK_NEVER, Ordering::SeqCst);
    let r = get(tg.addr, "/never", "api").await;
    assert_eq!(r.outcome(), Some("retry-after-too-long"));
    assert_eq!(share(&tg.metrics().await), 0.5);

    // A Retry-After is the upstream saying it is overloaded: back to ratio at once.
    mode.store(FAIL_RETRY_AFTER, Ordering::SeqCst);
    let r = get(tg.addr, "/busy", "api").await;
    assert_eq!(
        r.status, 200,
        "the retry still went, after the wait asked for"
    );
    assert_eq!(share(&tg.metrics().await), 0.1);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_max_ratio_the_gauge_is_the_fixed_ratio() {
    let up = first_attempts_fail(Arc::new(AtomicU8::new(FAIL_PLAIN))).await;
    let tg = Tollgate::start(&adaptive(up.addr, |b| b.ratio(0.2).min_per_sec(100))).await;
    for i in 0..10 {
        get(tg.addr, &format!("/{i}"), "api").await;
    }
    assert_eq!(share(&tg.metrics().await), 0.2);
    tg.stop().await;
}

/// Sends `n` distinct requests, 20 at a time, to a tollgate in front of a dead
/// upstream; returns how many reached it.
async fn against_a_dead_upstream(budget: impl FnOnce(Budget) -> Budget, n: usize) -> (usize, f64) {
    let up = Upstream::start(|_req| async { respond(503, "dead") }).await;
    let config = Config::new().upstream("api", |u| {
        u.authorities(["api"])
            .endpoint(up.addr)
            .retry(|r| r.max_attempts(3).backoff_base("1ms").backoff_max("2ms"))
            .budget(budget)
    });
    let tg = Tollgate::start(&config.to_toml()).await;
    let addr = tg.addr;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..20 {
        tasks.spawn(async move {
            for i in 0..n / 20 {
                let r = get(addr, &format!("/{w}/{i}"), "api").await;
                assert_eq!(r.status, 503);
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    let ratio = share(&tg.metrics().await);
    tg.stop().await;
    (up.hits(), ratio)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_upstream_sinks_the_share_below_ratio_and_gets_fewer_retries() {
    const N: usize = 1000;
    // A short window, so that pacing inside it does not depend on how fast this
    // machine sends; no floor, so that the shares alone decide.
    let window = |b: Budget| b.min_per_sec(0).window("100ms");
    let (fixed, _) = against_a_dead_upstream(|b| window(b.ratio(0.2)), N).await;
    let (adaptive, ratio) =
        against_a_dead_upstream(|b| window(b.ratio(0.2).max_ratio(0.6)), N).await;
    let (fixed_retries, adaptive_retries) = (fixed - N, adaptive - N);
    println!(
        "dead upstream, {N} requests: fixed budget {fixed_retries} retries, adaptive \
         {adaptive_retries} (share {ratio})"
    );
    assert!(ratio < 0.2, "retries keep failing: below ratio, {ratio}");
    // The fixed share keeps granting a fifth of the requests as retries; the adaptive
    // one halves after every 8 retries that fail, down to ratio / 10.
    assert!(
        adaptive_retries * 2 < fixed_retries,
        "adaptive {adaptive_retries} retries, fixed {fixed_retries}"
    );
    // Never above the fixed rule with max_ratio in place of ratio.
    assert!(adaptive_retries as f64 <= N as f64 * 0.6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_that_recovers_gets_its_share_back_without_a_retry() {
    // Dead: retries keep failing, the share sinks below ratio and the floor is off.
    // Back: its first attempts succeed and need no retry, so no retry can succeed to
    // lift the share; a first attempt's success does, back to ratio and the floor on.
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let up = {
        let dead = dead.clone();
        Upstream::start(move |_req| {
            let status = if dead.load(Ordering::SeqCst) {
                503
            } else {
                200
            };
            async move { respond(status, "") }
        })
        .await
    };
    let tg = Tollgate::start(&adaptive_with(
        up.addr,
        |r| r.max_attempts(3),
        |b| b.ratio(0.2).max_ratio(0.6).min_per_sec(0).window("100ms"),
    ))
    .await;
    for i in 0..200 {
        let r = get(tg.addr, &format!("/dead/{i}"), "api").await;
        assert_eq!(r.status, 503);
    }
    let sunk = share(&tg.metrics().await);
    assert!(sunk < 0.2, "retries kept failing: below ratio, {sunk}");
    dead.store(false, Ordering::SeqCst);
    for i in 0..5 {
        let r = get(tg.addr, &format!("/back/{i}"), "api").await;
        assert_eq!((r.status.as_u16(), r.attempts()), (200, 1));
    }
    let back = share(&tg.metrics().await);
    assert!(
        (back - 0.2).abs() < 1e-9,
        "first attempts served: the share is back at ratio, not {back}"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_what_the_share_learnt_unless_the_budget_changed() {
    let up = first_attempts_fail(Arc::new(AtomicU8::new(FAIL_PLAIN))).await;
    let dir = tempdir::TempDir::new("adaptive");
    let path = dir.path().join("tollgate.toml");
    let budget = |max: f64| move |b: Budget| b.ratio(0.1).max_ratio(max).min_per_sec(100);
    std::fs::write(&path, adaptive(up.addr, budget(0.5))).unwrap();
    let tg = Tollgate::start_file(&path).await;
    for i in 0..10 {
        get(tg.addr, &format!("/{i}"), "api").await;
    }
    assert!((share(&tg.metrics().await) - 0.3).abs() < 1e-9);
    // Another setting changes: the budget, and what its share learnt, carry over.
    let text = adaptive_with(up.addr, |r| r.max_body("32KiB"), budget(0.5));
    std::fs::write(&path, text).unwrap();
    tg.wait_reloads("ok", 1.0).await;
    assert!((share(&tg.metrics().await) - 0.3).abs() < 1e-9);
    // The budget changes: a new one, starting at its ratio.
    std::fs::write(&path, adaptive(up.addr, budget(0.6))).unwrap();
    tg.wait_reloads("ok", 2.0).await;
    assert_eq!(share(&tg.metrics().await), 0.1);
    tg.stop().await;
}
