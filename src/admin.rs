//! The admin endpoint: `/metrics` (Prometheus text), `/healthz` (the process is alive),
//! `/readyz` (listeners bound, config loaded and watched Services listed, not
//! draining), `/config` (the config in force as JSON, without secrets) and
//! `/probe/PORT/PATH` (a kubelet probe of the app, moved here by `tollgate inject`). It
//! binds loopback by default; in a pod it listens on every address for the kubelet and
//! Prometheus, and `/config` is then still answered on loopback only.

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
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    r = listener.accept() => {
                        let Ok((stream, peer)) = r else { continue };
                        let shared = shared.clone();
                        tokio::spawn(async move {
                            let svc = service_fn(move |req: Request<Incoming>| {
                                let shared = shared.clone();
                                async move {
                                    if req.method() == Method::GET
                                        && let Some(target) = probe_target(req.uri())
                                    {
                                        return Ok::<_, Infallible>(probe(&shared, target, &req).await);
                                    }
                                    Ok(route(&shared, req, peer))
                                }
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

/// The timeout of one forwarded probe, connect to response head. The kubelet gives up
/// sooner by its own `timeoutSeconds` (1 s unless set); this only keeps an app that never
/// answers from holding the admin endpoint's tasks.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `/probe/PORT/PATH` -> (PORT, `/PATH` with its query); `None` for any other path.
fn probe_target(uri: &http::Uri) -> Option<(u16, String)> {
    let rest = uri.path().strip_prefix("/probe/")?;
    let (port, path) = rest.split_once('/').unwrap_or((rest, ""));
    let port = port.parse().ok()?;
    Some(match uri.query() {
        Some(q) => (port, format!("/{path}?{q}")),
        None => (port, format!("/{path}")),
    })
}

/// A kubelet probe moved to the admin port: a GET to the app at 127.0.0.1:PORT/PATH,
/// answered with the app's status. Only the ports of `[admin] probe_ports` (read from
/// the config in force, so a reload applies to the next probe): anything else is 404,
/// so the admin port cannot be used to reach arbitrary local ports. The probe's own
/// fields (its `httpHeaders`, the kubelet's `User-Agent`) go along; `Host` names the app.
async fn probe(
    shared: &Shared,
    (port, path): (u16, String),
    req: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    if !shared.snapshot().config.admin.probe_ports.contains(&port) {
        let body = format!("port {port} is not in [admin] probe_ports\n");
        return reply(StatusCode::NOT_FOUND, "text/plain", body);
    }
    let app = SocketAddr::from(([127, 0, 0, 1], port));
    match tokio::time::timeout(PROBE_TIMEOUT, probe_app(app, &path, req.headers())).await {
        Ok(Ok(status)) => reply(status, "text/plain", format!("app answered {status}\n")),
        Ok(Err(e)) => {
            let body = format!("app at {app} unreachable: {e}\n");
            reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", body)
        }
        Err(_) => {
            let body = format!("app at {app} did not answer within {PROBE_TIMEOUT:?}\n");
            reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", body)
        }
    }
}

/// One GET on a new connection, closed after the response head: probes are rare, and
/// a probe must see whether the app accepts connections now.
async fn probe_app(
    app: SocketAddr,
    path: &str,
    headers: &http::HeaderMap,
) -> Result<StatusCode, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(app).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let mut out = Request::get(path).body(http_body_util::Empty::<Bytes>::new())?;
    use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TE, TRANSFER_ENCODING, UPGRADE};
    for (name, value) in headers {
        if ![
            HOST,
            CONNECTION,
            CONTENT_LENGTH,
            TE,
            TRANSFER_ENCODING,
            UPGRADE,
        ]
        .contains(name)
        {
            out.headers_mut().append(name, value.clone());
        }
    }
    let host = HeaderValue::from_str(&app.to_string())?;
    out.headers_mut().insert(HOST, host);
    let response = sender.send_request(out).await;
    conn.abort();
    Ok(response?.status())
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
    for up in snap.upstreams.iter() {
        let window = up.budget().stats(now);
        shared.metrics().set_gauges(
            up.name(),
            crate::metrics::amplification(window.attempts, window.requests),
            up.budget().available(now),
            up.inflight().load(Relaxed) as i64,
            up.connections_open() as i64,
        );
        shared
            .metrics()
            .set_ejected(up.name(), up.endpoints().readmit_due());
        let throttle = up.throttle().map_or(0.0, |t| t.probability(now));
        shared
            .metrics()
            .learning
            .set(up.name(), up.budget().share(), throttle);
    }
    if let Some(inbound) = &shared.inbound {
        inbound.refresh_gauges();
    }
    // Passed through: one attempt per request by construction, and no retry granted.
    let passing = &shared.outbound.passing;
    shared.metrics().set_gauges(
        crate::config::PASSTHROUGH,
        1.0,
        0.0,
        passing.inflight() as i64,
        passing.connections() as i64,
    );
}

#[cfg(test)]
mod tests {
    use super::{probe_target, served_to};

    #[test]
    fn probe_paths_name_a_port_and_the_apps_path() {
        let at = |uri: &str| probe_target(&uri.parse().unwrap_or_else(|_| unreachable!()));
        assert_eq!(at("/probe/8080/healthz"), Some((8080, "/healthz".into())));
        assert_eq!(at("/probe/8080/a/b?x=1"), Some((8080, "/a/b?x=1".into())));
        assert_eq!(at("/probe/8080"), Some((8080, "/".into())));
        assert_eq!(at("/probe/http/healthz"), None);
        assert_eq!(at("/probe/70000/healthz"), None);
        assert_eq!(at("/healthz"), None);
    }

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
