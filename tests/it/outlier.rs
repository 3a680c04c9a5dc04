//! Passive outlier ejection over loopback: an endpoint that fails in a row, and fails
//! clearly more than the others, is taken out of the rotation, comes back when its
//! time is up, and goes out again for longer when it fails at once; errors every
//! endpoint shares eject none; no more of the upstream is out than `max_ejected`
//! allows, the endpoints refusing connections counted in; answers carrying another
//! tollgate's verdict are not held against the endpoint. Time is mostly the paused
//! clock's: ejections of seconds pass in no time.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::config::{Config, Outlier};
use common::*;
use http::Response;

async fn answering(status: u16) -> Upstream {
    Upstream::start(move |_req| async move { respond(status, "x") }).await
}

/// An upstream that answers 503 carrying another tollgate's outcome.
async fn owned(outcome: &'static str) -> Upstream {
    Upstream::start(move |_req| async move {
        Response::builder()
            .status(503)
            .header("x-tollgate-outcome", outcome)
            .body(full("owned"))
            .unwrap()
    })
    .await
}

/// tollgate with upstream `api` on `endpoints`, retrying 503s and timeouts, with
/// `outlier` as its outlier section.
async fn tollgate(endpoints: &[SocketAddr], outlier: impl FnOnce(Outlier) -> Outlier) -> Tollgate {
    let config = Config::new().upstream("api", |u| {
        endpoints
            .iter()
            .fold(u.authorities(["api"]), |u, e| u.endpoint(e))
            .attempt_timeout("200ms")
            .request_timeout("2s")
            .retry(|r| r.max_attempts(3).backoff_base("1ms").backoff_max("2ms"))
            .budget(|b| b.ratio(1.0).min_per_sec(100))
            .outlier(outlier)
    });
    Tollgate::start(&config.to_toml()).await
}

async fn gauge(tg: &Tollgate, name: &str) -> f64 {
    metric(&tg.metrics().await, &format!("{name}{{upstream=\"api\"}}")).unwrap()
}

/// Sends `n` requests one after another; each must succeed.
async fn succeed(tg: &Tollgate, n: usize) {
    for i in 0..n {
        let r = get(tg.addr, &format!("/{i}"), "api").await;
        assert_eq!(r.status, 200, "request {i}: {:?}", r.outcome());
    }
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_failing_in_a_row_is_ejected_and_readmitted_on_probation() {
    let bad = answering(503).await;
    let (good1, good2) = (answering(200).await, answering(200).await);
    let tg = tollgate(&[bad.addr, good1.addr, good2.addr], |o| {
        o.consecutive_failures(3).base_ejection("10s")
    })
    .await;
    // Round-robin: every third first attempt goes to `bad`, and its 503 is retried on
    // another endpoint. The third failure in a row ejects it.
    succeed(&tg, 9).await;
    assert_eq!(bad.hits(), 3);
    assert_eq!(gauge(&tg, "tollgate_endpoints_ejected").await, 1.0);
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 1.0);
    succeed(&tg, 30).await;
    assert_eq!(bad.hits(), 3, "no request reaches an ejected endpoint");

    tokio::time::advance(Duration::from_secs(10)).await;
    succeed(&tg, 6).await;
    assert_eq!(
        bad.hits(),
        4,
        "re-admitted, and out again at its first failure"
    );
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 2.0);
    assert_eq!(gauge(&tg, "tollgate_endpoints_ejected").await, 1.0);
    tokio::time::advance(Duration::from_secs(15)).await;
    succeed(&tg, 6).await;
    assert_eq!(bad.hits(), 4, "the second ejection in a row lasts 20 s");
    tokio::time::advance(Duration::from_secs(5)).await;
    succeed(&tg, 6).await;
    assert_eq!(bad.hits(), 5);
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 3.0);
}

#[tokio::test(start_paused = true)]
async fn a_success_between_failures_breaks_the_run() {
    let flaky = Upstream::start({
        let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        move |_req| {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move { respond(if i.is_multiple_of(2) { 503 } else { 200 }, "x") }
        }
    })
    .await;
    let good = answering(200).await;
    let tg = tollgate(&[flaky.addr, good.addr], |o| o.consecutive_failures(2)).await;
    succeed(&tg, 40).await;
    // Its answers alternate 503, 200, 503...: never two failures in a row.
    assert!(flaky.hits() >= 20, "{} hits: ejected", flaky.hits());
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 0.0);
}

