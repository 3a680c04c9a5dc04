//! The hop itself: routing by authority, HTTP/1.1 and HTTP/2 cleartext, streaming in both
//! directions, header hygiene, and tollgate never being an open proxy.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::config::Config;
use common::*;
use http::{HeaderMap, HeaderValue, Response};
use http_body_util::BodyExt;

fn echo_upstream(
    name: &'static str,
) -> impl Fn(http::Request<hyper::body::Incoming>) -> std::future::Ready<Response<BoxBody>>
+ Send
+ Sync
+ 'static {
    move |req| {
        let host = req
            .headers()
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = format!("{name} {} {} host={host}", req.method(), req.uri());
        std::future::ready(Response::new(full(body)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_host_and_absolute_form_and_refuses_the_rest() {
    let a = Upstream::start(echo_upstream("a")).await;
    let b = Upstream::start(echo_upstream("b")).await;
    let tg = Tollgate::start(
        &Config::new()
            .listener(|l| l.unknown_authorities("refuse"))
            .upstream("a", |u| {
                u.authorities(["alpha", "alpha.default.svc.cluster.local"])
                    .endpoint(a.addr)
            })
            .upstream("b", |u| u.authorities(["beta:8080"]).endpoint(b.addr))
            .to_toml(),
    )
    .await;

    let r = get(tg.addr, "/x?q=1", "alpha").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "a GET /x?q=1 host=alpha");
    assert_eq!(r.attempts(), 1);
    assert_eq!(r.outcome(), None);

    let r = get(tg.addr, "/", "Alpha.Default.Svc.Cluster.Local:80").await;
    assert_eq!(r.status, 200, "case and port of the Host do not matter");

    let r = get(tg.addr, "/y", "beta:8080").await;
    assert_eq!(r.body, "b GET /y host=beta:8080");

    // HTTP_PROXY style: absolute-form request line; the upstream sees origin-form.
    let req = request("GET", "http://alpha/proxied?z=2", "ignored")
        .body(empty())
        .unwrap();
    let r = send(tg.addr, req).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "a GET /proxied?z=2 host=alpha");

    for host in ["unknown", "beta", "beta:9999", "evil.example.com"] {
        let r = get(tg.addr, "/", host).await;
        assert_eq!(r.status, 404, "{host}");
        assert_eq!(r.outcome(), Some("no-route"), "{host}");
    }
    let req = request("GET", "http://evil.example.com/", "alpha")
        .body(empty())
        .unwrap();
    let r = send(tg.addr, req).await;
    assert_eq!(
        r.status, 404,
        "an absolute-form URI to an unconfigured host is refused"
    );
    assert_eq!(a.hits() + b.hits(), 4);

    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"404\",outcome=\"no-route\",upstream=\"\"}"
        ),
        Some(5.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedicated_port_routes_whatever_the_host() {
    let a = Upstream::start(echo_upstream("a")).await;
    let port = free_port();
    let tg = Tollgate::start(
        &Config::new()
            .listener(|l| l.unknown_authorities("refuse"))
            .upstream("a", |u| {
                u.listen(format!("127.0.0.1:{port}"))
                    .endpoint(a.addr)
                    .host("api.example")
            })
            .to_toml(),
    )
    .await;
    let addr = tg.server().listen_addr("a").unwrap();
    let r = get(addr, "/z", "anything").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body, "a GET /z host=api.example",
        "the configured host is sent upstream"
    );
    let r = get(tg.addr, "/z", "anything").await;
    assert_eq!(r.status, 404, "the main listener still routes by authority");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_h2c_end_to_end_with_trailers() {
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        assert_eq!(req.version(), http::Version::HTTP_2, "h2 in, h2c out");
        let te = req.headers().get("te").cloned();
        let timeout = req.headers().get("grpc-timeout").cloned();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("x-te", te.unwrap_or(HeaderValue::from_static("none")));
        trailers.insert(
            "x-grpc-timeout",
            timeout.unwrap_or(HeaderValue::from_static("none")),
        );
        let mut echo = body.to_vec();
        echo.reverse();
        Response::builder()
            .header("content-type", "application/grpc")
            .body(
                WithTrailers {
                    data: Some(echo.into()),
                    trailers: Some(trailers),
                }
                .boxed(),
            )
            .unwrap()
    })
    .await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("greeter", |u| u.authorities(["greeter"]).endpoint(up.addr))
            .to_toml(),
    )
    .await;
    let frame = b"\x00\x00\x00\x00\x05hello".to_vec();
    let req = http::Request::builder()
        .method("POST")
        .uri("http://greeter/helloworld.Greeter/SayHello")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "1S")
        .body(full(frame.clone()))
        .unwrap();
    let r = send_h2(tg.addr, req).await;
    assert_eq!(r.status, 200);
    let mut expected = frame;
    expected.reverse();
    assert_eq!(r.body.to_vec(), expected);
    let t = r.trailers.expect("trailers pass through");
    assert_eq!(t["grpc-status"], "0");
    assert_eq!(t["x-te"], "trailers", "TE: trailers reaches a gRPC server");
    let sent: u64 = t["x-grpc-timeout"]
        .to_str()
        .unwrap()
        .trim_end_matches(|c: char| c.is_alphabetic())
        .parse()
        .unwrap();
    assert!(sent > 0, "grpc-timeout is rewritten, not dropped");
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_removed_both_ways() {
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let mut names: Vec<String> = req.headers().keys().map(|k| k.to_string()).collect();
        names.sort();
        Response::builder()
            .header("connection", "x-resp-hop")
            .header("x-resp-hop", "1")
            .header("keep-alive", "timeout=5")
            .header("proxy-connection", "keep-alive")
            .header("x-resp-end", "kept")
            .body(full(names.join(",")))
            .unwrap()
    })
    .await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("a", |u| u.authorities(["a"]).endpoint(up.addr))
            .to_toml(),
    )
    .await;
    let req = request("GET", "/", "a")
        .header("connection", "x-req-hop")
        .header("x-req-hop", "secret")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("upgrade", "websocket")
        .header("x-req-end", "kept")
        .body(empty())
        .unwrap();
    let r = send(tg.addr, req).await;
    let seen = String::from_utf8(r.body.to_vec()).unwrap();
    for hop in ["x-req-hop", "keep-alive", "proxy-authorization", "upgrade"] {
        assert!(
            !seen.split(',').any(|h| h == hop),
            "{hop} reached the upstream: {seen}"
        );
    }
    assert!(seen.split(',').any(|h| h == "x-req-end"));
    for hop in ["x-resp-hop", "keep-alive", "proxy-connection"] {
        assert!(r.headers.get(hop).is_none(), "{hop} reached the app");
    }
    assert_eq!(r.header("x-resp-end"), Some("kept"));
    tg.stop().await;
}

