//! A `CONNECT` to an authority an upstream lists (what Node's undici
//! `EnvHttpProxyAgent` and gRPC's C core send for plain `http://` behind `http_proxy`)
//! is answered `200` and its connection served as HTTP: HTTP/1.1, or HTTP/2 after the
//! preface, every request in it routed to that upstream with retries, budget and
//! metrics. Bytes that are not HTTP (a TLS ClientHello) pass as they are, to the
//! authority named. With `unknown_authorities = "refuse"`, a `CONNECT` to an authority
//! no upstream lists is `404 no-route`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::clients;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::config::Config;
use common::*;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that fails every other request with `503` (the first of each pair),
/// and answers the rest `200` with the path it was asked for.
async fn flaky() -> Upstream {
    let n = Arc::new(AtomicUsize::new(0));
    Upstream::start(move |req| {
        let n = n.fetch_add(1, Ordering::SeqCst);
        async move {
            if n.is_multiple_of(2) {
                respond(503, "not now")
            } else {
                respond(200, format!("path={}", req.uri().path()))
            }
        }
    })
    .await
}

fn config(up: SocketAddr) -> Config {
    Config::new()
        .listener(|l| l.unknown_authorities("refuse"))
        .upstream("api", |u| {
            u.authorities(["api"])
                .endpoint(up)
                .retry(|r| r.backoff_base("1ms"))
        })
}

/// Sends a `CONNECT` for `authority` and reads the answer's head.
async fn connect(tg: SocketAddr, authority: &str) -> (TcpStream, String) {
    let mut s = TcpStream::connect(tg).await.unwrap();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = tokio::time::timeout(Duration::from_secs(10), read_head(&mut s))
        .await
        .expect("no answer to the CONNECT in 10 s");
    (s, String::from_utf8_lossy(&head).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_to_an_upstream_is_served_as_http_with_its_retries() {
    let up = flaky().await;
    let tg = Tollgate::start(&config(up.addr).to_toml()).await;
    let (s, head) = connect(tg.addr, "api:80").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // HTTP/1.1 inside, whatever the Host says: routed to `api`, its 503 retried.
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    for path in ["/one", "/two"] {
        let req = request("GET", path, "api").body(empty()).unwrap();
        sender.ready().await.unwrap();
        let got = read(sender.send_request(req).await.unwrap()).await;
        assert_eq!(got.status, 200);
        assert_eq!(got.body, format!("path={path}"));
        assert_eq!(got.attempts(), 2, "the upstream's 503 was retried");
    }
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"200\",outcome=\"ok\",upstream=\"api\"}"
        ),
        Some(2.0),
        "{m}"
    );
    assert_eq!(up.hits(), 4);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_to_an_upstream_speaking_h2_inside_is_served_as_h2() {
    let up = flaky().await;
    let tg = Tollgate::start(&config(up.addr).to_toml()).await;
    let (s, head) = connect(tg.addr, "api:80").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri("http://api/h2")
        .version(http::Version::HTTP_2)
        .body(empty())
        .unwrap();
    let got = read(sender.send_request(req).await.unwrap()).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, "path=/h2");
    assert_eq!(got.attempts(), 2);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_not_http_pass_to_the_authority_as_they_are() {
    // The upstream's authority is this echo server's own address: what TLS would
    // reach on :443.
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let config = Config::new()
        .listener(|l| l.unknown_authorities("refuse"))
        .upstream("tls", |u| {
            u.authorities([echo_addr.to_string()]).endpoint(echo_addr)
        });
    let tg = Tollgate::start(&config.to_toml()).await;
    let (mut s, head) = connect(tg.addr, &echo_addr.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let hello = b"\x16\x03\x01\x00\x05hello";
    s.write_all(hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back))
        .await
        .expect("nothing came back in 10 s")
        .unwrap();
    assert_eq!(&back[..], &hello[..]);
    drop(s);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_a_connect_to_an_unknown_authority_is_404_no_route() {
    let up = flaky().await;
    let tg = Tollgate::start(&config(up.addr).to_toml()).await;
    let (_s, head) = connect(tg.addr, "elsewhere.example:443").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-tollgate-outcome: no-route"),
        "{head}"
    );
    assert_eq!(up.hits(), 0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undici_env_http_proxy_agent_calls_through_connect() {
    let Some(dir) = tokio::task::spawn_blocking(clients::undici).await.unwrap() else {
        return;
    };
    let up = flaky().await;
    let tg = Tollgate::start(&config(up.addr).to_toml()).await;
    let script = r#"
const { EnvHttpProxyAgent, request } = require('undici');
(async () => {
  const dispatcher = new EnvHttpProxyAgent();
  const out = [];
  for (const path of ['/a', '/b']) {
    const r = await request('http://api' + path, { dispatcher });
    out.push([r.statusCode, r.headers['x-tollgate-attempts'], await r.body.text()].join(' '));
  }
  console.log(out.join('\n'));
  await dispatcher.close();
})().catch((e) => { console.error(e); process.exit(1); });
"#;
    let proxy = format!("http://{}", tg.addr);
    let mut node = std::process::Command::new("node");
    node.arg("-e")
        .arg(script)
        .current_dir(&dir)
        .env("http_proxy", &proxy)
        .env("HTTP_PROXY", &proxy)
        .env_remove("no_proxy")
        .env_remove("NO_PROXY");
    let run = tokio::task::spawn_blocking(move || node.output());
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("node did not finish in 30 s")
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "200 2 path=/a\n200 2 path=/b");
    assert_eq!(up.hits(), 4);
    tg.stop().await;
}
