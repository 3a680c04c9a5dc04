//! A request for an authority no upstream lists, with `unknown_authorities = "pass"`:
//! forwarded as it is, once, as if tollgate were not there. An app that sends all its
//! HTTP through `http_proxy` calls hosts tollgate was never told about, and must reach
//! them as it would without tollgate.
//!
//! Where it goes: on a redirected connection, to the connection's original destination
//! (the upstream it belonged to has gone from the config); otherwise to the authority
//! the request names (an absolute-form or HTTP/2 target's, else `Host`), port 80 unless
//! it says another. A `CONNECT` (what `https_proxy` sends) is answered `200` once its
//! authority is connected, and its connection then carries bytes both ways untouched.
//!
//! As it is: one attempt, never retried; no deadline and no `x-tollgate-*` field is
//! added or taken out, in either direction; only the hop-by-hop fields go, as through
//! any proxy, and the head goes out in origin-form with the target's authority as
//! `Host`. The body streams both ways. HTTP/1.1 to the destination, whatever the app
//! spoke (a gRPC call over HTTP/2 tries HTTP/2 first: it cannot be carried otherwise).
//! Connections are kept per destination ([`super::origins`]) and names looked up as an
//! endpoint's are. Nothing but the connect is timed (`passthrough_connect_timeout`):
//! the app's own timeouts apply, as they would without tollgate.
//!
//! When it cannot go, tollgate answers, as a forward proxy does, with `x-tollgate-outcome`
//! saying why: `502 upstream-unreachable` when the destination could not be connected
//! to (or its name not resolved), `502 attempts-exhausted` when the connection broke
//! before an answer, `404 no-route` when the request names no usable destination, and
//! `508 loop` when the destination is one of tollgate's own listeners (the request
//! would come back, for ever). Counted under `upstream="passthrough"`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::AcqRel, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::uri::Authority;
use http::{HeaderValue, Method, Request, Response, Version};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::Shared;
use super::origins::{Origin, Origins};
use crate::answer::{Local, NO_DESCRIPTORS, NO_ROUTE, PASS_LOOP, PASS_RESET, PASS_UNREACHABLE};
use crate::config::{EndpointAddr, PASSTHROUGH, parse_endpoint};
use crate::fault::Fault;
use crate::http::fields::authority_of;
use crate::http::grpc::is_grpc;
use crate::http::request::origin_form;
use crate::listen::passthrough;
use crate::metrics::{AttemptResult, Metrics, Outcome, UpstreamMetrics, UpstreamSeries};
use crate::served::Served;
use crate::server::headers::strip_for_passing;
use crate::server::service::{AppRequest, AppResponse};
use crate::server::{AddedFields, Admission, AppBody, RequestGuard, ResponseBody};
use crate::upstream::connect::ConnectError;
use crate::upstream::exchange::{self, Reach};
use crate::upstream::pool::Want;
use crate::upstream::request::{AttemptFields, ContinueWait, RequestHead};
use crate::upstream::response::{UpstreamResponse, relayed};
use crate::upstream::upgraded::Upgraded;

/// The requests passed through, counted and pooled together.
pub struct Passing {
    /// Counted as the upstream `passthrough`, from the first request passed through.
    pub metrics: UpstreamSeries,
    pub origins: Origins,
    inflight: AtomicUsize,
}

impl std::fmt::Debug for Passing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Passing")
            .field("origins", &self.origins)
            .finish_non_exhaustive()
    }
}

impl Passing {
    pub fn new(metrics: &Metrics, workers: usize) -> Arc<Self> {
        Arc::new(Passing {
            metrics: metrics.upstream(PASSTHROUGH, &[], false),
            origins: Origins::new(workers),
            inflight: AtomicUsize::new(0),
        })
    }

    /// Requests being passed through now (a tunnel counts until it closes).
    pub fn inflight(&self) -> usize {
        self.inflight.load(Relaxed)
    }

    /// Open connections to the destinations.
    pub fn connections(&self) -> usize {
        self.origins.open.load(Relaxed)
    }
}

