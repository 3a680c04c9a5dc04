//! One request to the app, on one of the pooled connections to it: the head goes out
//! with the deadline rewritten to the time left, the body as the caller sends it
//! (streaming, never kept: the inbound side never sends a request twice), and the
//! response head is awaited until the deadline. A pooled connection the app had closed
//! is passed over for another without resending anything (the request never left).
//! When no head comes, the [`Fault`] says why, as the outbound side's attempts say it
//! (the inbound side's refusal for it: [`super::answer::refusal`]).
//!
//! The app is at `[inbound] app`, or, when that is loopback and refuses, at the same port
//! of the pod's own address (`POD_IP`, which inject sets from the downward API): an app
//! bound to its pod IP is reached as the kubelet reaches it ([`App`]).
//!
//! The inbound service reaches the app through [`AppWire`]: in production its pooled
//! connections ([`Connections`], which is [`send`]), in the service's tests a script.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use http::HeaderName;
use prometheus::IntCounter;
use tokio::time::Instant;

use crate::config::EndpointAddr;
use crate::deadline::{self, Deadline};
use crate::fault::Fault;
use crate::upstream::OutgoingBody;
use crate::upstream::connect::ConnectError;
use crate::upstream::exchange::{self, Failed, Reach, Wire};
use crate::upstream::pool::{Endpoint, Want};
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::UpstreamResponse;

/// The app is local: a connection that takes longer than this is not coming.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How the deadline travels to the app.
pub struct DeadlineFields<'a> {
    pub deadline: Deadline,
    /// The configured deadline header, written with the time left.
    pub header: &'a HeaderName,
    /// A gRPC call: `grpc-timeout` carries the time left of the caller's own deadline.
    pub grpc: bool,
    /// The request's `traceparent` for the app, when it is traced: the inbound side's
    /// SERVER span as the parent.
    pub traceparent: Option<http::HeaderValue>,
}

static TRACEPARENT_NAME: HeaderName = crate::trace::TRACEPARENT;

impl<'a> DeadlineFields<'a> {
    /// The fields for a request sent now: the deadline header only when there is a
    /// deadline.
    pub(super) fn at(&self, now: Instant) -> AttemptFields<'a> {
        let left = self.deadline.remaining(now);
        AttemptFields([
            left.map(|left| (self.header, deadline::format_millis(left))),
            self.deadline.caller_at().filter(|_| self.grpc).map(|at| {
                let left = at.saturating_duration_since(now);
                (
                    &deadline::GRPC_TIMEOUT_NAME,
                    deadline::format_grpc_timeout(left),
                )
            }),
            self.traceparent.clone().map(|v| (&TRACEPARENT_NAME, v)),
            None,
        ])
    }
}

/// The pod's own address, as inject sets it from the downward API (`POD_IP`).
pub fn pod_ip() -> Option<IpAddr> {
    std::env::var("POD_IP")
        .ok()
        .and_then(|ip| ip.trim().parse::<IpAddr>().ok())
}

/// The app's connections: at its configured address, and at the pod's own address when
/// that is loopback and the app refuses it there.
pub struct App<B> {
    /// At `[inbound] app`.
    configured: Endpoint<B>,
    /// At the same port of `POD_IP`, when `[inbound] app` is a loopback address.
    pod: Option<Endpoint<B>>,
    /// The pod's address answered where the configured one refused: it goes first.
    at_pod: AtomicBool,
}

impl<B: OutgoingBody> App<B> {
    /// The app at `addr` (its connections counted in `open`), with its fallback at the
    /// pod's address `pod_ip` when `addr` is loopback.
    pub fn new(
        addr: EndpointAddr,
        pod_ip: Option<IpAddr>,
        open: &Arc<AtomicUsize>,
        workers: usize,
    ) -> Self {
        let endpoint = |addr| Endpoint::new("inbound".into(), addr, open.clone(), workers, None);
        let pod = addr
            .ip()
            .filter(|a| a.ip().is_loopback())
            .zip(pod_ip)
            .filter(|(a, ip)| *ip != a.ip() && !ip.is_unspecified())
            .map(|(a, ip)| {
                endpoint(EndpointAddr {
                    host: ip.to_string(),
                    port: a.port(),
                })
            });
        App {
            configured: endpoint(addr),
            pod,
            at_pod: AtomicBool::new(false),
        }
    }

    /// Closes the idle connections the app has closed.
    pub fn sweep(&self) {
        self.configured.sweep();
        if let Some(pod) = &self.pod {
            pod.sweep();
        }
    }