#[tokio::test(start_paused = true)]
async fn no_more_than_max_ejected_are_out_at_once() {
    let mut bad = Vec::new();
    for _ in 0..3 {
        bad.push(answering(503).await);
    }
    let mut good = Vec::new();
    for _ in 0..5 {
        good.push(answering(200).await);
    }
    let endpoints: Vec<SocketAddr> = bad.iter().chain(&good).map(|u| u.addr).collect();
    // A quarter of eight: two.
    let tg = tollgate(&endpoints, |o| o.consecutive_failures(2).max_ejected("25%")).await;
    for i in 0..80 {
        // Three attempts may all fail: the answer is then the last 503.
        let r = get(tg.addr, &format!("/{i}"), "api").await;
        assert!(r.status == 200 || r.status == 503);
        assert!(gauge(&tg, "tollgate_endpoints_ejected").await <= 2.0);
    }
    assert_eq!(gauge(&tg, "tollgate_endpoints_ejected").await, 2.0);
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 2.0);
    let before: Vec<usize> = bad.iter().map(Upstream::hits).collect();
    for i in 0..24 {
        get(tg.addr, &format!("/more{i}"), "api").await;
    }
    let still_in = bad
        .iter()
        .zip(&before)
        .filter(|(u, b)| u.hits() > **b)
        .count();
    assert_eq!(
        still_in, 1,
        "the failing endpoint over the share stays in rotation"
    );
}

#[tokio::test(start_paused = true)]
async fn an_endpoint_refusing_connections_counts_against_max_ejected() {
    // 50% of three is one. The dead endpoint is skipped for refusing connections, and
    // that fills the one place: the failing one is not ejected while it is skipped.
    let dead = dead_port().await;
    let bad = answering(503).await;
    let good = answering(200).await;
    let tg = tollgate(&[dead, bad.addr, good.addr], |o| {
        o.consecutive_failures(2).max_ejected("50%")
    })
    .await;
    // The first request to `dead` fails to connect and is retried; from then on it is
    // skipped (for 250 ms at first, and the clock stands still).
    for i in 0..12 {
        let r = get(tg.addr, &format!("/{i}"), "api").await;
        assert!(r.status == 200 || r.status == 503);
    }
    assert!(
        bad.hits() >= 4,
        "{} hits: ejected despite the skip",
        bad.hits()
    );
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_silent_endpoint_is_ejected_for_its_timeouts() {
    let silent = Scripted::start(until_peer_closes).await;
    let (good1, good2) = (answering(200).await, answering(200).await);
    let tg = tollgate(&[silent.addr, good1.addr, good2.addr], |o| {
        o.consecutive_failures(2)
    })
    .await;
    // Each attempt on the silent endpoint waits out its 200 ms and is retried elsewhere.
    succeed(&tg, 30).await;
    assert_eq!(
        silent.accepted(),
        2,
        "two timeouts, then out of the rotation"
    );
    assert_eq!(gauge(&tg, "tollgate_endpoints_ejected").await, 1.0);
}

#[tokio::test(start_paused = true)]
async fn another_tollgates_verdict_is_not_the_endpoints_fault_but_overload_is() {
    let spent = owned("budget-exhausted").await;
    let shedding = owned("overloaded").await;
    let good = answering(200).await;
    let tg = tollgate(&[spent.addr, good.addr], |o| o.consecutive_failures(2)).await;
    for i in 0..20 {
        get(tg.addr, &format!("/{i}"), "api").await;
    }
    assert_eq!(
        spent.hits(),
        10,
        "its owned answers pass back, and it stays in"
    );
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 0.0);
    drop(tg);

    let tg = tollgate(&[shedding.addr, good.addr], |o| o.consecutive_failures(2)).await;
    for i in 0..20 {
        get(tg.addr, &format!("/{i}"), "api").await;
    }
    assert_eq!(shedding.hits(), 2, "overloaded twice in a row: out");
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_log_line_per_ejection_and_per_readmission() {
    let bad = answering(503).await;
    let good = answering(200).await;
    let mut p = Process::start_logged(
        &Config::new()
            .upstream("api", |u| {
                u.authorities(["api"])
                    .endpoint(bad.addr)
                    .endpoint(good.addr)
                    .retry(|r| r.max_attempts(2))
                    .budget(|b| b.ratio(1.0))
                    .outlier(|o| o.consecutive_failures(2).base_ejection("1s"))
            })
            .to_toml_for_process(),
    )
    .await;
    for i in 0..10 {
        assert_eq!(get(p.addr, &format!("/{i}"), "api").await.status, 200);
    }
    assert_eq!(bad.hits(), 2);
    // Re-admitted by the background sweep (every 2 s) once the second has passed.
    let readmitted = wait_until(Duration::from_secs(10), || {
        p.log().contains("endpoint re-admitted")
    })
    .await;
    assert!(readmitted, "no re-admission logged:\n{}", p.log());
    let log = p.log();
    assert_eq!(log.matches("endpoint ejected").count(), 1, "{log}");
    assert_eq!(log.matches("endpoint re-admitted").count(), 1, "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("endpoint ejected"))
        .unwrap();
    assert!(line.contains(&bad.addr.to_string()), "{line}");
    assert!(
        line.contains("upstream=api") || line.contains("\"api\""),
        "{line}"
    );
    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(10)).await, Some(0));
}