impl Admission for Passing {
    fn leave(&self) {
        self.inflight.fetch_sub(1, AcqRel);
    }

    fn finished(&self, took: Duration) {
        self.metrics
            .get()
            .request_duration
            .observe(took.as_secs_f64());
    }
}

/// Why a request was not passed through: tollgate answers in its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unpassed {
    /// It names no destination tollgate can use.
    NoTarget(&'static str),
    /// The destination is one of tollgate's own listeners.
    Loop,
    /// No connection to the destination (refused, no answer in time, name unknown).
    Unreachable,
    /// The connection broke before the destination answered.
    Reset,
    /// This process is out of file descriptors.
    NoDescriptors,
}

impl Unpassed {
    /// Its answer, from the table of refusals ([`crate::answer`]); a request that names
    /// no usable destination is told why in its own words.
    fn local(self) -> Local<'static> {
        let r = match self {
            Unpassed::NoTarget(why) => {
                return Local {
                    text: why,
                    ..NO_ROUTE.local(Some(0))
                };
            }
            Unpassed::Loop => &PASS_LOOP,
            Unpassed::Unreachable => &PASS_UNREACHABLE,
            Unpassed::Reset => &PASS_RESET,
            Unpassed::NoDescriptors => &NO_DESCRIPTORS,
        };
        r.local(Some(u32::from(self.attempt().is_some())))
    }

    /// The attempt it counts as, if one was made.
    fn attempt(self) -> Option<AttemptResult> {
        match self {
            Unpassed::Unreachable => Some(AttemptResult::ConnectFailure),
            Unpassed::Reset => Some(AttemptResult::Reset),
            Unpassed::NoTarget(_) | Unpassed::Loop | Unpassed::NoDescriptors => None,
        }
    }
}

/// The one attempt: counted once with its result, or as cancelled when the app left
/// before it ended.
struct Attempt<'a> {
    metrics: &'a UpstreamMetrics,
    start: Instant,
    ended: bool,
}

impl<'a> Attempt<'a> {
    fn start(metrics: &'a UpstreamMetrics) -> Self {
        Attempt {
            metrics,
            start: Instant::now(),
            ended: false,
        }
    }

    fn end(mut self, result: Option<AttemptResult>) {
        self.ended = true;
        if let Some(r) = result {
            self.record(r);
        }
    }

    fn record(&self, r: AttemptResult) {
        self.metrics.attempt(r);
        let took = self.start.elapsed().as_secs_f64();
        self.metrics.attempt_duration.observe(took);
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.record(AttemptResult::Cancelled);
        }
    }
}

/// Passes `req` through: to `captured`, the original destination of its connection,
/// or else to the authority it names.
pub(super) async fn pass(
    shared: Arc<Shared>,
    captured: Option<SocketAddr>,
    req: AppRequest,
    mut served: Served,
) -> AppResponse {
    served.grpc_call(is_grpc(req.headers()));
    let passing = shared.passing.clone();
    passing.inflight.fetch_add(1, AcqRel);
    served.guard().admitted(passing.clone());
    if let Some(e) = served.log() {
        e.upstream = Some(PASSTHROUGH.to_string());
    }
    let target = match destination(&req, captured) {
        Ok(t) => t,
        Err(why) => return refuse(served, &passing, Unpassed::NoTarget(why)),
    };
    let origin = passing.origins.get(&target);
    let timeout = shared
        .snapshot
        .load()
        .config
        .listener
        .passthrough_connect_timeout;
    let to = To {
        shared: &shared,
        origin: &origin,
        timeout,
    };
    if req.method() == Method::CONNECT {
        return tunnel(&to, req, served).await;
    }
    forward(&to, *req, served).await
}

/// Tollgate answers in the place of the destination's answer.
fn refuse(served: Served, passing: &Passing, u: Unpassed) -> AppResponse {
    served.answer(u.local(), passing.metrics.get())
}

