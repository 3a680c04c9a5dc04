//! `Expect: 100-continue` through tollgate: the upstream decides. Its `100 Continue`
//! reaches the app, and only then does the app's body move; a final answer at the
//! expectation goes back before any of the body is sent, saying `Connection: close`;
//! an upstream that never sends `100` gets the body after a short wait; a retry after a
//! refusal at the expectation still sends the whole body.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(10);

/// Reads one message head (through the blank line) from `s`, keeping what follows it
/// in `buf`.
async fn next_head(s: &mut TcpStream, buf: &mut Vec<u8>) -> String {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..end + 4).collect();
            return String::from_utf8_lossy(&head).into_owned();
        }
        let mut chunk = [0u8; 4096];
        let n = timeout(LIMIT, s.read(&mut chunk)).await.unwrap().unwrap();
        assert!(
            n > 0,
            "closed before a whole head: {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The value of `Content-Length` in a head.
fn length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0)
}

/// An upstream that reads a head, answers `status` at once (after `100 Continue`
/// first if `continues`), reads the body it was promised (`continues`) and counts the
/// body bytes it received.
async fn upstream(continues: bool, status: u16) -> (Scripted, Arc<AtomicUsize>) {
    let got = Arc::new(AtomicUsize::new(0));
    let counted = got.clone();
    let s = Scripted::start(move |mut s: TcpStream, _closed| {
        let got = counted.clone();
        async move {
            let mut buf = Vec::new();
            let head = next_head(&mut s, &mut buf).await;
            let want = length(&head);
            if continues {
                s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
            } else if status != 200 {
                let answer = format!("HTTP/1.1 {status} No\r\nContent-Length: 0\r\n\r\n");
                s.write_all(answer.as_bytes()).await.unwrap();
            }
            let mut total = buf.len();
            let mut chunk = vec![0u8; 64 * 1024];
            // Reads what comes: the promised body, or (after a refusal) whatever the
            // client still sends, until it closes or goes quiet.
            while total < want {
                match timeout(Duration::from_millis(1500), s.read(&mut chunk)).await {
                    Ok(Ok(n)) if n > 0 => total += n,
                    _ => break,
                }
            }
            got.fetch_add(total, Ordering::SeqCst);
            if continues || status == 200 {
                let answer = format!("HTTP/1.1 {status} Done\r\nContent-Length: {total}\r\n\r\n");
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.write_all(&vec![b'r'; total]).await;
            }
        }
    })
    .await;
    (s, got)
}

fn tollgate_for(endpoints: &[std::net::SocketAddr]) -> String {
    Config::new()
        .upstream("up", |u| {
            endpoints
                .iter()
                .fold(u.authorities(["up"]), |u, e| u.endpoint(e))
                .protocol("http1")
                .attempt_timeout("5s")
                .request_timeout("10s")
                .retry(|r| r.max_attempts(2).backoff_base("1ms").backoff_max("2ms"))
        })
        .to_toml()
}

async fn expecting(tg: &Tollgate, len: usize) -> TcpStream {
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    let head = format!(
        "PUT /up HTTP/1.1\r\nHost: up\r\nContent-Length: {len}\r\nExpect: 100-continue\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_at_the_expectation_goes_back_before_any_body_is_sent() {
    let (up, got) = upstream(false, 413).await;
    let tg = Tollgate::start(&tollgate_for(&[up.addr])).await;
    let mut s = expecting(&tg, 8 * 1024 * 1024).await;
    let mut buf = Vec::new();
    let head = next_head(&mut s, &mut buf).await;
    assert!(
        head.starts_with("HTTP/1.1 413 "),
        "the first answer is the upstream's: {head}"
    );
    assert!(head.contains("connection: close\r\n"), "{head}");
    // The app sends nothing more; tollgate closes.
    let mut rest = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(wait_until(LIMIT, || up.accepted() == 1).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        got.load(Ordering::SeqCst),
        0,
        "no byte of the body reached the upstream"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstreams_100_continue_reaches_the_app_and_then_the_body_flows() {
    let (up, got) = upstream(true, 200).await;
    let tg = Tollgate::start(&tollgate_for(&[up.addr])).await;
    let body = vec![b'b'; 200 * 1024];
    let mut s = expecting(&tg, body.len()).await;
    let mut buf = Vec::new();
    let head = next_head(&mut s, &mut buf).await;
    assert_eq!(head, "HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(&body).await.unwrap();
    let head = next_head(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(length(&head), body.len());
    assert_eq!(got.load(Ordering::SeqCst), body.len());
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_sends_100_gets_the_body_after_a_short_wait() {
    let (up, got) = upstream(false, 200).await;
    let tg = Tollgate::start(&tollgate_for(&[up.addr])).await;
    let body = vec![b'b'; 1000];
    let mut s = expecting(&tg, body.len()).await;
    let mut buf = Vec::new();
    let head = next_head(&mut s, &mut buf).await;
    assert_eq!(
        head, "HTTP/1.1 100 Continue\r\n\r\n",
        "tollgate's own go-ahead, late"
    );
    s.write_all(&body).await.unwrap();
    let head = next_head(&mut s, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert_eq!(got.load(Ordering::SeqCst), body.len());
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_refusal_at_the_expectation_sends_the_whole_body() {
    let (busy, busy_got) = upstream(false, 503).await;
    let (fine, fine_got) = upstream(true, 200).await;
    let tg = Tollgate::start(&tollgate_for(&[busy.addr, fine.addr])).await;
    let body = vec![b'b'; 10 * 1024];
    for _ in 0..2 {
        let mut s = expecting(&tg, body.len()).await;
        let mut buf = Vec::new();
        let head = next_head(&mut s, &mut buf).await;
        assert_eq!(head, "HTTP/1.1 100 Continue\r\n\r\n");
        s.write_all(&body).await.unwrap();
        let head = next_head(&mut s, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        assert_eq!(
            length(&head),
            body.len(),
            "the whole body, not an empty replay"
        );
    }
    assert!(
        busy.accepted() >= 1,
        "round-robin sent one of them to the busy endpoint first"
    );
    assert_eq!(busy_got.load(Ordering::SeqCst), 0);
    assert_eq!(fine_got.load(Ordering::SeqCst), 2 * body.len());
    tg.stop().await;
}
