//! Transparent capture, as a listener sees it: a connection the pod's NAT rules
//! redirected here (`tollgate iptables`) still knows where it was going, and that
//! decides what it is.
//!
//! The original destination is read from the socket (`SO_ORIGINAL_DST`, or
//! `IP6T_SO_ORIGINAL_DST` for IPv6) as soon as the connection is accepted, before a
//! byte is read: one `getsockopt` per connection, on the outbound and inbound listeners
//! only. A connection that was not redirected (no original destination, or the
//! listener's own address) is served exactly as before. A redirected one:
//!
//! - outbound: to an address that belongs to an upstream (the outbound side's
//!   `destinations`) it is HTTP to that upstream, as on the upstream's own `listen` port: every request on
//!   it goes there whatever its `Host` (which is still sent on, unless the upstream sets
//!   `host`), under that upstream's retry policy, budget and limits; unless its client
//!   does not begin with an HTTP request line, or stays silent ([`super::sniff`]): then
//!   it is passed through as below;
//! - inbound: to the port of `[inbound].app` (or the inbound port itself) it is a
//!   caller's HTTP to the app, through the inbound side;
//! - anything else is passed through to where it was going, bytes untouched
//!   ([`super::passthrough`]), counted in `tollgate_passthrough_connections_total`.
//!
//! Never into tollgate itself: a destination that is one of tollgate's own listeners is
//! refused (closed, counted as a `loop` failure), not connected to.
//!
//! Each side says which redirected connections are its own ([`Captures`]): the outbound
//! side's service implements it beside its destinations, the inbound side's beside its
//! service.

use std::future::Future;
use std::net::SocketAddr;

use socket2::SockRef;
use tokio::net::TcpStream;
use tokio::sync::watch;

use std::sync::Arc;

use super::{ConnCount, Serving, passthrough, sniff};
use crate::answer::Local;
use crate::config::ListenerConfig;
use crate::descriptors::Throttled;
use crate::metrics::Outcome;
use crate::metrics::passthrough::{Direction, PassFailure};
use crate::served::{Served, Uncounted};
use crate::server::service::{AppRequest, AppResponse};
use crate::server::{self, ConnState, Service};

/// A service whose listener may receive redirected connections.
pub trait Captures: Service {
    /// The service for a connection redirected from `original`, or `None` when it is
    /// not this service's to serve (it is passed through).
    fn redirected(&self, original: SocketAddr) -> impl Future<Output = Option<Self>> + Send;
}

/// Where a connection was going when it was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// To this listener: not redirected.
    Direct,
    /// Redirected here from this address.
    Redirected(SocketAddr),
}

/// The original destination of an accepted connection, when the kernel's connection
/// tracking knows one (it does for every connection once a NAT rule exists in the
/// network namespace, redirected or not).
fn original_dst(stream: &TcpStream, peer: SocketAddr) -> Option<SocketAddr> {
    let sock = SockRef::from(stream);
    let found = match peer {
        SocketAddr::V6(p) if p.ip().to_ipv4_mapped().is_none() => sock.original_dst_v6(),
        _ => sock.original_dst_v4(),
    };
    found.ok()?.as_socket()
}

/// Whether the connection was redirected to the listener bound at `bound`.
fn arrival(stream: &TcpStream, peer: SocketAddr, bound: SocketAddr, d: Direction) -> Arrival {
    let Some(original) = original_dst(stream, peer) else {
        return Arrival::Direct;
    };
    let ip = original.ip().to_canonical();
    if original.port() != bound.port() {
        return Arrival::Redirected(original);
    }
    let direct = match d {
        // Sent to the inbound port, at whichever of the pod's addresses: what it is for.
        Direction::Inbound => true,
        Direction::Outbound => {
            ip == bound.ip().to_canonical()
                || ip.is_loopback()
                // Bound to every address: the one it came to tells.
                || (bound.ip().is_unspecified()
                    && stream
                        .local_addr()
                        .is_ok_and(|l| l.ip().to_canonical() == ip))
        }
    };
    if direct {
        Arrival::Direct
    } else {
        Arrival::Redirected(original)
    }
}

