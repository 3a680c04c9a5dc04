//! HTTP/1.1 towards the upstream, against servers that write the protocol byte by byte:
//! every framing a response may have, interim responses, trailers, the request body's
//! own framing, and when a connection is (and is not) used again.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::config::Config;
use common::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn h1_upstream(addr: std::net::SocketAddr) -> String {
    Config::new()
        .upstream("raw", |u| {
            u.authorities(["raw"])
                .endpoint(addr)
                .protocol("http1")
                .attempt_timeout("5s")
                .request_timeout("10s")
        })
        .to_toml()
}

/// The request line of a request head.
fn request_line(head: &[u8]) -> String {
    let head = String::from_utf8_lossy(head);
    head.lines().next().unwrap_or_default().to_string()
}

/// Writes `bytes` one at a time, each in its own segment.
async fn trickle(s: &mut TcpStream, bytes: &[u8]) {
    s.set_nodelay(true).unwrap();
    for b in bytes {
        if s.write_all(&[*b]).await.is_err() {
            return;
        }
    }
}

async fn open_connections(tg: &Tollgate) -> f64 {
    metric(
        &tg.metrics().await,
        "tollgate_upstream_connections{upstream=\"raw\"}",
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_framing_arrives_whole_and_the_connection_is_used_again() {
    // One connection, many exchanges, each response written a byte at a time so that
    // every boundary (inside the status line, a field, a chunk-size line, a CRLF) falls
    // between two reads somewhere.
    let up = Scripted::start(|mut s, _| async move {
        loop {
            let head = read_head(&mut s).await;
            if head.is_empty() {
                return;
            }
            let answer: &[u8] = match request_line(&head).as_str() {
                "GET /length HTTP/1.1" => b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
                "GET /chunked HTTP/1.1" => {
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                      5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n"
                }
                "GET /interim HTTP/1.1" => {
                    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n\
                      HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nat last"
                }
                "HEAD /length HTTP/1.1" => b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n",
                "GET /none HTTP/1.1" => b"HTTP/1.1 204 No Content\r\n\r\n",
                "GET /same HTTP/1.1" => {
                    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 11\r\nETag: \"v1\"\r\n\r\n"
                }
                _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n",
            };
            trickle(&mut s, answer).await;
        }
    })
    .await;
    let tg = Tollgate::start(&h1_upstream(up.addr)).await;

    for round in 0..2 {
        let r = get(tg.addr, "/length", "raw").await;
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"hello world"[..]));
        assert_eq!(r.header("content-length"), Some("11"));

        let r = get(tg.addr, "/chunked", "raw").await;
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"hello world"[..]));
        assert_eq!(
            r.header("transfer-encoding"),
            Some("chunked"),
            "re-chunked by the app's side"
        );

        let r = get(tg.addr, "/interim", "raw").await;
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"at last"[..]));
        assert_eq!(
            r.header("link"),
            None,
            "an interim response's fields stay there"
        );

        let r = send(
            tg.addr,
            request("HEAD", "/length", "raw").body(empty()).unwrap(),
        )
        .await;
        assert_eq!((r.status.as_u16(), r.body.len()), (200, 0));
        assert_eq!(r.header("content-length"), Some("11"));

        let r = get(tg.addr, "/none", "raw").await;
        assert_eq!((r.status.as_u16(), r.body.len()), (204, 0));

        let r = get(tg.addr, "/same", "raw").await;
        assert_eq!((r.status.as_u16(), r.body.len()), (304, 0));
        assert_eq!(r.header("etag"), Some("\"v1\""));
        assert_eq!(r.attempts(), 1, "round {round}");
    }
    assert_eq!(up.accepted(), 1, "every exchange on the one connection");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_trailers_reach_an_app_that_can_take_them() {
    let up = Scripted::start(|mut s, _| async move {
        read_head(&mut s).await;
        trickle(
            &mut s,
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-checksum\r\n\r\n\
              4\r\ndata\r\n0\r\nx-checksum: 1234\r\nx-count: 1\r\n\r\n",
        )
        .await;
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
    })
    .await;
    let tg = Tollgate::start(&h1_upstream(up.addr)).await;
    let r = send_h2(
        tg.addr,
        request("GET", "http://raw/t", "raw").body(empty()).unwrap(),
    )
    .await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"data"[..]));
    let t = r.trailers.expect("the trailers came through");
    assert_eq!(t["x-checksum"], "1234");
    assert_eq!(t["x-count"], "1");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_go_out_framed_as_the_app_sent_them() {
    // The upstream reports what framing it saw and the body it read.
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let framing = match (
            req.headers().get("content-length"),
            req.headers().get("transfer-encoding"),
        ) {
            (Some(n), None) => format!("length {}", n.to_str().unwrap()),
            (None, Some(te)) => format!("coded {}", te.to_str().unwrap()),
            (None, None) => "none".to_string(),
            (Some(_), Some(_)) => "both".to_string(),
        };
        let body = req.into_body().collect().await.unwrap().to_bytes();
        respond(
            200,
            format!("{framing}: {}", String::from_utf8_lossy(&body)),
        )
    })
    .await;
    let tg = Tollgate::start(&h1_upstream(up.addr)).await;

    let r = send(
        tg.addr,
        request("PUT", "/a", "raw")
            .body(full("a known length"))
            .unwrap(),
    )
    .await;
    assert_eq!(&r.body[..], b"length 14: a known length");

    let r = send(tg.addr, request("POST", "/b", "raw").body(empty()).unwrap()).await;
    assert_eq!(&r.body[..], b"length 0: ", "an empty POST still says so");

    let r = get(tg.addr, "/c", "raw").await;
    assert_eq!(&r.body[..], b"none: ");

    // A body of unknown length, sent as it is produced: it goes on chunked.
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let send_body = tokio::spawn(async move {
        for part in ["streamed ", "in ", "parts"] {
            tx.send(Bytes::from(part)).await.unwrap();
        }
    });
    let body = ChannelBody(rx).boxed();
    let r = send(tg.addr, request("POST", "/d", "raw").body(body).unwrap()).await;
    send_body.await.unwrap();
    assert_eq!(&r.body[..], b"coded chunked: streamed in parts");
    assert_eq!(r.attempts(), 1);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_upstream_closed_while_idle_is_closed_and_never_used() {
    // Answers one request per connection, keeping it alive as far as the headers
    // say, then closes it: the pooled connection dies while idle.
    let up = Scripted::start(|mut s, _| async move {
        read_head(&mut s).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await;
        drop(s);
    })
    .await;
    let tg = Tollgate::start(&h1_upstream(up.addr)).await;
    let r = get(tg.addr, "/", "raw").await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"ok"[..]));
    // Nothing else asks: tollgate notices the close by itself and lets the socket go.
    let mut gone = false;
    for _ in 0..200 {
        if open_connections(&tg).await == 0.0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the half-closed idle connection was not closed");
    // The next request opens a fresh connection at once: no failed attempt first.
    let r = get(tg.addr, "/", "raw").await;
    assert_eq!((r.status.as_u16(), r.attempts()), (200, 1));
    assert_eq!(up.accepted(), 2);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_says_close_or_cannot_be_trusted_is_not_followed_by_another() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"[..],
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        // Both framings: the chunked one wins, and the connection is not trusted.
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    ] {
        // The upstream keeps every connection open whatever it said.
        let up = Scripted::start(move |mut s, closed| async move {
            read_head(&mut s).await;
            let _ = s.write_all(answer).await;
            until_peer_closes(s, closed).await;
        })
        .await;
        let tg = Tollgate::start(&h1_upstream(up.addr)).await;
        let what = String::from_utf8_lossy(answer);
        for _ in 0..2 {
            let r = get(tg.addr, "/", "raw").await;
            assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"ok"[..]), "{what}");
            assert_eq!(r.attempts(), 1, "{what}");
        }
        assert_eq!(up.accepted(), 2, "{what}: a connection was used again");
        assert!(
            wait_until(Duration::from_secs(10), || up.peer_closed() == 2).await,
            "{what}: tollgate kept a connection it will not use"
        );
        tg.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_fields_reach_either_app_once_and_clean() {
    let up = Scripted::start(|mut s, _| async move {
        loop {
            if read_head(&mut s).await.is_empty() {
                return;
            }
            let answer = b"HTTP/1.1 200 OK\r\nX-Custom:  a b \r\nX-Tollgate-Attempts: 7\r\n\
                           Content-Length: 2\r\nConnection: x-named\r\nX-Named: secret\r\n\
                           Keep-Alive: timeout=5\r\nx-custom: second\r\n\r\nok";
            if s.write_all(answer).await.is_err() {
                return;
            }
        }
    })
    .await;
    let tg = Tollgate::start(&h1_upstream(up.addr)).await;

    // HTTP/1.1: the fields as they came, each once, this hop's attempt count only.
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: raw\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let lower = raw.to_ascii_lowercase();
    assert!(raw.contains("\r\nX-Custom:  a b\r\n"), "{raw}");
    assert!(raw.contains("\r\nx-custom: second\r\n"), "{raw}");
    assert_eq!(lower.matches("x-tollgate-attempts").count(), 1, "{raw}");
    assert!(lower.contains("x-tollgate-attempts: 1\r\n"), "{raw}");
    assert_eq!(lower.matches("content-length").count(), 1, "{raw}");
    for hop in ["x-named", "keep-alive", "connection: x-named"] {
        assert!(!lower.contains(hop), "{hop}: {raw}");
    }
    assert!(raw.ends_with("\r\n\r\nok"), "{raw}");

    // HTTP/2: the same fields, in the map.
    let r = send_h2(
        tg.addr,
        request("GET", "http://raw/", "raw").body(empty()).unwrap(),
    )
    .await;
    assert_eq!(&r.body[..], b"ok");
    let all = |n: &str| -> Vec<&str> {
        r.headers
            .get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    };
    assert_eq!(all("x-custom"), ["a b", "second"]);
    assert_eq!(all("x-tollgate-attempts"), ["1"]);
    assert!(all("x-named").is_empty() && all("keep-alive").is_empty());
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_larger_than_one_read_arrives_whole_on_a_pooled_connection() {
    // A pooled connection holds no read buffer, and the read of the next response takes
    // at most a few KiB: a larger head, written in one piece with its body, must still
    // arrive whole, on the same connection, each time.
    let big = "v".repeat(10 * 1024);
    let answer =
        format!("HTTP/1.1 200 OK\r\nX-Big: {big}\r\nContent-Length: 11\r\n\r\nhello world");
    let up = Scripted::start(move |mut s, _| {
        let answer = answer.clone();
        async move {
            loop {
                if read_head(&mut s).await.is_empty() {
                    return;
                }
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let tg = Tollgate::start(&h1_upstream(up.addr)).await;
    for round in 0..3 {
        let r = get(tg.addr, "/big", "raw").await;
        assert_eq!(
            (r.status.as_u16(), &r.body[..]),
            (200, &b"hello world"[..]),
            "round {round}"
        );
        assert_eq!(r.header("x-big").map(str::len), Some(big.len()));
    }
    assert_eq!(up.accepted(), 1, "every exchange on the one connection");
    tg.stop().await;
}

/// The pool hands out the connection that answered last: after a burst has opened
/// several, one request at a time keeps using one of them, and the others stay idle
/// (and can be closed by the upstream when they have waited long enough) instead of
/// each being used in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_that_answered_last_carries_the_next_request() {
    const BURST: usize = 6;
    let next_id = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let burst = std::sync::Arc::new(tokio::sync::Barrier::new(BURST));
    let up = {
        let next_id = next_id.clone();
        Scripted::start(move |mut s, _| {
            let id = next_id.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let burst = burst.clone();
            async move {
                let mut first = true;
                loop {
                    if read_head(&mut s).await.is_empty() {
                        return;
                    }
                    // Each of the burst's connections answers its first request only
                    // once all of them hold one: the burst needs them all at once.
                    if std::mem::take(&mut first) {
                        let _ = tokio::time::timeout(Duration::from_secs(10), burst.wait()).await;
                    }
                    let body = id.to_string();
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                    if s.write_all(format!("{head}{body}").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        })
        .await
    };
    let tg = Tollgate::start(&h1_upstream(up.addr)).await;
    let addr = tg.addr;
    let burst: Vec<_> = (0..BURST)
        .map(|_| tokio::spawn(async move { get(addr, "/", "raw").await }))
        .collect();
    for r in burst {
        assert_eq!(r.await.unwrap().status.as_u16(), 200);
    }
    assert_eq!(up.accepted(), BURST);
    let mut carried = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let r = get(tg.addr, "/", "raw").await;
        assert_eq!(r.status.as_u16(), 200);
        carried.insert(String::from_utf8_lossy(&r.body).into_owned());
    }
    assert_eq!(up.accepted(), BURST, "a pooled connection was not reused");
    assert_eq!(
        carried.len(),
        1,
        "twenty requests one at a time went over {carried:?}, not one connection"
    );
    tg.stop().await;
}

/// A server answering every request on a connection with `answer`; counts the requests.
async fn answering(answer: String) -> (Scripted, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let up = Scripted::start(move |mut s, _| {
        let (answer, count) = (answer.clone(), count.clone());
        async move {
            loop {
                if read_head(&mut s).await.is_empty() {
                    return;
                }
                count.fetch_add(1, Ordering::SeqCst);
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    (up, asked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_head_is_limited_by_its_size_not_its_count_of_fields() {
    // 130 fields, a few KiB: passes whole.
    let fields: String = (0..130).map(|i| format!("X-F{i}: {i}\r\n")).collect();
    let (many, _) = answering(format!(
        "HTTP/1.1 200 OK\r\n{fields}Content-Length: 2\r\n\r\nok"
    ))
    .await;
    let tg = Tollgate::start(&h1_upstream(many.addr)).await;
    // (Read raw: hyper's client takes at most 100 fields.)
    let r = raw_exchange(
        tg.addr,
        b"GET /many HTTP/1.1\r\nHost: raw\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.ends_with("\r\n\r\nok"), "{r}");
    for i in [0, 64, 129] {
        assert!(
            r.contains(&format!("\r\nX-F{i}: {i}\r\n")),
            "field {i}: {r}"
        );
    }
    tg.stop().await;

    // Over 64 KiB: 502 not-retryable, asked once (the same request would get it again).
    let big = "v".repeat(65 * 1024);
    let (huge, asked) = answering(format!(
        "HTTP/1.1 503 Service Unavailable\r\nX-Big: {big}\r\nContent-Length: 2\r\n\r\nno"
    ))
    .await;
    let tg = Tollgate::start(&h1_upstream(huge.addr)).await;
    let r = get(tg.addr, "/huge", "raw").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("not-retryable"));
    assert_eq!(r.attempts(), 1);
    assert_eq!(asked.load(Ordering::SeqCst), 1, "not retried");
    tg.stop().await;
}
