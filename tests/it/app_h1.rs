//! HTTP/1.1 (and 1.0) as the app speaks it to tollgate, over raw sockets: `Expect:
//! 100-continue`, pipelined requests, HTTP/1.0 keep-alive and close-delimited bodies,
//! how a response body of unknown length is framed, and tollgate's own answers.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::config::Config;
use common::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(10);

fn app(addr: SocketAddr) -> String {
    Config::new()
        .listener(|l| l.unknown_authorities("refuse"))
        .upstream("app", |u| u.authorities(["app"]).endpoint(addr))
        .to_toml()
}

/// An upstream answering `METHOD PATH BODY` with the request's own line and body.
async fn echo() -> Upstream {
    Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let line = format!("{} {} ", req.method(), req.uri());
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let mut out = line.into_bytes();
        out.extend_from_slice(&body);
        respond(200, out)
    })
    .await
}

/// Reads one response (head and a `Content-Length` body) off the socket; `""` when
/// the connection closed first.
async fn one_response(s: &mut TcpStream, pending: &mut Vec<u8>) -> String {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end + 4]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if pending.len() >= end + 4 + length {
                let all: Vec<u8> = pending.drain(..end + 4 + length).collect();
                return String::from_utf8_lossy(&all).into_owned();
            }
        }
        match timeout(LIMIT, s.read(&mut buf)).await.unwrap() {
            Ok(0) | Err(_) => return String::new(),
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

async fn read_to_close(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    timeout(LIMIT, s.read_to_end(&mut all))
        .await
        .expect("the connection was closed")
        .ok();
    String::from_utf8_lossy(&all).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_before_the_body_is_read() {
    let up = echo().await;
    let tg = Tollgate::start(&app(up.addr)).await;

    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(
        b"PUT /up HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    // The app waits for the go-ahead before it sends the body.
    let head = timeout(LIMIT, read_head(&mut s)).await.unwrap();
    assert_eq!(head, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"hello").await.unwrap();
    let mut pending = Vec::new();
    let resp = one_response(&mut s, &mut pending).await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(resp.ends_with("\r\n\r\nPUT /up hello"), "{resp}");
    assert_eq!(up.hits(), 1);

    // No route: no go-ahead, the answer at once, and the unread body ends the connection.
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(
        b"PUT /up HTTP/1.1\r\nHost: nowhere\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let resp = read_to_close(&mut s).await;
    assert!(resp.starts_with("HTTP/1.1 404 Not Found\r\n"), "{resp}");
    assert!(!resp.contains("100 Continue"), "{resp}");
    assert!(resp.contains("connection: close\r\n"), "{resp}");
    assert_eq!(up.hits(), 1);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let up = echo().await;
    let tg = Tollgate::start(&app(up.addr)).await;
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(
        b"GET /one HTTP/1.1\r\nHost: app\r\n\r\n\
          POST /two HTTP/1.1\r\nHost: app\r\nContent-Length: 3\r\n\r\nabc\
          POST /three HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n0\r\n\r\n\
          GET /four HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let raw = read_to_close(&mut s).await;
    let bodies: Vec<&str> = raw
        .split("HTTP/1.1 200 OK\r\n")
        .skip(1)
        .map(|r| r.split("\r\n\r\n").nth(1).unwrap())
        .collect();
    assert_eq!(
        bodies,
        ["GET /one ", "POST /two abc", "POST /three xy", "GET /four "],
        "{raw}"
    );
    assert!(raw.ends_with("GET /four "), "closed after the last: {raw}");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_apps_get_http10_answers_and_keep_alive_only_when_asked() {
    let up = echo().await;
    let tg = Tollgate::start(&app(up.addr)).await;

    // No keep-alive asked for: the connection ends with the response.
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(b"GET /a HTTP/1.0\r\nHost: app\r\n\r\n")
        .await
        .unwrap();
    let raw = read_to_close(&mut s).await;
    assert!(raw.starts_with("HTTP/1.0 200 OK\r\n"), "{raw}");
    assert!(raw.contains("connection: close\r\n"), "{raw}");
    assert!(raw.ends_with("GET /a "), "{raw}");

    // Asked for: two requests on one connection.
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    let mut pending = Vec::new();
    for path in ["/b", "/c"] {
        s.write_all(
            format!("GET {path} HTTP/1.0\r\nHost: app\r\nConnection: keep-alive\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let resp = one_response(&mut s, &mut pending).await;
        assert!(resp.starts_with("HTTP/1.0 200 OK\r\n"), "{resp}");
        assert!(resp.contains("connection: keep-alive\r\n"), "{resp}");
        assert!(resp.ends_with(&format!("GET {path} ")), "{resp}");
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_unknown_length_is_chunked_for_http11_and_runs_to_the_close_for_http10() {
    // The upstream sends its body chunked, with no length.
    let up = Scripted::start(|mut s, _| async move {
        loop {
            let head = read_head(&mut s).await;
            if head.is_empty() {
                return;
            }
            let answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                           5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
            if s.write_all(answer).await.is_err() {
                return;
            }
        }
    })
    .await;
    let tg = Tollgate::start(&app(up.addr)).await;

    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(b"GET /x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let raw = read_to_close(&mut s).await;
    assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw}");
    assert!(raw.contains("transfer-encoding: chunked\r\n"), "{raw}");
    assert!(!raw.contains("content-length"), "{raw}");
    let body = raw
        .split("\r\n\r\n")
        .skip(1)
        .collect::<Vec<_>>()
        .join("\r\n\r\n");
    assert_eq!(body, "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "{raw}");

    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(b"GET /x HTTP/1.0\r\nHost: app\r\nConnection: keep-alive\r\n\r\n")
        .await
        .unwrap();
    let raw = read_to_close(&mut s).await;
    assert!(raw.starts_with("HTTP/1.0 200 OK\r\n"), "{raw}");
    assert!(!raw.contains("transfer-encoding"), "{raw}");
    assert!(
        raw.contains("connection: close\r\n"),
        "no length, so the close ends the body: {raw}"
    );
    assert!(raw.ends_with("\r\n\r\nhello world"), "{raw}");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgates_own_answers_are_dated_and_framed() {
    let tg = Tollgate::start(&app(dead_port().await)).await;
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    let mut pending = Vec::new();
    for host in ["nowhere", "app"] {
        s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let resp = one_response(&mut s, &mut pending).await;
        let date = resp
            .lines()
            .find_map(|l| l.strip_prefix("date: "))
            .unwrap_or_else(|| panic!("no date: {resp}"));
        assert!(
            httpdate_like(date),
            "an IMF-fixdate like \"Sun, 06 Nov 1994 08:49:37 GMT\": {date}"
        );
        let body = resp.split("\r\n\r\n").nth(1).unwrap();
        let length = format!("content-length: {}\r\n", body.len());
        assert!(resp.contains(&length), "{resp}");
    }
    tg.stop().await;
}

fn httpdate_like(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() == 29 && v.ends_with(" GMT") && b[3] == b',' && b[19] == b':' && b[22] == b':'
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_from_http11_apps_reach_an_h2c_upstream_whole() {
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        assert_eq!(req.version(), http::Version::HTTP_2, "h1 in, h2c out");
        let body = req.into_body().collect().await.unwrap().to_bytes();
        respond(
            200,
            format!(
                "{} bytes, sum {}",
                body.len(),
                body.iter().map(|b| u64::from(*b)).sum::<u64>()
            ),
        )
    })
    .await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("app", |u| {
                u.authorities(["app"]).endpoint(up.addr).protocol("h2c")
            })
            .to_toml(),
    )
    .await;
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    let mut pending = Vec::new();
    for expect in [false, true] {
        let head = format!(
            "POST /up HTTP/1.1\r\nHost: app\r\nContent-Length: {}\r\n{}\r\n",
            body.len(),
            if expect {
                "Expect: 100-continue\r\n"
            } else {
                ""
            }
        );
        s.write_all(head.as_bytes()).await.unwrap();
        if expect {
            let interim = timeout(LIMIT, read_head(&mut s)).await.unwrap();
            assert_eq!(interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        s.write_all(&body).await.unwrap();
        let resp = one_response(&mut s, &mut pending).await;
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
        assert!(
            resp.ends_with(&format!("\r\n\r\n200000 bytes, sum {sum}")),
            "{resp}"
        );
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_larger_than_one_read_after_a_wait_are_answered_whole() {
    // Between requests a connection holds no read buffer, and the read that ends the
    // wait takes at most a few KiB: a head larger than that, sent in one piece, and a
    // body right behind it, must still arrive whole.
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let big = req.headers().get("x-big").map_or(0, |v| v.len());
        let body = req.into_body().collect().await.unwrap().to_bytes();
        respond(200, format!("big={big} body={}", body.len()))
    })
    .await;
    let tg = Tollgate::start(&app(up.addr)).await;
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    let mut pending = Vec::new();
    let big = "b".repeat(12 * 1024);
    let body = "x".repeat(20 * 1024);
    for round in 0..3 {
        s.write_all(b"GET /small HTTP/1.1\r\nHost: app\r\n\r\n")
            .await
            .unwrap();
        let resp = one_response(&mut s, &mut pending).await;
        assert!(resp.ends_with("big=0 body=0"), "round {round}: {resp}");
        let ask = format!(
            "POST /large HTTP/1.1\r\nHost: app\r\nX-Big: {big}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(ask.as_bytes()).await.unwrap();
        let resp = one_response(&mut s, &mut pending).await;
        assert!(
            resp.ends_with(&format!("big={} body={}", big.len(), body.len())),
            "round {round}: {}",
            &resp[..resp.len().min(200)]
        );
    }
    assert_eq!(up.hits(), 6);
    tg.stop().await;
}
