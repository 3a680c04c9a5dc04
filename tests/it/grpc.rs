//! gRPC through tollgate with a real gRPC stack on both sides (tonic's client and
//! server): streams outlive `attempt_timeout`, `grpc-timeout` carries the caller's own
//! deadline and nothing when it set none, every answer tollgate makes itself is a gRPC
//! answer that a gRPC client will not retry, and ownership holds across two tollgates.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::grpc as grpc_stack;

use std::net::SocketAddr;
use std::time::Duration;

use common::config::{Config, Upstream};
use common::*;
use grpc_stack::{Ask, Client, Server};
use tonic::Code;

/// A file whose listener refuses unknown authorities.
fn refusing_all() -> Config {
    Config::new().listener(|l| l.unknown_authorities("refuse"))
}

/// `[upstreams.greeter]` to `addr`, a short attempt_timeout and request_timeout, and
/// what `f` sets on it. Unknown authorities are refused.
fn greeter(addr: SocketAddr, f: impl FnOnce(Upstream) -> Upstream) -> String {
    greeter_in(refusing_all(), addr, f).to_toml()
}

fn greeter_in(config: Config, addr: SocketAddr, f: impl FnOnce(Upstream) -> Upstream) -> Config {
    config.upstream("greeter", |u| {
        f(u.authorities(["greeter"])
            .endpoint(addr)
            .attempt_timeout("300ms")
            .request_timeout("500ms"))
    })
}

/// POSTs retried up to 3 times within a budget that never runs out.
fn retry_post(u: Upstream) -> Upstream {
    u.retry(|r| {
        r.max_attempts(3)
            .methods(["POST"])
            .backoff_base("1ms")
            .backoff_max("2ms")
    })
    .budget(|b| b.ratio(10.0).min_per_sec(1000))
}

fn header<'a>(s: &'a tonic::Status, name: &str) -> Option<&'a str> {
    s.metadata().get(name).and_then(|v| v.to_str().ok())
}

