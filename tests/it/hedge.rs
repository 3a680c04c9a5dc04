//! Hedged requests over loopback: a slow attempt gets a second one on another endpoint,
//! the first answer that is not a failure wins and the loser is cancelled at once (its
//! HTTP/1.1 connection closed, its HTTP/2 stream reset); a hedge is an attempt (counted,
//! numbered, marked), bounded by `max_attempts` and charged to `max_extra` only; a
//! failed or rejected hedge is put aside while the other attempt runs. Time is the
//! paused clock's: the slow answers take no real time.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::config::Config;
use common::*;
use http::{HeaderMap, Response};
use tokio::time::Instant;

/// A server that answers `status` after `delay`, keeping each request's headers and
/// noting when a caller went away before the answer.
struct Server {
    up: Upstream,
    heads: Arc<Mutex<Vec<HeaderMap>>>,
    abandoned: Arc<AtomicUsize>,
}

impl Server {
    async fn start(delay: Duration, status: u16, outcome: Option<&'static str>) -> Self {
        Self::slow_first(delay, delay, status, outcome).await
    }

    /// As [`Server::start`], taking `first` for the first request and `delay` for the
    /// others.
    async fn slow_first(
        first: Duration,
        rest: Duration,
        status: u16,
        outcome: Option<&'static str>,
    ) -> Self {
        let heads: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
        let abandoned = Arc::new(AtomicUsize::new(0));
        let (h, a) = (heads.clone(), abandoned.clone());
        let up = Upstream::start(move |req| {
            let mut heads = h.lock().unwrap();
            let delay = if heads.is_empty() { first } else { rest };
            heads.push(req.headers().clone());
            let a = a.clone();
            async move {
                let mut answering = Answering(a, false);
                tokio::time::sleep(delay).await;
                answering.1 = true;
                let mut r = Response::builder().status(status);
                if let Some(o) = outcome {
                    r = r.header("x-tollgate-outcome", o);
                }
                r.body(full(format!("{status} after {delay:?}"))).unwrap()
            }
        })
        .await;
        Server {
            up,
            heads,
            abandoned,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.up.addr
    }

    fn header(&self, i: usize, name: &str) -> Option<String> {
        let heads = self.heads.lock().unwrap();
        heads[i].get(name).map(|v| v.to_str().unwrap().to_string())
    }

    /// Waits (bounded) until `n` callers have gone away before their answer.
    async fn abandoned(&self, n: usize) -> bool {
        wait_until(Duration::from_secs(5), || self.abandoned.load(SeqCst) >= n).await
    }
}

/// Adds one to the count when dropped before its answer was ready (the handler was
/// dropped: its caller went away).
struct Answering(Arc<AtomicUsize>, bool);

impl Drop for Answering {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, SeqCst);
        }
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// tollgate with upstream `api` on `endpoints`, and what `f` sets on it.
async fn tollgate(
    endpoints: &[SocketAddr],
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> Tollgate {
    let config = Config::new().upstream("api", |u| {
        let u = endpoints
            .iter()
            .fold(u.authorities(["api"]), |u, e| u.endpoint(e));
        f(u.attempt_timeout("2s").request_timeout("5s"))
    });
    Tollgate::start(&config.to_toml()).await
}

/// Up to 3 attempts, keyed by `idempotency-key`, within half the requests again.
fn retries(u: common::config::Upstream) -> common::config::Upstream {
    u.retry(|r| {
        r.max_attempts(3)
            .backoff_base("1ms")
            .backoff_max("2ms")
            .idempotency_header("idempotency-key")
    })
    .budget(|b| b.ratio(0.5).min_per_sec(10))
}

async fn hedges(tg: &Tollgate, result: &str) -> f64 {
    metric(
        &tg.metrics().await,
        &format!("tollgate_hedges_total{{result=\"{result}\",upstream=\"api\"}}"),
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_is_hedged_on_another_endpoint_and_the_loser_is_cancelled() {
    let slow = Server::start(ms(1000), 200, None).await;
    let fast = Server::start(ms(10), 200, None).await;
    let tg = tollgate(&[slow.addr(), fast.addr()], |u| {
        retries(u).hedge(|h| h.after("50ms").max_extra(1.0))
    })
    .await;
    let started = Instant::now();
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "200 after 10ms", "the hedge's answer");
    assert_eq!(r.attempts(), 2, "a hedge is an attempt");
    assert_eq!(r.outcome(), None);
    assert!(
        started.elapsed() < ms(100),
        "answered at {:?}",
        started.elapsed()
    );
    assert_eq!(slow.header(0, "x-tollgate-attempt").as_deref(), Some("1"));
    assert_eq!(slow.header(0, "x-tollgate-hedge"), None);
    assert_eq!(fast.header(0, "x-tollgate-attempt").as_deref(), Some("2"));
    assert_eq!(fast.header(0, "x-tollgate-hedge").as_deref(), Some("1"));
    assert!(
        slow.abandoned(1).await,
        "the loser's work was not cancelled"
    );
    assert_eq!(hedges(&tg, "won").await, 1.0);
    assert_eq!(hedges(&tg, "lost").await, 0.0);
    let m = tg.metrics().await;
    let cancelled = metric(
        &m,
        "tollgate_attempts_total{result=\"cancelled\",upstream=\"api\"}",
    );
    assert_eq!(cancelled, Some(1.0), "the loser counts as cancelled");
}

#[tokio::test(start_paused = true)]
async fn over_http2_the_loser_is_a_reset_stream_on_a_connection_that_lives_on() {
    let slow = Server::slow_first(ms(1000), ms(10), 200, None).await;
    let fast = Server::start(ms(10), 200, None).await;
    let tg = tollgate(&[slow.addr(), fast.addr()], |u| {
        retries(u.protocol("h2c")).hedge(|h| h.after("50ms").max_extra(1.0))
    })
    .await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.body, "200 after 10ms");
    assert!(slow.abandoned(1).await, "the loser's stream was not reset");
    let connections = |m: &str| metric(m, "tollgate_upstream_connections{upstream=\"api\"}");
    assert_eq!(connections(&tg.metrics().await), Some(2.0));
    // The slow endpoint's connection carries the next requests: only the stream went.
    for _ in 0..4 {
        let r = get(tg.addr, "/", "api").await;
        assert_eq!((r.status.as_u16(), r.attempts()), (200, 1));
    }
    assert_eq!(slow.up.hits(), 3);
    assert_eq!(connections(&tg.metrics().await), Some(2.0));
}

#[tokio::test(start_paused = true)]
async fn the_first_answer_wins_and_a_failed_hedge_is_put_aside() {
    let slow = Server::start(ms(300), 200, None).await;
    let failing = Server::start(ms(10), 503, None).await;
    let tg = tollgate(&[slow.addr(), failing.addr()], |u| {
        retries(u).hedge(|h| h.after("50ms").max_extra(1.0))
    })
    .await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.status, 200, "the hedge's 503 does not end the request");
    assert_eq!(r.body, "200 after 300ms");
    assert_eq!(r.attempts(), 2);
    assert_eq!(failing.up.hits(), 1);
    assert_eq!(hedges(&tg, "lost").await, 1.0);
    let retries = metric(
        &tg.metrics().await,
        "tollgate_retries_total{reason=\"503\",upstream=\"api\"}",
    );
    assert_eq!(retries, Some(0.0), "nothing was retried");
}