/// Request heads are read into header maps, and response fields listed, that the next
/// request reuses: nothing of one request may show in the next, either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_one_request_shows_in_the_next() {
    use tokio::io::AsyncWriteExt;
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let mut names: Vec<String> = req
            .headers()
            .keys()
            .map(|k| k.to_string())
            .filter(|k| k.starts_with("x-asked") || k.starts_with("x-only"))
            .collect();
        names.sort();
        let mut resp = Response::builder();
        if req.uri().path() == "/first" {
            for i in 0..20 {
                resp = resp.header(format!("x-first-{i}"), "1");
            }
        }
        resp.body(full(names.join(","))).unwrap()
    })
    .await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("a", |u| u.authorities(["a"]).endpoint(up.addr))
            .to_toml(),
    )
    .await;
    let mut s = tokio::net::TcpStream::connect(tg.addr).await.unwrap();
    let many: String = (0..20).map(|i| format!("x-asked-{i}: 1\r\n")).collect();
    for round in 0..3 {
        let first = format!("GET /first HTTP/1.1\r\nhost: a\r\n{many}\r\n");
        s.write_all(first.as_bytes()).await.unwrap();
        let got = raw_response(&mut s).await;
        assert!(got.contains("x-asked-19"), "round {round}: {got}");
        assert!(got.contains("x-first-19: 1"), "round {round}: {got}");
        s.write_all(b"GET /second HTTP/1.1\r\nhost: a\r\nx-only: 1\r\n\r\n")
            .await
            .unwrap();
        let got = raw_response(&mut s).await;
        let body = got.split("\r\n\r\n").nth(1).unwrap_or("");
        assert_eq!(body, "x-only", "round {round}: the upstream saw {got}");
        assert!(!got.contains("x-first"), "round {round}: the app got {got}");
    }
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failure_is_a_502() {
    let dead = dead_port().await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("gone", |u| u.authorities(["gone"]).endpoint(dead))
            .to_toml(),
    )
    .await;
    let r = get(tg.addr, "/", "gone").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("upstream-unreachable"));
    assert_eq!(r.attempts(), 1);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_ten_mebibytes_each_way_intact_with_flat_memory() {
    const LEN: usize = 10 << 20;
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        match req.uri().path() {
            "/download" => Response::new(
                Generated::new(7, LEN)
                    .paced(Duration::from_millis(2))
                    .boxed(),
            ),
            _ => {
                let (hash, len) = hash_body(req.into_body()).await;
                Response::new(full(format!("{hash} {len}")))
            }
        }
    })
    .await;
    let p = Process::start(
        &Config::new()
            .upstream("bulk", |u| {
                u.authorities(["bulk"])
                    .endpoint(up.addr)
                    .request_timeout("60s")
                    .attempt_timeout("60s")
            })
            .to_toml_for_process(),
    )
    .await;
    // Warm up so the baseline includes pools and buffers.
    assert_eq!(get(p.addr, "/upload", "bulk").await.status, 200);
    let before = p.status_kib("VmHWM");

    let r = get(p.addr, "/download", "bulk").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), LEN);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hasher::write(&mut h, &r.body);
    assert_eq!(
        std::hash::Hasher::finish(&h),
        Generated::expected_hash(7, LEN),
        "response bytes differ"
    );

    let req = request("POST", "/upload", "bulk")
        .body(
            Generated::new(9, LEN)
                .paced(Duration::from_millis(2))
                .boxed(),
        )
        .unwrap();
    let r = send(p.addr, req).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        String::from_utf8(r.body.to_vec()).unwrap(),
        format!("{} {LEN}", Generated::expected_hash(9, LEN)),
        "request bytes differ"
    );

    let grown = p.status_kib("VmHWM").saturating_sub(before);
    assert!(
        grown < 4 * 1024,
        "peak memory grew by {grown} KiB while streaming 2 x 10 MiB: bodies were buffered"
    );
}

