//! HTTP/2 towards the upstream: the authority travels as `:authority` alone (servers
//! such as nginx refuse a request that carries `host` too), cookies an HTTP/2 app split
//! are joined for an HTTP/1.1 upstream, and `protocol = "auto"` follows an endpoint
//! that answers the HTTP/2 preface in HTTP/1.1.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::{Arc, Mutex};

use common::config::Config;
use common::*;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Says what the upstream saw: its HTTP version, `:authority` and every `host` field.
async fn describe(req: http::Request<Incoming>) -> http::Response<BoxBody> {
    let hosts: Vec<&str> = req
        .headers()
        .get_all("host")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    let cookies: Vec<&str> = req
        .headers()
        .get_all("cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    respond(
        200,
        format!(
            "{:?} authority={} host={hosts:?} cookie={cookies:?}",
            req.version(),
            req.uri().authority().map_or("none", |a| a.as_str()),
        ),
    )
}

fn upstream(
    addr: std::net::SocketAddr,
    protocol: &str,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> String {
    Config::new()
        .upstream("api", |u| {
            f(u.authorities(["api"]).endpoint(addr).protocol(protocol))
        })
        .to_toml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_upstreams_get_the_authority_and_no_host_field() {
    let up = Upstream::start(describe).await;
    let tg = Tollgate::start(&upstream(up.addr, "h2c", |u| u)).await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "HTTP/2.0 authority=api host=[] cookie=[]"
    );
    let r = send_h2(tg.addr, request("GET", "/", "api").body(empty()).unwrap()).await;
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "HTTP/2.0 authority=api host=[] cookie=[]"
    );
    tg.stop().await;

    let tg = Tollgate::start(&upstream(up.addr, "h2c", |u| u.host("api.example"))).await;
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "HTTP/2.0 authority=api.example host=[] cookie=[]",
        "the configured host, as :authority only"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_an_http2_app_split_are_joined_for_an_http1_upstream() {
    let up = Upstream::start(describe).await;
    let tg = Tollgate::start(&upstream(up.addr, "http1", |u| u)).await;
    let req = request("GET", "/", "api")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .header("cookie", "c=3")
        .body(empty())
        .unwrap();
    let r = send_h2(tg.addr, req).await;
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "HTTP/1.1 authority=none host=[\"api\"] cookie=[\"a=1; b=2; c=3\"]"
    );
    tg.stop().await;
}

/// An HTTP/1.1-only server recording the version of each request it serves. It
/// answers the HTTP/2 preface with `505` and closes, as the servers of Go's and
/// Python's standard libraries do (nginx answers `400`; hyper closes without a word,
/// which tollgate does not take for HTTP/1.1: a connection closed early proves
/// nothing).
async fn http1_only() -> (
    std::net::SocketAddr,
    Arc<Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            conns.spawn(async move {
                let mut stream = stream;
                let mut first = [0u8; 3];
                if stream.peek(&mut first).await.is_ok() && &first == b"PRI" {
                    use tokio::io::AsyncWriteExt;
                    let _ = stream
                        .write_all(b"HTTP/1.1 505 HTTP Version Not Supported\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let svc = service_fn(move |req: http::Request<Incoming>| {
                    log.lock().unwrap().push(format!("{:?}", req.version()));
                    async move { Ok::<_, std::convert::Infallible>(describe(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_sends_http2_apps_as_http1_to_an_endpoint_that_speaks_only_http1() {
    let (addr, seen, server) = http1_only().await;
    let tg = Tollgate::start(&upstream(addr, "auto", |u| u.retry(|r| r.max_attempts(3)))).await;
    for i in 0..3 {
        let r = send_h2(tg.addr, request("GET", "/x", "api").body(empty()).unwrap()).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.attempts(), 1, "request {i}: the fallback is no retry");
        assert!(
            String::from_utf8_lossy(&r.body).starts_with("HTTP/1.1 authority=none host=[\"api\"]"),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
    }
    assert_eq!(*seen.lock().unwrap(), ["HTTP/1.1"; 3]);
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"2xx\",upstream=\"api\"}"
        ),
        Some(3.0)
    );
    for result in ["reset", "connect-failure", "5xx"] {
        let series = format!("tollgate_attempts_total{{result=\"{result}\",upstream=\"api\"}}");
        assert_eq!(metric(&m, &series), Some(0.0), "{series}");
    }
    // An HTTP/1.1 app is unaffected, and an HTTP/2 upstream is still spoken HTTP/2.
    let r = get(tg.addr, "/", "api").await;
    assert_eq!(r.status, 200);
    tg.stop().await;
    server.abort();

    let h2 = Upstream::start(describe).await;
    let tg = Tollgate::start(&upstream(h2.addr, "auto", |u| u)).await;
    let r = send_h2(tg.addr, request("GET", "/", "api").body(empty()).unwrap()).await;
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "HTTP/2.0 authority=api host=[] cookie=[]"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_response_head_is_limited_by_its_size_as_over_http11() {
    // A head of 20 KiB passes (hyper's own HTTP/2 limit is 16 KiB); one far past the
    // limit is `502 not-retryable` after one attempt, as over HTTP/1.1: the same
    // request would get the same head again.
    let up = Upstream::start(|req| async move {
        let size: usize = req.uri().path()[1..].parse().unwrap_or(0);
        http::Response::builder()
            .header("x-big", "b".repeat(size))
            .body(full("ok"))
            .unwrap()
    })
    .await;
    let tg = Tollgate::start(&upstream(up.addr, "h2c", |u| {
        u.retry(|r| {
            r.max_attempts(3)
                .backoff_base("1ms")
                .on(["reset", "502", "503"])
        })
    }))
    .await;
    let r = get(tg.addr, "/20000", "api").await;
    assert_eq!(r.status, 200, "{:?}", r.outcome());
    assert_eq!(r.header("x-big").map(str::len), Some(20_000));
    let before = up.hits();
    let r = get(tg.addr, "/200000", "api").await;
    assert_eq!(
        (r.status.as_u16(), r.attempts(), r.outcome()),
        (502, 1, Some("not-retryable"))
    );
    assert_eq!(up.hits() - before, 1, "not sent again");
    tg.stop().await;
}
