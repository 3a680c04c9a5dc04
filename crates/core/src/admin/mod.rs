//! The admin endpoint: `/metrics` (Prometheus text), `/healthz` (the process is alive),
//! `/readyz` (listeners bound, config loaded and watched Services listed, not
//! draining), `/config` (the config in force as JSON, without secrets) and
//! `/probe/PORT/PATH` (a kubelet probe of the app, moved here by `tollgate inject`:
//! [`probe`]). It binds loopback by default; in a pod it listens on every address for
//! the kubelet and Prometheus, and `/config` is then still answered on loopback only.
//! Its connections are bounded ([`conns`]): heads within 5 s, idle ones closed after
//! 30 s, at most 64 at once.

pub mod conns;
pub mod probe;

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

use crate::listen::BindError;
use crate::metrics::Gauges;
use crate::sides::Shared;

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
        let probes = Arc::new(probe::Probes::default());
        let open = Arc::new(conns::Conns::default());
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    r = listener.accept() => {
                        let Ok((stream, peer)) = r else { continue };
                        // Every place has a request in flight: closed at once.
                        let Some(held) = open.admit() else { continue };
                        let (shared, probes) = (shared.clone(), probes.clone());
                        tokio::spawn(serve(stream, peer, shared, probes, held));
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

/// One admin connection, until it closes, is evicted or sits idle too long.
async fn serve(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    probes: Arc<probe::Probes>,
    held: conns::Held,
) {
    let slot = held.slot.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let (shared, probes, slot) = (shared.clone(), probes.clone(), slot.clone());
        async move {
            let _busy = slot.busy();
            let resp = if req.uri().path().starts_with("/probe/") || req.uri().scheme().is_some() {
                let declared = &shared.snapshot().config.admin.probes;
                let got = probes
                    .answer(declared, req.method(), req.uri(), req.headers())
                    .await;
                reply(got.status, "text/plain", got.text)
            } else {
                route(&shared, req, peer)
            };
            Ok::<_, Infallible>(resp)
        }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new()).header_read_timeout(conns::HEAD);
    let conn = b.serve_connection(TokioIo::new(stream), svc);
    tokio::select! {
        _ = conn => {}
        _ = held.closing() => {}
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

/// Whether `path` may be served to `peer`. `/config` shows the whole config
/// (upstreams, endpoints, certificate paths): it is served on the pod's own loopback
/// only, so the admin port can listen on every address for the kubelet's probes and
/// Prometheus without showing it to the network.
fn served_to(path: &str, peer: SocketAddr) -> bool {
    path != "/config" || peer.ip().is_loopback()
}

fn route(shared: &Shared, req: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    if !served_to(req.uri().path(), peer) {
        return reply(
            StatusCode::FORBIDDEN,
            "text/plain",
            "/config is served to localhost only\n",
        );
    }
    match req.uri().path() {
        "/metrics" => {
            refresh_gauges(shared);
            reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                shared.metrics().encode(),
            )
        }
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => readyz(shared),
        "/config" => {
            let snap = shared.snapshot();
            let mut json = snap.config.to_json();
            json["pending_restart"] = snap.pending_restart.clone().into();
            let body = serde_json::to_vec_pretty(&json).unwrap_or_default();
            reply(StatusCode::OK, "application/json", body)
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics, /healthz, /readyz or /config\n",
        ),
    }
}

/// 200 once the listeners are bound and the config loaded, 503 while draining. The
/// body says what is not as configured: an upstream's own listen port a reload could
/// not bind (the rest serves, so the pod stays ready), a change waiting for a restart.
/// With `discovery = "kubernetes"`, 503 also until each watched Service's first list has
/// arrived, for 10 s at most (an API that is down must not keep the pod unready).
fn readyz(shared: &Shared) -> Response<Full<Bytes>> {
    if !shared.ready.load(Acquire) {
        return reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n");
    }
    if !crate::discovery::all_listed() {
        return reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: waiting for the first list of a watched Service's endpoints\n",
        );
    }
    let snap = shared.snapshot();
    let mut body = String::from("ready\n");
    for (upstream, error) in &snap.listeners_down {
        body.push_str(&format!(
            "listener of upstream {upstream} not bound: {error}\n"
        ));
    }
    for what in &snap.pending_restart {
        body.push_str(&format!("waiting for a restart: {what}\n"));
    }
    reply(StatusCode::OK, "text/plain", body)
}

/// Gauges are read from live state at scrape time rather than kept up to date on the
/// request path.
fn refresh_gauges(shared: &Shared) {
    let snap = shared.snapshot();
    let now = Instant::now();
    // Only for upstreams that had a request: the others have no series.
    for up in snap.upstreams.iter() {
        let Some(m) = up.series().used() else {
            continue;
        };
        let window = up.budget().stats(now);
        m.set(Gauges {
            amplification: crate::metrics::amplification(window.attempts, window.requests),
            budget_available: up.budget().available(now),
            inflight: up.inflight().load(Relaxed),
            connections: up.connections_open(),
            ejected: up.endpoints().readmit_due(),
            budget_ratio: up.budget().share(),
            throttle_probability: up.throttle().map_or(0.0, |t| t.probability(now)),
        });
    }
    if let Some(inbound) = &shared.inbound {
        inbound.refresh_gauges();
    }
    // Passed through: one attempt per request by construction, and no retry granted.
    let passing = &shared.outbound.passing;
    if let Some(m) = passing.metrics.used() {
        m.set(Gauges {
            amplification: 1.0,
            budget_available: 0.0,
            inflight: passing.inflight(),
            connections: passing.connections(),
            ejected: 0,
            budget_ratio: 0.0,
            throttle_probability: 0.0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::served_to;

    #[test]
    fn the_config_is_shown_on_loopback_only() {
        let pod: std::net::SocketAddr = "10.1.2.3:40000".parse().unwrap_or_else(|_| unreachable!());
        let local: std::net::SocketAddr =
            "127.0.0.1:40000".parse().unwrap_or_else(|_| unreachable!());
        assert!(served_to("/config", local));
        assert!(!served_to("/config", pod));
        for path in ["/metrics", "/healthz", "/readyz"] {
            assert!(served_to(path, pod), "{path}");
        }
    }
}
