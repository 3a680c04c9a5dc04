//! The inbound side, over loopback: a real app behind a real tollgate's `[inbound]`
//! listener. Retries of every caller are admitted against one budget (by each of the
//! three headers that say "retry"), a rejected retry never reaches the app, a spent
//! deadline is refused and the app is told the time left, the kubelet's probes pass
//! whatever the limits, both HTTP/1.1 and h2c callers are served as they spoke,
//! bodies stream both ways, and head limits and slow heads are refused as on the
//! outbound listener.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::config::{Config, Inbound};
use common::*;
use http::Version;

/// An app that answers 200 and records each request's headers and version.
async fn recording_app() -> (Upstream, Arc<Mutex<Vec<(Version, http::HeaderMap)>>>) {
    let seen: Arc<Mutex<Vec<(Version, http::HeaderMap)>>> = Arc::default();
    let s = seen.clone();
    let app = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        s.lock()
            .unwrap()
            .push((req.version(), req.headers().clone()));
        async { respond(200, "from the app") }
    })
    .await;
    (app, seen)
}

fn get_with(addr_host: &str, headers: &[(&str, &str)]) -> http::Request<BoxBody> {
    let mut b = request("GET", "/thing", addr_host);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(empty()).unwrap()
}

/// A budget that admits no retry at all.
/// tollgate's inbound side in front of `app`, set by `f`.
fn in_front_of(app: std::net::SocketAddr, f: impl FnOnce(Inbound) -> Inbound) -> String {
    Config::new().inbound(app, f).to_toml()
}