#[tokio::test(start_paused = true)]
async fn a_first_attempt_failing_while_its_hedge_runs_is_put_aside_too() {
    // The first attempt goes to `failing` (503 after 100 ms); its hedge at 50 ms goes
    // to `ok` (200 after 100 ms, at 150 ms). The 503 is not retried: the hedge answers.
    let failing = Server::start(ms(100), 503, None).await;
    let ok = Server::start(ms(100), 200, None).await;
    let tg = tollgate(&[failing.addr(), ok.addr()], |u| {
        retries(u).hedge(|h| h.after("50ms").max_extra(1.0))
    })
    .await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.attempts(), 2);
    assert_eq!(hedges(&tg, "won").await, 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_rejected_by_the_callee_is_put_aside() {
    let slow = Server::start(ms(300), 200, None).await;
    let rejecting = Server::start(ms(1), 503, Some("retry-rejected")).await;
    let tg = tollgate(&[slow.addr(), rejecting.addr()], |u| {
        retries(u).hedge(|h| h.after("50ms").max_extra(1.0))
    })
    .await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "200 after 300ms");
    assert_eq!(rejecting.up.hits(), 1);
    assert_eq!(
        rejecting.header(0, "x-tollgate-hedge").as_deref(),
        Some("1")
    );
}

#[tokio::test(start_paused = true)]
async fn a_hedge_counts_toward_max_attempts() {
    let a = Server::start(ms(300), 503, None).await;
    let b = Server::start(ms(300), 503, None).await;
    let tg = tollgate(&[a.addr(), b.addr()], |u| {
        u.retry(|r| r.max_attempts(2))
            .budget(|b| b.ratio(1.0))
            .hedge(|h| h.after("50ms").max_extra(1.0))
    })
    .await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.attempts(), 2);
    assert_eq!(r.outcome(), Some("attempts-exhausted"));
    assert_eq!(a.up.hits() + b.up.hits(), 2, "no third attempt");
}