static LOOPS: Throttled = Throttled::new();
static CAME_BACK: Throttled = Throttled::new();

/// One accepted connection of a listener that `capture`s in that direction (`None`:
/// it does not, like an upstream's own `listen` port): served by `service`, by the
/// service a redirect calls for, or passed through. `counted` holds the connection's
/// place in its listener's count until it closes.
#[allow(clippy::too_many_arguments)]
pub(super) async fn connection<S: Captures>(
    stream: TcpStream,
    peer: SocketAddr,
    bound: SocketAddr,
    capture: Option<Direction>,
    service: S,
    counted: ConnCount,
    settings: ListenerConfig,
    shutdown: watch::Receiver<bool>,
) {
    let serving = &counted.0;
    let redirected = match capture.map(|d| (d, arrival(&stream, peer, bound, d))) {
        Some((d, Arrival::Redirected(original))) => Some((d, original)),
        _ => None,
    };
    if let Some((d, original)) = redirected {
        if crate::loops::arrived(original) {
            // `run`'s check that its own connections are not captured: they are.
            return;
        }
        if crate::loops::is_own(peer) {
            looped(serving, d, original);
            return server::serve(stream, peer, Looped, settings, shutdown).await;
        }
    }
    let service = match redirected {
        None => service,
        Some((d, original)) => match service.redirected(original).await {
            // An upstream's port, but not every client there speaks HTTP (a Redis
            // client, TLS, a server that speaks first): those pass, untouched.
            Some(_) if d == Direction::Outbound && !sniff::speaks_http(&stream).await => {
                return pass(stream, original, d, serving, settings, shutdown).await;
            }
            Some(service) => service,
            None => return pass(stream, original, d, serving, settings, shutdown).await,
        },
    };
    server::serve(stream, peer, service, settings, shutdown).await
}

/// tollgate's own connection to `original` came back to it: counted, warned about (at
/// most once every few seconds), and closed at this first turn.
fn looped(serving: &Serving, direction: Direction, original: SocketAddr) {
    serving
        .metrics
        .passthrough()
        .failure(direction, PassFailure::Loop)
        .inc();
    if let Some(n) = CAME_BACK.due() {
        let uid = crate::loops::uid().map_or_else(|| "unknown".to_string(), |u| u.to_string());
        tracing::warn!(count = n, %original, direction = direction.as_str(), uid, "tollgate's own connection came back to it through the capture rules and is closed (the rules must spare the UID tollgate runs as: `tollgate iptables --uid {uid}`)");
    }
}

/// What answers the requests of one of tollgate's own connections that came back:
/// `508`, outcome `loop`, and the connection closed.
#[derive(Clone)]
struct Looped;

impl Service for Looped {
    fn call(
        &self,
        req: AppRequest,
        conn: &Arc<ConnState>,
    ) -> impl Future<Output = AppResponse> + Send + use<> {
        let mut served = Served::arrive(conn.clone(), tokio::time::Instant::now(), &req);
        served.close_connection();
        let local = Local {
            status: http::StatusCode::LOOP_DETECTED,
            outcome: Outcome::Loop,
            attempts: Some(0),
            failure: None,
            text: "this is tollgate's own connection come back through the capture rules: \
                   they must spare the UID tollgate runs as\n",
            retry_after: None,
            ran: None,
        };
        std::future::ready(served.answer(local, &Uncounted))
    }
}

/// Passes a redirected connection through to `original`, unless that would loop.
async fn pass(
    stream: TcpStream,
    original: SocketAddr,
    direction: Direction,
    serving: &Serving,
    settings: ListenerConfig,
    shutdown: watch::Receiver<bool>,
) {
    let metrics = &serving.metrics;
    if serving.own.is_own(original) {
        metrics
            .passthrough()
            .failure(direction, PassFailure::Loop)
            .inc();
        if let Some(n) = LOOPS.due() {
            tracing::warn!(count = n, %original, direction = direction.as_str(), "a redirected connection to one of tollgate's own listeners is closed, not passed through (it would loop)");
        }
        return;
    }
    metrics.passthrough().connection(direction).inc();
    passthrough::relay(stream, original, direction, metrics, shutdown, &settings).await;
}
