//! A retry the callee's inbound side refuses (`503`, `x-tollgate-outcome:
//! retry-rejected`): no further attempt, and the app gets the failure the retry retried,
//! as it came (or tollgate's own 502/504 for a reset or a timeout), with outcome
//! `retry-rejected`; a first attempt refused passes back as it came.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const REJECTED: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nx-tollgate-outcome: retry-rejected\r\n\
content-length: 8\r\n\r\nrejected";

/// An upstream that retries up to 3 times within a roomy budget.
fn section(
    u: common::config::Upstream,
    name: &str,
    addr: std::net::SocketAddr,
) -> common::config::Upstream {
    u.authorities([name])
        .endpoint(addr)
        .protocol("http1")
        .attempt_timeout("300ms")
        .retry(|r| r.max_attempts(3).backoff_base("1ms").backoff_max("2ms"))
        .budget(|b| b.ratio(1.0).min_per_sec(100))
}

/// The file with one such upstream, `api`.
fn api(addr: std::net::SocketAddr) -> String {
    Config::new()
        .upstream("api", |u| section(u, "api", addr))
        .to_toml()
}

/// The attempt number a request head carries.
fn attempt_of(head: &[u8]) -> u32 {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    text.lines()
        .find_map(|l| l.strip_prefix("x-tollgate-attempt:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A keep-alive HTTP/1.1 server: each request is answered by `script(attempt)`, `None`
/// closing the connection instead (a reset), counting the requests it read.
async fn scripted(
    script: fn(u32) -> Option<&'static [u8]>,
) -> (Scripted, Arc<AtomicUsize>, Arc<std::sync::Mutex<Vec<u32>>>) {
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (r, s) = (requests.clone(), seen.clone());
    let server = Scripted::start(move |mut stream: TcpStream, _closed| {
        let (r, s) = (r.clone(), s.clone());
        async move {
            loop {
                let head = read_head(&mut stream).await;
                if head.is_empty() {
                    return;
                }
                r.fetch_add(1, Ordering::SeqCst);
                let attempt = attempt_of(&head);
                s.lock().unwrap().push(attempt);
                match script(attempt) {
                    Some([]) => {
                        // Never answers: the attempt times out.
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        return;
                    }
                    Some(reply) => {
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                }
            }
        }
    })
    .await;
    (server, requests, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_retry_answers_the_previous_failure_as_it_came() {
    let (up, requests, seen) = scripted(|attempt| {
        Some(if attempt == 1 {
            b"HTTP/1.1 503 Service Unavailable\r\nx-first: yes\r\ncontent-length: 13\r\n\r\nfirst failure"
        } else {
            REJECTED
        })
    })
    .await;
    let tg = Tollgate::start(&api(up.addr)).await;
    let r = get(tg.addr, "/charge", "api").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        &r.body[..],
        b"first failure",
        "the previous failure, as it came"
    );
    assert_eq!(r.header("x-first"), Some("yes"));
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(r.attempts(), 2, "the rejected attempt counts");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "no attempt after the refusal"
    );
    assert_eq!(*seen.lock().unwrap(), [1, 2]);
    // The kept response was read whole and its connection went back to the pool, but
    // the retry back to the same endpoint goes out on a connection of its own: behind a
    // Service's VIP the pooled one reaches the pod that just failed.
    assert_eq!(up.accepted(), 2, "a connection of its own for the retry");
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"upstream-rejected\",upstream=\"api\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"503\",outcome=\"retry-rejected\",upstream=\"api\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_retry_of_a_reset_or_a_timeout_is_tollgates_own_502_or_504() {
    let (reset, requests, _) = scripted(|attempt| (attempt > 1).then_some(REJECTED)).await;
    let (slow, _, _) = scripted(|attempt| Some(if attempt == 1 { b"" } else { REJECTED })).await;
    // The slow one's first attempt never answers: past its attempt timeout a retry
    // starts beside it and is refused, and it runs on to the deadline.
    let tg = Tollgate::start(
        &Config::new()
            .upstream("reset", |u| section(u, "reset", reset.addr))
            .upstream("slow", |u| {
                section(u, "slow", slow.addr).request_timeout("1s")
            })
            .to_toml(),
    )
    .await;
    let r = get(tg.addr, "/a", "reset").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(r.attempts(), 2);
    assert_eq!(requests.load(Ordering::SeqCst), 2);

    let r = get(tg.addr, "/b", "slow").await;
    assert_eq!(r.status, 504);
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(r.attempts(), 2);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_refused_passes_back_as_it_came() {
    let (up, requests, _) = scripted(|_| Some(REJECTED)).await;
    let tg = Tollgate::start(&api(up.addr)).await;
    let r = get(tg.addr, "/x", "api").await;
    assert_eq!(r.status, 503);
    assert_eq!(&r.body[..], b"rejected");
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(r.attempts(), 1);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "owned by the callee: not retried"
    );
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"upstream-rejected\",upstream=\"api\"}"
        ),
        Some(0.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_is_an_overload_signal_for_the_adaptive_share() {
    // Retries succeed until the callee starts refusing them.
    let refusing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = refusing.clone();
    let up = Upstream::start(move |req| {
        let refusing = flag.load(Ordering::SeqCst);
        async move {
            let attempt = req
                .headers()
                .get("x-tollgate-attempt")
                .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
                .unwrap_or(1);
            match (attempt, refusing) {
                (1, _) => respond(503, "busy"),
                (_, false) => respond(200, "ok"),
                (_, true) => {
                    let mut r = respond(503, "rejected");
                    r.headers_mut()
                        .insert("x-tollgate-outcome", "retry-rejected".parse().unwrap());
                    r
                }
            }
        }
    })
    .await;
    let config = Config::new().upstream("api", |u| {
        u.authorities(["api"])
            .endpoint(up.addr)
            .retry(|r| r.max_attempts(2).backoff_base("1ms").backoff_max("1ms"))
            .budget(|b| b.ratio(0.1).max_ratio(0.5).min_per_sec(100))
    });
    let tg = Tollgate::start(&config.to_toml()).await;
    let share = |m: &str| metric(m, "tollgate_retry_budget_ratio{upstream=\"api\"}").unwrap();
    for i in 0..30 {
        assert_eq!(get(tg.addr, &format!("/{i}"), "api").await.status, 200);
    }
    assert_eq!(
        share(&tg.metrics().await),
        0.5,
        "retries succeeded: up to max_ratio"
    );
    refusing.store(true, Ordering::SeqCst);
    let r = get(tg.addr, "/refused", "api").await;
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(&r.body[..], b"busy");
    assert_eq!(share(&tg.metrics().await), 0.1, "back to ratio at once");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_retry_the_callee_refuses_answers_the_previous_failure() {
    // A callee's refusal of a retry, to a gRPC call, is its trailers-only answer: HTTP
    // 200 with RESOURCE_EXHAUSTED and `retry-rejected` in the head. The caller's app
    // gets the UNAVAILABLE the retry retried, not the refusal.
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let first = req
            .headers()
            .get("x-tollgate-attempt")
            .is_some_and(|v| v == "1");
        let mut b = http::Response::builder().header("content-type", "application/grpc");
        b = if first {
            b.header("grpc-status", "14")
                .header("grpc-message", "app down")
        } else {
            b.header("grpc-status", "8")
                .header("grpc-message", "the app's retry budget is spent")
                .header("x-tollgate-outcome", "retry-rejected")
                .header("grpc-retry-pushback-ms", "-1")
        };
        b.body(empty()).unwrap()
    })
    .await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("greeter", |u| {
                u.authorities(["greeter"])
                    .endpoint(up.addr)
                    .protocol("h2c")
                    .retry(|r| {
                        r.max_attempts(3)
                            .methods(["POST"])
                            .backoff_base("1ms")
                            .backoff_max("2ms")
                    })
                    .budget(|b| b.ratio(1.0).min_per_sec(100))
            })
            .to_toml(),
    )
    .await;
    let r = send_h2(
        tg.addr,
        grpc_call("greeter", "/helloworld.Greeter/SayHello"),
    )
    .await;
    assert_eq!(
        (
            r.status.as_u16(),
            r.header("grpc-status"),
            r.header("grpc-message")
        ),
        (200, Some("14"), Some("app down")),
        "the previous failure, as it came"
    );
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(r.attempts(), 2, "no attempt after the refusal");
    assert_eq!(up.hits(), 2);
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"upstream-rejected\",upstream=\"greeter\"}"
        ),
        Some(1.0),
        "{m}"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_callee_whose_app_is_unreachable_is_passed_over_as_over_http() {
    // Pod A's sidecar says, to a gRPC call, that its app is unreachable (HTTP 200,
    // UNAVAILABLE, `app-unreachable; ran=no` in the head); pod B serves. As with the
    // HTTP `502 app-unreachable`, pod A is passed over for a while rather than taking
    // every other call (each then retried).
    let dead = Upstream::start(|_req| async move {
        http::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .header("x-tollgate-outcome", "app-unreachable; ran=no")
            .body(empty())
            .unwrap()
    })
    .await;
    let ok = Upstream::start(|_req| async move {
        http::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "0")
            .body(empty())
            .unwrap()
    })
    .await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("greeter", |u| {
                u.authorities(["greeter"])
                    .endpoint(dead.addr)
                    .endpoint(ok.addr)
                    .protocol("h2c")
                    .retry(|r| r.max_attempts(3).methods(["POST"]).backoff_base("1ms"))
                    .budget(|b| b.ratio(1.0).min_per_sec(100))
            })
            .to_toml(),
    )
    .await;
    for i in 0..20 {
        let call = grpc_call("greeter", &format!("/helloworld.Greeter/Say{i}"));
        let r = send_h2(tg.addr, call).await;
        assert_eq!(r.header("grpc-status"), Some("0"), "call {i}");
    }
    // Passed over after its answer, for 250 ms and doubling: a few calls at most,
    // where round-robin alone gives it every other one (10).
    assert!(dead.hits() <= 5, "pod A took {} of 20 calls", dead.hits());
    tg.stop().await;
}
