//! A request head that arrives without the body it announces is acknowledged at once
//! (`TCP_QUICKACK`), so an app whose Nagle holds the body back until the head is
//! acknowledged (Python `requests` through `http_proxy`: head and body in two writes)
//! waits for no delayed ACK; a head that comes with its body, or has none (the small
//! GET), makes no such call. Counted by `tollgate::server::socket::quick_acks`, which is
//! process-wide: this file holds one test. The delay itself is timed by
//! `scripts/bench-quickack.sh`.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::server::socket::quick_acks;

/// Reads one response with a `Content-Length` body off `s`.
async fn read_response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if got.len() >= end + 4 + len {
                    return;
                }
            }
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before a whole response: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no response in 10 s");
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_head_without_its_body_is_acknowledged_at_once() {
    let app = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let config = Config::new().upstream("app", |u| u.authorities(["app"]).endpoint(app.addr));
    let tg = Tollgate::start(&config.to_toml()).await;
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.set_nodelay(false).unwrap();

    // The small GET: no call.
    let before = quick_acks();
    s.write_all(b"GET / HTTP/1.1\r\nHost: app\r\n\r\n")
        .await
        .unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    assert_eq!(quick_acks(), before, "a GET without a body made the call");

    // A POST whose body comes with its head: no call.
    s.write_all(b"POST / HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\n\r\nhello")
        .await
        .unwrap();
    assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    assert_eq!(quick_acks(), before, "a head with its body made the call");

    // Head, then body, in two writes with Nagle on: the head is acknowledged at once.
    // (Five times: the kernel may acknowledge a segment at once by itself, and then
    // the body can be in before the head is read.)
    for _ in 0..5 {
        s.write_all(b"POST / HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\n\r\n")
            .await
            .unwrap();
        s.write_all(b"hello").await.unwrap();
        assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
    }
    let acked = quick_acks() - before;
    assert!(
        (1..=5).contains(&acked),
        "heads without their body acknowledged at once: {acked} of 5"
    );
    tg.stop().await;
}
