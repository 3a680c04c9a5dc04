//! A request head that arrives without the body it announces is acknowledged at once
//! (`TCP_QUICKACK`), so an app whose Nagle holds the body back until the head is
//! acknowledged (Python `requests` through `http_proxy`: head and body in two writes)
//! waits for no delayed ACK; a head that comes with its body, or has none (the small
//! GET), makes no such call. Counted by `tollgate_core::server::socket::quick_acks`, which is
//! process-wide: this file holds one test. The delay itself is timed by
//! `scripts/bench-quickack.sh`.

#![allow(clippy::unwrap_used)]

use crate::common;

use common::config::Config;
use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tollgate_core::server::socket::quick_acks;

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
    assert!(read_one_response(&mut s).await.starts_with("HTTP/1.1 200"));
    assert_eq!(quick_acks(), before, "a GET without a body made the call");

    // A POST whose body comes with its head: no call.
    s.write_all(b"POST / HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\n\r\nhello")
        .await
        .unwrap();
    assert!(read_one_response(&mut s).await.starts_with("HTTP/1.1 200"));
    assert_eq!(quick_acks(), before, "a head with its body made the call");

    // Head, then body, in two writes with Nagle on: the head is acknowledged at once.
    // (Five times: the kernel may acknowledge a segment at once by itself, and then
    // the body can be in before the head is read.)
    for _ in 0..5 {
        s.write_all(b"POST / HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\n\r\n")
            .await
            .unwrap();
        s.write_all(b"hello").await.unwrap();
        assert!(read_one_response(&mut s).await.starts_with("HTTP/1.1 200"));
    }
    let acked = quick_acks() - before;
    assert!(
        (1..=5).contains(&acked),
        "heads without their body acknowledged at once: {acked} of 5"
    );
    tg.stop().await;
}
