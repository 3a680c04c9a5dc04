//! The retry budget under a hard-down upstream: whatever the concurrency, the attempts
//! the upstream receives stay within requests × (1 + ratio) + min_per_sec × window.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::config::Config;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_down_upstream_gets_no_more_than_the_budget_allows() {
    let up = Upstream::start(|_req| async { respond(503, "down") }).await;
    let config = Config::new().upstream("down", |u| {
        u.authorities(["down"])
            .endpoint(up.addr)
            .retry(|r| r.max_attempts(3).backoff_base("1ms").backoff_max("5ms"))
            .budget(|b| b.ratio(0.1).min_per_sec(1).window("10s"))
    });
    let tg = Tollgate::start(&config.to_toml()).await;
    const REQUESTS: usize = 400;
    const CONCURRENCY: usize = 40;
    let addr = tg.addr;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..CONCURRENCY {
        tasks.spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..REQUESTS / CONCURRENCY {
                // Distinct requests: the same one again within 2 s would be the app's
                // own retry.
                let r = get(addr, &format!("/w{w}/{i}"), "down").await;
                assert_eq!(r.status, 503);
                outcomes.push(r.outcome().unwrap().to_string());
            }
            outcomes
        });
    }
    let mut budget_refusals = 0;
    while let Some(outcomes) = tasks.join_next().await {
        for o in outcomes.unwrap() {
            assert!(o == "budget-exhausted" || o == "attempts-exhausted", "{o}");
            budget_refusals += usize::from(o == "budget-exhausted");
        }
    }
    let attempts = up.hits();
    let bound = REQUESTS as f64 * 1.1 + 1.0 * 10.0;
    println!(
        "hard-down upstream: {REQUESTS} requests, {attempts} attempts, amplification {:.3} (bound {bound})",
        attempts as f64 / REQUESTS as f64
    );
    assert!(
        attempts as f64 <= bound,
        "{attempts} attempts exceed the budget bound {bound}"
    );
    assert!(
        attempts > REQUESTS,
        "the budget should still allow some retries"
    );
    assert!(
        budget_refusals > REQUESTS / 2,
        "most failures must be refused by the budget"
    );

    let m = tg.metrics().await;
    let retries = metric(
        &m,
        "tollgate_retries_total{reason=\"503\",upstream=\"down\"}",
    )
    .unwrap();
    assert_eq!(retries as usize, attempts - REQUESTS);
    let denied = metric(
        &m,
        "tollgate_retries_denied_total{reason=\"budget\",upstream=\"down\"}",
    )
    .unwrap();
    assert_eq!(denied as usize, budget_refusals);
    let amp = metric(&m, "tollgate_amplification{upstream=\"down\"}").unwrap();
    assert!(
        (amp - attempts as f64 / REQUESTS as f64).abs() < 1e-9,
        "gauge {amp}"
    );
    // What the next retries would get: what is left of the window's allowance, no
    // more than the current slot's pacing lets through (the exact figure is checked
    // on a controlled clock in the budget's own tests).
    let available = metric(&m, "tollgate_retry_budget_available{upstream=\"down\"}").unwrap();
    let retry_bound = 0.1 * REQUESTS as f64 + 1.0 * 10.0;
    let window_left = (retry_bound - (attempts - REQUESTS) as f64).floor();
    assert!(
        (0.0..=window_left).contains(&available),
        "gauge {available}, window allowance left {window_left}"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_budget_every_failure_uses_every_attempt() {
    let up = Upstream::start(|_req| async { respond(503, "down") }).await;
    let config = Config::new().upstream("down", |u| {
        u.authorities(["down"])
            .endpoint(up.addr)
            .retry(|r| r.max_attempts(3).backoff_base("1ms").backoff_max("2ms"))
    });
    let tg = Tollgate::start(&config.to_toml()).await;
    for i in 0..20 {
        let r = get(tg.addr, &format!("/{i}"), "down").await;
        assert_eq!(r.attempts(), 3);
        assert_eq!(r.outcome(), Some("attempts-exhausted"));
    }
    assert_eq!(up.hits(), 60);
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_amplification{upstream=\"down\"}"),
        Some(3.0)
    );
    assert!(
        metric(&m, "tollgate_retry_budget_available{upstream=\"down\"}")
            .unwrap()
            .is_infinite()
    );
    tg.stop().await;
}
