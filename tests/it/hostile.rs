//! Hostile and malformed input from the client side, over real sockets: oversized heads,
//! slowloris, request smuggling, malformed request lines and Host headers, open-proxy
//! attempts, CONNECT, oversized bodies and connection floods. Each case gets the right
//! status or a closed connection, and tollgate keeps serving everyone else: every test
//! ends with (and several interleave) a normal request that succeeds.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::config::{Config, Listener, Retry};
use common::*;
use http::Response;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

/// What the upstream received: method, path, the framing headers and the body.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    method: String,
    path: String,
    content_length: Option<String>,
    transfer_encoding: Option<String>,
    body: Vec<u8>,
}

/// An upstream that records every request it receives and answers `200 ok`.
async fn recording_upstream() -> (Upstream, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let up = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let header = |n: &str| {
                req.headers()
                    .get(n)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            };
            let mut s = Seen {
                method: req.method().to_string(),
                path: req.uri().to_string(),
                content_length: header("content-length"),
                transfer_encoding: header("transfer-encoding"),
                body: Vec::new(),
            };
            s.body = req.into_body().collect().await.unwrap().to_bytes().to_vec();
            log.lock().unwrap().push(s);
            respond(200, "ok")
        }
    })
    .await;
    (up, seen)
}

fn app(addr: SocketAddr, listener: impl FnOnce(Listener) -> Listener) -> String {
    app_with(addr, listener, |u| u).to_toml()
}

/// `[upstreams.app]` to `addr` with roomy timeouts and what `upstream` sets, behind a
/// listener set by `listener`.
fn app_with(
    addr: SocketAddr,
    listener: impl FnOnce(Listener) -> Listener,
    upstream: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> Config {
    Config::new().listener(listener).upstream("app", |u| {
        let u = u.authorities(["app"]).endpoint(addr).attempt_timeout("5s");
        upstream(u.request_timeout("10s").connect_timeout("2s"))
    })
}

/// The listener setting that makes an authority no upstream lists a `404 no-route`
/// (passed through as it is otherwise: `tests/it/passthrough.rs`).
fn refuse(l: Listener) -> Listener {
    l.unknown_authorities("refuse")
}

/// A normal request through tollgate succeeds.
async fn still_serving(tg: &Tollgate) {
    let r = get(tg.addr, "/normal", "app").await;
    assert_eq!(r.status, 200, "a normal request after the hostile one");
}

/// Writes `bytes` on a fresh connection and reads until tollgate closes it (bounded).
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    read_to_close(&mut s).await
}

async fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let limit = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(limit, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "tollgate did not close the connection; read so far: {}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status codes of every response in a raw HTTP/1.1 byte stream.
fn statuses(raw: &str) -> Vec<u16> {
    raw.split("HTTP/1.1 ")
        .skip(1)
        .filter_map(|r| r.get(..3).and_then(|c| c.parse().ok()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_head_gets_431() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, |l| {
        l.max_header_bytes("4KiB").max_headers(20)
    }))
    .await;

    // Just under the configured size: served.
    let r = send(
        tg.addr,
        request("GET", "/fits", "app")
            .header("x-big", "a".repeat(3000))
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);

    // One big header over the size.
    let raw = exchange(
        tg.addr,
        format!(
            "GET /big HTTP/1.1\r\nHost: app\r\nX-Big: {}\r\n\r\n",
            "a".repeat(6000)
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(statuses(&raw), vec![431], "{raw}");

    // A huge one, far over any buffer, is refused as soon as the limit is passed.
    let raw = exchange(
        tg.addr,
        format!(
            "GET /huge HTTP/1.1\r\nHost: app\r\nX-Big: {}\r\n\r\n",
            "a".repeat(200_000)
        )
        .as_bytes(),
    )
    .await;
    assert!(
        statuses(&raw) == vec![431] || raw.is_empty(),
        "431 or closed: {raw}"
    );

    // A long request line counts against the same limit.
    let raw = exchange(
        tg.addr,
        format!("GET /{} HTTP/1.1\r\nHost: app\r\n\r\n", "p".repeat(6000)).as_bytes(),
    )
    .await;
    let st = statuses(&raw);
    assert!(st == vec![431] || st == vec![414], "{raw}");

    // More header fields than max_headers.
    let many: String = (0..30).map(|i| format!("X-H{i}: v\r\n")).collect();
    let raw = exchange(
        tg.addr,
        format!("GET /many HTTP/1.1\r\nHost: app\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert_eq!(statuses(&raw), vec![431], "{raw}");
    // Up to max_headers is fine.
    let fewer: String = (0..15).map(|i| format!("X-H{i}: v\r\n")).collect();
    let raw = exchange(
        tg.addr,
        format!("GET /fewer HTTP/1.1\r\nHost: app\r\nConnection: close\r\n{fewer}\r\n").as_bytes(),
    )
    .await;
    assert_eq!(statuses(&raw), vec![200], "{raw}");

    let paths: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(
        paths,
        ["/fits", "/fewer"],
        "refused heads never reach the upstream"
    );
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_h2_header_list_is_refused() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, |l| l.max_header_bytes("4KiB"))).await;
    let (mut sender, conn) = h2_client(tg.addr).await;
    let req = request("GET", "http://app/big", "app")
        .header("x-big", "a".repeat(8000))
        .body(empty())
        .unwrap();
    match sender.send_request(req).await {
        Ok(resp) => assert_eq!(resp.status(), 431),
        // The client may refuse to send what the server announced it will not take.
        Err(e) => assert!(!e.is_canceled(), "{e}"),
    }
    conn.abort();
    assert!(seen.lock().unwrap().is_empty());
    let r = send_h2(tg.addr, request("GET", "/", "app").body(empty()).unwrap()).await;
    assert_eq!(r.status, 200);
    tg.stop().await;
}

/// Dribbles `bytes` one at a time every `every`, while a reader waits for the close.
/// Returns how many bytes were written before tollgate closed the connection, and
/// how long after the first byte that was.
async fn dribble(addr: SocketAddr, bytes: &[u8], every: Duration) -> Option<(usize, Duration)> {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let closed = tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        let mut got = Vec::new();
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return (Instant::now(), got),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    });
    let first = Instant::now();
    for (i, b) in bytes.iter().enumerate() {
        if closed.is_finished() {
            let (at, got) = closed.await.unwrap();
            assert!(
                got.is_empty() || String::from_utf8_lossy(&got).starts_with("HTTP/1.1 408"),
                "nothing but a timeout answer: {}",
                String::from_utf8_lossy(&got)
            );
            return Some((i, at - first));
        }
        if w.write_all(&[*b]).await.is_err() {
            let (at, _) = closed.await.unwrap();
            return Some((i, at - first));
        }
        tokio::time::sleep(every).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dribbled_head_is_cut_off_after_header_read_timeout() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, |l| {
        l.header_read_timeout("500ms").idle_timeout("30s")
    }))
    .await;
    let addr = tg.addr;
    let mut head = b"GET /slow HTTP/1.1\r\nHost: app\r\n".to_vec();
    head.extend(std::iter::repeat_n(b'x', 400));
    let slow = tokio::spawn(async move { dribble(addr, &head, Duration::from_millis(20)).await });

    // Everyone else is served meanwhile.
    for _ in 0..3 {
        still_serving(&tg).await;
    }
    let (written, after) = slow
        .await
        .unwrap()
        .expect("the slow head was never cut off");
    assert!(
        after >= Duration::from_millis(500),
        "cut off before header_read_timeout: {after:?}"
    );
    assert!(written < 400, "cut off mid-head");
    assert!(
        seen.lock().unwrap().iter().all(|s| s.path != "/slow"),
        "the slow request never reached the upstream"
    );
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dribbled_http2_preface_is_cut_off_after_header_read_timeout() {
    let (up, _seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, |l| {
        l.header_read_timeout("500ms").idle_timeout("30s")
    }))
    .await;
    // The preface byte by byte: while the bytes still match it, tollgate cannot tell
    // HTTP/2 from HTTP/1.1 yet, but the head limit still runs from the first byte.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let cut = dribble(tg.addr, preface, Duration::from_millis(150)).await;
    let (written, after) = cut.expect("the dribbled preface was never cut off");
    assert!(
        written < preface.len(),
        "cut off before the preface was whole"
    );
    assert!(after >= Duration::from_millis(500), "{after:?}");
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_outlives_header_read_timeout_until_idle_timeout() {
    let (up, _seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, |l| {
        l.header_read_timeout("300ms").idle_timeout("1500ms")
    }))
    .await;
    let stream = TcpStream::connect(tg.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let mut conn = tokio::spawn(conn);
    let resp = sender
        .send_request(request("GET", "/1", "app").body(empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(read(resp).await.status, 200);

    // Idle for longer than header_read_timeout: an idle connection is not a slow head.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !conn.is_finished(),
        "closed while idle for less than idle_timeout"
    );
    // Taken before the request: tollgate's idle clock starts only once it has answered.
    let idle_from = Instant::now();
    let resp = sender
        .send_request(request("GET", "/2", "app").body(empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(read(resp).await.status, 200);

    // Then idle_timeout closes it.
    let ended = timeout(Duration::from_secs(10), &mut conn).await;
    assert!(ended.is_ok(), "the idle connection was never closed");
    assert!(
        idle_from.elapsed() >= Duration::from_millis(1500),
        "closed before idle_timeout: {:?}",
        idle_from.elapsed()
    );
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_with_chunked_cannot_smuggle_a_request() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, |l| l)).await;

    // CL.TE and TE.CL: refused (or, were it read, as chunked with the connection closed
    // after the response); what follows the chunked body is never read.
    for (n, framing) in [
        "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
        "Content-Length: 100\r\nTransfer-Encoding: chunked\r\n",
    ]
    .iter()
    .enumerate()
    {
        let raw = exchange(
            tg.addr,
            format!(
                "POST /cl-te-{n} HTTP/1.1\r\nHost: app\r\n{framing}\r\n\
                 5\r\nhello\r\n0\r\n\r\n\
                 GET /smuggled HTTP/1.1\r\nHost: app\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        let st = statuses(&raw);
        assert!(st == vec![200] || st == vec![400], "{framing}: {raw}");
        if st == vec![200] {
            let last = seen.lock().unwrap().last().cloned().unwrap();
            assert_eq!(last.path, format!("/cl-te-{n}"));
            assert_eq!(
                last.body, b"hello",
                "{framing}: the chunked body, not 4 bytes"
            );
            assert_ne!(
                last.content_length.as_deref(),
                Some("4"),
                "{framing}: the stale Content-Length is not forwarded"
            );
            assert_ne!(last.content_length.as_deref(), Some("100"));
        }
    }

    // Conflicting Content-Lengths: 400, nothing forwarded.
    for framing in [
        "Content-Length: 5\r\nContent-Length: 6\r\n",
        "Content-Length: 5, 6\r\n",
        "Content-Length: +5\r\n",
        "Content-Length: -5\r\n",
        "Content-Length: 0x5\r\n",
        "Transfer-Encoding: chunked, identity\r\n",
        "Transfer-Encoding: identity\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        "Transfer-Encoding : chunked\r\n",
        " Transfer-Encoding: chunked\r\n",
    ] {
        let raw = exchange(
            tg.addr,
            format!(
                "POST /bad HTTP/1.1\r\nHost: app\r\n{framing}\r\nhello\
                 GET /smuggled HTTP/1.1\r\nHost: app\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(statuses(&raw), vec![400], "{framing:?}: {raw}");
    }
    // Chunked in HTTP/1.0 does not exist.
    let raw = exchange(
        tg.addr,
        b"POST /bad HTTP/1.0\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert!(raw.contains(" 400 "), "{raw}");

    // Repeated identical Content-Lengths are one length (RFC 9110 section 8.6), and a
    // pipelined request after the body is a request of its own, framed afresh.
    let raw = exchange(
        tg.addr,
        b"POST /same HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello\
          POST /next HTTP/1.1\r\nHost: app\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    )
    .await;
    assert_eq!(statuses(&raw), vec![200, 200], "{raw}");

    // `Connection: content-length` cannot strip the framing of a forwarded request.
    let raw = exchange(
        tg.addr,
        b"POST /conn-cl HTTP/1.1\r\nHost: app\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello\
          GET /after HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&raw), vec![200, 200], "{raw}");

    let log = seen.lock().unwrap().clone();
    assert!(
        log.iter()
            .all(|s| s.path != "/smuggled" && s.path != "/bad")
    );
    let by_path = |p: &str| log.iter().find(|s| s.path == p).cloned().unwrap();
    assert_eq!(by_path("/same").body, b"hello");
    assert_eq!(by_path("/next").body, b"abc");
    assert_eq!(by_path("/conn-cl").body, b"hello");
    assert_eq!(by_path("/after").body, b"");
    assert_eq!(by_path("/after").method, "GET");
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_body_longer_than_its_content_length_is_not_forwarded_whole() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, |l| l)).await;
    let (mut sender, conn) = h2_client(tg.addr).await;
    let req = request("POST", "http://app/h2-cl", "app")
        .header("content-length", "5")
        .body(full("hello GET /smuggled HTTP/1.1\r\nHost: app\r\n\r\n"))
        .unwrap();
    let status = match sender.send_request(req).await {
        Ok(resp) => resp.status().as_u16(),
        Err(_) => 0,
    };
    conn.abort();
    assert_ne!(status, 200, "a body that overruns its length is an error");
    let log = seen.lock().unwrap().clone();
    assert!(log.iter().all(|s| s.path != "/smuggled"), "{log:?}");
    assert!(
        log.iter().all(|s| s.path != "/h2-cl" || s.body.len() <= 5),
        "{log:?}"
    );
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_request_lines_get_400_or_a_closed_connection() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, |l| l)).await;
    for bad in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\nHost: app\r\n\r\n",
        b"GET  / HTTP/1.1\r\nHost: app\r\n\r\n",
        b"GET / HTTP/1.1\rHost: app\r\n\r\n",
        b"G(T / HTTP/1.1\r\nHost: app\r\n\r\n",
        b"GET /\x00 HTTP/1.1\r\nHost: app\r\n\r\n",
        b"GET / HTTP/9.9\r\nHost: app\r\n\r\n",
        b"GET / FTP/1.1\r\nHost: app\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: app\r\nBad Header: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: app\r\nX: a\x01b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: app\r\n folded: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: app\r\nX: a\r\n  folded\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all",
        b"\r\n\r\n\r\n\r\n\r\n",
        b"\xff\xfe\xfd\xfc\r\n\r\n",
    ] {
        let raw = exchange(tg.addr, bad).await;
        let st = statuses(&raw);
        assert!(
            st.is_empty() || st.iter().all(|s| (400..=505).contains(s) && *s != 404),
            "{:?}: {raw}",
            String::from_utf8_lossy(bad)
        );
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing malformed was forwarded"
    );
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_or_ambiguous_host_headers_are_refused() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, refuse)).await;

    // Two Host lines (RFC 9112 section 3.2: 400), whichever comes first.
    for hosts in [
        "Host: app\r\nHost: evil.example\r\n",
        "Host: evil.example\r\nHost: app\r\n",
        "Host: app\r\nHost: app\r\n",
    ] {
        let raw = exchange(
            tg.addr,
            format!("GET /dup HTTP/1.1\r\n{hosts}Connection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert_eq!(statuses(&raw), vec![400], "{hosts:?}: {raw}");
    }
    // Values that are no authority at all.
    for host in [
        "app evil",
        "app@evil.example",
        "evil.example@app",
        "app:notaport",
        "app/path",
        "app?x",
        "[::1",
    ] {
        let raw = exchange(
            tg.addr,
            format!("GET /invalid HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        assert_eq!(statuses(&raw), vec![400], "{host:?}: {raw}");
    }
    // A valid Host no upstream claims: 404 no-route.
    let r = get(tg.addr, "/", "unknown.example").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.outcome(), Some("no-route"));
    // No Host at all (HTTP/1.0): nothing to route by.
    let raw = exchange(tg.addr, b"GET /none HTTP/1.0\r\n\r\n").await;
    assert_eq!(statuses(&raw), Vec::<u16>::new(), "{raw}");
    assert!(raw.starts_with("HTTP/1.0 404"), "{raw}");

    assert!(seen.lock().unwrap().is_empty(), "nothing was forwarded");
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_unknown_authorities_makes_no_open_proxy() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, refuse)).await;
    let endpoint = up.addr;
    for target in [
        "http://evil.example/".to_string(),
        "http://evil.example:80/x".to_string(),
        "https://evil.example/".to_string(),
        // The upstream's own address is not one of its authorities.
        format!("http://{endpoint}/"),
        "http://app.evil.example/".to_string(),
        "http://evil.example./".to_string(),
    ] {
        // The Host header names a configured upstream: the request target still wins.
        let raw = exchange(
            tg.addr,
            format!("GET {target} HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert_eq!(statuses(&raw), vec![404], "{target}: {raw}");
        assert!(raw.contains("x-tollgate-outcome: no-route"), "{raw}");
    }
    // Userinfo in the target is no way around the route either.
    for target in ["http://app@evil.example/", "http://evil.example@app/"] {
        let raw = exchange(
            tg.addr,
            format!("GET {target} HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        let st = statuses(&raw);
        assert!(st == vec![400] || st == vec![404], "{target}: {raw}");
    }
    // Authority-form is only for CONNECT.
    let raw = exchange(
        tg.addr,
        b"GET evil.example:80 HTTP/1.1\r\nHost: evil.example:80\r\nConnection: close\r\n\r\n",
    )
    .await;
    let st = statuses(&raw);
    assert!(st == vec![400] || st == vec![404], "{raw}");
    // The configured name in absolute form works (HTTP_PROXY).
    let raw = exchange(
        tg.addr,
        b"GET http://app/ok HTTP/1.1\r\nHost: whatever\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&raw), vec![200], "{raw}");

    let paths: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(paths, ["/ok"]);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_unknown_authorities_tunnels_no_connect() {
    let (up, seen) = recording_upstream().await;
    let tg = Tollgate::start(&app(up.addr, refuse)).await;
    let endpoint = up.addr;

    // To a configured authority: served as HTTP when HTTP comes (tests/it/connect.rs);
    // other bytes go to the authority as named, never to anything else.
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(b"CONNECT app:443 HTTP/1.1\r\nHost: app:443\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // Bytes that are not HTTP go to `app:443` as named (which does not resolve here),
    // not to the upstream's endpoints.
    let _ = s.write_all(b"\x16\x03\x01 raw tunnel bytes\r\n\r\n").await;
    let rest = read_to_close(&mut s).await;
    assert!(rest.is_empty(), "{rest}");

    // To anything else, including the upstream's own address: refused, never dialled.
    for target in ["evil.example:443".to_string(), endpoint.to_string()] {
        let raw = exchange(
            tg.addr,
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await;
        let st = statuses(&raw);
        assert!(st == vec![404] || st == vec![405], "{target}: {raw}");
    }
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(up.hits(), 0, "the upstream never saw a CONNECT");
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_forwarded_whole_but_not_retried() {
    let ok = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let (hash, len) = hash_body(req.into_body()).await;
        respond(200, format!("{hash} {len}"))
    })
    .await;
    let failing = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let _ = req.into_body().collect().await;
        respond(503, "down")
    })
    .await;
    let retry = |r: Retry| r.max_attempts(3).max_body("1KiB").backoff_base("1ms");
    let config = app_with(ok.addr, |l| l, |u| u.retry(retry)).upstream("down", |u| {
        u.authorities(["down"]).endpoint(failing.addr).retry(retry)
    });
    let tg = Tollgate::start(&config.to_toml()).await;

    let len = 256 * 1024;
    let r = send(
        tg.addr,
        request("PUT", "/big", "app")
            .body(http_body_util::BodyExt::boxed(Generated::new(7, len)))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("{} {len}", Generated::expected_hash(7, len)),
        "the whole body reached the upstream, unchanged"
    );
    assert_eq!(r.attempts(), 1);

    let r = send(
        tg.addr,
        request("PUT", "/big", "down")
            .body(http_body_util::BodyExt::boxed(Generated::new(8, len)))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.outcome(), Some("body-too-large"));
    assert_eq!(r.attempts(), 1);
    assert_eq!(failing.hits(), 1, "too big to replay: not retried");

    // A small body to the same upstream is retried.
    let r = send(
        tg.addr,
        request("PUT", "/small", "down")
            .body(full("small"))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.outcome(), Some("attempts-exhausted"));
    assert_eq!(failing.hits(), 4);
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"body-too-large\",upstream=\"down\"}"
        ),
        Some(1.0)
    );
    still_serving(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_max_connections_are_closed_at_once() {
    let up = Upstream::start(|_req| async { Response::new(full("ok")) }).await;
    let tg = Tollgate::start(&app(up.addr, |l| l.max_connections(3))).await;

    async fn open(
        addr: SocketAddr,
    ) -> (
        hyper::client::conn::http1::SendRequest<BoxBody>,
        tokio::task::JoinHandle<()>,
    ) {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let resp = sender
            .send_request(request("GET", "/", "app").body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(read(resp).await.status, 200);
        (sender, conn)
    }
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(open(tg.addr).await);
    }
    // The fourth is accepted by the kernel and closed by tollgate without a word.
    for _ in 0..3 {
        let mut s = TcpStream::connect(tg.addr).await.unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: app\r\n\r\n").await;
        let raw = read_to_close(&mut s).await;
        assert_eq!(raw, "", "over the limit: closed at once");
    }
    // The ones within the limit keep working.
    for (sender, _) in held.iter_mut() {
        let resp = sender
            .send_request(request("GET", "/again", "app").body(empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(read(resp).await.status, 200);
    }
    // One closes: a newcomer gets its place.
    let (sender, conn) = held.pop().unwrap();
    drop(sender);
    conn.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = TcpStream::connect(tg.addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        if statuses(&read_to_close(&mut s).await) == vec![200] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed place was never reused"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(held);
    tg.stop().await;
}

/// An answer that comes before the app has sent its small body (an upstream that
/// answers without reading it, a refusal) keeps the connection, as nginx does: the
/// body is read and thrown away when it comes, and the app's next request on the
/// connection is served. Python `requests` writes head and body apart, so its pooled
/// connection closed under it (and an error in the app) was the other way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_to_a_small_body_keeps_the_connection() {
    let up = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let tg = Tollgate::start(&app(up.addr, refuse)).await;
    for (host, status) in [("app", 200), ("unknown.example", 404)] {
        let mut s = TcpStream::connect(tg.addr).await.unwrap();
        s.write_all(
            format!("POST / HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        // The answer comes before the body is sent.
        let first = read_one_response(&mut s).await;
        assert_eq!(statuses(&first), vec![status], "{host}: {first}");
        assert!(
            !first.to_ascii_lowercase().contains("connection: close"),
            "{host}: the answer closes the connection: {first}"
        );
        s.write_all(b"hello").await.unwrap();
        s.write_all(
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let next = read_to_close(&mut s).await;
        assert_eq!(
            statuses(&next),
            vec![status],
            "{host}: the next request: {next}"
        );
    }
    tg.stop().await;
}

/// When tollgate answers before it has read the request body (no route, the upstream
/// unreachable, overloaded), hyper closes the connection after the response because
/// the rest of the body cannot be skipped; but the response does not say so. An app
/// whose client then reuses the connection gets a reset instead of an answer, and
/// many clients retry that themselves, behind tollgate's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_to_an_unread_body_announces_the_close() {
    let dead = dead_port().await;
    let tg = Tollgate::start(&app(dead, |l| l)).await;
    for host in ["app", "unknown.example"] {
        let body = vec![b'x'; 100 * 1024];
        let mut s = TcpStream::connect(tg.addr).await.unwrap();
        s.write_all(
            format!(
                "PUT /big HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let _ = s.write_all(&body).await;
        let mut buf = vec![0u8; 8192];
        let n = timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
        assert!(
            head.starts_with("http/1.1 50") || head.starts_with("http/1.1 404"),
            "{head}"
        );
        if head.contains("connection: close") {
            continue;
        }
        // Not announced: then the connection must still serve the next request.
        let _ = s
            .write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .await;
        let next = read_to_close(&mut s).await;
        assert!(
            next.starts_with("HTTP/1.1 "),
            "{host}: a keep-alive connection closed under the app's next request"
        );
    }
    tg.stop().await;
}