    /// The address tried first, and the other one.
    fn order(&self) -> (&Endpoint<B>, Option<&Endpoint<B>>) {
        match &self.pod {
            Some(pod) if self.at_pod.load(Ordering::Relaxed) => (pod, Some(&self.configured)),
            pod => (&self.configured, pod.as_ref()),
        }
    }
}

/// What carries a request to the app: its pooled connections ([`Connections`]), or, in
/// the tests of the inbound service, a script. [`send`] is what it does.
pub trait AppWire: Clone + Send + Sync + 'static {
    /// Sends the request to `app` and waits for its response head, as [`send`] does.
    fn send<'a, B: OutgoingBody>(
        &'a self,
        app: &'a App<B>,
        want: Want,
        head: &'a RequestHead<'a>,
        body: B,
        fields: &'a DeadlineFields<'a>,
        exhausted: &'a IntCounter,
    ) -> impl Future<Output = Result<UpstreamResponse, NoAnswer>> + Send + 'a;
}

/// The app's own connections, pooled: how requests reach it in production.
#[derive(Clone, Copy, Debug, Default)]
pub struct Connections;

impl AppWire for Connections {
    #[inline]
    fn send<'a, B: OutgoingBody>(
        &'a self,
        app: &'a App<B>,
        want: Want,
        head: &'a RequestHead<'a>,
        body: B,
        fields: &'a DeadlineFields<'a>,
        exhausted: &'a IntCounter,
    ) -> impl Future<Output = Result<UpstreamResponse, NoAnswer>> + Send + 'a {
        send(app, want, head, body, fields, exhausted)
    }
}

/// Whether no connection could be opened because the address refused it.
fn refused(failed: &Failed) -> bool {
    matches!(failed, Failed::Connect(ConnectError::Connect { source, .. })
        if source.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// The app gave no answer: why, and whether it may have had the request.
#[derive(Clone, Copy, Debug)]
pub struct NoAnswer {
    pub fault: Fault,
    /// The request went out to it (and then its connection broke, or the deadline
    /// passed): it may have run. Not when no connection was made before the deadline,
    /// nor for a stream it refused.
    pub sent: bool,
}

/// Sends the request to `app` and waits for its response head until the deadline. No
/// head is a [`Fault::ConnectFailure`] (no connection to it), a [`Fault::Timeout`]
/// (the deadline passed first), a [`Fault::Reset`] (it broke the connection after the
/// request went out) or [`Fault::NoDescriptors`].
pub async fn send<'a, B: OutgoingBody>(
    app: &App<B>,
    want: Want,
    head: &RequestHead<'a>,
    body: B,
    fields: &DeadlineFields<'a>,
    exhausted: &IntCounter,
) -> Result<UpstreamResponse, NoAnswer> {
    let reach = Reach {
        want,
        tls: None,
        connect_timeout: CONNECT_TIMEOUT,
        started: Instant::now(),
        by: fields.deadline.at(),
        own_connection: false,
        race: None,
    };
    let at = |now| RequestHead {
        fields: fields.at(now),
        rare: None,
        continue_wait: exchange::continue_wait(fields.deadline.remaining(now)),
        ..*head
    };
    let mut body = Some(body);
    let (mut tried, other) = app.order();
    let mut sent = exchange::send(tried, reach, &at, &mut body, &mut None).await;
    // Refused there, nothing sent: the other address of the same app.
    if let (Err(failed), Some(other)) = (&sent, other)
        && refused(failed)
    {
        tried = other;
        sent = exchange::send(other, reach, &at, &mut body, &mut None).await;
        if sent.is_ok() {
            let at_pod = app.pod.as_ref().is_some_and(|pod| std::ptr::eq(pod, other));
            app.at_pod.store(at_pod, Ordering::Relaxed);
        }
    }
    let failed = match sent {
        Ok(resp) => return Ok(resp),
        Err(failed) => failed,
    };
    // The app is reached without TLS: no reason to tell. A stream it refused never
    // left tollgate as far as the app is concerned (RFC 9113 section 8.7: nothing of
    // it was processed): as a refused connection, it did not run.
    let (fault, sent) = match &failed {
        Failed::Broken { error, .. } if refused_stream(&**error) => (Fault::ConnectFailure, false),
        _ => (failed.fault(Wire::Plain), failed.sent()),
    };
    match fault {
        Fault::NoDescriptors => exhausted.inc(),
        Fault::Timeout => {}
        _ => tracing::debug!(app = %tried.addr, error = %failed, "the app gave no answer"),
    }
    Err(NoAnswer { fault, sent })
}

/// Whether an HTTP/2 stream was refused by the app (`REFUSED_STREAM` from its side).
fn refused_stream(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_remote() && h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        cause = e.source();
    }
    false
}
