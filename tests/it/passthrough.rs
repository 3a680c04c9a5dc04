//! Requests for authorities no upstream lists (`[listener] unknown_authorities`): with
//! "pass" (the default) an app behind `http_proxy` / `https_proxy` reaches the host as
//! it would without tollgate, side by side with a direct call; with "refuse" it gets
//! `404 no-route`. Loops into tollgate itself are answered, not followed.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::config::{Config, Listener};
use common::*;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A config with one upstream the tests never call, so the file serves something.
fn with(listener: impl FnOnce(Listener) -> Listener) -> String {
    known().listener(listener).to_toml()
}

/// One upstream, `known`, at an address nothing answers.
fn known() -> Config {
    Config::new().upstream("known", |u| {
        u.authorities(["known"]).endpoint("127.0.0.1:1")
    })
}

/// An app's server: answers `201` with what it was asked (method, target, Host and
/// every header whose name starts with `x-`), and a header of its own.
async fn echo_server() -> Upstream {
    Upstream::start(|req: Request<Incoming>| async move {
        let mut seen = format!(
            "{} {} host={}",
            req.method(),
            req.uri(),
            req.headers()
                .get("host")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
        );
        for (name, value) in req.headers() {
            if name.as_str().starts_with("x-") {
                seen.push_str(&format!(" {name}={}", value.to_str().unwrap_or("?")));
            }
        }
        Response::builder()
            .status(201)
            .header("x-served-by", "origin")
            .body(full(seen))
            .unwrap()
    })
    .await
}

/// Sends `req` on `stream` (HTTP/1.1, the target as written: absolute-form for a
/// proxy) and reads the answer whole.
async fn over(stream: TcpStream, req: Request<BoxBody>) -> Got {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let got = read(sender.send_request(req).await.unwrap()).await;
    conn.abort();
    got
}

/// The app's request to `url`, as a client behind `http_proxy` sends it to the proxy
/// (absolute-form target) or directly (origin-form).
fn app_request(url: &str, via_proxy: bool) -> Request<BoxBody> {
    let uri: http::Uri = url.parse().unwrap();
    let target = if via_proxy {
        url.to_string()
    } else {
        uri.path_and_query().unwrap().to_string()
    };
    Request::builder()
        .uri(target)
        .header("host", uri.authority().unwrap().as_str())
        .header("x-app", "kept")
        .header("x-timeout-ms", "5000")
        .body(empty())
        .unwrap()
}

#[tokio::test]
async fn an_unknown_host_answers_through_tollgate_as_it_does_directly() {
    let origin = echo_server().await;
    let tg = Tollgate::start(&with(|l| l)).await;
    let url = format!("http://{}/items?page=2", origin.addr);

    let direct = over(
        TcpStream::connect(origin.addr).await.unwrap(),
        app_request(&url, false),
    )
    .await;
    let proxied = over(
        TcpStream::connect(tg.addr).await.unwrap(),
        app_request(&url, true),
    )
    .await;

    assert_eq!(direct.status, 201);
    assert_eq!(proxied.status, direct.status);
    assert_eq!(proxied.body, direct.body, "the origin saw the same request");
    let seen = String::from_utf8_lossy(&proxied.body);
    assert!(
        seen.starts_with(&format!("GET /items?page=2 host={}", origin.addr)),
        "{seen}"
    );
    assert!(
        seen.contains("x-timeout-ms=5000"),
        "no deadline rewriting: {seen}"
    );
    assert!(
        !seen.contains("x-tollgate"),
        "nothing of tollgate's added: {seen}"
    );
    assert_eq!(proxied.header("x-served-by"), Some("origin"));
    for name in proxied.headers.keys() {
        assert!(
            !name.as_str().starts_with("x-tollgate"),
            "tollgate added {name} to the answer"
        );
    }
    assert_eq!(origin.hits(), 2);

    // As through any proxy, hop-by-hop fields stop at tollgate.
    let mut hop = app_request(&url, true);
    let h = hop.headers_mut();
    h.insert("connection", "keep-alive, x-hop".parse().unwrap());
    h.insert("x-hop", "dropped".parse().unwrap());
    h.insert("proxy-connection", "keep-alive".parse().unwrap());
    let r = over(TcpStream::connect(tg.addr).await.unwrap(), hop).await;
    assert_eq!(r.body, direct.body, "the origin saw the same request");

    let m = tg.metrics().await;
    let series = |s: &str| metric(&m, s).unwrap_or(0.0);
    assert_eq!(
        series("tollgate_requests_total{code=\"201\",outcome=\"ok\",upstream=\"passthrough\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        series("tollgate_attempts_total{result=\"2xx\",upstream=\"passthrough\"}"),
        2.0
    );
    assert_eq!(
        series("tollgate_attempts_per_request_sum{upstream=\"passthrough\"}"),
        2.0,
        "one attempt each"
    );
    assert_eq!(
        series("tollgate_requests_total{code=\"404\",outcome=\"no-route\",upstream=\"\"}"),
        0.0
    );
    tg.stop().await;
}

#[tokio::test]
async fn the_host_header_alone_names_the_destination_and_http2_maps_to_http1() {
    let origin = echo_server().await;
    let tg = Tollgate::start(&with(|l| l)).await;
    let host = origin.addr.to_string();
    // An app that sends its requests to tollgate as to the host itself.
    let r = get(tg.addr, "/plain", &host).await;
    assert_eq!(r.status, 201);
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("GET /plain host={host}")
    );
    // HTTP/2 from the app, HTTP/1.1 to the destination.
    let req = Request::builder()
        .uri(format!("http://{host}/over-h2"))
        .body(empty())
        .unwrap();
    let r = send_h2(tg.addr, req).await;
    assert_eq!(r.status, 201);
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("GET /over-h2 host={host}")
    );
    tg.stop().await;
}

