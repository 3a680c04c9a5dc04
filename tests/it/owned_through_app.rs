//! Ownership through the app: an app does not copy `x-tollgate-outcome` onto its own
//! failure, so the inbound side marks the app's 502/503/504 `downstream-owned` when,
//! within that request's lifetime, the same pod's outbound side gave up with an owned
//! outcome on a call made for it, matched by the trace id of `traceparent` or by
//! `x-request-id`, which the app passes on. Without either nothing is added.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use http_body_util::BodyExt;

use common::config::Config;
use common::*;

const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// One pod: an app behind its tollgate's inbound side, calling `db` (which always
/// answers 503) through the same tollgate's outbound side, passing on the request's
/// `traceparent` and `x-request-id`; whatever db answered, the app answers its caller
/// a plain 503 of its own. A request with `x-call: no` makes no call; one with
/// `x-hold: yes` is answered 300 ms later.
struct Pod {
    tollgate: Tollgate,
    app: Upstream,
    _db: Upstream,
}

async fn pod(owned_failures: &str) -> Pod {
    let db = Upstream::start(|_req| async { respond(503, "db down") }).await;
    let outbound: Arc<OnceLock<SocketAddr>> = Arc::default();
    let to = outbound.clone();
    let app = Upstream::start(move |req| {
        let to = to.clone();
        async move {
            if req.headers().get("x-call").is_none() {
                let mut call = request("GET", "/rows", "db");
                for name in ["traceparent", "x-request-id"] {
                    if let Some(v) = req.headers().get(name) {
                        call = call.header(name, v);
                    }
                }
                // `x-spent: yes`: the app passes on a deadline already spent, which its
                // tollgate refuses before any attempt (owned all the same).
                let spent = req.headers().get("x-spent").is_some();
                if spent {
                    call = call.header("x-timeout-ms", "0");
                }
                let got = send(*to.get().unwrap(), call.body(empty()).unwrap()).await;
                let want = if spent {
                    "deadline-exceeded"
                } else {
                    "attempts-exhausted"
                };
                assert_eq!(got.outcome(), Some(want));
            }
            if req.headers().get("x-hold").is_some() {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            if req
                .headers()
                .get("content-type")
                .is_some_and(|v| v == "application/grpc")
            {
                // A gRPC answer whose status comes last, in its trailers (a stream that
                // failed after its head).
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
                return http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(
                        WithTrailers {
                            data: Some(bytes::Bytes::from_static(b"\0\0\0\0\0")),
                            trailers: Some(trailers),
                        }
                        .boxed(),
                    )
                    .unwrap();
            }
            respond(503, "the app could not serve it")
        }
    })
    .await;
    let tollgate = Tollgate::start(
        &Config::new()
            .inbound(app.addr, |i| i.owned_failures(owned_failures))
            .upstream("db", |u| {
                u.authorities(["db"])
                    .endpoint(db.addr)
                    .retry(|r| r.max_attempts(2).backoff_base("1ms").backoff_max("2ms"))
                    .budget(|b| b.ratio(10.0).min_per_sec(1000))
            })
            .to_toml(),
    )
    .await;
    outbound.set(tollgate.addr).unwrap();
    Pod {
        tollgate,
        app,
        _db: db,
    }
}

async fn call(to: SocketAddr, host: &str, headers: &[(&str, &str)]) -> Got {
    let mut req = request("GET", "/pay", host);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    send(to, req.body(empty()).unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apps_failure_after_its_own_call_was_given_up_on_is_marked_owned() {
    let p = pod("mark").await;
    let inbound = p.tollgate.inbound();

    let by_id = call(inbound, "payments", &[("x-request-id", "r-1")]).await;
    assert_eq!(by_id.status, 503);
    assert_eq!(by_id.outcome(), Some("downstream-owned"));
    assert_eq!(by_id.header("grpc-retry-pushback-ms"), Some("-1"));

    let by_trace = call(inbound, "payments", &[("traceparent", TRACE)]).await;
    assert_eq!(by_trace.outcome(), Some("downstream-owned"));

    // Nothing ties the app's call to the request: nothing is added.
    let untied = call(inbound, "payments", &[]).await;
    assert_eq!(untied.status, 503);
    assert_eq!(untied.outcome(), None, "no guessing");
    assert_eq!(untied.header("grpc-retry-pushback-ms"), None);

    // Its call was refused before any attempt (a deadline already spent): given up on,
    // owned, all the same.
    let refused = call(
        inbound,
        "payments",
        &[("x-request-id", "r-3"), ("x-spent", "yes")],
    )
    .await;
    assert_eq!(refused.outcome(), Some("downstream-owned"));

    // The app failed without a call that was given up on: its own failure, retryable.
    let own = call(
        inbound,
        "payments",
        &[("x-request-id", "r-2"), ("x-call", "no")],
    )
    .await;
    assert_eq!(own.outcome(), None);

    let text = p.tollgate.metrics().await;
    assert_eq!(
        metric(&text, "tollgate_inbound_owned_failures_total"),
        Some(3.0)
    );
    assert_eq!(
        metric(
            &text,
            "tollgate_inbound_requests_total{code=\"503\",kind=\"first\",outcome=\"downstream-owned\"}"
        ),
        Some(3.0)
    );
    p.tollgate.stop().await;
}

/// A caller reusing another's `x-request-id` (or trace id) while that other request is
/// in flight makes the id ambiguous: neither request's failure is marked, so the
/// other's stays retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_two_requests_in_flight_carry_at_once_marks_nothing() {
    let p = pod("mark").await;
    let inbound = p.tollgate.inbound();
    for key in ["x-request-id", "traceparent"] {
        let id = if key == "traceparent" {
            TRACE
        } else {
            "r-shared"
        };
        let (calls, holds) = ([(key, id), ("x-hold", "yes")], ("x-call", "no"));
        let reused = [calls[0], calls[1], holds];
        let victim = call(inbound, "payments", &calls);
        let reuser = call(inbound, "payments", &reused);
        let (victim, reuser) = tokio::join!(victim, reuser);
        assert_eq!(victim.status, 503);
        assert_eq!(
            victim.outcome(),
            None,
            "{key}: an ambiguous id marked a failure"
        );
        assert_eq!(reuser.outcome(), None, "{key}");
    }
    // Alone again, the id is the request's own.
    let alone = call(inbound, "payments", &[("x-request-id", "r-shared")]).await;
    assert_eq!(alone.outcome(), Some("downstream-owned"));
    p.tollgate.stop().await;
}

/// The point of it: the caller's tollgate does not retry what the layer below owned,
/// so the failing dependency sees the attempts of one layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_tollgate_does_not_retry_a_failure_owned_below_the_app() {
    let p = pod("mark").await;
    let caller = Tollgate::start(
        &Config::new()
            .upstream("payments", |u| {
                u.authorities(["payments"])
                    .endpoint(p.tollgate.inbound())
                    .retry(|r| r.max_attempts(3).backoff_base("1ms").backoff_max("2ms"))
                    .budget(|b| b.ratio(10.0).min_per_sec(1000))
            })
            .to_toml(),
    )
    .await;
    let got = call(caller.addr, "payments", &[("x-request-id", "r-9")]).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.attempts(), 1, "not retried");
    assert_eq!(got.outcome(), Some("downstream-owned"));
    assert_eq!(p.app.hits(), 1);

    // Without the request id the caller cannot be told: it retries, as before.
    let untied = call(caller.addr, "payments", &[]).await;
    assert_eq!(untied.attempts(), 3);
    caller.stop().await;
    p.tollgate.stop().await;
}