#[tokio::test(start_paused = true)]
async fn hedges_are_charged_to_max_extra_and_never_to_the_retry_budget() {
    let slow = Server::start(ms(200), 200, None).await;
    let other = Server::start(ms(200), 200, None).await;
    // A retry budget with no room at all, and hedges of at most 10% of the requests.
    let tg = tollgate(&[slow.addr(), other.addr()], |u| {
        u.retry(|r| r.max_attempts(3))
            .budget(|b| b.ratio(0.0).min_per_sec(0).window("60s"))
            .hedge(|h| h.after("20ms").max_extra(0.1))
    })
    .await;
    const N: usize = 100;
    for i in 0..N {
        let r = get(tg.addr, &format!("/{i}"), "api").await;
        assert_eq!(r.status, 200);
    }
    let (won, lost, denied) = (
        hedges(&tg, "won").await,
        hedges(&tg, "lost").await,
        hedges(&tg, "denied").await,
    );
    let sent = won + lost;
    println!("hedges: {won} won, {lost} lost, {denied} denied of {N} requests");
    assert!(
        sent >= 5.0,
        "{sent} hedges: the retry budget's refusal applied to them"
    );
    assert!(
        sent <= N as f64 * 0.1,
        "{sent} hedges exceed 10% of {N} requests"
    );
    assert_eq!(sent + denied, N as f64, "every request was due a hedge");
    let calls = slow.up.hits() + other.up.hits();
    assert_eq!(calls as f64, N as f64 + sent);
}

#[tokio::test(start_paused = true)]
async fn only_requests_that_may_be_sent_again_are_hedged() {
    let slow = Server::start(ms(300), 200, None).await;
    let other = Server::start(ms(300), 200, None).await;
    let tg = tollgate(&[slow.addr(), other.addr()], |u| {
        retries(u).hedge(|h| h.after("50ms").max_extra(1.0))
    })
    .await;
    let call = |method: &str, key: Option<&str>| {
        let mut b = request(method, "/pay", "api");
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b.body(full("amount=10")).unwrap()
    };
    let r = send(tg.addr, call("POST", None)).await;
    assert_eq!(r.attempts(), 1, "a POST without a key is sent once");
    // A keyed POST may be retried, but a second copy beside the first would at best
    // join it at a callee that deduplicates: never hedged.
    let r = send(tg.addr, call("POST", Some("k1"))).await;
    assert_eq!(r.attempts(), 1, "a POST with a key is not hedged");
    // Enough requests for the budget (max_extra of them) to afford one.
    let r = send(tg.addr, call("PUT", Some("k2"))).await;
    assert_eq!(r.attempts(), 2, "an idempotent request is hedged");
    assert_eq!(slow.up.hits() + other.up.hits(), 4);
    let bodies_match = slow.header(1, "content-length") == other.header(1, "content-length");
    assert!(bodies_match, "the hedge carries the same body");
}

#[tokio::test(start_paused = true)]
async fn after_a_percentile_hedges_once_the_latency_is_known() {
    let turn_slow = Arc::new(AtomicBool::new(false));
    let flag = turn_slow.clone();
    let a = Upstream::start(move |_req| {
        let slow = flag.load(SeqCst);
        async move {
            tokio::time::sleep(if slow { ms(1000) } else { ms(20) }).await;
            respond(200, if slow { "a slow" } else { "a" })
        }
    })
    .await;
    let b = Server::start(ms(20), 200, None).await;
    let tg = tollgate(&[a.addr, b.addr()], |u| {
        retries(u).hedge(|h| h.after("p95").max_extra(1.0))
    })
    .await;
    // Twenty answers of 20 ms each: the estimate is known, and no hedge was due before.
    for i in 0..20 {
        assert_eq!(get(tg.addr, &format!("/{i}"), "api").await.attempts(), 1);
    }
    turn_slow.store(true, SeqCst);
    let started = Instant::now();
    let r = get(tg.addr, "/slow", "api").await;
    assert_eq!(r.attempts(), 2);
    assert_eq!(r.body, "200 after 20ms", "b answered the hedge");
    assert!(
        started.elapsed() < ms(100),
        "answered at {:?}",
        started.elapsed()
    );
}
