//! What crosses the wire is framed one way only, whoever reads it: lengths, chunk-size
//! lines, request targets, and the fields a `Connection` may not take away. The app
//! speaks raw bytes to tollgate, and the upstream records the exact bytes it receives,
//! so what is asserted is what each hop really saw.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::config::Config;
use common::*;
use http::Request;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every complete request an upstream received, as the bytes it came in.
type Seen = Arc<Mutex<Vec<String>>>;

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Where the request at the front of `buf` ends, if it is all there: its head, then a
/// `Content-Length` body or a chunked one (as tollgate writes it).
fn request_end(buf: &[u8]) -> Option<usize> {
    let head = find(buf, b"\r\n\r\n")? + 4;
    let text = String::from_utf8_lossy(&buf[..head]).to_ascii_lowercase();
    if text.contains("\r\ntransfer-encoding: chunked\r\n") {
        let body = &buf[head..];
        if body.starts_with(b"0\r\n\r\n") {
            return Some(head + 5);
        }
        return find(body, b"\r\n0\r\n\r\n").map(|i| head + i + 7);
    }
    let length = text
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
    (buf.len() >= head + length).then_some(head + length)
}

/// An upstream that records each complete request as the bytes it came in, and answers
/// each with `answer`.
async fn raw_upstream(answer: &'static [u8]) -> (Scripted, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let up = Scripted::start(move |mut s, _| {
        let log = log.clone();
        async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                while let Some(end) = request_end(&buf) {
                    let req: Vec<u8> = buf.drain(..end).collect();
                    log.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&req).into_owned());
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        }
    })
    .await;
    (up, seen)
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

