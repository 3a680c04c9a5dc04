//! Timeouts and admission. At the defaults nothing cuts a slow healthy answer the app
//! would have waited for; a caller's deadline is the deadline and travels as its time
//! left; an attempt past `attempt_timeout` gets a retry beside it when one is allowed and
//! otherwise runs to the deadline; `request_timeout` answers 504 with the outcome;
//! `max_inflight` sheds at once with 503 and Retry-After, counting only requests that
//! wait for a head.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::sync::Semaphore;

/// An upstream that answers every request after `delay`, healthy but slow.
async fn slow_upstream(delay: Duration) -> Upstream {
    Upstream::start(move |_req| async move {
        tokio::time::sleep(delay).await;
        respond(200, "late but fine")
    })
    .await
}

/// One upstream, `name`, for the authority of the same name at `addr`, and what `f` sets.
fn one(
    name: &str,
    addr: std::net::SocketAddr,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> String {
    Config::new()
        .upstream(name, |u| f(u.authorities([name]).endpoint(addr)))
        .to_toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_defaults_a_slow_healthy_answer_is_waited_for_as_direct() {
    // 700 ms, then a long poll: nothing configured cuts either, as calling directly.
    for delay in [Duration::from_millis(700), Duration::from_millis(2500)] {
        let up = slow_upstream(delay).await;
        let tg = Tollgate::start(&one("slow", up.addr, |u| {
            u.retry(|r| r.max_attempts(3)).budget(|b| b.ratio(0.1))
        }))
        .await;
        let direct = get(up.addr, "/", "slow").await;
        let through = get(tg.addr, "/", "slow").await;
        assert_eq!(direct.status, 200);
        assert_eq!(through.status, 200, "{delay:?}: {:?}", through.outcome());
        assert_eq!(through.body, direct.body);
        assert_eq!(through.header("x-tollgate-attempts"), Some("1"));
        assert_eq!(
            up.hits(),
            2,
            "{delay:?}: one call each, nothing cancelled and redone"
        );
        tg.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_longer_deadline_is_the_deadline_and_travels_as_the_time_left() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let up = Upstream::start(move |req| {
        let s = s.clone();
        async move {
            let t = req
                .headers()
                .get("x-timeout-ms")
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            s.lock().unwrap().push(t);
            tokio::time::sleep(Duration::from_millis(2500)).await;
            respond(200, "done")
        }
    })
    .await;
    let tg = Tollgate::start(&one("slow", up.addr, |u| u)).await;
    let req = request("GET", "/", "slow")
        .header("x-timeout-ms", "10000")
        .body(empty())
        .unwrap();
    let r = send(tg.addr, req).await;
    assert_eq!(r.status, 200, "{:?}", r.outcome());
    // Without a deadline, none is sent.
    assert_eq!(get(tg.addr, "/", "slow").await.status, 200);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    let sent = seen[0].expect("the caller's deadline travels upstream");
    assert!(
        (9000..=10_000).contains(&sent),
        "the time left of the caller's 10 s, not a default's: {sent}"
    );
    assert_eq!(seen[1], None, "no deadline, no deadline header");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_timeout_that_is_the_only_hope_runs_on() {
    // Retries off: the slow attempt is all there is, so it is not cut off.
    let up = slow_upstream(Duration::from_millis(700)).await;
    let tg = Tollgate::start(&one("slow", up.addr, |u| u.attempt_timeout("200ms"))).await;
    let r = get(tg.addr, "/", "slow").await;
    assert_eq!(r.status, 200, "{:?}", r.outcome());
    assert_eq!(r.outcome(), None);
    assert_eq!(up.hits(), 1);
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"2xx\",upstream=\"slow\"}"
        ),
        Some(1.0),
        "an answer past the attempt timeout is an answer like any other"
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"timeout\",upstream=\"slow\"}"
        )
        .unwrap_or(0.0),
        0.0
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_attempt_gets_a_retry_beside_it_and_the_first_good_answer_wins() {
    // The first request hangs; every later one answers at once.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    let up = Upstream::start(move |_req| {
        let n = c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            respond(200, "fast")
        }
    })
    .await;
    let tg = Tollgate::start(&one("slow", up.addr, |u| {
        u.attempt_timeout("200ms")
            .retry(|r| r.max_attempts(3).on(["timeout", "503"]))
            .budget(|b| b.ratio(0.1))
    }))
    .await;
    let started = tokio::time::Instant::now();
    let r = get(tg.addr, "/", "slow").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "fast");
    assert_eq!(r.header("x-tollgate-attempts"), Some("2"));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the hung attempt was not waited for"
    );
    // The loser was dropped before the answer went back: its count is in.
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_total{reason=\"timeout\",upstream=\"slow\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"timeout\",upstream=\"slow\"}"
        ),
        Some(1.0),
        "the abandoned slow attempt is a timeout"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_attempt_with_no_retry_left_runs_to_the_deadline() {
    let up = slow_upstream(Duration::from_secs(5)).await;
    let tg = Tollgate::start(&one("slow", up.addr, |u| {
        u.attempt_timeout("200ms").request_timeout("700ms")
    }))
    .await;
    let started = tokio::time::Instant::now();
    let r = get(tg.addr, "/", "slow").await;
    let took = started.elapsed();
    assert_eq!(r.status, 504);
    assert_eq!(r.outcome(), Some("deadline-exceeded"));
    assert!(
        took >= Duration::from_millis(700),
        "cut at the attempt timeout, not the deadline: {took:?}"
    );
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"timeout\",upstream=\"slow\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_is_a_504_deadline_exceeded() {
    let up = Upstream::start(|_req| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        respond(200, "late")
    })
    .await;
    let tg = Tollgate::start(&one("slow", up.addr, |u| {
        u.attempt_timeout("10s").request_timeout("300ms")
    }))
    .await;
    let started = tokio::time::Instant::now();
    let r = get(tg.addr, "/", "slow").await;
    assert_eq!(r.status, 504);
    assert_eq!(r.outcome(), Some("deadline-exceeded"));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "answered before the deadline: {took:?}"
    );
    assert!(took < Duration::from_secs(5));
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_inflight_sheds_at_once_with_retry_after() {
    // Each permit lets one held request finish.
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let up = Upstream::start(move |_req| {
        let g = g.clone();
        async move {
            g.acquire().await.unwrap().forget();
            respond(200, "done")
        }
    })
    .await;
    let tg = Tollgate::start(&one("busy", up.addr, |u| {
        u.max_inflight(2)
            .request_timeout("10s")
            .attempt_timeout("10s")
    }))
    .await;
    let addr = tg.addr;
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { get(addr, "/", "busy").await }))
        .collect();
    assert!(
        wait_until(Duration::from_secs(5), || up.hits() == 2).await,
        "two requests should be in flight"
    );

    let r = get(tg.addr, "/", "busy").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.outcome(), Some("overloaded"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(up.hits(), 2, "the shed request never reached the upstream");

    gate.add_permits(2);
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    // Capacity is back once the held requests finished.
    let waiter = tokio::spawn(async move { get(addr, "/", "busy").await });
    assert!(wait_until(Duration::from_secs(5), || up.hits() == 3).await);
    gate.add_permits(1);
    assert_eq!(waiter.await.unwrap().status, 200);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_body_holds_no_place_in_max_inflight() {
    // Every answer's head comes at once, and its body streams until the test lets it end.
    let (release, _) = tokio::sync::broadcast::channel::<()>(1);
    let r2 = release.clone();
    let up = Upstream::start(move |_req| {
        let mut done = r2.subscribe();
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move {
                let _ = tx.send(bytes::Bytes::from_static(b"first ")).await;
                let _ = done.recv().await;
                let _ = tx.send(bytes::Bytes::from_static(b"last")).await;
            });
            use http_body_util::BodyExt;
            let body = ChannelBody(rx).boxed();
            http::Response::new(body)
        }
    })
    .await;
    let tg = Tollgate::start(&one("streams", up.addr, |u| u.max_inflight(2))).await;
    // Three streams at once through a limit of two, as directly.
    let mut open = Vec::new();
    for _ in 0..3 {
        let req = request("GET", "/", "streams").body(empty()).unwrap();
        open.push(send_for_head(tg.addr, req).await);
    }
    for (r, _) in &open {
        assert_eq!(
            r.status(),
            200,
            "a stream was shed at a limit it holds no place in"
        );
    }
    let _ = release.send(());
    for (r, conn) in open {
        assert_eq!(read(r).await.body, "first last");
        conn.abort();
    }
    tg.stop().await;
}
