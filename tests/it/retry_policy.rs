//! What is retried and what is not: conditions, methods and idempotency keys, replayed
//! bodies, another endpoint after a failure, gRPC UNAVAILABLE.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::config::{Config, Retry};
use common::*;
use http::Response;
use http_body_util::BodyExt;

/// `name` for the authority of the same name, 3 attempts within a roomy budget, and
/// what `retry` adds to its retry section.
fn retrying(
    name: &str,
    endpoints: &[std::net::SocketAddr],
    retry: impl FnOnce(Retry) -> Retry,
) -> String {
    retrying_with(name, endpoints, |u| u, retry)
}

/// As [`retrying`], with what `f` sets on the upstream.
fn retrying_with(
    name: &str,
    endpoints: &[std::net::SocketAddr],
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
    retry: impl FnOnce(Retry) -> Retry,
) -> String {
    Config::new()
        .upstream(name, |u| {
            let u = endpoints
                .iter()
                .fold(u.authorities([name]), |u, e| u.endpoint(e));
            f(u).retry(|r| retry(r.max_attempts(3).backoff_base("1ms").backoff_max("5ms")))
                .budget(|b| b.ratio(1.0).min_per_sec(100))
        })
        .to_toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_a_key_is_sent_once_and_with_a_key_is_retried() {
    let up = Upstream::start(|_req| async { respond(503, "busy") }).await;
    let tg = Tollgate::start(&retrying("pay", &[up.addr], |r| r)).await;

    let r = send(
        tg.addr,
        request("POST", "/charge", "pay").body(full("{}")).unwrap(),
    )
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.outcome(), Some("not-retryable"));
    assert_eq!(r.attempts(), 1);
    assert_eq!(
        up.hits(),
        1,
        "a POST without an idempotency key must reach the upstream once"
    );

    let req = request("POST", "/charge", "pay")
        .header("idempotency-key", "order-42")
        .body(full("{}"))
        .unwrap();
    let r = send(tg.addr, req).await;
    assert_eq!(r.attempts(), 3);
    assert_eq!(r.outcome(), Some("attempts-exhausted"));
    assert_eq!(up.hits(), 4);

    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"method\",upstream=\"pay\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

/// An upstream that keeps every request body it reads and answers 503, except every
/// `ok_every`th request, which it answers 200 with the body it read.
async fn recording(ok_every: usize) -> (Upstream, Arc<Mutex<Vec<Bytes>>>) {
    let bodies: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let seen = bodies.clone();
    let up = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let seen = seen.clone();
        async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let n = {
                let mut s = seen.lock().unwrap();
                s.push(body.clone());
                s.len()
            };
            if n % ok_every != 0 {
                respond(503, "again")
            } else {
                respond(200, body)
            }
        }
    })
    .await;
    (up, bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_kib_body_is_replayed_byte_identical() {
    let (up, bodies) = recording(3).await;
    let tg = Tollgate::start(&retrying("store", &[up.addr], |r| r)).await;
    // Streamed from the client in chunks as it is produced.
    let body = Generated::new(5, 10 * 1024).boxed();
    let r = send(
        tg.addr,
        request("PUT", "/blob", "store").body(body).unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.attempts(), 3);
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3);
    let mut g = Generated::new(5, 10 * 1024);
    let mut original = Vec::new();
    while let Some(frame) = futures_frame(&mut g).await {
        original.extend_from_slice(&frame);
    }
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(
            b.as_ref(),
            original.as_slice(),
            "attempt {} carried a different body",
            i + 1
        );
    }
    tg.stop().await;
}