fn app(
    addr: SocketAddr,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> String {
    Config::new()
        .upstream("app", |u| f(u.authorities(["app"]).endpoint(addr)))
        .to_toml()
}

fn requests(seen: &Seen) -> Vec<String> {
    seen.lock().unwrap().clone()
}

/// The request a recording upstream saw whose request line starts with `line`.
fn saw(seen: &Seen, line: &str) -> Option<String> {
    requests(seen).into_iter().find(|r| r.starts_with(line))
}

/// The values of the field `name` in a raw head (any case).
fn field_values(head: &str, name: &str) -> Vec<String> {
    head.split("\r\n\r\n")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_field_cannot_take_away_the_length_of_a_response() {
    // The upstream names its own length in `Connection` and keeps the connection.
    let (up, _) = raw_upstream(
        b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    let tg = Tollgate::start(&app(up.addr, |u| u)).await;
    let raw = raw_exchange(
        tg.addr,
        b"GET /1 HTTP/1.1\r\nHost: app\r\n\r\nGET /2 HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n",
    )
    .await;
    let responses: Vec<&str> = raw.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(responses.len(), 2, "two responses, each framed: {raw}");
    for r in responses {
        assert!(r.starts_with("200 OK\r\n"), "{raw}");
        assert_eq!(field_values(r, "content-length"), ["5"], "{raw}");
        assert!(r.ends_with("\r\n\r\nhello"), "{raw}");
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_field_cannot_take_away_the_length_or_host_of_a_request() {
    let (up, seen) = raw_upstream(OK).await;
    let tg = Tollgate::start(&app(up.addr, |u| u)).await;
    let raw = raw_exchange(
        tg.addr,
        b"POST /cl HTTP/1.1\r\nHost: app\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello\
          GET /host HTTP/1.1\r\nHost: app\r\nConnection: host, close\r\n\r\n",
    )
    .await;
    assert_eq!(raw.matches("HTTP/1.1 200 OK").count(), 2, "{raw}");
    let cl = saw(&seen, "POST /cl ").unwrap();
    assert_eq!(field_values(&cl, "content-length"), ["5"], "{cl}");
    assert!(cl.ends_with("\r\n\r\nhello"), "{cl}");
    let host = saw(&seen, "GET /host ").unwrap();
    assert_eq!(field_values(&host, "host"), ["app"], "{host}");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_field_cannot_take_away_the_authority_of_an_h2c_request() {
    let authority = Arc::new(Mutex::new(Vec::new()));
    let log = authority.clone();
    let up = Upstream::start(move |req: Request<hyper::body::Incoming>| {
        log.lock()
            .unwrap()
            .push((req.version(), req.uri().authority().map(|a| a.to_string())));
        async { respond(200, "ok") }
    })
    .await;
    let tg = Tollgate::start(&app(up.addr, |u| u.protocol("h2c"))).await;
    let raw = raw_exchange(
        tg.addr,
        b"GET / HTTP/1.1\r\nHost: app\r\nConnection: host, close\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 200 OK"), "{raw}");
    assert_eq!(
        *authority.lock().unwrap(),
        [(http::Version::HTTP_2, Some("app".to_string()))]
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_targets_are_refused_unless_valid_for_their_method() {
    let (up, seen) = raw_upstream(OK).await;
    let tg = Tollgate::start(&app(up.addr, |u| u.protocol("http1"))).await;
    for line in [
        "POST * HTTP/1.1",
        "GET * HTTP/1.1",
        "GET app:80 HTTP/1.1",
        "GET ftp://app/x HTTP/1.1",
    ] {
        let raw = raw_exchange(
            tg.addr,
            format!("{line}\r\nHost: app\r\nContent-Length: 0\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(raw.starts_with("HTTP/1.1 400 "), "{line}: {raw}");
    }
    assert_eq!(requests(&seen), Vec::<String>::new(), "nothing forwarded");

    // An absolute-form target with an empty path means `/`; OPTIONS * goes as it came.
    let raw = raw_exchange(
        tg.addr,
        b"GET http://app?x=1 HTTP/1.1\r\nHost: app\r\n\r\n\
          OPTIONS * HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw.matches("HTTP/1.1 200 OK").count(), 2, "{raw}");
    assert!(
        saw(&seen, "GET /?x=1 HTTP/1.1\r\n").is_some(),
        "{:?}",
        requests(&seen)
    );
    assert!(
        saw(&seen, "OPTIONS * HTTP/1.1\r\n").is_some(),
        "{:?}",
        requests(&seen)
    );

    // HTTP/2: `:path: *` is for OPTIONS only.
    let (mut h2, conn) = h2_client(tg.addr).await;
    let star = http::Uri::from_parts({
        let mut p = http::uri::Parts::default();
        p.scheme = Some(http::uri::Scheme::HTTP);
        p.authority = Some("app".parse().unwrap());
        p.path_and_query = Some("*".parse().unwrap());
        p
    })
    .unwrap();
    let resp = h2
        .send_request(
            Request::post(star.clone())
                .version(http::Version::HTTP_2)
                .body(empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = h2
        .send_request(
            Request::options(star)
                .version(http::Version::HTTP_2)
                .body(empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    conn.abort();
    assert!(saw(&seen, "POST * ").is_none(), "{:?}", requests(&seen));
    assert_eq!(requests(&seen).len(), 3, "{:?}", requests(&seen));
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_content_lengths_are_one_value_on_both_sides() {
    let (up, seen) = raw_upstream(OK).await;
    let tg = Tollgate::start(&app(up.addr, |u| u)).await;
    for (n, framing) in [
        "Content-Length: 5, 5\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
    ]
    .iter()
    .enumerate()
    {
        let raw = raw_exchange(
            tg.addr,
            format!(
                "POST /same-{n} HTTP/1.1\r\nHost: app\r\nConnection: close\r\n{framing}\r\nhello"
            )
            .as_bytes(),
        )
        .await;
        assert!(raw.starts_with("HTTP/1.1 200 OK"), "{framing:?}: {raw}");
        let got = saw(&seen, &format!("POST /same-{n} ")).unwrap();
        assert_eq!(field_values(&got, "content-length"), ["5"], "{got}");
        assert!(got.ends_with("\r\n\r\nhello"), "{got}");
    }
    let raw = raw_exchange(
        tg.addr,
        b"POST /huge HTTP/1.1\r\nHost: app\r\nContent-Length: 9223372036854775808\r\n\r\nhello",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 400 "), "{raw}");
    assert!(saw(&seen, "POST /huge").is_none());
    tg.stop().await;

    // The same rule for what an upstream answers.
    for (answer, expect) in [
        (
            &b"HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\nabc"[..],
            Some("abc"),
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            Some("abc"),
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\nabc", None),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
            None,
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775808\r\n\r\nabc",
            None,
        ),
    ] {
        let (up, _) = raw_upstream(answer).await;
        let tg = Tollgate::start(&app(up.addr, |u| u)).await;
        let raw = raw_exchange(
            tg.addr,
            b"GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n",
        )
        .await;
        let shown = String::from_utf8_lossy(answer);
        match expect {
            Some(body) => {
                assert!(raw.starts_with("HTTP/1.1 200 OK"), "{shown}: {raw}");
                assert_eq!(field_values(&raw, "content-length"), ["3"], "{raw}");
                assert!(raw.ends_with(&format!("\r\n\r\n{body}")), "{raw}");
            }
            None => assert!(raw.starts_with("HTTP/1.1 502 "), "{shown}: {raw}"),
        }
        tg.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lenient_chunk_size_line_is_never_forwarded() {
    let (up, seen) = raw_upstream(OK).await;
    let tg = Tollgate::start(&app(up.addr, |u| u)).await;
    for (n, line) in ["5;a\nb", "5garbage", "5 ", "5;a=\"x", "5;a\rb"]
        .iter()
        .enumerate()
    {
        let raw = raw_exchange(
            tg.addr,
            format!(
                "POST /chunk-{n} HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n\
                 {line}\r\nhello\r\n0\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert!(raw.starts_with("HTTP/1.1 400 "), "{line:?}: {raw}");
        assert!(
            saw(&seen, &format!("POST /chunk-{n} ")).is_none(),
            "{line:?}"
        );
    }
    // Extensions as the grammar writes them pass; the body goes on without them.
    let raw = raw_exchange(
        tg.addr,
        b"POST /ext HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          5 ; name = \"v \\\" ;\" ;flag\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 200 OK"), "{raw}");
    let got = saw(&seen, "POST /ext ").unwrap();
    assert!(got.ends_with("\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), "{got:?}");
    tg.stop().await;
}

/// An app whose chunked body is malformed gets a 400, and the upstream is not blamed:
/// the cut attempt counts as `cancelled`, not as a `reset`, and is not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_body_from_the_app_is_the_apps_fault() {
    for protocol in ["http1", "h2c"] {
        let up = Upstream::start(|req: Request<hyper::body::Incoming>| async move {
            match req.into_body().collect().await {
                Ok(_) => respond(200, "read whole"),
                Err(_) => respond(499, "cut"),
            }
        })
        .await;
        let tg = Tollgate::start(&app(up.addr, |u| {
            u.protocol(protocol)
                .retry(|r| r.methods(["POST"]).on(["reset", "connect-failure", "502"]))
        }))
        .await;
        let mut s = TcpStream::connect(tg.addr).await.unwrap();
        s.write_all(
            b"POST /bad HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        )
        .await
        .unwrap();
        // The upstream is reached and reads the first chunk before the malformed one.
        assert!(wait_until(std::time::Duration::from_secs(5), || up.hits() == 1).await);
        s.write_all(b"zz\r\nmore\r\n0\r\n\r\n").await.unwrap();
        let raw = read_until_close(&mut s).await;
        assert!(raw.starts_with("HTTP/1.1 400 "), "{protocol}: {raw}");
        assert!(
            raw.to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "{raw}"
        );
        let m = tg.metrics().await;
        let attempts = |result: &str| {
            metric(
                &m,
                &format!("tollgate_attempts_total{{result=\"{result}\",upstream=\"app\"}}"),
            )
            .unwrap()
        };
        assert_eq!(
            attempts("reset"),
            0.0,
            "{protocol}: not the upstream's fault"
        );
        assert_eq!(attempts("cancelled"), 1.0, "{protocol}");
        assert_eq!(up.hits(), 1, "{protocol}: not retried");
        assert_eq!(
            metric(
                &m,
                "tollgate_requests_total{code=\"400\",outcome=\"not-retryable\",upstream=\"app\"}"
            ),
            Some(1.0),
            "{protocol}"
        );
        tg.stop().await;
    }
}
