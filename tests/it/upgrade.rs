//! HTTP/1.1 upgrades (WebSocket) through tollgate: the handshake reaches the upstream
//! with its `Upgrade` and `Connection`, its `101` reaches the app with them, and the
//! connection becomes a byte tunnel both ways until either side closes (or a drain
//! times out). An upgrade is never retried; a `101` nobody asked for is refused.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(10);
/// RFC 6455 section 1.3's example key, and the accept value it must get.
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

/// SHA-1 (for `Sec-WebSocket-Accept` only).
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 80];
        for i in 0..16 {
            w[i] = u32::from_be_bytes(block[i * 4..i * 4 + 4].try_into().unwrap());
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A827999),
                20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                _ => (b ^ c ^ d, 0xCA62C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            (e, d, c, b, a) = (d, c, b.rotate_left(30), a, t);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn accept_for(key: &str) -> String {
    base64(&sha1(
        format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
    ))
}

/// The value of a field in a head (any case), if present.
fn field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A WebSocket server: answers the handshake with `101`, says `hello` first, then
/// echoes what it reads until the client closes; with `leave`, it says `bye` and
/// closes instead. A request that is no handshake gets `status`.
async fn ws_server(leave: bool, status: u16) -> Scripted {
    Scripted::start(move |mut s: TcpStream, closed| async move {
        let head = String::from_utf8(read_head(&mut s).await).unwrap();
        let key = field(&head, "sec-websocket-key");
        let asked = field(&head, "upgrade") == Some("websocket")
            && field(&head, "connection").is_some_and(|c| c.eq_ignore_ascii_case("upgrade"));
        let Some(key) = key.filter(|_| asked && status == 101) else {
            let answer = if status == 101 {
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: something\r\nConnection: upgrade\r\n\r\n".to_string()
            } else {
                format!("HTTP/1.1 {status} No\r\nContent-Length: 0\r\n\r\n")
            };
            let _ = s.write_all(answer.as_bytes()).await;
            until_peer_closes(s, closed).await;
            return;
        };
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {}\r\n\r\nhello",
            accept_for(key)
        );
        s.write_all(answer.as_bytes()).await.unwrap();
        if leave {
            let _ = s.write_all(b" bye").await;
            return;
        }
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        closed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    })
    .await
}

fn tollgate_for(up: std::net::SocketAddr, drain: &str) -> String {
    Config::new()
        .listener(|l| l.drain_timeout(drain))
        .upstream("ws", |u| {
            u.authorities(["ws"])
                .endpoint(up)
                .attempt_timeout("5s")
                .retry(|r| r.max_attempts(3).backoff_base("1ms").backoff_max("2ms"))
        })
        .to_toml()
}

/// Sends a WebSocket handshake and reads the answer's head; the rest of what came with
/// it is returned too.
async fn handshake(addr: std::net::SocketAddr) -> (TcpStream, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET /chat HTTP/1.1\r\nHost: ws\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let end = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = timeout(LIMIT, s.read(&mut chunk)).await.unwrap().unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    };
    let rest = buf.split_off(end);
    (s, String::from_utf8(buf).unwrap(), rest)
}

async fn read_exactly(s: &mut TcpStream, have: &mut Vec<u8>, n: usize) -> Vec<u8> {
    while have.len() < n {
        let mut chunk = [0u8; 4096];
        let got = timeout(LIMIT, s.read(&mut chunk)).await.unwrap().unwrap();
        assert!(got > 0, "closed after {:?}", String::from_utf8_lossy(have));
        have.extend_from_slice(&chunk[..got]);
    }
    have.drain(..n).collect()
}

#[test]
fn the_accept_value_is_computed_as_rfc_6455_shows() {
    assert_eq!(accept_for(KEY), ACCEPT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_handshake_becomes_a_tunnel_both_ways() {
    let up = ws_server(false, 101).await;
    let tg = Tollgate::start(&tollgate_for(up.addr, "5s")).await;
    let (mut s, head, mut rest) = handshake(tg.addr).await;
    assert!(
        head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{head}"
    );
    assert_eq!(field(&head, "upgrade"), Some("websocket"), "{head}");
    assert!(
        field(&head, "connection").is_some_and(|c| c.eq_ignore_ascii_case("upgrade")),
        "{head}"
    );
    assert_eq!(field(&head, "sec-websocket-accept"), Some(ACCEPT), "{head}");
    assert_eq!(
        read_exactly(&mut s, &mut rest, 5).await,
        b"hello",
        "the upstream spoke first"
    );

    // A masked text frame "hello", as a browser sends it, and raw bytes after it.
    let mut frame = vec![0x81, 0x85, 1, 2, 3, 4];
    frame.extend(
        b"hello"
            .iter()
            .zip([1u8, 2, 3, 4].iter().cycle())
            .map(|(b, m)| b ^ m),
    );
    for bytes in [frame, vec![7u8; 100_000]] {
        s.write_all(&bytes).await.unwrap();
        assert_eq!(read_exactly(&mut s, &mut rest, bytes.len()).await, bytes);
    }
    // The app closes: the upstream hears it, closes too, and so does tollgate.
    s.shutdown().await.unwrap();
    let mut tail = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut tail))
        .await
        .unwrap()
        .unwrap();
    assert!(tail.is_empty());
    assert!(wait_until(LIMIT, || up.peer_closed() == 1).await);

    let m = tg.metrics().await;
    for series in [
        "tollgate_requests_total{code=\"101\",outcome=\"ok\",upstream=\"ws\"}",
        "tollgate_attempts_total{result=\"1xx\",upstream=\"ws\"}",
    ] {
        assert_eq!(metric(&m, series), Some(1.0), "{series}");
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_closing_ends_the_tunnel() {
    let up = ws_server(true, 101).await;
    let tg = Tollgate::start(&tollgate_for(up.addr, "5s")).await;
    let (mut s, head, mut rest) = handshake(tg.addr).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    timeout(LIMIT, s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest, b"hello bye");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_not_retried_and_an_unasked_101_is_refused() {
    let busy = ws_server(false, 503).await;
    let tg = Tollgate::start(&tollgate_for(busy.addr, "5s")).await;
    let (_s, head, _) = handshake(tg.addr).await;
    assert!(head.starts_with("HTTP/1.1 503 "), "{head}");
    assert_eq!(field(&head, "x-tollgate-outcome"), Some("not-retryable"));
    assert_eq!(field(&head, "x-tollgate-attempts"), Some("1"));
    assert_eq!(busy.accepted(), 1);
    tg.stop().await;

    let switching = ws_server(false, 101).await;
    let tg = Tollgate::start(&tollgate_for(switching.addr, "5s")).await;
    let r = get(tg.addr, "/", "ws").await;
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.outcome(), Some("not-retryable"));
    assert_eq!(r.attempts(), 1);
    assert!(
        wait_until(LIMIT, || switching.peer_closed() == 1).await,
        "the switched connection is closed"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_is_closed_at_the_drain_timeout() {
    let up = ws_server(false, 101).await;
    let tg = Tollgate::start(&tollgate_for(up.addr, "1s")).await;
    let (mut s, head, mut rest) = handshake(tg.addr).await;
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert_eq!(read_exactly(&mut s, &mut rest, 5).await, b"hello");
    let stopping = tokio::spawn(tg.stop());
    // Still a tunnel while the drain lasts, closed when it times out.
    s.write_all(b"still here").await.unwrap();
    assert_eq!(read_exactly(&mut s, &mut rest, 10).await, b"still here");
    timeout(LIMIT, s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    timeout(LIMIT, stopping).await.unwrap().unwrap();
}
