//! The ownership rule: a failure another tollgate already retried (or deliberately did
//! not) passes straight back, so a chain of tollgates costs the failing dependency the
//! attempts of one layer, not the product of all layers. Its exceptions: a callee's
//! inbound side speaking of its own app (`app-unreachable`, `app-timeout`) is that
//! endpoint's failure, retried on another and counted toward ejection; `in-progress`
//! is retried like a 503; an outcome on a `1xx`-`3xx` answer is removed.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::config::{Config, Inbound, Retry};
use common::*;

fn layer(name: &str, next: std::net::SocketAddr) -> String {
    layer_with(name, next, |u| u, |r| r)
}

/// As [`layer`], with what `f` sets on the upstream and `retry` on its retries.
fn layer_with(
    name: &str,
    next: std::net::SocketAddr,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
    retry: impl FnOnce(Retry) -> Retry,
) -> String {
    Config::new()
        .upstream(name, |u| {
            f(u.authorities([name]).endpoint(next))
                .retry(|r| retry(r.max_attempts(3).backoff_base("1ms").backoff_max("2ms")))
                .budget(|b| b.ratio(10.0).min_per_sec(1000))
        })
        .to_toml()
}

/// tollgate's inbound side in front of `app`, set by `f`.
fn sidecar(app: std::net::SocketAddr, f: impl FnOnce(Inbound) -> Inbound) -> String {
    Config::new().inbound(app, f).to_toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tollgates_in_a_chain_cost_the_failing_upstream_one_layer_of_attempts() {
    let failing = Upstream::start(|_req| async { respond(503, "down") }).await;
    let inner = Tollgate::start(&layer("db", failing.addr)).await;
    let outer = Tollgate::start(&layer("db", inner.addr)).await;
    const REQUESTS: usize = 10;
    for i in 0..REQUESTS {
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
    // client libraries would (tests/it/app_retries.rs shows what it does by default).
    let inner = Tollgate::start(&layer_with(
        "db",
        failing.addr,
        |u| u.app_retries("ignore"),
        |r| r,
    ))
    .await;
    let outer = Tollgate::start(&layer_with(
        "db",
        inner.addr,
        |u| u,
        |r| r.ownership("ignore"),
    ))
    .await;
    let r = get(outer.addr, "/", "db").await;
    assert_eq!(r.status, 503);
    assert_eq!(failing.hits(), 9, "blind retries at both layers: 3 x 3");
    outer.stop().await;
    inner.stop().await;
}

/// A caller tollgate with `endpoints`, retrying at its defaults (quick backoff), with
/// `[outlier]` at its defaults and what `f` sets on the upstream.
fn caller(
    endpoints: &[std::net::SocketAddr],
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> String {
    retrying_app(endpoints, |u| f(u).outlier(|o| o))
}

/// `[upstreams.app]` on `endpoints`, retrying at its defaults (quick backoff), and what
/// `f` sets on it.
fn retrying_app(
    endpoints: &[std::net::SocketAddr],
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> String {
    Config::new()
        .upstream("app", |u| {
            let u = endpoints
                .iter()
                .fold(u.authorities(["app"]), |u, e| u.endpoint(e));
            f(u.retry(|r| r.backoff_base("1ms").backoff_max("2ms")))
        })
        .to_toml()
}

/// Sends `n` GETs one after another; how many were answered 200.
async fn successes(addr: std::net::SocketAddr, n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        if get(addr, &format!("/{i}"), "app").await.status == 200 {
            ok += 1;
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_behind_its_sidecar_costs_its_callers_no_more_than_without_one() {
    let live = [
        Upstream::start(|_req| async { respond(200, "ok") }).await,
        Upstream::start(|_req| async { respond(200, "ok") }).await,
    ];
    let dead = dead_port().await;
    const REQUESTS: usize = 60;

    // Direct: the dead replica refuses connections, and each refusal is retried on
    // another replica.
    let direct = Tollgate::start(&caller(&[live[0].addr, live[1].addr, dead], |u| u)).await;
    assert_eq!(successes(direct.addr, REQUESTS).await, REQUESTS);
    direct.stop().await;

    // Each replica behind its own sidecar: the dead app's sidecar answers
    // `502 app-unreachable`, the endpoint's failure.
    let mut sidecars = Vec::new();
    for app in [live[0].addr, live[1].addr, dead] {
        sidecars.push(Tollgate::start(&sidecar(app, |i| i)).await);
    }
    let inbound: Vec<_> = sidecars.iter().map(Tollgate::inbound).collect();
    let tg = Tollgate::start(&caller(&inbound, |u| u)).await;
    assert_eq!(
        successes(tg.addr, REQUESTS).await,
        REQUESTS,
        "as many answered as direct"
    );
    let m = tg.metrics().await;
    assert!(
        metric(
            &m,
            "tollgate_retries_total{reason=\"reset\",upstream=\"app\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{m}"
    );
    // Its sidecar's answer put the dead replica aside at once, as a refused connection
    // does: it saw a few of the 60 calls, not a third of them.
    let dead_side = sidecars[2].metrics().await;
    let reached = metric(
        &dead_side,
        "tollgate_inbound_requests_total{code=\"502\",kind=\"first\",outcome=\"app-unreachable\"}",
    )
    .unwrap_or(0.0);
    assert!(
        (1.0..=5.0).contains(&reached),
        "{reached} calls reached the dead replica"
    );
    tg.stop().await;
    for s in sidecars {
        s.stop().await;
    }
}

/// Without `[outlier]` and with no retry to spare, a caller stops offering a dead replica
/// its first attempts as soon as it refuses a connection: the same must hold when the
/// replica's sidecar answers for it (`502 app-unreachable`), or every third call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replica_behind_its_sidecar_is_skipped_as_a_refusing_one_is() {
    let live = [
        Upstream::start(|_req| async { respond(200, "ok") }).await,
        Upstream::start(|_req| async { respond(200, "ok") }).await,
    ];
    let dead = dead_port().await;
    const REQUESTS: usize = 60;
    let plain = |endpoints: &[std::net::SocketAddr]| {
        retrying_app(endpoints, |u| u.budget(|b| b.ratio(0.0).min_per_sec(0)))
    };
    let direct = Tollgate::start(&plain(&[live[0].addr, live[1].addr, dead])).await;
    let direct_failed = REQUESTS - successes(direct.addr, REQUESTS).await;
    direct.stop().await;

    let mut sidecars = Vec::new();
    for app in [live[0].addr, live[1].addr, dead] {
        sidecars.push(Tollgate::start(&sidecar(app, |i| i)).await);
    }
    let inbound: Vec<_> = sidecars.iter().map(Tollgate::inbound).collect();
    let tg = Tollgate::start(&plain(&inbound)).await;
    let failed = REQUESTS - successes(tg.addr, REQUESTS).await;
    assert!(
        failed <= direct_failed + 2,
        "{failed} of {REQUESTS} failed behind sidecars, {direct_failed} without"
    );
    tg.stop().await;
    for s in sidecars {
        s.stop().await;
    }
}

/// `[upstreams.app]` on `endpoints`, minting a key for each POST (a method it does not
/// list, so the key alone lets it go again, and only where it did not run).
fn keyed_posts(endpoints: &[std::net::SocketAddr]) -> String {
    Config::new()
        .upstream("app", |u| {
            endpoints
                .iter()
                .fold(u.authorities(["app"]), |u, e| u.endpoint(e))
                .retry(|r| {
                    r.mint_idempotency_key(["POST"])
                        .backoff_base("1ms")
                        .backoff_max("2ms")
                })
                .budget(|b| b.ratio(10.0).min_per_sec(1000))
        })
        .to_toml()
}

/// Sends `n` POSTs one after another; the status of each.
async fn posts(addr: std::net::SocketAddr, n: usize) -> Vec<Got> {
    let mut got = Vec::new();
    for i in 0..n {
        let req = request("POST", &format!("/orders/{i}"), "app")
            .body(full("one coffee"))
            .unwrap();
        got.push(send(addr, req).await);
    }
    got
}

/// A keyed POST is sent again only where it did not run. A dead replica refuses the
/// connection when called directly; behind its sidecar it is `502 app-unreachable;
/// ran=no`: both say it did not run, so the POST goes to another replica, and as many
/// are answered through sidecars as directly. A replica whose app takes the request and
/// then closes the connection answers `ran=maybe`: it may have run, so that POST is
/// never sent to another replica (nothing said this upstream deduplicates).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_post_a_dead_replica_never_ran_goes_to_another_and_one_that_may_have_run_does_not()
{
    let orders = Arc::new(AtomicUsize::new(0));
    let live = {
        let orders = orders.clone();
        Upstream::start(move |_req| {
            orders.fetch_add(1, Ordering::SeqCst);
            async { respond(201, "made") }
        })
        .await
    };
    let dead = dead_port().await;
    const REQUESTS: usize = 30;
    let made = |got: &[Got]| got.iter().filter(|r| r.status == 201).count();

    let direct = Tollgate::start(&keyed_posts(&[live.addr, dead])).await;
    let direct_made = made(&posts(direct.addr, REQUESTS).await);
    direct.stop().await;
    assert_eq!(
        direct_made, REQUESTS,
        "a refused connection never ran: sent again"
    );

    let sidecars = [
        Tollgate::start(&sidecar(live.addr, |i| i)).await,
        Tollgate::start(&sidecar(dead, |i| i)).await,
    ];
    let tg = Tollgate::start(&keyed_posts(&[
        sidecars[0].inbound(),
        sidecars[1].inbound(),
    ]))
    .await;
    let got = posts(tg.addr, REQUESTS).await;
    assert_eq!(
        made(&got),
        direct_made,
        "as many made through sidecars as directly: {:?}",
        got.iter()
            .map(|r| (r.status, r.outcome()))
            .collect::<Vec<_>>()
    );
    let dead_side = sidecars[1].metrics().await;
    assert!(
        metric(
            &dead_side,
            "tollgate_inbound_requests_total{code=\"502\",kind=\"first\",outcome=\"app-unreachable\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "the dead replica's sidecar was asked, and said it did not run\n{dead_side}"
    );
    tg.stop().await;
    for s in sidecars {
        s.stop().await;
    }

    // An app that reads the request and closes the connection: it may have run.
    let closing = Scripted::start(|mut s, _| async move {
        read_head(&mut s).await;
    })
    .await;
    let sidecars = [
        Tollgate::start(&sidecar(live.addr, |i| i)).await,
        Tollgate::start(&sidecar(closing.addr, |i| i)).await,
    ];
    let tg = Tollgate::start(&keyed_posts(&[
        sidecars[0].inbound(),
        sidecars[1].inbound(),
    ]))
    .await;
    let before = orders.load(Ordering::SeqCst);
    let got = posts(tg.addr, REQUESTS).await;
    let failed: Vec<_> = got.iter().filter(|r| r.status != 201).collect();
    assert!(
        closing.accepted() >= 1,
        "the closing replica was asked at least once in {REQUESTS}"
    );
    for r in &failed {
        assert_eq!(
            (r.status, r.outcome()),
            (http::StatusCode::BAD_GATEWAY, Some("not-retryable")),
            "what may have run is answered, not sent again"
        );
    }
    assert_eq!(
        orders.load(Ordering::SeqCst) - before + failed.len(),
        REQUESTS,
        "each POST reached one replica: none that may have run was sent to the other"
    );
    assert!(
        !failed.is_empty(),
        "the POSTs the closing replica took failed"
    );
    tg.stop().await;
    for s in sidecars {
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_app_behind_its_sidecar_is_retried_on_another_replica() {
    let hung = Scripted::start(until_peer_closes).await;
    let live = Upstream::start(|_req| async { respond(200, "ok") }).await;
    // The sidecars give their app 200 ms; the caller waits up to 5 s.
    let mut sidecars = Vec::new();
    for app in [hung.addr, live.addr] {
        sidecars.push(Tollgate::start(&sidecar(app, |i| i.request_timeout("200ms"))).await);
    }
    let inbound: Vec<_> = sidecars.iter().map(Tollgate::inbound).collect();
    let tg = Tollgate::start(&caller(&inbound, |u| u.request_timeout("5s"))).await;
    for i in 0..6 {
        let r = get(tg.addr, &format!("/{i}"), "app").await;
        assert_eq!(r.status, 200, "{:?}", r.outcome());
    }
    assert!(hung.accepted() >= 1, "the hung app was asked");
    let m = tg.metrics().await;
    assert!(
        metric(
            &m,
            "tollgate_retries_total{reason=\"timeout\",upstream=\"app\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{m}"
    );
    tg.stop().await;
    for s in sidecars {
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callees_request_in_progress_is_retried_like_a_503() {
    let first = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let up = Upstream::start(move |_req| {
        let first = first.swap(false, std::sync::atomic::Ordering::SeqCst);
        async move {
            if first {
                http::Response::builder()
                    .status(409)
                    .header("x-tollgate-outcome", "in-progress")
                    .header("retry-after", "0")
                    .body(full("still running"))
                    .unwrap()
            } else {
                respond(200, "done")
            }
        }
    })
    .await;
    let tg = Tollgate::start(&layer("db", up.addr)).await;
    let r = send(
        tg.addr,
        request("POST", "/charge", "db")
            .header("idempotency-key", "k")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.attempts(), 2);
    assert_eq!(
        metric(
            &tg.metrics().await,
            "tollgate_retries_total{reason=\"503\",upstream=\"db\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_on_a_success_or_a_redirect_means_nothing_and_is_removed() {
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let status = if req.uri().path() == "/moved" {
            302
        } else {
            200
        };
        http::Response::builder()
            .status(status)
            .header("x-tollgate-outcome", "budget-exhausted")
            .body(full("fine"))
            .unwrap()
    })
    .await;
    let tg = Tollgate::start(&layer("db", up.addr)).await;
    for path in ["/ok", "/moved"] {
        let r = get(tg.addr, path, "db").await;
        assert_eq!(r.outcome(), None, "{path}: HTTP/1.1");
        let r = send_h2(tg.addr, request("GET", path, "db").body(empty()).unwrap()).await;
        assert_eq!(r.outcome(), None, "{path}: HTTP/2");
    }
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"200\",outcome=\"ok\",upstream=\"db\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"302\",outcome=\"ok\",upstream=\"db\"}"
        ),
        Some(2.0)
    );
    tg.stop().await;
}