#[tokio::test]
async fn a_post_body_streams_both_ways() {
    // Echoes the body as it arrives.
    let origin = Upstream::start(|req: Request<Incoming>| async move {
        let body = req.into_body().map_err(|e| e).boxed();
        Response::new(body)
    })
    .await;
    let tg = Tollgate::start(&with(|l| l)).await;
    let stream = TcpStream::connect(tg.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{}/echo", origin.addr))
        .header("host", origin.addr.to_string())
        .body(ChannelBody(rx).boxed())
        .unwrap();
    let limit = Duration::from_secs(10);
    tx.send(Bytes::from_static(b"first")).await.unwrap();
    let resp = tokio::time::timeout(limit, sender.send_request(req))
        .await
        .expect("the head came back before the body ended")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut next = async || {
        let frame = tokio::time::timeout(limit, body.frame()).await.unwrap();
        frame.unwrap().unwrap().into_data().unwrap()
    };
    // Each piece comes back before the next is sent: nothing waits for the whole.
    assert_eq!(next().await, "first");
    tx.send(Bytes::from_static(b"second")).await.unwrap();
    assert_eq!(next().await, "second");
    drop(tx);
    let rest = tokio::time::timeout(limit, body.collect()).await.unwrap();
    assert!(rest.unwrap().to_bytes().is_empty());
    conn.abort();
    tg.stop().await;
}

/// A server that counts the connections it accepts.
async fn counting_server() -> (SocketAddr, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            conns.spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(respond(200, "pooled"))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, accepted, task)
}

#[tokio::test]
async fn connections_to_a_destination_are_kept_for_the_next_request() {
    let (origin, accepted, server) = counting_server().await;
    let tg = Tollgate::start(&with(|l| l)).await;
    let url = format!("http://{origin}/again");
    // Each request on a connection of its own to tollgate: only tollgate's pool can
    // carry the second on the first one's connection.
    for _ in 0..3 {
        let r = over(
            TcpStream::connect(tg.addr).await.unwrap(),
            app_request(&url, true),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "pooled");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection, reused");
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_upstream_connections{upstream=\"passthrough\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
    server.abort();
}

#[tokio::test]
async fn an_upgrade_passed_through_becomes_a_tunnel() {
    // Answers any head with `101`, then echoes the bytes.
    let origin = Scripted::start(|mut s: TcpStream, _| async move {
        read_head(&mut s).await;
        let switch =
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n";
        s.write_all(switch).await.unwrap();
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
    })
    .await;
    let tg = Tollgate::start(&with(|l| l)).await;
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    let at = origin.addr;
    let head = format!(
        "GET http://{at}/ws HTTP/1.1\r\nHost: {at}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let head = String::from_utf8(read_head(&mut s).await).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: echo"),
        "{head}"
    );
    s.write_all(b"through").await.unwrap();
    assert_eq!(read_n(&mut s, 7).await, b"through");
    drop(s);
    tg.stop().await;
}

/// A raw TCP echo server.
async fn tcp_echo() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut s, _)) = listener.accept().await {
            conns.spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, task)
}

/// Reads exactly `n` bytes, within 10 s.
async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut buf))
        .await
        .expect("the bytes came")
        .unwrap();
    buf
}