/// A gRPC status in the trailers is marked there: a caller's gRPC client reads
/// `grpc-retry-pushback-ms: -1` where the status is, and does not retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_unavailable_in_the_trailers_is_marked_in_the_trailers() {
    let p = pod("mark").await;
    let grpc = |id: Option<&str>| {
        let mut req = request("POST", "/pay.Payments/Charge", "payments")
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(id) = id {
            req = req.header("x-request-id", id);
        }
        req.body(full(&b"\0\0\0\0\0"[..])).unwrap()
    };
    let marked = send_h2(p.tollgate.inbound(), grpc(Some("g-1"))).await;
    assert_eq!(marked.status, 200);
    let trailers = marked.trailers.expect("the app's trailers come through");
    assert_eq!(trailers["grpc-status"], "14");
    assert_eq!(trailers["x-tollgate-outcome"], "downstream-owned");
    assert_eq!(trailers["grpc-retry-pushback-ms"], "-1");
    assert!(marked.headers.get("x-tollgate-outcome").is_none());

    // Untied to the call that was given up on: the caller may retry it.
    let untied = send_h2(p.tollgate.inbound(), grpc(None)).await;
    let trailers = untied.trailers.expect("the app's trailers come through");
    assert_eq!(trailers["grpc-status"], "14");
    assert!(trailers.get("x-tollgate-outcome").is_none());
    assert!(trailers.get("grpc-retry-pushback-ms").is_none());
    let text = p.tollgate.metrics().await;
    assert_eq!(
        metric(&text, "tollgate_inbound_owned_failures_total"),
        Some(1.0)
    );
    p.tollgate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_failures_off_adds_nothing() {
    let p = pod("off").await;
    let got = call(p.tollgate.inbound(), "payments", &[("x-request-id", "r-1")]).await;
    assert_eq!(got.status, 503);
    assert_eq!(got.outcome(), None);
    let text = p.tollgate.metrics().await;
    assert_eq!(
        metric(&text, "tollgate_inbound_owned_failures_total"),
        Some(0.0)
    );
    p.tollgate.stop().await;
}
