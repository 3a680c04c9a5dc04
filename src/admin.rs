//! The admin endpoint: `/metrics` (Prometheus text), `/healthz` (the process is alive),
//! `/readyz` (listeners bound and config loaded, not draining) and `/config` (the
//! effective config as JSON, without secrets). It binds loopback by default: it is for
//! the kubelet and Prometheus in the same pod, not for the network.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::proxy::{BindError, Shared};

pub struct Admin {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Admin {
    pub async fn start(addr: SocketAddr, shared: Arc<Shared>) -> Result<Self, BindError> {
        let listener = TcpListener::bind(addr).await.map_err(|source| BindError {
            addr,
            what: "admin.addr".into(),
            source,
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    r = listener.accept() => {
                        let Ok((stream, _)) = r else { continue };
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            let svc = service_fn(move |req| {
                                let shared = shared.clone();
                                async move { Ok::<_, Infallible>(route(&shared, req)) }
                            });
                            let mut b = hyper::server::conn::http1::Builder::new();
                            b.timer(TokioTimer::new())
                                .header_read_timeout(std::time::Duration::from_secs(10));
                            let _ = b.serve_connection(TokioIo::new(stream), svc).await;
                        });
                    }
                }
            }
        });
        Ok(Admin { addr, stop, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn route(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {
            refresh_gauges(shared);
            reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                shared.metrics.encode(),
            )
        }
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            if shared.ready.load(Acquire) {
                reply(StatusCode::OK, "text/plain", "ready\n")
            } else {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n")
            }
        }
        "/config" => {
            let snap = shared.snapshot();
            let body = serde_json::to_vec_pretty(&snap.config.to_json()).unwrap_or_default();
            reply(StatusCode::OK, "application/json", body)
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics, /healthz, /readyz or /config\n",
        ),
    }
}

/// Gauges are read from live state at scrape time rather than kept up to date on the
/// request path.
fn refresh_gauges(shared: &Shared) {
    let snap = shared.snapshot();
    let now = Instant::now();
    for up in snap.upstreams.iter() {
        let window = up.budget.stats(now);
        shared.metrics.set_gauges(
            up.name(),
            crate::metrics::amplification(window.attempts, window.requests),
            up.budget.available(now),
            up.inflight.load(Relaxed) as i64,
            up.connections.load(Relaxed) as i64,
        );
    }
}