/// Room for 100 requests and no retry at all.
fn no_retries(i: Inbound) -> Inbound {
    i.max_inflight(100).retries(|r| r.ratio(0.0).min_per_sec(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_retry_header_marks_a_retry_and_a_rejected_retry_never_reaches_the_app() {
    let (app, _) = recording_app().await;
    let tg = Tollgate::start(&in_front_of(app.addr, no_retries)).await;
    let firsts = [
        ("x-tollgate-attempt", "1"),
        ("grpc-previous-rpc-attempts", "0"),
        ("x-envoy-attempt-count", "1"),
    ];
    for (name, value) in firsts {
        let r = send(tg.inbound(), get_with("app", &[(name, value)])).await;
        assert_eq!(r.status, 200, "{name}: {value} is a first attempt");
        assert_eq!(r.body, "from the app");
        assert_eq!(r.outcome(), None, "the app's answer passes as it came");
    }
    assert_eq!(app.hits(), 3);
    let retries = [
        ("x-tollgate-attempt", "2"),
        ("grpc-previous-rpc-attempts", "1"),
        ("x-envoy-attempt-count", "3"),
    ];
    for (name, value) in retries {
        let r = send(tg.inbound(), get_with("app", &[(name, value)])).await;
        assert_eq!(r.status, 503, "{name}: {value} is a retry");
        assert_eq!(r.outcome(), Some("retry-rejected"));
    }
    assert_eq!(app.hits(), 3, "no rejected retry reached the app");
    let m = tg.metrics().await;
    let series = |labels: &str| metric(&m, &format!("tollgate_inbound_requests_total{{{labels}}}"));
    assert_eq!(
        series("code=\"200\",kind=\"first\",outcome=\"ok\""),
        Some(3.0)
    );
    assert_eq!(
        series("code=\"503\",kind=\"retry\",outcome=\"retry-rejected\""),
        Some(3.0)
    );
    assert_eq!(
        metric(&m, "tollgate_inbound_denied_total{reason=\"retry-budget\"}"),
        Some(3.0)
    );
    // 6 requests, 3 of them first attempts.
    assert_eq!(metric(&m, "tollgate_inbound_amplification"), Some(2.0));
    assert_eq!(
        metric(&m, "tollgate_inbound_retry_budget_available"),
        Some(0.0)
    );
    tg.stop().await;
}

/// An app's own attempt headers, passed through its caller's tollgate, would make the
/// callee count a first attempt as a retry (and refuse it with the budget spent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apps_own_attempt_headers_make_no_first_attempt_a_retry() {
    let (app, seen) = recording_app().await;
    let callee = Tollgate::start(&in_front_of(app.addr, no_retries)).await;
    let caller = Tollgate::start(
        &Config::new()
            .upstream("app", |u| u.authorities(["app"]).endpoint(callee.inbound()))
            .to_toml(),
    )
    .await;
    // Only tollgate writes tollgate's headers. (A retry marker of the app's own client,
    // `x-envoy-attempt-count: 2`, is evidence of the app retrying: its tollgate sends
    // that on as a retry, which tests/it/app_retries.rs covers.)
    let marked = [("x-tollgate-attempt", "3"), ("x-tollgate-hedge", "1")];
    for _ in 0..5 {
        let r = send(caller.addr, get_with("app", &marked)).await;
        assert_eq!(r.status, 200, "{:?}", r.outcome());
    }
    let m = callee.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_inbound_requests_total{code=\"200\",kind=\"first\",outcome=\"ok\"}"
        ),
        Some(5.0)
    );
    for (_, headers) in seen.lock().unwrap().iter() {
        assert!(
            headers.get("x-tollgate-hedge").is_none(),
            "the app's x-tollgate-hedge went on"
        );
        assert!(headers.get("x-tollgate-attempt").is_none());
    }
    caller.stop().await;
    callee.stop().await;
}

/// Sends one request from the loopback address `from` (127.0.0.x: a caller of its own).
async fn send_from(from: [u8; 4], to: std::net::SocketAddr, req: http::Request<BoxBody>) -> Got {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    let stream = socket.connect(to).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let got = read(sender.send_request(req).await.unwrap()).await;
    conn.abort();
    got
}

/// One caller marking every request a retry spends no more than its share of the fleet
/// budget while another caller is seen: the other's one retry still reaches the app.
/// (`per_caller = "off"`, first come first served, shows the harm it prevents.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_caller_cannot_spend_another_callers_share_of_the_fleet_budget() {
    let (app, _) = recording_app().await;
    // Four retries in 10 s for the whole fleet (strictly below 0.45/s × 10 s = 4.5), one
    // per half second at most.
    let budget = |per_caller: &'static str| {
        move |i: Inbound| {
            i.max_inflight(100).retries(|r| {
                r.ratio(0.0)
                    .min_per_sec(0.45)
                    .window("10s")
                    .per_caller(per_caller)
            })
        }
    };
    let mut outcomes = Vec::new();
    for per_caller in ["fair", "off"] {
        let tg = Tollgate::start(&in_front_of(app.addr, budget(per_caller))).await;
        let (real, noisy) = ([127, 0, 0, 1], [127, 0, 0, 2]);
        assert_eq!(
            send_from(real, tg.inbound(), get_with("app", &[]))
                .await
                .status,
            200
        );
        let retry = || get_with("app", &[("grpc-previous-rpc-attempts", "1")]);
        let mut noisy_granted = 0;
        for _ in 0..25 {
            if send_from(noisy, tg.inbound(), retry()).await.status == 200 {
                noisy_granted += 1;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let real_retry = send_from(real, tg.inbound(), retry()).await;
        outcomes.push((per_caller, noisy_granted, real_retry.status));
        tg.stop().await;
    }
    let (_, noisy, real) = outcomes[0];
    assert_eq!(
        noisy, 2,
        "fair: the noisy caller's share is half: {outcomes:?}"
    );
    assert_eq!(
        real, 200,
        "fair: the real caller's retry reached the app: {outcomes:?}"
    );
    let (_, noisy, real) = outcomes[1];
    assert_eq!(
        noisy, 4,
        "off: the noisy caller took the whole budget: {outcomes:?}"
    );
    assert_eq!(
        real, 503,
        "off: the real caller's retry was rejected: {outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_within_the_fleet_budget_reach_the_app_and_the_next_is_rejected() {
    let (app, _) = recording_app().await;
    // 35 first attempts allow 3 retries in the window, strictly below 0.1 × 35 = 3.5 (at
    // most one per half-second slot: the budget paces its grants).
    let tg = Tollgate::start(&in_front_of(app.addr, |i| {
        i.max_inflight(100)
            .retries(|r| r.ratio(0.1).min_per_sec(0).window("10s"))
    }))
    .await;
    for _ in 0..35 {
        assert_eq!(send(tg.inbound(), get_with("app", &[])).await.status, 200);
    }
    let retry = || get_with("app", &[("x-tollgate-attempt", "2")]);
    for n in 1..=3 {
        let r = send(tg.inbound(), retry()).await;
        assert_eq!(r.status, 200, "retry {n} of 3 fits the budget");
        tokio::time::sleep(Duration::from_millis(550)).await;
    }
    let r = send(tg.inbound(), retry()).await;
    assert_eq!(r.status, 503, "the fourth would reach 0.1 × 35");
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(app.hits(), 38);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_retry_beyond_the_budget_gets_the_grpc_answer() {
    let (app, _) = recording_app().await;
    let tg = Tollgate::start(&in_front_of(app.addr, no_retries)).await;
    let req = request("POST", "/pkg.Svc/Method", "app")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-previous-rpc-attempts", "1")
        .body(full(&b"\0\0\0\0\0"[..]))
        .unwrap();
    let r = send_h2(tg.inbound(), req).await;
    assert_eq!(r.status, 200, "gRPC answers are HTTP 200");
    assert_eq!(r.header("grpc-status"), Some("8"), "RESOURCE_EXHAUSTED");
    assert_eq!(r.outcome(), Some("retry-rejected"));
    assert_eq!(r.header("grpc-retry-pushback-ms"), Some("-1"));
    assert_eq!(app.hits(), 0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_deadline_is_refused_and_the_app_gets_the_time_left() {
    let (app, seen) = recording_app().await;
    let tg = Tollgate::start(&in_front_of(app.addr, |i| i.request_timeout("20s"))).await;
    let r = send(tg.inbound(), get_with("app", &[("x-timeout-ms", "0")])).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.outcome(), Some("deadline-exceeded"));
    assert_eq!(app.hits(), 0, "the app was never asked");
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_inbound_denied_total{reason=\"deadline\"}"),
        Some(1.0)
    );

    let left = |h: &http::HeaderMap, name: &str| -> u64 {
        h.get(name).unwrap().to_str().unwrap().parse().unwrap()
    };
    // The caller's deadline, in any accepted header, arrives as the time left.
    for (name, value) in [
        ("x-timeout-ms", "800"),
        ("x-envoy-expected-rq-timeout-ms", "800"),
    ] {
        let r = send(tg.inbound(), get_with("app", &[(name, value)])).await;
        assert_eq!(r.status, 200);
        let h = seen.lock().unwrap().last().unwrap().1.clone();
        let ms = left(&h, "x-timeout-ms");
        assert!((1..=800).contains(&ms), "{name}: the app was told {ms} ms");
        assert!(h.get("x-envoy-expected-rq-timeout-ms").is_none());
    }
    // No deadline: request_timeout's.
    send(tg.inbound(), get_with("app", &[])).await;
    let h = seen.lock().unwrap().last().unwrap().1.clone();
    let ms = left(&h, "x-timeout-ms");
    assert!((19_000..=20_000).contains(&ms), "{ms}");
    // A gRPC call's own deadline goes on as grpc-timeout.
    let req = request("POST", "/pkg.Svc/Method", "app")
        .header("content-type", "application/grpc")
        .header("grpc-timeout", "700m")
        .body(empty())
        .unwrap();
    send_h2(tg.inbound(), req).await;
    let h = seen.lock().unwrap().last().unwrap().1.clone();
    let grpc = h.get("grpc-timeout").unwrap().to_str().unwrap().to_string();
    let n: u64 = grpc.trim_end_matches(char::is_alphabetic).parse().unwrap();
    assert!(grpc.ends_with('u') || grpc.ends_with('m'), "{grpc}");
    let ms = if grpc.ends_with('u') { n / 1000 } else { n };
    assert!((1..=700).contains(&ms), "{grpc}");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_bounds_the_wait_for_the_head_never_a_streaming_body() {
    let app = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        if req.uri().path() == "/slow-head" {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            return respond(200, "late");
        }
        // The head at once, the body over 900 ms.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            for i in 0..3 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = tx.send(bytes::Bytes::from(format!("part{i};"))).await;
            }
        });
        use http_body_util::BodyExt;
        let body = ChannelBody(rx).boxed();
        http::Response::new(body)
    })
    .await;
    let tg = Tollgate::start(&in_front_of(app.addr, |i| i)).await;
    let slow = request("GET", "/slow-head", "app")
        .header("x-timeout-ms", "300")
        .body(empty())
        .unwrap();
    let r = send(tg.inbound(), slow).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.outcome(), Some("app-timeout"), "the app's, not owned");
    let streaming = request("GET", "/stream", "app")
        .header("x-timeout-ms", "300")
        .body(empty())
        .unwrap();
    let r = send(tg.inbound(), streaming).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body, "part0;part1;part2;",
        "the body outlived the deadline whole"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_probes_are_never_shed_but_spared_nothing_else() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let app = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let g = g.clone();
        async move {
            if req.uri().path() == "/hold" {
                g.notified().await;
            }
            respond(200, "ok")
        }
    })
    .await;
    let tg = Tollgate::start(&in_front_of(app.addr, |i| {
        i.max_inflight(1).retries(|r| r.ratio(0.0).min_per_sec(0))
    }))
    .await;
    let addr = tg.inbound();
    let held = tokio::spawn(async move { get(addr, "/hold", "app").await });
    assert!(wait_until(Duration::from_secs(5), || app.hits() == 1).await);
    let r = send(tg.inbound(), get_with("app", &[])).await;
    assert_eq!(r.status, 503, "the one place is taken");
    assert_eq!(r.outcome(), Some("overloaded"));
    assert_eq!(r.header("retry-after"), Some("1"));
    let probe = [("user-agent", "kube-probe/1.31")];
    for _ in 0..3 {
        let r = send(tg.inbound(), get_with("app", &probe)).await;
        assert_eq!(r.status, 200, "a probe reaches the app whatever the limit");
    }
    assert_eq!(app.hits(), 4);
    // Not the budget: a "probe" that is a retry needs one, as any retry does.
    let retrying = [
        ("user-agent", "kube-probe/1.31"),
        ("x-tollgate-attempt", "3"),
    ];
    let r = send(tg.inbound(), get_with("app", &retrying)).await;
    assert_eq!(r.outcome(), Some("retry-rejected"));
    // Nor a spent deadline.
    let late = [("user-agent", "kube-probe/1.31"), ("x-timeout-ms", "0")];
    let r = send(tg.inbound(), get_with("app", &late)).await;
    assert_eq!(r.status, 504);
    // Nor a POST, which no kubelet probe is.
    let post = request("POST", "/thing", "app")
        .header("user-agent", "kube-probe/1.31")
        .body(empty())
        .unwrap();
    assert_eq!(send(tg.inbound(), post).await.status, 503);
    assert_eq!(app.hits(), 4, "none of the three reached the app");
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_inbound_denied_total{reason=\"overloaded\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric(&m, "tollgate_inbound_probes_exempt_total"),
        Some(3.0)
    );
    gate.notify_one();
    assert_eq!(held.await.unwrap().status, 200);
    tg.stop().await;
}