/// A body large enough to go out from its own buffers rather than copied: each attempt
/// carries it whole, declared by its length or chunked as it streams, and the answer
/// that echoes it back reaches the app whole as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_256_kib_body_is_replayed_byte_identical_with_or_without_a_length() {
    const LEN: usize = 256 * 1024;
    let (up, bodies) = recording(3).await;
    let tg = Tollgate::start(&retrying("store", &[up.addr], |r| r.max_body("1MiB"))).await;
    let mut original = Vec::new();
    let mut g = Generated::new(11, LEN);
    while let Some(frame) = futures_frame(&mut g).await {
        original.extend_from_slice(&frame);
    }
    let sized = full(original.clone());
    let streamed = Generated::new(11, LEN).boxed();
    for (how, body) in [("with a length", sized), ("chunked", streamed)] {
        let r = send(
            tg.addr,
            request("PUT", "/blob", "store").body(body).unwrap(),
        )
        .await;
        assert_eq!(r.status, 200, "{how}");
        assert_eq!(r.attempts(), 3, "{how}");
        assert!(
            r.body == original.as_slice(),
            "{how}: the echoed answer differs"
        );
    }
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 6);
    for (i, b) in bodies.iter().enumerate() {
        assert!(
            b.as_ref() == original.as_slice(),
            "attempt {} carried a different body ({} bytes)",
            i + 1,
            b.len()
        );
    }
    tg.stop().await;
}