/// An upstream whose answers fail (503) at random, `share` of them.
async fn flaky(share: f64) -> Upstream {
    Upstream::start(move |_req| async move {
        if fastrand::f64() < share {
            respond(503, "x")
        } else {
            respond(200, "x")
        }
    })
    .await
}

/// tollgate with upstream `api` on `endpoints`, retrying and budgeted at the
/// defaults (with a quick backoff), with `[outlier]` at its defaults when `outlier`.
fn defaults(endpoints: &[SocketAddr], outlier: bool) -> String {
    Config::new()
        .upstream("api", |u| {
            let u = endpoints
                .iter()
                .fold(u.authorities(["api"]), |u, e| u.endpoint(e))
                .retry(|r| r.backoff_base("1ms").backoff_max("2ms"))
                .budget(|b| b);
            if outlier { u.outlier(|o| o) } else { u }
        })
        .to_toml()
}

/// The share of `n` GETs answered 200, sent by ten users at once.
async fn success_rate(tg: &Tollgate, n: usize) -> f64 {
    let addr = tg.addr;
    let mut users = tokio::task::JoinSet::new();
    for u in 0..10 {
        users.spawn(async move {
            let mut ok = 0;
            for i in 0..n / 10 {
                if get(addr, &format!("/{u}/{i}"), "api").await.status == 200 {
                    ok += 1;
                }
            }
            ok
        });
    }
    let mut ok = 0;
    while let Some(u) = users.join_next().await {
        ok += u.unwrap();
    }
    ok as f64 / (n / 10 * 10) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_every_replica_shares_eject_none() {
    // Two replicas with the same 30% of errors: the dependency's, not a replica's.
    // Runs of five failures in a row happen on each, several times in 3000 requests.
    let replicas = [flaky(0.3).await, flaky(0.3).await];
    let endpoints = [replicas[0].addr, replicas[1].addr];
    const REQUESTS: usize = 3000;
    // Side by side, at once: the budget's floor allows more retries when fewer requests
    // go by in a second, so two runs one after the other on a busy machine would
    // compare two budgets, not the ejection rules.
    let without = Tollgate::start(&defaults(&endpoints, false)).await;
    let tg = Tollgate::start(&defaults(&endpoints, true)).await;
    let (base, rate) = tokio::join!(
        success_rate(&without, REQUESTS),
        success_rate(&tg, REQUESTS)
    );
    without.stop().await;
    assert_eq!(gauge(&tg, "tollgate_ejections_total").await, 0.0);
    assert_eq!(gauge(&tg, "tollgate_endpoints_ejected").await, 0.0);
    assert!(
        rate >= base - 0.05,
        "{rate:.3} succeeded with [outlier], {base:.3} without"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_failing_alone_is_ejected_at_the_defaults() {
    let bad = answering(503).await;
    let good = answering(200).await;
    let tg = Tollgate::start(&defaults(&[bad.addr, good.addr], true)).await;
    for i in 0..20 {
        let r = get(tg.addr, &format!("/{i}"), "api").await;
        assert_eq!(r.status, 200, "{:?}", r.outcome());
    }
    assert_eq!(bad.hits(), 5, "five failures in a row, then out");
    assert_eq!(gauge(&tg, "tollgate_endpoints_ejected").await, 1.0);
    tg.stop().await;
}