/// A `User-Agent` proves nothing: a flood of "probes" costs the callers nothing. Six long
/// ones took places over a limit of four and got ordinary callers shed; now they hold
/// none, at most eight are spared at once, and the rest queue for places like anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_spoofed_probes_costs_legitimate_callers_nothing() {
    let app = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let wait = if req.uri().path() == "/slow" {
            1500
        } else {
            50
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
        respond(200, "ok")
    })
    .await;
    let tg = Tollgate::start(&in_front_of(app.addr, |i| i.max_inflight(4))).await;
    let addr = tg.inbound();
    // Four callers, one request at a time each: never more than the limit.
    let legitimate = || async move {
        let clients: Vec<_> = (0..4)
            .map(|_| {
                tokio::spawn(async move {
                    let mut ok = 0;
                    for _ in 0..10 {
                        ok += usize::from(send(addr, get_with("app", &[])).await.status == 200);
                    }
                    ok
                })
            })
            .collect();
        let mut ok = 0;
        for c in clients {
            ok += c.await.unwrap();
        }
        ok
    };
    let quiet = legitimate().await;
    assert_eq!(quiet, 40);
    let probe = || {
        request("GET", "/slow", "app")
            .header("user-agent", "kube-probe/1.31")
            .body(empty())
            .unwrap()
    };
    let flood: Vec<_> = (0..6)
        .map(|_| tokio::spawn(async move { send(addr, probe()).await.status }))
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || app.hits() >= 40 + 6).await,
        "the probes reached the app"
    );
    let flooded = legitimate().await;
    assert_eq!(
        flooded,
        quiet,
        "the probes cost legitimate callers {} answers",
        quiet - flooded
    );
    for f in flood {
        assert_eq!(f.await.unwrap(), 200);
    }
    // Twelve at once: eight are spared, the other four take the four places like anyone.
    let before = app.hits();
    let many: Vec<_> = (0..12)
        .map(|_| tokio::spawn(async move { send(addr, probe()).await.status }))
        .collect();
    assert!(wait_until(Duration::from_secs(5), || app.hits() >= before + 12).await);
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_inbound_probes_exempt_total"),
        Some(6.0 + 8.0)
    );
    assert_eq!(metric(&m, "tollgate_inbound_inflight"), Some(4.0));
    assert_eq!(
        send(addr, get_with("app", &[])).await.status,
        503,
        "the four not spared hold the places, as any four requests would"
    );
    for f in many {
        assert_eq!(f.await.unwrap(), 200);
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_h2c_callers_reach_the_app_as_they_spoke() {
    let (app, seen) = recording_app().await;
    let tg = Tollgate::start(&in_front_of(app.addr, |i| i)).await;
    let r = send(tg.inbound(), get_with("app", &[])).await;
    assert_eq!(
        (r.status.as_u16(), r.body.as_ref()),
        (200, &b"from the app"[..])
    );
    let r = send_h2(
        tg.inbound(),
        http::Request::get("http://app/thing")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.body.as_ref()),
        (200, &b"from the app"[..])
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0].0, Version::HTTP_11);
    assert_eq!(seen[1].0, Version::HTTP_2);
    assert_eq!(seen[0].1["host"], "app");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_both_ways_and_hop_by_hop_fields_stay_behind() {
    const LEN: usize = 4 << 20;
    let seen: Arc<Mutex<Vec<http::HeaderMap>>> = Arc::default();
    let s = seen.clone();
    let app = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        s.lock().unwrap().push(req.headers().clone());
        async move {
            let (hash, len) = hash_body(req.into_body()).await;
            use http_body_util::BodyExt;
            let body = Generated::new(hash, LEN).map_err(|e| e).boxed();
            http::Response::builder()
                .header("x-upload-len", len.to_string())
                .header("connection", "x-app-hop")
                .header("x-app-hop", "1")
                .body(body)
                .unwrap()
        }
    })
    .await;
    let tg = Tollgate::start(&in_front_of(app.addr, |i| i)).await;
    use http_body_util::BodyExt;
    let req = request("POST", "/upload", "app")
        .header("connection", "x-caller-hop")
        .header("x-caller-hop", "1")
        .header("keep-alive", "timeout=5")
        .body(
            Generated::new(7, LEN)
                .paced(Duration::from_millis(1))
                .boxed(),
        )
        .unwrap();
    let r = send(tg.inbound(), req).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-upload-len"), Some(LEN.to_string().as_str()));
    let sent = Generated::expected_hash(7, LEN);
    assert_eq!(r.body.len(), LEN);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for chunk in r.body.chunks(64 * 1024) {
        std::hash::Hasher::write(&mut h, chunk);
    }
    assert_eq!(
        std::hash::Hasher::finish(&h),
        Generated::expected_hash(sent, LEN),
        "the app's answer to exactly the bytes sent came back whole"
    );
    assert!(
        r.header("x-app-hop").is_none(),
        "the app's hop-by-hop field stayed"
    );
    let h = seen.lock().unwrap()[0].clone();
    assert!(h.get("x-caller-hop").is_none());
    assert!(h.get("keep-alive").is_none());
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_that_is_not_there_is_a_502_that_callers_retry_elsewhere() {
    let tg = Tollgate::start(&in_front_of(dead_port().await, |i| i)).await;
    let r = send(tg.inbound(), get_with("app", &[])).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("app-unreachable; ran=no"));
    assert_eq!(
        r.header("connection"),
        Some("close"),
        "behind a Service's VIP the caller's next connection may reach another pod; this one \
         reaches the same"
    );
    // Not owned: a gRPC client may retry it too (tests/it/ownership.rs: a caller's
    // tollgate does, on another replica).
    let call = request("POST", "/pkg.Svc/Method", "app")
        .header("content-type", "application/grpc")
        .body(empty())
        .unwrap();
    let r = send_h2(tg.inbound(), call).await;
    assert_eq!(r.header("grpc-status"), Some("14"));
    assert_eq!(r.outcome(), Some("app-unreachable; ran=no"));
    assert_eq!(r.header("grpc-retry-pushback-ms"), None);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_with_only_an_inbound_side_serves() {
    let (app, _) = recording_app().await;
    let tg = Tollgate::start(&in_front_of(app.addr, |i| i)).await;
    assert_eq!(send(tg.inbound(), get_with("app", &[])).await.status, 200);
    // The outbound listener is there, with no upstream: what it is sent passes through.
    assert_eq!(get(tg.addr, "/", &app.addr.to_string()).await.status, 200);
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_inbound_concurrency_limit"),
        Some(10_000.0),
        "the default limit is a fixed 10,000"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_limits_and_slow_heads_are_refused_as_on_the_outbound_listener() {
    let (app, _) = recording_app().await;
    let tg = Tollgate::start(&format!(
        "[listener]\naddr = \"127.0.0.1:0\"\nheader_read_timeout = \"300ms\"\n\
         max_header_bytes = \"2KiB\"\n[admin]\naddr = \"127.0.0.1:0\"\n\
         [inbound]\naddr = \"127.0.0.1:0\"\napp = \"{}\"\n",
        app.addr
    ))
    .await;
    let big = format!(
        "GET / HTTP/1.1\r\nHost: app\r\nx-big: {}\r\n\r\n",
        "a".repeat(3000)
    );
    let answer = raw_exchange(tg.inbound(), big.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // A head that never ends is cut off at header_read_timeout (the read gives up
    // after 10 s; the idle timeout would be a minute).
    let mut slow = tokio::net::TcpStream::connect(tg.inbound()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut slow, b"GET / HTTP/1.1\r\nHo")
        .await
        .unwrap();
    read_until_close(&mut slow).await;
    assert_eq!(app.hits(), 0, "neither reached the app");
    tg.stop().await;
}