/// A status tollgate made itself: the code, its outcome, and "do not retry".
fn assert_tollgate_status(s: &tonic::Status, code: Code, outcome: &str) {
    assert_eq!(s.code(), code, "{s:?}");
    assert_eq!(header(s, "x-tollgate-outcome"), Some(outcome), "{s:?}");
    assert_eq!(header(s, "grpc-retry-pushback-ms"), Some("-1"), "{s:?}");
    assert!(header(s, "x-tollgate-attempts").is_some(), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_without_a_deadline_outlive_attempt_timeout() {
    let server = Server::start().await;
    let tg = Tollgate::start(&greeter(server.addr, |u| u)).await;
    let mut client = Client::connect(tg.addr, "greeter").await;

    // 10 items 100 ms apart: a second, past attempt_timeout and request_timeout.
    let ask = Ask {
        count: 10,
        gap_ms: 100,
        ..Ask::default()
    };
    let (items, end) = client.list(ask, None).await;
    assert_eq!(end.code(), Code::Ok, "{end:?}");
    assert_eq!(items.len(), 10);
    assert_eq!(items[0].note, "none", "no deadline reached the server");

    let (items, end) = client.echo(10, Duration::from_millis(100)).await;
    assert_eq!(end.code(), Code::Ok, "{end:?}");
    assert_eq!(items.len(), 10, "every message echoed");
    assert_eq!(server.seen(), vec![None, None]);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_deadline_arrives_as_the_calls_time_left_uncapped() {
    let server = Server::start().await;
    let tg = Tollgate::start(&greeter(server.addr, |u| u)).await;
    let mut client = Client::connect(tg.addr, "greeter").await;

    let item = client
        .unary(Ask::default(), Some(Duration::from_secs(10)))
        .await
        .unwrap();
    let d = tollgate_core::deadline::parse_grpc_timeout(item.note.as_bytes())
        .unwrap_or_else(|| panic!("the server saw grpc-timeout {:?}", item.note));
    assert!(
        d <= Duration::from_secs(10) && d > Duration::from_millis(9_500),
        "the server was told {d:?} of a 10 s deadline (attempt_timeout 300 ms, \
         request_timeout 500 ms bound only tollgate's wait for the head)"
    );
    let item = client.unary(Ask::default(), None).await.unwrap();
    assert_eq!(item.note, "none", "no deadline of its own: no grpc-timeout");

    // The server stream runs to the deadline the client set, and no further.
    let ask = Ask {
        count: 30,
        gap_ms: 100,
        ..Ask::default()
    };
    let (items, end) = client.list(ask, Some(Duration::from_millis(1_200))).await;
    assert_eq!(end.code(), Code::DeadlineExceeded, "{end:?}");
    assert!(
        items.len() > 5 && items.len() < 30,
        "{} items in 1.2 s",
        items.len()
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgates_own_failures_are_grpc_statuses_a_client_does_not_retry() {
    let server = Server::start().await;
    let dead = dead_port().await;
    // `busy` takes one call at a time, and waits for it as long as it takes: a call held
    // there fills it for as long as the test needs, however slow the machine.
    let tg = Tollgate::start(
        &greeter_in(refusing_all(), server.addr, |u| {
            u.retry(|r| r.max_attempts(1))
        })
        .upstream("down", |u| {
            retry_post(u.authorities(["down"]).endpoint(dead))
        })
        .upstream("busy", |u| {
            u.authorities(["busy"])
                .endpoint(server.addr)
                .max_inflight(1)
                .attempt_timeout("60s")
                .request_timeout("60s")
        })
        .to_toml(),
    )
    .await;

    let mut client = Client::connect(tg.addr, "nowhere").await;
    let s = client.unary(Ask::default(), None).await.unwrap_err();
    assert_tollgate_status(&s, Code::Unimplemented, "no-route");

    let mut client = Client::connect(tg.addr, "down").await;
    let s = client.unary(Ask::default(), None).await.unwrap_err();
    assert_tollgate_status(&s, Code::Unavailable, "upstream-unreachable");
    assert_eq!(header(&s, "x-tollgate-attempts"), Some("3"));

    let mut client = Client::connect(tg.addr, "greeter").await;
    let slow = Ask {
        sleep_ms: 2_000,
        ..Ask::default()
    };
    // Past attempt_timeout with no retry to start beside it, the call runs on to the
    // deadline.
    let s = client.unary(slow.clone(), None).await.unwrap_err();
    assert_tollgate_status(&s, Code::DeadlineExceeded, "deadline-exceeded");

    // One call in flight fills max_inflight = 1: the next is shed.
    let mut holder = Client::connect(tg.addr, "busy").await;
    let held = Ask {
        sleep_ms: 30_000,
        ..Ask::default()
    };
    let in_flight = tokio::spawn(async move { holder.unary(held, None).await });
    assert!(wait_until(Duration::from_secs(10), || server.seen().len() >= 2).await);
    let mut shed = Client::connect(tg.addr, "busy").await;
    let s = shed.unary(Ask::default(), None).await.unwrap_err();
    assert_tollgate_status(&s, Code::ResourceExhausted, "overloaded");
    in_flight.abort();
    let _ = in_flight.await;

    // The upstream's own UNAVAILABLE, given up on (`max_attempts = 1`: attempts
    // exhausted, whatever the method): it passes through with the verdict and the
    // pushback added.
    let fail = Ask {
        fail: Code::Unavailable as i32,
        ..Ask::default()
    };
    let s = client.unary(fail, None).await.unwrap_err();
    assert_eq!(s.message(), "asked to fail", "the upstream's own status");
    assert_tollgate_status(&s, Code::Unavailable, "attempts-exhausted");

    let m = tg.metrics().await;
    for (outcome, upstream, n) in [
        ("no-route", "", 1.0),
        ("upstream-unreachable", "down", 1.0),
        ("overloaded", "busy", 1.0),
        ("attempts-exhausted", "greeter", 1.0),
        ("deadline-exceeded", "greeter", 1.0),
    ] {
        let series = format!(
            "tollgate_requests_total{{code=\"200\",outcome=\"{outcome}\",upstream=\"{upstream}\"}}"
        );
        assert_eq!(metric(&m, &series), Some(n), "{series}");
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_failure_the_inner_tollgate_gave_up_on_is_not_retried_by_the_outer() {
    let server = Server::start().await;
    let inner = Tollgate::start(&greeter(server.addr, retry_post)).await;
    let outer = Tollgate::start(&greeter(inner.addr, retry_post)).await;
    let mut client = Client::connect(outer.addr, "greeter").await;
    let fail = Ask {
        fail: Code::Unavailable as i32,
        ..Ask::default()
    };
    let s = client.unary(fail, None).await.unwrap_err();
    assert_tollgate_status(&s, Code::Unavailable, "attempts-exhausted");
    assert_eq!(
        header(&s, "x-tollgate-attempts"),
        Some("1"),
        "the outer layer did not retry"
    );
    assert_eq!(server.seen().len(), 3, "3 attempts, not 9");
    let m = outer.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"ownership\",upstream=\"greeter\"}"
        ),
        Some(1.0)
    );
    outer.stop().await;
    inner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http1_too_tollgates_answers_to_grpc_calls_are_grpc_answers() {
    let dead = dead_port().await;
    let tg = Tollgate::start(
        &refusing_all()
            .upstream("down", |u| u.authorities(["down"]).endpoint(dead))
            .to_toml(),
    )
    .await;
    for (host, code, outcome) in [
        ("nowhere", "12", "no-route"),
        ("down", "14", "upstream-unreachable"),
    ] {
        let req = request("POST", "/test.Stream/Unary", host)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(full(&b"\0\0\0\0\0"[..]))
            .unwrap();
        let r = send(tg.addr, req).await;
        assert_eq!(r.status, 200, "{host}");
        assert_eq!(r.header("content-type"), Some("application/grpc"));
        assert_eq!(r.header("grpc-status"), Some(code), "{host}");
        assert_eq!(r.outcome(), Some(outcome));
        assert_eq!(r.header("grpc-retry-pushback-ms"), Some("-1"));
        assert!(r.header("grpc-message").is_some());
        assert!(r.body.is_empty(), "trailers-only: no body");
    }
    // A plain HTTP request still gets a plain answer.
    let r = get(tg.addr, "/", "nowhere").await;
    assert_eq!(r.status, 404);
    tg.stop().await;
}
