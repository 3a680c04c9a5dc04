//! A whole request through tollgate in this process, over loopback: client -> tollgate
//! -> upstream and back, beside the same request sent straight to the upstream. The
//! difference is what the hop costs end to end; the load comparison in
//! `scripts/bench.sh` measures the same against nginx and HAProxy.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

async fn client(addr: SocketAddr) -> SendRequest<Empty<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

async fn once(sender: &mut SendRequest<Empty<Bytes>>) {
    sender.ready().await.expect("ready");
    let req = Request::builder()
        .uri("/")
        .header("host", "backend")
        .body(Empty::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let _ = resp.into_body().collect().await.expect("body");
}

fn round_trip(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let (up, running) = rt.block_on(async {
        let up = upstream().await;
        let text = format!(
            "[listener]\naddr = \"127.0.0.1:0\"\n[admin]\naddr = \"127.0.0.1:0\"\n\
             [upstreams.backend]\nauthorities = [\"backend\"]\nendpoints = [\"{up}\"]\nprotocol = \"http1\"\n\
             [upstreams.backend.retry]\nmax_attempts = 3\n[upstreams.backend.budget]\n"
        );
        let cfg = tollgate_core::config::parse("bench.toml", &text, Path::new(".")).expect("config");
        let running = tollgate_core::run::Running::start(cfg, None).await.expect("start");
        (up, running)
    });
    let proxy = running.server.local_addr();
    let mut direct = rt.block_on(client(up));
    let mut through = rt.block_on(client(proxy));
    c.bench_function("round trip: straight to the upstream", |b| {
        b.iter(|| rt.block_on(once(&mut direct)))
    });
    c.bench_function(
        "round trip: through tollgate (retries, budget, metrics on)",
        |b| b.iter(|| rt.block_on(once(&mut through))),
    );
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
