//! The app's own retries over loopback, seen on evidence only: a retry count the app's
//! client set (`evidence="marker"`), or the same per-call identity as a request
//! tollgate answered with an outcome in the last 2 s (`evidence="key"`, the key of the
//! same user: the same `Authorization`). Such a request
//! is counted (`tollgate_app_retries_total`) and sent as a retry (`x-tollgate-attempt:
//! 2`, within the budget, not retried again), or with `app_retries = "refuse"` answered
//! at once with the failure's status and outcome `app-retry`. The same trace id alone
//! is only counted (`evidence="trace"`). Without evidence a request is a first attempt,
//! however many users ask for the same URL.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::config::{Budget, Config, Retry};
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

/// `[upstreams.api]` over HTTP/1.1 to `addr`, and what `f` sets on it.
fn api(
    addr: std::net::SocketAddr,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> String {
    Config::new()
        .upstream("api", |u| {
            f(u.authorities(["api"]).endpoint(addr).protocol("http1"))
        })
        .to_toml()
}

/// Two attempts, a quick backoff.
fn retrying(r: Retry) -> Retry {
    r.max_attempts(2).backoff_base("1ms").backoff_max("1ms")
}

fn roomy(b: Budget) -> Budget {
    b.ratio(1.0).min_per_sec(100)
}

/// [`retrying`] within a [`roomy`] budget.
fn standard(u: common::config::Upstream) -> common::config::Upstream {
    u.retry(retrying).budget(roomy)
}

/// `tollgate_app_retries_total` of upstream `api` on `evidence`.
fn app_retries(m: &str, evidence: &str) -> f64 {
    metric(
        m,
        &format!("tollgate_app_retries_total{{evidence=\"{evidence}\",upstream=\"api\"}}"),
    )
    .unwrap()
}

/// `GET path` with the extra headers.
fn get_with(path: &str, headers: &[(&str, &str)]) -> http::Request<BoxBody> {
    let mut b = request("GET", path, "api");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(empty()).unwrap()
}

fn keyed(path: &str, key: &str) -> http::Request<BoxBody> {
    get_with(path, &[("idempotency-key", key)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_popular_url_keeps_its_success_rate_when_the_upstream_fails_often() {
    // 30% of the answers fail, at random: one URL, asked by many users at once.
    let up = Upstream::start(|_req| async {
        if fastrand::f64() < 0.3 {
            respond(503, "down")
        } else {
            respond(200, "ok")
        }
    })
    .await;
    // The retry budget at its defaults.
    let tg = Tollgate::start(
        &Config::new()
            .upstream("api", |u| {
                u.authorities(["api"])
                    .endpoint(up.addr)
                    .retry(|r| r.backoff_base("1ms").backoff_max("2ms"))
                    .budget(|b| b)
            })
            .to_toml(),
    )
    .await;
    const USERS: usize = 20;
    const EACH: usize = 40;
    let addr = tg.addr;
    let mut users = tokio::task::JoinSet::new();
    for _ in 0..USERS {
        users.spawn(async move {
            let mut got = Vec::new();
            for _ in 0..EACH {
                let r = get(addr, "/popular", "api").await;
                got.push((
                    r.status.as_u16(),
                    r.attempts(),
                    r.outcome().map(str::to_string),
                ));
            }
            got
        });
    }
    let mut answers = Vec::new();
    while let Some(u) = users.join_next().await {
        answers.extend(u.unwrap());
    }
    for (status, attempts, outcome) in &answers {
        assert!(
            *attempts >= 1,
            "refused without an upstream call: {status} {outcome:?}"
        );
    }
    let ok = answers.iter().filter(|(s, ..)| *s == 200).count();
    let rate = ok as f64 / answers.len() as f64;
    // Direct, each request would succeed 70% of the time; tollgate's retries within
    // the budget can only add to that.
    assert!(rate >= 0.62, "{ok} of {} succeeded", answers.len());
    assert!(
        up.hits() >= USERS * EACH,
        "every request reached the upstream"
    );
    let m = tg.metrics().await;
    for evidence in ["marker", "key", "trace"] {
        assert_eq!(app_retries(&m, evidence), 0.0, "{evidence}");
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_count_set_by_the_apps_client_makes_a_retry() {
    let (up, seen) = recording(failing).await;
    let tg = Tollgate::start(&api(up.addr, standard)).await;
    // The first count of each marker is a first attempt: retried by tollgate.
    for (name, value) in [
        ("grpc-previous-rpc-attempts", "0"),
        ("x-envoy-attempt-count", "1"),
        ("amz-sdk-request", "attempt=1; max=3"),
        ("retry-attempt", "0"),
    ] {
        let r = send(tg.addr, get_with("/first", &[(name, value)])).await;
        assert_eq!(r.attempts(), 2, "{name}: {value}");
    }
    assert_eq!(app_retries(&tg.metrics().await, "marker"), 0.0);
    let markers = [
        ("grpc-previous-rpc-attempts", "1"),
        ("x-envoy-attempt-count", "2"),
        ("amz-sdk-request", "attempt=2; max=3"),
        ("retry-attempt", "1"),
    ];
    seen.lock().unwrap().clear();
    for (i, (name, value)) in markers.iter().enumerate() {
        // A URL tollgate never saw fail: the marker alone is the evidence.
        let r = send(tg.addr, get_with(&format!("/m{i}"), &[(name, value)])).await;
        assert_eq!(r.status, 503);
        assert_eq!(r.attempts(), 1, "{name}: not retried again by tollgate");
        assert_eq!(r.outcome(), Some("attempts-exhausted"));
    }
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|(_, attempt)| *attempt == 2),
        "each went as a retry: {:?}",
        seen.lock().unwrap()
    );
    let m = tg.metrics().await;
    assert_eq!(app_retries(&m, "marker"), 4.0);
    assert_eq!(app_retries(&m, "key"), 0.0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_call_identity_again_is_the_apps_retry() {
    let (up, seen) = recording(failing).await;
    let tg = Tollgate::start(&api(up.addr, standard)).await;
    let first = send(tg.addr, keyed("/charge", "k1")).await;
    assert_eq!(first.outcome(), Some("attempts-exhausted"));
    assert_eq!(first.attempts(), 2);
    let m = tg.metrics().await;
    let amplification = |m: &str| metric(m, "tollgate_amplification{upstream=\"api\"}").unwrap();
    assert_eq!(amplification(&m), 2.0);

    let again = send(tg.addr, keyed("/charge", "k1")).await;
    assert_eq!(again.status, 503);
    assert_eq!(again.attempts(), 1, "not retried again by tollgate");
    assert_eq!(again.outcome(), Some("attempts-exhausted"));
    let m = tg.metrics().await;
    assert_eq!(app_retries(&m, "key"), 1.0);
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

    // The same URL without the key, or with another one, is another call.
    assert_eq!(get(tg.addr, "/charge", "api").await.attempts(), 2);
    assert_eq!(send(tg.addr, keyed("/charge", "k2")).await.attempts(), 2);
    // The same key on another target or method is another call too.
    assert_eq!(send(tg.addr, keyed("/other", "k1")).await.attempts(), 2);
    let post = request("POST", "/charge", "api")
        .header("idempotency-key", "k1")
        .body(empty())
        .unwrap();
    assert_eq!(send(tg.addr, post).await.attempts(), 2);
    assert_eq!(app_retries(&tg.metrics().await, "key"), 1.0);

    // The AWS SDKs' identity of a call is one too.
    let aws = || get_with("/s3", &[("amz-sdk-invocation-id", "a1b2")]);
    assert_eq!(send(tg.addr, aws()).await.attempts(), 2);
    assert_eq!(send(tg.addr, aws()).await.attempts(), 1);
    assert_eq!(app_retries(&tg.metrics().await, "key"), 2.0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_from_another_user_is_another_call() {
    // Keys that clients pick alike (an order's number), from users of their own: each
    // user's call is a first attempt, as a callee's dedupe keeps them apart.
    let (up, seen) = recording(failing).await;
    let tg = Tollgate::start(&api(up.addr, standard)).await;
    let as_user = |user: &str| {
        request("POST", "/orders", "api")
            .header("idempotency-key", "\"order-7\"")
            .header("authorization", format!("Bearer {user}"))
            .body(empty())
            .unwrap()
    };
    let alice = send(tg.addr, as_user("alice")).await;
    assert_eq!(alice.outcome(), Some("attempts-exhausted"));
    assert_eq!(alice.attempts(), 2);
    for user in ["bob", "carol"] {
        let other = send(tg.addr, as_user(user)).await;
        assert_eq!(
            other.attempts(),
            2,
            "{user}'s call is a first attempt, retried"
        );
    }
    assert_eq!(app_retries(&tg.metrics().await, "key"), 0.0);
    // The same user's call again is that user's app retrying.
    let again = send(tg.addr, as_user("alice")).await;
    assert_eq!(again.attempts(), 1);
    assert_eq!(app_retries(&tg.metrics().await, "key"), 1.0);
    let attempts: Vec<u32> = seen.lock().unwrap().iter().map(|(_, a)| *a).collect();
    assert_eq!(attempts, [1, 2, 1, 2, 1, 2, 2]);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_trace_is_counted_and_nothing_more() {
    let (up, _) = recording(failing).await;
    // Even with "refuse", a trace alone refuses nothing.
    let tg = Tollgate::start(&api(up.addr, |u| standard(u.app_retries("refuse")))).await;
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    // Another span of the same trace: the app's incoming request asks again.
    let again = "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01";
    for (header, first, second) in [
        ("traceparent", trace, again),
        ("x-request-id", "req-42", "req-42"),
    ] {
        let r = send(tg.addr, get_with("/poll", &[(header, first)])).await;
        assert_eq!(r.attempts(), 2, "{header}");
        let r = send(tg.addr, get_with("/poll", &[(header, second)])).await;
        assert_eq!(
            (r.attempts(), r.outcome()),
            (2, Some("attempts-exhausted")),
            "{header}: a first attempt, retried by tollgate"
        );
    }
    let m = tg.metrics().await;
    assert_eq!(app_retries(&m, "trace"), 2.0);
    assert_eq!(app_retries(&m, "key") + app_retries(&m, "marker"), 0.0);
    assert_eq!(up.hits(), 8);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authority_is_the_one_the_app_called_when_a_host_is_configured() {
    let (up, seen) = recording(failing).await;
    let cfg = api(up.addr, |u| {
        standard(u.host("backend.example").authorities(["api", "api2"]))
    });
    let tg = Tollgate::start(&cfg).await;
    let call = |host: &str| {
        request("GET", "/charge", host)
            .header("idempotency-key", "k")
            .body(empty())
            .unwrap()
    };
    assert_eq!(send(tg.addr, call("api")).await.attempts(), 2);
    // Sent upstream with the same Host, but the app called another authority: another
    // call, not a retry of the first.
    assert_eq!(send(tg.addr, call("api2")).await.attempts(), 2);
    assert_eq!(app_retries(&tg.metrics().await, "key"), 0.0);
    let again = send(tg.addr, call("api")).await;
    assert_eq!(
        again.attempts(),
        1,
        "the same authority again is the app's retry"
    );
    assert_eq!(app_retries(&tg.metrics().await, "key"), 1.0);
    assert_eq!(seen.lock().unwrap().len(), 5);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_ends_the_memory_of_the_failure() {
    let (up, _) = recording(|_, attempt| (if attempt >= 2 { 200 } else { 503 }, None)).await;
    // One attempt only: tollgate gives up on the first failure, the app's retry works.
    let tg = Tollgate::start(&api(up.addr, |u| {
        u.retry(|r| retrying(r).max_attempts(1)).budget(roomy)
    }))
    .await;
    assert_eq!(send(tg.addr, keyed("/x", "k")).await.status, 503);
    let r = send(tg.addr, keyed("/x", "k")).await;
    assert_eq!((r.status.as_u16(), r.outcome()), (200, None));
    assert_eq!(app_retries(&tg.metrics().await, "key"), 1.0);
    // The same call after it succeeded is a new one.
    assert_eq!(send(tg.addr, keyed("/x", "k")).await.status, 503);
    assert_eq!(app_retries(&tg.metrics().await, "key"), 1.0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_retry_needs_room_in_the_budget() {
    let (up, _) = recording(failing).await;
    // One retry in the window at most (strictly below 0.15/s × 10 s = 1.5), and
    // tollgate itself retries nothing.
    let tg = Tollgate::start(&api(up.addr, |u| {
        u.retry(|r| retrying(r).max_attempts(1))
            .budget(|b| b.ratio(0.0).min_per_sec(0.15))
    }))
    .await;
    assert_eq!(send(tg.addr, keyed("/y", "k")).await.attempts(), 1);
    assert_eq!(
        send(tg.addr, keyed("/y", "k")).await.attempts(),
        1,
        "the one retry"
    );
    assert_eq!(up.hits(), 2);
    let r = send(tg.addr, keyed("/y", "k")).await;
    assert_eq!(r.status, 503, "the failure's own status");
    assert_eq!(r.outcome(), Some("budget-exhausted"));
    assert_eq!(r.attempts(), 0);
    assert_eq!(up.hits(), 2, "no upstream call");
    // A marked retry of a call tollgate never saw fail needs the budget just the same.
    let marked = send(tg.addr, get_with("/z", &[("x-envoy-attempt-count", "2")])).await;
    assert_eq!(marked.status, 503);
    assert_eq!(marked.outcome(), Some("budget-exhausted"));
    assert_eq!(marked.attempts(), 0);
    assert_eq!(up.hits(), 2, "no upstream call");
    // First attempts are not held back.
    assert_eq!(get(tg.addr, "/y", "api").await.attempts(), 1);
    assert_eq!(up.hits(), 3);
    let m = tg.metrics().await;
    assert_eq!(app_retries(&m, "key"), 2.0);
    assert_eq!(app_retries(&m, "marker"), 1.0);
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"budget\",upstream=\"api\"}"
        ),
        Some(2.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_app_retries_never_reach_the_upstream_and_do_not_restart_the_memory() {
    let (up, _) = recording(|_, _| (502, None)).await;
    let tg = Tollgate::start(&api(up.addr, |u| standard(u.app_retries("refuse")))).await;
    let first = send(tg.addr, keyed("/z", "k")).await;
    assert_eq!(first.status, 502);
    assert_eq!(up.hits(), 2);
    let r = send(tg.addr, keyed("/z", "k")).await;
    assert_eq!(r.status, 502, "the same status as the failure");
    assert_eq!(r.outcome(), Some("app-retry"));
    assert_eq!(r.attempts(), 0);
    assert_eq!(up.hits(), 2, "no upstream call");
    // Another user's first attempt at the same URL is not refused.
    assert_eq!(get(tg.addr, "/z", "api").await.attempts(), 2);
    assert_eq!(up.hits(), 4);
    // Refused again and again, every 50 ms: the refusals do not restart the 2 s, so
    // the call is sent again once they have passed.
    let mut refused = 1;
    let sent = loop {
        let r = send(tg.addr, keyed("/z", "k")).await;
        if r.outcome() != Some("app-retry") {
            break r;
        }
        refused += 1;
        assert!(refused < 200, "still refused after 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(sent.outcome(), Some("attempts-exhausted"));
    assert_eq!(up.hits(), 6);
    assert_eq!(app_retries(&tg.metrics().await, "key"), f64::from(refused));
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_marker_repeats_the_last_failure_of_its_call_or_goes_as_a_retry() {
    let (up, seen) = recording(|path, _| (if path == "/fails" { 502 } else { 200 }, None)).await;
    let tg = Tollgate::start(&api(up.addr, |u| standard(u.app_retries("refuse")))).await;
    let marked = |path| get_with(path, &[("x-envoy-attempt-count", "2")]);
    // No failure to repeat: sent, as a retry, and answered.
    let r = send(tg.addr, marked("/works")).await;
    assert_eq!((r.status.as_u16(), r.attempts()), (200, 1));
    assert_eq!(*seen.lock().unwrap(), [("/works".to_string(), 2)]);
    // After a failure of the same method, authority and target: refused with it.
    assert_eq!(get(tg.addr, "/fails", "api").await.status, 502);
    let r = send(tg.addr, marked("/fails")).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("app-retry"));
    assert_eq!(r.attempts(), 0);
    assert_eq!(up.hits(), 3);
    assert_eq!(app_retries(&tg.metrics().await, "marker"), 2.0);
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
    let tg = Tollgate::start(&api(up.addr, |u| {
        u.app_retries("refuse")
            .protocol("h2c")
            .retry(|r| retrying(r).methods(["POST"]))
            .budget(roomy)
    }))
    .await;
    let call = |previous: &str| {
        request("POST", "/pkg.Svc/Call", "api")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-previous-rpc-attempts", previous)
            .body(empty())
            .unwrap()
    };
    let first = send_h2(tg.addr, call("0")).await;
    assert_eq!(first.header("grpc-status"), Some("14"));
    assert_eq!(first.outcome(), Some("attempts-exhausted"));
    // The gRPC client's own retry policy tries again.
    let r = send_h2(tg.addr, call("1")).await;
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
    let tg = Tollgate::start(&api(up.addr, standard)).await;
    // tollgate's own retry is refused: the first failure goes back.
    let first = send(tg.addr, keyed("/w", "k")).await;
    assert_eq!(first.outcome(), Some("retry-rejected"));
    assert_eq!(first.attempts(), 2);
    // The app's retry is refused too: it had no previous attempt here, so the refusal
    // passes back as it came.
    let r = send(tg.addr, keyed("/w", "k")).await;
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(r.attempts(), 1);
    assert_eq!(up.hits(), 3);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_above_that_ignores_ownership_is_an_app_retrying_a_keyed_call() {
    // The outer layer retries what the inner one gave up on, with the call's key; the
    // inner one sees those retries as its app's, and sends each once: 3 + 1 + 1
    // attempts, not 3 × 3.
    let failing_up = Upstream::start(|_req| async { respond(503, "down") }).await;
    let layer = |next: std::net::SocketAddr, ownership: Option<&str>| {
        Config::new()
            .upstream("db", |u| {
                u.authorities(["db"])
                    .endpoint(next)
                    .retry(|r| {
                        let r = r.max_attempts(3).backoff_base("1ms").backoff_max("2ms");
                        match ownership {
                            Some(o) => r.ownership(o),
                            None => r,
                        }
                    })
                    .budget(|b| b.ratio(10.0).min_per_sec(1000))
            })
            .to_toml()
    };
    let inner = Tollgate::start(&layer(failing_up.addr, None)).await;
    let outer = Tollgate::start(&layer(inner.addr, Some("ignore"))).await;
    let req = request("GET", "/", "db")
        .header("idempotency-key", "once")
        .body(empty())
        .unwrap();
    let r = send(outer.addr, req).await;
    assert_eq!(r.status, 503);
    assert_eq!(failing_up.hits(), 5);
    let m = inner.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_app_retries_total{evidence=\"key\",upstream=\"db\"}"
        ),
        Some(2.0)
    );
    outer.stop().await;
    inner.stop().await;
}