async fn futures_frame(g: &mut Generated) -> Option<Bytes> {
    g.frame().await.map(|f| f.unwrap().into_data().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_max_body_is_not_retried() {
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let _ = req.into_body().collect().await;
        respond(503, "busy")
    })
    .await;
    let tg = Tollgate::start(&retrying("store", &[up.addr], |r| r.max_body("1KiB"))).await;
    let r = send(
        tg.addr,
        request("PUT", "/blob", "store")
            .body(full(vec![7u8; 10 * 1024]))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.outcome(), Some("body-too-large"));
    assert_eq!(up.hits(), 1);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_goes_to_another_endpoint() {
    let broken = Upstream::start(|_req| async { respond(503, "broken") }).await;
    let healthy = Upstream::start(|_req| async { respond(200, "fine") }).await;
    let tg = Tollgate::start(&retrying("api", &[broken.addr, healthy.addr], |r| r)).await;
    for _ in 0..20 {
        let r = get(tg.addr, "/", "api").await;
        assert_eq!(
            r.status, 200,
            "a failure on one endpoint is retried on the other"
        );
        assert!(r.attempts() <= 2);
    }
    assert_eq!(healthy.hits(), 20);
    assert!(
        broken.hits() >= 5,
        "round-robin sends first attempts to both endpoints"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_not_listed_are_not_retried() {
    let up = Upstream::start(|_req| async { respond(500, "bug") }).await;
    let tg = Tollgate::start(&retrying("api", &[up.addr], |r| r)).await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.status, 500);
    assert_eq!(r.attempts(), 1);
    assert_eq!(
        r.outcome(),
        None,
        "a 500 is the upstream's answer, not a failure tollgate owns"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_attempt_allowed_is_attempts_exhausted_whatever_the_method() {
    // `max_attempts = 1`, and an upstream with no [retry] section (one attempt): a
    // listed failure ends with `attempts-exhausted` and a denial for `attempts`, not
    // `not-retryable` for a method that is retried elsewhere.
    let up = Upstream::start(|_req| async { respond(503, "busy") }).await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("once", |u| {
                u.authorities(["once"])
                    .endpoint(up.addr)
                    .retry(|r| r.max_attempts(1))
            })
            .upstream("plain", |u| u.authorities(["plain"]).endpoint(up.addr))
            .to_toml(),
    )
    .await;
    for upstream in ["once", "plain"] {
        for method in ["GET", "POST"] {
            let req = request(method, "/", upstream).body(empty()).unwrap();
            let r = send(tg.addr, req).await;
            assert_eq!(
                (r.status.as_u16(), r.attempts(), r.outcome()),
                (503, 1, Some("attempts-exhausted")),
                "{method} to {upstream}"
            );
        }
    }
    let m = tg.metrics().await;
    for upstream in ["once", "plain"] {
        let denied = |reason: &str| {
            metric(
                &m,
                &format!(
                    "tollgate_retries_denied_total{{reason=\"{reason}\",upstream=\"{upstream}\"}}"
                ),
            )
        };
        assert_eq!(denied("attempts"), Some(2.0), "{upstream}\n{m}");
        assert_eq!(denied("method"), Some(0.0), "{upstream}\n{m}");
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unavailable_in_a_trailers_only_response_is_retried() {
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let attempt = req.headers()["x-tollgate-attempt"]
            .to_str()
            .unwrap()
            .to_string();
        let status = if attempt == "1" { "14" } else { "0" };
        Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", status)
            .body(empty())
            .unwrap()
    })
    .await;
    // gRPC calls are POSTs: a gRPC upstream whose calls are safe to repeat lists POST.
    let tg = Tollgate::start(&retrying("greeter", &[up.addr], |r| r.methods(["POST"]))).await;
    let r = send_h2(
        tg.addr,
        grpc_call("greeter", "/helloworld.Greeter/SayHello"),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("grpc-status"),
        Some("0"),
        "attempts {}, outcome {:?}",
        r.attempts(),
        r.outcome()
    );
    assert_eq!(r.attempts(), 2);
    assert_eq!(up.hits(), 2);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_is_numbered_and_carries_its_deadline() {
    let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let s = seen.clone();
    let up = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let s = s.clone();
        async move {
            let attempt = req.headers()["x-tollgate-attempt"]
                .to_str()
                .unwrap()
                .to_string();
            let ms: u64 = req.headers()["x-timeout-ms"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            s.lock().unwrap().push((attempt.clone(), ms));
            if attempt == "3" {
                respond(200, "ok")
            } else {
                respond(502, "bad gateway")
            }
        }
    })
    .await;
    let tg = Tollgate::start(&retrying_with(
        "api",
        &[up.addr],
        |u| u.request_timeout("800ms"),
        |r| r,
    ))
    .await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.attempts(), 3);
    let first = seen.lock().unwrap().clone();
    assert_eq!(
        first.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>(),
        ["1", "2", "3"]
    );
    for (_, ms) in &first {
        assert!(
            *ms <= 800 && *ms > 600,
            "x-timeout-ms {ms} should be the time left of request_timeout (800 ms)"
        );
    }
    assert!(
        first.windows(2).all(|w| w[1].1 <= w[0].1),
        "each attempt is told the time left, which only shrinks: {first:?}"
    );

    // With a tighter caller deadline, the header carries what is left of it.
    let req = request("GET", "/", "api")
        .header("x-timeout-ms", "300")
        .body(empty())
        .unwrap();
    let _ = send(tg.addr, req).await;
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() > 3);
    for (_, ms) in &seen[3..] {
        assert!(
            *ms <= 300,
            "x-timeout-ms {ms} exceeds what the caller has left"
        );
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_refuses_connections_is_skipped() {
    let dead = dead_port().await;
    let healthy = Upstream::start(|_req| async { respond(200, "fine") }).await;
    // Retries off: without skipping, every other request would go to the dead endpoint.
    let tg = Tollgate::start(
        &Config::new()
            .upstream("api", |u| {
                u.authorities(["api"]).endpoint(dead).endpoint(healthy.addr)
            })
            .to_toml(),
    )
    .await;
    let mut failed = 0;
    for _ in 0..40 {
        let r = get(tg.addr, "/", "api").await;
        if r.status != 200 {
            assert_eq!(r.status, 502);
            failed += 1;
        }
    }
    // The dead endpoint is tried again after 250 ms, 500 ms, 1 s, ...: a few probes.
    assert!(
        failed <= 5,
        "{failed} of 40 requests went to the dead endpoint"
    );
    assert_eq!(healthy.hits(), 40 - failed);
    tg.stop().await;
}
