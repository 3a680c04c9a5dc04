//! The app's own retries over loopback: a request with the same method, authority,
//! target and idempotency key as one tollgate answered with an outcome in the last 2 s
//! is counted (`tollgate_app_retries_total`) and sent as a retry (`x-tollgate-attempt:
//! 2`, within the budget, not retried again), or with `app_retries = "refuse"` answered
//! at once with the failure's status and outcome `app-retry`.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// An upstream that answers 503 (or what `reply` says for an attempt number) and
/// records the `x-tollgate-attempt` of every request it gets.
async fn recording(
    reply: fn(&str, u32) -> (u16, Option<&'static str>),
) -> (Upstream, Arc<Mutex<Vec<(String, u32)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let up = Upstream::start(move |req| {
        let attempt = req
            .headers()
            .get("x-tollgate-attempt")
            .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
            .unwrap_or(0);
        let path = req.uri().path().to_string();
        log.lock().unwrap().push((path.clone(), attempt));
        let (status, outcome) = reply(&path, attempt);
        async move {
            let mut r = respond(status, "answer");
            if let Some(o) = outcome {
                r.headers_mut()
                    .insert("x-tollgate-outcome", o.parse().unwrap());
            }
            r
        }
    })
    .await;
    (up, seen)
}

fn failing(_: &str, _: u32) -> (u16, Option<&'static str>) {
    (503, None)
}

fn api(addr: std::net::SocketAddr, extra: &str, budget: &str) -> String {
    config(&format!(
        "[upstreams.api]\nauthorities = [\"api\"]\nendpoints = [\"{addr}\"]\nprotocol = \"http1\"\n{extra}\
         [upstreams.api.retry]\nmax_attempts = 2\nbackoff_base = \"1ms\"\nbackoff_max = \"1ms\"\n\
         [upstreams.api.budget]\n{budget}"
    ))
}

const ROOMY: &str = "ratio = 1.0\nmin_per_sec = 100\n";

fn app_retries(m: &str) -> f64 {
    metric(m, "tollgate_app_retries_total{upstream=\"api\"}").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_again_is_counted_and_sent_as_a_retry() {
    let (up, seen) = recording(failing).await;
    let tg = Tollgate::start(&api(up.addr, "", ROOMY)).await;
    let first = get(tg.addr, "/charge", "api").await;
    assert_eq!(first.outcome(), Some("attempts-exhausted"));
    assert_eq!(first.attempts(), 2);
    let m = tg.metrics().await;
    assert_eq!(app_retries(&m), 0.0);
    let amplification = |m: &str| metric(m, "tollgate_amplification{upstream=\"api\"}").unwrap();
    assert_eq!(amplification(&m), 2.0);

    let again = get(tg.addr, "/charge", "api").await;
    assert_eq!(again.status, 503);
    assert_eq!(again.attempts(), 1, "not retried again by tollgate");
    assert_eq!(again.outcome(), Some("attempts-exhausted"));
    let m = tg.metrics().await;
    assert_eq!(app_retries(&m), 1.0);
    // Three attempts for one request received: the app's retry is a retry, not a
    // request (it counts in retries_sent, not requests_received).
    assert_eq!(amplification(&m), 3.0);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("/charge".to_string(), 1),
            ("/charge".to_string(), 2),
            ("/charge".to_string(), 2)
        ],
        "the app's retry goes as a retry"
    );

    // Another target, method or idempotency key is another request.
    get(tg.addr, "/other", "api").await;
    let post = request("POST", "/charge", "api").body(empty()).unwrap();
    send(tg.addr, post).await;
    let keyed = |key: &'static str| {
        request("GET", "/charge", "api")
            .header("idempotency-key", key)
            .body(empty())
            .unwrap()
    };
    assert_eq!(send(tg.addr, keyed("k1")).await.attempts(), 2);
    assert_eq!(app_retries(&tg.metrics().await), 1.0);
    let r = send(tg.addr, keyed("k1")).await;
    assert_eq!(r.attempts(), 1, "the same key again is the app's retry");
    assert_eq!(app_retries(&tg.metrics().await), 2.0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authority_is_the_one_the_app_called_when_a_host_is_configured() {
    let (up, seen) = recording(failing).await;
    let cfg = api(up.addr, "host = \"backend.example\"\n", ROOMY).replace(
        "authorities = [\"api\"]",
        "authorities = [\"api\", \"api2\"]",
    );
    let tg = Tollgate::start(&cfg).await;
    assert_eq!(get(tg.addr, "/charge", "api").await.attempts(), 2);
    // Sent upstream with the same Host, but the app called another authority: another
    // request, not a retry of the first.
    assert_eq!(get(tg.addr, "/charge", "api2").await.attempts(), 2);
    assert_eq!(app_retries(&tg.metrics().await), 0.0);
    let again = get(tg.addr, "/charge", "api").await;
    assert_eq!(
        again.attempts(),
        1,
        "the same authority again is the app's retry"
    );
    assert_eq!(app_retries(&tg.metrics().await), 1.0);
    assert_eq!(seen.lock().unwrap().len(), 5);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_ends_the_memory_of_the_failure() {
    let (up, _) = recording(|_, attempt| (if attempt >= 2 { 200 } else { 503 }, None)).await;
    // One attempt only: tollgate gives up on the first failure, the app's retry works.
    let tg =
        Tollgate::start(&api(up.addr, "", ROOMY).replace("max_attempts = 2", "max_attempts = 1"))
            .await;
    assert_eq!(get(tg.addr, "/x", "api").await.status, 503);
    let r = get(tg.addr, "/x", "api").await;
    assert_eq!((r.status.as_u16(), r.outcome()), (200, None));
    assert_eq!(app_retries(&tg.metrics().await), 1.0);
    // The same request after it succeeded is a new one.
    assert_eq!(get(tg.addr, "/x", "api").await.status, 503);
    assert_eq!(app_retries(&tg.metrics().await), 1.0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_retry_needs_room_in_the_budget() {
    let (up, _) = recording(failing).await;
    // One retry in the window at most (0.1/s × 10 s), and tollgate itself retries
    // nothing.
    let tg = Tollgate::start(
        &api(up.addr, "", "ratio = 0.0\nmin_per_sec = 0.1\n")
            .replace("max_attempts = 2", "max_attempts = 1"),
    )
    .await;
    assert_eq!(get(tg.addr, "/y", "api").await.attempts(), 1);
    assert_eq!(
        get(tg.addr, "/y", "api").await.attempts(),
        1,
        "the one retry"
    );
    assert_eq!(up.hits(), 2);
    let r = get(tg.addr, "/y", "api").await;
    assert_eq!(r.status, 503, "the failure's own status");
    assert_eq!(r.outcome(), Some("budget-exhausted"));
    assert_eq!(r.attempts(), 0);
    assert_eq!(up.hits(), 2, "no upstream call");
    let m = tg.metrics().await;
    assert_eq!(app_retries(&m), 2.0);
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"budget\",upstream=\"api\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_app_retries_never_reach_the_upstream_and_do_not_restart_the_memory() {
    let (up, _) = recording(|_, _| (502, None)).await;
    let tg = Tollgate::start(&api(up.addr, "app_retries = \"refuse\"\n", ROOMY)).await;
    let first = get(tg.addr, "/z", "api").await;
    assert_eq!(first.status, 502);
    assert_eq!(up.hits(), 2);
    let r = get(tg.addr, "/z", "api").await;
    assert_eq!(r.status, 502, "the same status as the failure");
    assert_eq!(r.outcome(), Some("app-retry"));
    assert_eq!(r.attempts(), 0);
    assert_eq!(up.hits(), 2, "no upstream call");
    // Refused again and again, every 50 ms: the refusals do not restart the 2 s, so
    // the request is sent again once they have passed.
    let mut refused = 1;
    let sent = loop {
        let r = get(tg.addr, "/z", "api").await;
        if r.outcome() != Some("app-retry") {
            break r;
        }
        refused += 1;
        assert!(refused < 200, "still refused after 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(sent.outcome(), Some("attempts-exhausted"));
    assert_eq!(up.hits(), 4);
    assert_eq!(app_retries(&tg.metrics().await), f64::from(refused));
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_grpc_call_says_the_status_of_its_failure() {
    let up = Upstream::start(|_req| async {
        let mut r = respond(200, "");
        let h = r.headers_mut();
        h.insert("content-type", "application/grpc".parse().unwrap());
        h.insert("grpc-status", "14".parse().unwrap());
        r
    })
    .await;
    let tg = Tollgate::start(
        &api(up.addr, "app_retries = \"refuse\"\n", ROOMY)
            .replace("protocol = \"http1\"", "protocol = \"h2c\"")
            .replace(
                "[upstreams.api.retry]\n",
                "[upstreams.api.retry]\nmethods = [\"POST\"]\n",
            ),
    )
    .await;
    let call = || {
        request("POST", "/pkg.Svc/Call", "api")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(empty())
            .unwrap()
    };
    let first = send_h2(tg.addr, call()).await;
    assert_eq!(first.header("grpc-status"), Some("14"));
    assert_eq!(first.outcome(), Some("attempts-exhausted"));
    let r = send_h2(tg.addr, call()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.outcome(), Some("app-retry"));
    assert_eq!(
        r.header("grpc-status"),
        Some("14"),
        "the failure's own status"
    );
    assert_eq!(r.header("grpc-retry-pushback-ms"), Some("-1"));
    assert_eq!(up.hits(), 2);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_app_retry_passes_back_as_it_came() {
    let (up, _) = recording(|_, attempt| {
        if attempt >= 2 {
            (503, Some("retry-rejected"))
        } else {
            (503, None)
        }
    })
    .await;
    let tg = Tollgate::start(&api(up.addr, "", ROOMY)).await;
    // tollgate's own retry is refused: the first failure goes back.
    let first = get(tg.addr, "/w", "api").await;
    assert_eq!(first.outcome(), Some("retry-rejected"));
    assert_eq!(first.attempts(), 2);
    // The app's retry is refused too: it had no previous attempt here, so the refusal
    // passes back as it came.
    let r = get(tg.addr, "/w", "api").await;
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(r.attempts(), 1);
    assert_eq!(up.hits(), 3);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_above_that_ignores_ownership_is_an_app_retrying() {
    // The outer layer retries what the inner one gave up on; the inner one sees those
    // retries as its app's, and sends each once: 3 + 1 + 1 attempts, not 3 × 3.
    let failing_up = Upstream::start(|_req| async { respond(503, "down") }).await;
    let layer = |next: std::net::SocketAddr, extra: &str| {
        config(&format!(
            "[upstreams.db]\nauthorities = [\"db\"]\nendpoints = [\"{next}\"]\n\
             [upstreams.db.retry]\nmax_attempts = 3\nbackoff_base = \"1ms\"\nbackoff_max = \"2ms\"\n{extra}\
             [upstreams.db.budget]\nratio = 10.0\nmin_per_sec = 1000\n"
        ))
    };
    let inner = Tollgate::start(&layer(failing_up.addr, "")).await;
    let outer = Tollgate::start(&layer(inner.addr, "ownership = \"ignore\"\n")).await;
    let r = get(outer.addr, "/", "db").await;
    assert_eq!(r.status, 503);
    assert_eq!(failing_up.hits(), 5);
    let m = inner.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_app_retries_total{upstream=\"db\"}"),
        Some(2.0)
    );
    outer.stop().await;
    inner.stop().await;
}