/// The destination's answer goes back with `status`, counted and logged: the
/// request's guard goes on to the body that carries it.
fn answered(mut served: Served, passing: &Passing, status: u16) -> RequestGuard {
    let start = served.start();
    if let Some(e) = served.log() {
        e.upstream_time = Some(start.elapsed());
    }
    served.answered((status, Outcome::Ok, 1), passing.metrics.get())
}

/// A TCP connection of its own to what a `CONNECT` names (`host:port`), within
/// `passthrough_connect_timeout`: for a tunnel to an upstream's authority whose bytes
/// are not HTTP. `None` when it cannot be made, or would loop back into tollgate.
pub(super) async fn connect_named<B>(shared: &Shared, req: &Request<B>) -> Option<TcpStream> {
    let target = destination(req, None).ok()?;
    let origin = shared.passing.origins.get(&target);
    let timeout = shared
        .snapshot
        .load()
        .config
        .listener
        .passthrough_connect_timeout;
    let to = To {
        shared,
        origin: &origin,
        timeout,
    };
    to.stream().await.ok()
}

/// Where a request no upstream claims goes: the original destination of a redirected
/// connection, else the authority it names, port 80 unless it says another (a
/// `CONNECT` must say).
fn destination<B>(
    req: &Request<B>,
    captured: Option<SocketAddr>,
) -> Result<EndpointAddr, &'static str> {
    if let Some(dst) = captured {
        return Ok(EndpointAddr {
            host: dst.ip().to_canonical().to_string(),
            port: dst.port(),
        });
    }
    if req
        .uri()
        .scheme_str()
        .is_some_and(|s| !s.eq_ignore_ascii_case("http"))
    {
        return Err(
            "only http:// is passed through as a request: send https:// through \
                    CONNECT (https_proxy)\n",
        );
    }
    let named = authority_of(req).ok_or("the request names no authority (no Host)\n")?;
    let bad = "the authority is not a usable host[:port]\n";
    let authority: Authority = named.parse().map_err(|_| bad)?;
    let port = match authority.port_u16() {
        Some(p) => p,
        None if req.method() == Method::CONNECT => return Err("CONNECT needs host:port\n"),
        None => 80,
    };
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let addr = EndpointAddr {
        host: host.trim_end_matches('.').to_string(),
        port,
    };
    parse_endpoint(&addr.to_string()).map_err(|_| bad)
}

/// The destination of one request, and how long connecting to it may take.
struct To<'a> {
    shared: &'a Shared,
    origin: &'a Origin,
    timeout: Duration,
}

impl To<'_> {
    /// The destination's address to connect to, unless it would loop back into
    /// tollgate. Bounded by the caller.
    async fn address(&self) -> Result<SocketAddr, Unpassed> {
        let resolver = self.origin.resolver();
        let addrs = resolver.addresses().await.map_err(|e| {
            tracing::debug!(error = %e, "a request passed through names an unknown host");
            failed_connect(&ConnectError::from(e))
        })?;
        if addrs.iter().any(|a| self.shared.is_own(*a)) {
            return Err(Unpassed::Loop);
        }
        resolver.resolve().await.map_err(|_| Unpassed::Unreachable)
    }

    /// A TCP connection of its own, for a tunnel.
    async fn stream(&self) -> Result<TcpStream, Unpassed> {
        let until = Instant::now() + self.timeout;
        let addr = match tokio::time::timeout_at(until, self.address()).await {
            Ok(a) => a?,
            Err(_) => return Err(Unpassed::Unreachable),
        };
        let left = until.saturating_duration_since(Instant::now());
        let metrics = &self.shared.metrics;
        passthrough::connect(addr, left, metrics)
            .await
            .map_err(|e| {
                tracing::debug!(%addr, error = %e, "cannot connect a CONNECT tunnel");
                if crate::descriptors::is_exhaustion(&e) {
                    Unpassed::NoDescriptors
                } else {
                    Unpassed::Unreachable
                }
            })
    }
}