#[tokio::test]
async fn connect_is_tunnelled_to_its_authority() {
    let (echo, server) = tcp_echo().await;
    let tg = Tollgate::start(&with(|l| l)).await;
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    // The first bytes of the tunnel in the same write as the head, as clients that
    // send their TLS hello at once do.
    s.write_all(format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\nearly").as_bytes())
        .await
        .unwrap();
    let head = String::from_utf8(read_head(&mut s).await).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(
        !lower.contains("content-length") && !lower.contains("transfer-encoding"),
        "no framing on a 2xx to CONNECT: {head}"
    );
    let rest = head.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    let early = rest.len() + read_n(&mut s, 5 - rest.len()).await.len();
    assert_eq!(early, 5);
    s.write_all(b"ping").await.unwrap();
    assert_eq!(read_n(&mut s, 4).await, b"ping");
    // The app ends its side: the tunnel ends.
    s.shutdown().await.unwrap();
    let after = read_until_close(&mut s).await;
    assert!(after.is_empty(), "{after}");

    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"200\",outcome=\"ok\",upstream=\"passthrough\"}"
        ),
        Some(1.0),
        "{m}"
    );
    tg.stop().await;
    server.abort();
}

#[tokio::test]
async fn connect_over_http2_is_tunnelled_too() {
    let (echo, server) = tcp_echo().await;
    let tg = Tollgate::start(&with(|l| l)).await;
    let stream = TcpStream::connect(tg.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::builder()
        .method("CONNECT")
        .uri(echo.to_string())
        .body(empty())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let upgraded = tokio::time::timeout(Duration::from_secs(10), hyper::upgrade::on(resp))
        .await
        .unwrap()
        .unwrap();
    let mut tunnel = TokioIo::new(upgraded);
    tunnel.write_all(b"over h2").await.unwrap();
    let mut buf = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(10), tunnel.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"over h2");
    drop(tunnel);
    conn.abort();
    tg.stop().await;
    server.abort();
}

#[tokio::test]
async fn refuse_answers_unknown_authorities_with_404_no_route() {
    let origin = echo_server().await;
    let (echo, server) = tcp_echo().await;
    let tg = Tollgate::start(&with(|l| l.unknown_authorities("refuse"))).await;
    let r = over(
        TcpStream::connect(tg.addr).await.unwrap(),
        app_request(&format!("http://{}/", origin.addr), true),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.outcome(), Some("no-route"));
    let raw = raw_exchange(
        tg.addr,
        format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 404"), "{raw}");
    assert_eq!(origin.hits(), 0);
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"404\",outcome=\"no-route\",upstream=\"\"}"
        ),
        Some(2.0)
    );
    tg.stop().await;
    server.abort();
}

#[tokio::test]
async fn a_destination_that_refuses_gets_502_and_no_retry() {
    let dead = dead_port().await;
    let tg = Tollgate::start(&with(|l| l)).await;
    let r = over(
        TcpStream::connect(tg.addr).await.unwrap(),
        app_request(&format!("http://{dead}/"), true),
    )
    .await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("upstream-unreachable"));
    let raw = raw_exchange(
        tg.addr,
        format!("CONNECT {dead} HTTP/1.1\r\nHost: {dead}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 502"), "{raw}");
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"connect-failure\",upstream=\"passthrough\"}"
        ),
        Some(2.0),
        "one attempt each: {m}"
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"502\",outcome=\"upstream-unreachable\",upstream=\"passthrough\"}"
        ),
        Some(2.0)
    );
    tg.stop().await;
}

/// A loopback address whose SYNs go unanswered: a listener whose accept queue is full
/// drops them. Keep the returned sockets alive for as long as it must stay so.
fn unanswered() -> (SocketAddr, Vec<std::net::TcpStream>, socket2::Socket) {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    s.listen(0).unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    let mut filling = Vec::new();
    // Connect until one hangs: the queue is full from then on. On the real clock,
    // whatever the test's tokio clock does.
    for _ in 0..16 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(c) => filling.push(c),
            Err(_) => return (addr, filling, s),
        }
    }
    panic!("the accept queue never filled");
}

