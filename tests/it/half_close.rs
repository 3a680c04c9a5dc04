//! A caller that half-closes its connection (shuts down its write side) after a whole
//! request still gets its answer, on both sides, as a direct call does: a FIN after a
//! whole request is not a cancellation. A reset is, and so is a close before the
//! request is whole.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An app that answers `slow` after 200 ms: long enough that the caller's FIN arrives
/// while its request is in flight.
async fn slow_app() -> Upstream {
    Upstream::start(|_req| async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        respond(200, "slow answer")
    })
    .await
}

/// Writes `request`, shuts down the write side, and reads until the connection closes
/// (at most 10 s).
async fn half_closed(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("no answer and no close within 10 s")
        .unwrap();
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_caller_gets_its_answer_through_the_outbound_side() {
    let app = slow_app().await;
    let config = Config::new().upstream("slow", |u| u.authorities(["slow"]).endpoint(app.addr));
    let tg = Tollgate::start(&config.to_toml()).await;
    let got = half_closed(tg.addr, b"GET / HTTP/1.1\r\nHost: slow\r\n\r\n").await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert!(got.ends_with("slow answer"), "{got:?}");
    // A body, whole before the FIN, is a whole request too.
    let got = half_closed(
        tg.addr,
        b"POST / HTTP/1.1\r\nHost: slow\r\nContent-Length: 4\r\n\r\nbody",
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert_eq!(app.hits(), 2);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_caller_gets_its_answer_through_the_inbound_side() {
    let app = slow_app().await;
    let tg = Tollgate::start(&Config::new().inbound(app.addr, |i| i).to_toml()).await;
    let got = half_closed(tg.inbound(), b"GET / HTTP/1.1\r\nHost: app\r\n\r\n").await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    assert!(got.ends_with("slow answer"), "{got:?}");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_before_the_body_is_whole_is_not_forwarded_as_whole() {
    let app = slow_app().await;
    let config = Config::new().upstream("slow", |u| u.authorities(["slow"]).endpoint(app.addr));
    let tg = Tollgate::start(&config.to_toml()).await;
    // 4 of 10 bytes, then the FIN: the request never became whole.
    let got = half_closed(
        tg.addr,
        b"POST / HTTP/1.1\r\nHost: slow\r\nContent-Length: 10\r\n\r\nbody",
    )
    .await;
    assert!(!got.starts_with("HTTP/1.1 200"), "{got:?}");
    tg.stop().await;
}
