//! The ownership rule: a failure another tollgate already retried (or deliberately did
//! not) passes straight back, so a chain of tollgates costs the failing dependency the
//! attempts of one layer, not the product of all layers.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;

fn layer(name: &str, next: std::net::SocketAddr) -> String {
    config(&format!(
        "[upstreams.{name}]\nauthorities = [\"{name}\"]\nendpoints = [\"{next}\"]\n\
         [upstreams.{name}.retry]\nmax_attempts = 3\nbackoff_base = \"1ms\"\nbackoff_max = \"2ms\"\n\
         [upstreams.{name}.budget]\nratio = 10.0\nmin_per_sec = 1000\n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tollgates_in_a_chain_cost_the_failing_upstream_one_layer_of_attempts() {
    let failing = Upstream::start(|_req| async { respond(503, "down") }).await;
    let inner = Tollgate::start(&layer("db", failing.addr)).await;
    let outer = Tollgate::start(&layer("db", inner.addr)).await;
    const REQUESTS: usize = 10;
    for i in 0..REQUESTS {
        // Distinct requests: the same one again within 2 s would be the app's retry.
        let r = get(outer.addr, &format!("/{i}"), "db").await;
        assert_eq!(r.status, 503);
        assert_eq!(
            r.outcome(),
            Some("attempts-exhausted"),
            "the inner layer's verdict passes back"
        );
        assert_eq!(r.attempts(), 1, "the outer layer did not retry");
    }
    assert_eq!(
        failing.hits(),
        3 * REQUESTS,
        "3 attempts per request, not 9"
    );
    let m = outer.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"ownership\",upstream=\"db\"}"
        ),
        Some(REQUESTS as f64)
    );
    assert_eq!(
        metric(&m, "tollgate_retries_total{reason=\"503\",upstream=\"db\"}"),
        Some(0.0)
    );
    outer.stop().await;
    inner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_ownership_multiplies_the_attempts() {
    let failing = Upstream::start(|_req| async { respond(503, "down") }).await;
    // The inner layer takes the outer one's retries for new requests, as a stack of
    // client libraries would (tests/app_retries.rs shows what it does by default).
    let inner = Tollgate::start(&layer("db", failing.addr).replace(
        "[upstreams.db.retry]",
        "app_retries = \"ignore\"\n[upstreams.db.retry]",
    ))
    .await;
    let outer = Tollgate::start(&layer("db", inner.addr).replace(
        "max_attempts = 3\n",
        "max_attempts = 3\nownership = \"ignore\"\n",
    ))
    .await;
    let r = get(outer.addr, "/", "db").await;
    assert_eq!(r.status, 503);
    assert_eq!(failing.hits(), 9, "blind retries at both layers: 3 x 3");
    outer.stop().await;
    inner.stop().await;
}