#[tokio::test]
async fn the_connect_of_a_request_passed_through_is_bounded() {
    let (silent, _filling, _listener) = unanswered();
    let tg = Tollgate::start(&with(|l| l.passthrough_connect_timeout("100ms"))).await;
    let ask = over(
        TcpStream::connect(tg.addr).await.unwrap(),
        app_request(&format!("http://{silent}/"), true),
    );
    let r = tokio::time::timeout(Duration::from_secs(30), ask)
        .await
        .expect("answered once the connect timed out");
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("upstream-unreachable"));
    let mut s = TcpStream::connect(tg.addr).await.unwrap();
    s.write_all(format!("CONNECT {silent} HTTP/1.1\r\nHost: {silent}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = tokio::time::timeout(Duration::from_secs(30), read_head(&mut s))
        .await
        .unwrap();
    assert!(head.starts_with(b"HTTP/1.1 502"), "{head:?}");
    tg.stop().await;
}

/// A captured connection (what `SO_ORIGINAL_DST` finds) whose destination does not
/// answer: the app's connection is reset once `passthrough_connect_timeout` has passed,
/// not the kernel's two minutes later. Paused time: the wait is measured, not slept.
#[tokio::test(start_paused = true)]
async fn a_captured_connection_whose_destination_is_silent_is_reset_at_the_timeout() {
    let (silent, _filling, _listener) = unanswered();
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut app = TcpStream::connect(front.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = front.accept().await.unwrap();
    let metrics = tollgate_core::metrics::Metrics::new();
    let settings = tollgate_core::config::ListenerConfig {
        passthrough_connect_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let (_drain, shutdown) = tokio::sync::watch::channel(false);
    let began = tokio::time::Instant::now();
    tollgate_core::listen::passthrough::relay(
        accepted,
        silent,
        tollgate_core::metrics::passthrough::Direction::Outbound,
        &metrics,
        shutdown,
        &settings,
    )
    .await;
    let waited = began.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(10),
        "gave up after {waited:?}"
    );
    let mut buf = [0u8; 1];
    let read = app.read(&mut buf).await;
    assert_eq!(
        read.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset)
    );
    let text = String::from_utf8(metrics.encode()).unwrap();
    assert_eq!(
        metric(
            &text,
            "tollgate_passthrough_failures_total{direction=\"outbound\",reason=\"connect-failure\"}"
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_request_for_tollgates_own_address_is_508_not_a_loop() {
    let tg = Tollgate::start(&with(|l| l)).await;
    for own in [tg.addr.to_string(), tg.admin.to_string()] {
        let r = over(
            TcpStream::connect(tg.addr).await.unwrap(),
            app_request(&format!("http://{own}/"), true),
        )
        .await;
        assert_eq!(r.status, 508, "{own}: {:?}", r.body);
        assert_eq!(r.outcome(), Some("loop"), "{own}");
    }
    // By name, or by the address that reaches every local one.
    for host in [
        format!("localhost:{}", tg.addr.port()),
        format!("0.0.0.0:{}", tg.addr.port()),
    ] {
        assert_eq!(get(tg.addr, "/", &host).await.status, 508, "{host}");
    }
    let raw = raw_exchange(
        tg.addr,
        format!(
            "CONNECT {0} HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n",
            tg.addr
        )
        .as_bytes(),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 508"), "{raw}");
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"508\",outcome=\"loop\",upstream=\"passthrough\"}"
        ),
        Some(5.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"2xx\",upstream=\"passthrough\"}"
        ),
        Some(0.0),
        "nothing was sent anywhere"
    );
    tg.stop().await;
}

#[tokio::test]
async fn a_listener_that_asks_to_pass_is_a_forward_proxy_without_upstreams() {
    // Left empty, a file is refused; `unknown_authorities = "pass"` written out is
    // the intent to forward and nothing else.
    let empty = "[listener]\naddr = \"127.0.0.1:0\"\n";
    assert!(tollgate_core::config::load_text("t.toml", empty, std::path::Path::new(".")).is_err());
    let origin = echo_server().await;
    let tg = Tollgate::start(&format!(
        "{empty}unknown_authorities = \"pass\"\n[admin]\naddr = \"127.0.0.1:0\"\n"
    ))
    .await;
    let r = get(tg.addr, "/", &origin.addr.to_string()).await;
    assert_eq!(r.status, 201);
    let config = get(tg.admin, "/config", "admin").await;
    let config = String::from_utf8_lossy(&config.body);
    assert!(
        config.contains("\"unknown_authorities\": \"pass\""),
        "{config}"
    );
    assert!(
        config.contains("\"passthrough_connect_timeout\": \"1s\""),
        "{config}"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_names_a_request_passed_through() {
    let origin = echo_server().await;
    let p = Process::start_logged(
        &known()
            .access_log(|a| a.enabled(true))
            .to_toml_for_process(),
    )
    .await;
    let host = origin.addr.to_string();
    assert_eq!(get(p.addr, "/logged?secret=1", &host).await.status, 201);
    let logged = wait_until(Duration::from_secs(10), || {
        p.log()
            .contains(" access direction=outbound upstream=passthrough")
    })
    .await;
    let log = p.log();
    assert!(logged, "{log}");
    let line = log
        .lines()
        .find(|l| l.contains(" access direction=outbound upstream=passthrough"))
        .unwrap();
    for part in [
        &format!("authority={host}"),
        "path=/logged ",
        "status=201",
        "attempts=1",
        "outcome=ok",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
}