fn failed_connect(e: &ConnectError) -> Unpassed {
    if e.out_of_descriptors() {
        Unpassed::NoDescriptors
    } else {
        Unpassed::Unreachable
    }
}

/// An HTTP request, sent once; the destination's answer goes back as it came.
async fn forward(to: &To<'_>, req: Request<AppBody>, served: Served) -> AppResponse {
    let (parts, body) = req.into_parts();
    let version = parts.version;
    let mut headers = parts.headers;
    let upgrade = strip_for_passing(&mut headers, version == Version::HTTP_11);
    // An absolute-form (or HTTP/2) target's authority is the Host the destination
    // gets (RFC 9112 section 3.2.2).
    if let Some(a) = parts.uri.authority()
        && let Ok(v) = HeaderValue::from_str(a.as_str())
    {
        headers.insert(HOST, v);
    }
    let uri = origin_form(parts.uri);
    let head = RequestHead::as_is(
        &parts.method,
        &uri,
        &headers,
        ContinueWait::of(exchange::CONTINUE_WAIT),
    );
    let want = match version {
        Version::HTTP_2 if served.grpc() && !upgrade => Want::PreferHttp2,
        _ => Want::Http1,
    };
    let passing = &to.shared.passing;
    let attempt = Attempt::start(passing.metrics.get());
    let resp = match send(to, want, &head, body).await {
        Ok(resp) => resp,
        Err(u) => {
            attempt.end(u.attempt());
            return refuse(served, passing, u);
        }
    };
    let status = resp.status().as_u16();
    attempt.end(Some(AttemptResult::of_status(status)));
    let guard = answered(served, passing, status);
    let (parts, body) = relayed(resp, version);
    Box::new(Response::from_parts(
        parts,
        ResponseBody::upstream(body, guard, AddedFields::default()),
    ))
}

/// Sends the request to the destination, as every exchange is sent
/// ([`crate::upstream::exchange`]: a pooled connection, else a new one within the
/// connect timeout, a closed pooled one passed over), and waits for the answer's head
/// for as long as the app does. A destination that would loop back into tollgate is
/// never connected to.
async fn send(
    to: &To<'_>,
    want: Want,
    head: &RequestHead<'_>,
    body: AppBody,
) -> Result<UpstreamResponse, Unpassed> {
    // The name's lookup is part of the connect, and timed with it.
    let started = Instant::now();
    match tokio::time::timeout(to.timeout, to.address()).await {
        Ok(address) => address?,
        Err(_) => return Err(Unpassed::Unreachable),
    };
    let reach = Reach {
        want,
        tls: None,
        connect_timeout: to.timeout.saturating_sub(started.elapsed()),
        started,
        by: None,
        own_connection: false,
        race: None,
    };
    let at = |_| RequestHead {
        fields: AttemptFields::default(),
        ..*head
    };
    let failed = match exchange::send(to.origin, reach, at, &mut Some(body), &mut None).await {
        Ok(resp) => return Ok(resp),
        Err(failed) => failed,
    };
    tracing::debug!(error = %failed, "a request passed through got no answer");
    Err(match failed.fault(exchange::Wire::Plain) {
        Fault::NoDescriptors => Unpassed::NoDescriptors,
        // Sent, and broken off (no deadline: no timeout after it went).
        f if failed.sent() => {
            debug_assert_eq!(f, Fault::Reset);
            Unpassed::Reset
        }
        _ => Unpassed::Unreachable,
    })
}