/// Reads one response with a `Content-Length` body off a raw socket (bounded).
async fn raw_response(s: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + length {
                return String::from_utf8_lossy(&got).into_owned();
            }
        }
        let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        match read.unwrap().unwrap() {
            0 => return String::from_utf8_lossy(&got).into_owned(),
            n => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_hold_little_memory() {
    use tokio::io::AsyncWriteExt;
    // An app's connection pool parked on the sidecar: each connection has been answered
    // and waits for its next request. With its read buffers held at full size while it
    // waits, a connection cost some 17 KiB; with them given back, 13; with its future
    // the size of its larger phase rather than of all of them, and its task holding
    // that future once, about 9; with the request and its answer boxed and the race of
    // a hedge kept out of the request's future, about 7.
    const CONNS: usize = 400;
    let up = Upstream::start(echo_upstream("idle")).await;
    let p = Process::start(
        &Config::new()
            .upstream("idle", |u| u.authorities(["idle"]).endpoint(up.addr))
            .to_toml_for_process(),
    )
    .await;
    let ask = format!(
        "GET /parked HTTP/1.1\r\nHost: idle\r\nUser-Agent: pool/1.0\r\nAccept: */*\r\nX-Trace: {}\r\n\r\n",
        "t".repeat(200)
    );
    // Warm up so the baseline holds the runtime, the pools and a first connection's
    // worth of everything.
    let mut warm = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    warm.write_all(ask.as_bytes()).await.unwrap();
    assert!(raw_response(&mut warm).await.starts_with("HTTP/1.1 200"));
    let before = p.status_kib("VmRSS");

    let mut parked = Vec::with_capacity(CONNS);
    for _ in 0..CONNS {
        let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
        s.write_all(ask.as_bytes()).await.unwrap();
        let r = raw_response(&mut s).await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.ends_with("idle GET /parked host=idle"), "{r}");
        parked.push(s);
    }
    let held = p.status_kib("VmRSS").saturating_sub(before);
    let per_conn = held * 1024 / CONNS as u64;

    // Every parked connection still answers its next request.
    for s in &mut parked {
        s.write_all(ask.as_bytes()).await.unwrap();
        let r = raw_response(s).await;
        assert!(r.ends_with("idle GET /parked host=idle"), "{r}");
    }
    assert!(
        per_conn < 9 * 1024,
        "{CONNS} idle keep-alive connections hold {held} KiB, {per_conn} bytes each"
    );
}