/// A `CONNECT`: answered `200` once its authority is connected, then a tunnel.
async fn tunnel(to: &To<'_>, mut req: AppRequest, served: Served) -> AppResponse {
    let passing = &to.shared.passing;
    let attempt = Attempt::start(passing.metrics.get());
    let stream = match to.stream().await {
        Ok(s) => s,
        Err(u) => {
            attempt.end(u.attempt());
            return refuse(served, passing, u);
        }
    };
    attempt.end(Some(AttemptResult::Success));
    let guard = answered(served, passing, 200);
    let upgraded = Upgraded::plain(stream, &to.origin_open());
    if req.version() == Version::HTTP_2 {
        // HTTP/2 (RFC 9113 section 8.5): the stream is the tunnel once the answer is
        // out; hyper hands it over then.
        let on_upgrade = hyper::upgrade::on(&mut *req);
        let shutdown = to.shared.listeners.draining();
        let drain = to.shared.snapshot.load().config.listener.drain_timeout;
        tokio::spawn(h2_tunnel(on_upgrade, upgraded, guard, shutdown, drain));
        return Box::new(Response::new(ResponseBody::full(Bytes::new(), None)));
    }
    Box::new(Response::new(ResponseBody::tunnel(upgraded, guard)))
}

impl To<'_> {
    fn origin_open(&self) -> Arc<AtomicUsize> {
        self.shared.passing.origins.open.clone()
    }
}

/// Carries an HTTP/2 `CONNECT` stream's bytes to its destination and back until both
/// have ended, or `drain` after a drain began. The request's guard lives as long.
async fn h2_tunnel(
    on_upgrade: hyper::upgrade::OnUpgrade,
    mut dst: Upgraded,
    _guard: RequestGuard,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    drain: Duration,
) {
    let Ok(stream) = on_upgrade.await else {
        return;
    };
    let mut app = TokioIo::new(stream);
    relay(&mut app, &mut dst, &mut shutdown, drain).await;
}

/// Carries a tunnel's bytes both ways until either side ends, or `drain` after a drain
/// began.
pub(super) async fn relay<A, B>(
    a: &mut A,
    b: &mut B,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    drain: Duration,
) where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
{
    let drained = async {
        if shutdown.wait_for(|draining| *draining).await.is_ok() {
            tokio::time::sleep(drain).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(a, b) => {}
        _ = drained => tracing::debug!("CONNECT tunnel closed at the drain timeout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(method: &str, target: &str, host: Option<&str>) -> Result<String, &'static str> {
        let mut b = Request::builder().method(method).uri(target);
        if let Some(h) = host {
            b = b.header(HOST, h);
        }
        let req = b.body(()).unwrap_or_else(|_| unreachable!());
        destination(&req, None).map(|a| a.to_string())
    }

    #[test]
    fn the_destination_is_the_authority_the_request_names_port_80_by_default() {
        assert_eq!(
            to("GET", "http://Api.Example/x", None),
            Ok("api.example:80".into())
        );
        assert_eq!(
            to("GET", "/x", Some("api.example:8080")),
            Ok("api.example:8080".into())
        );
        assert_eq!(
            to("GET", "/x", Some("api.example.")),
            Ok("api.example:80".into())
        );
        assert_eq!(to("GET", "/x", Some("[::1]:81")), Ok("[::1]:81".into()));
        // The target's authority wins over Host, as for routing.
        assert_eq!(
            to("GET", "http://a.example/", Some("b.example")),
            Ok("a.example:80".into())
        );
        assert_eq!(
            to("CONNECT", "a.example:443", None),
            Ok("a.example:443".into())
        );
    }

    #[test]
    fn a_request_that_names_no_usable_destination_is_not_passed() {
        assert!(to("GET", "/x", None).is_err(), "no Host");
        assert!(
            to("GET", "https://a.example/", None).is_err(),
            "https goes by CONNECT"
        );
        assert!(to("GET", "/x", Some("a_b.example")).is_err());
        assert!(to("CONNECT", "a.example:443", None).is_ok());
    }

    #[test]
    fn a_captured_connection_goes_where_it_was_going() {
        let req = Request::builder()
            .uri("/x")
            .header(HOST, "elsewhere.example")
            .body(())
            .unwrap_or_else(|_| unreachable!());
        let original: SocketAddr = "[::ffff:10.0.0.7]:8080"
            .parse()
            .unwrap_or_else(|_| unreachable!());
        let dst = destination(&req, Some(original)).map(|a| a.to_string());
        assert_eq!(dst, Ok("10.0.0.7:8080".into()));
    }
}
