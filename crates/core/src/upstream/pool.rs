//! One endpoint's connections: idle HTTP/1.1 connections (see [`h1`]), or one shared
//! HTTP/2 connection, per worker; and the connection an attempt checks out, which
//! sends the request on whichever it is.
//!
//! With `max_connection_age`, a connection older than that is not used for another
//! request: an HTTP/1.1 one is closed when its response ends instead of going back to
//! the idle queue, and a shared HTTP/2 one is replaced for new requests (those running
//! on it finish). A pool that is never idle would otherwise keep its connections for
//! ever, and never see the endpoints a Service's name or VIP leads to now.

use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed,
};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::OutgoingBody;
use super::connect::{self, ConnectError, H2Sender};
use super::dns::Resolver;
use super::h1::{self, Connection, IdleQueues, Lease};
use super::outlier::Health;
use super::request::RequestHead;
use super::response::UpstreamResponse;
use super::tls::TlsClient;
use super::tls_failure::WarnEvery;
use crate::config::EndpointAddr;
use crate::http::{BoxError, ByProtocol};

const SKIP_FIRST_MS: u64 = 250;
const SKIP_MAX_MS: u64 = 30_000;

/// Milliseconds on a process-wide monotonic clock (tokio's, so tests can pause it).
pub fn clock_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Which HTTP an attempt wants on this endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Http1,
    Http2,
    /// TLS with ALPN offering both: whatever the endpoint picked last time.
    Negotiate,
    /// Cleartext HTTP/2 unless the endpoint turned out to speak HTTP/1.1 only (an
    /// HTTP/2 app with `protocol = "auto"`).
    PreferHttp2,
}

const ALPN_UNKNOWN: u8 = 0;
const ALPN_H1: u8 = 1;
const ALPN_H2: u8 = 2;

/// The HTTP/2 connection one worker shares among its requests to an endpoint. Its I/O
/// task runs on that worker.
struct H2Conn<B> {
    sender: H2Sender<B>,
    task: AbortHandle,
    born: Instant,
}

struct WorkerH2<B> {
    conn: ArcSwapOption<H2Conn<B>>,
    connecting: tokio::sync::Mutex<()>,
}

/// One endpoint (one address, or a name whose addresses are not known yet) and the
/// connections to it.
pub struct Endpoint<B> {
    pub addr: EndpointAddr,
    /// Its number among its upstream's endpoints, for life: what an attempt avoids.
    pub id: usize,
    /// Its address, when it is one (not a name still to resolve).
    pub peer: Option<std::net::SocketAddr>,
    /// A name's: the address its first connection went to (for the access log, which
    /// names the address an attempt went to).
    resolved: std::sync::OnceLock<std::net::SocketAddr>,
    /// Taken out of its upstream's endpoints: its connections are not kept.
    retired: AtomicBool,
    resolver: Resolver,
    idle: Arc<IdleQueues>,
    h2: Box<[WorkerH2<B>]>,
    /// The HTTP the endpoint speaks, as ALPN picked it last time or, in cleartext, as
    /// its answer to the HTTP/2 preface showed.
    alpn: AtomicU8,
    /// The upstream's name, for the log.
    upstream: Arc<str>,
    /// TLS failures are warned about at most once every few seconds.
    pub tls_warn: WarnEvery,
    /// Connect failures in a row; reset by a successful connect.
    failures: AtomicU32,
    /// Until when (ms on [`clock_ms`]) the endpoint is skipped after a connect failure.
    skip_until: AtomicU64,
    /// Open connections (shared by every endpoint of the upstream).
    open: Arc<AtomicUsize>,
    /// A connection older than this takes no new request.
    max_age: Option<Duration>,
    /// Failures in a row and ejection ([`super::outlier`]).
    pub health: Health,
}

impl<B> std::fmt::Debug for Endpoint<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl<B> Drop for Endpoint<B> {
    fn drop(&mut self) {
        for w in self.h2.iter() {
            if let Some(h2) = w.conn.swap(None) {
                h2.task.abort();
            }
        }
    }
}

impl<B: OutgoingBody> Endpoint<B> {
    pub fn new(
        upstream: Arc<str>,
        addr: EndpointAddr,
        open: Arc<AtomicUsize>,
        workers: usize,
        max_age: Option<Duration>,
    ) -> Self {
        let resolver = Resolver::new(addr.clone());
        Self::with_resolver(upstream, resolver, open, workers, max_age)
    }

    /// An endpoint whose name is looked up by `resolver` (the endpoint's address is
    /// the resolver's).
    pub fn with_resolver(
        upstream: Arc<str>,
        resolver: Resolver,
        open: Arc<AtomicUsize>,
        workers: usize,
        max_age: Option<Duration>,
    ) -> Self {
        let workers = workers.max(1);
        Endpoint {
            upstream,
            tls_warn: WarnEvery::default(),
            addr: resolver.addr().clone(),
            id: 0,
            peer: resolver.addr().ip(),
            resolved: std::sync::OnceLock::new(),
            retired: AtomicBool::new(false),
            resolver,
            idle: Arc::new(IdleQueues::new(workers, max_age)),
            h2: (0..workers)
                .map(|_| WorkerH2 {
                    conn: ArcSwapOption::empty(),
                    connecting: tokio::sync::Mutex::new(()),
                })
                .collect(),
            alpn: AtomicU8::new(ALPN_UNKNOWN),
            failures: AtomicU32::new(0),
            skip_until: AtomicU64::new(0),
            open,
            max_age,
            health: Health::default(),
        }
    }

    fn connect_failed(&self) {
        let n = self.failures.fetch_add(1, Relaxed).min(16);
        let pause = (SKIP_FIRST_MS << n).min(SKIP_MAX_MS);
        self.skip_until.store(clock_ms() + pause, Relaxed);
    }

    /// A connect to it was still not made when one raced beside it to another endpoint
    /// was. Not a failure (a full accept queue is slow, not dead; its health is not
    /// told), but new requests go to the others for a while, as after a refused connect,
    /// so that an endpoint that drops SYNs costs a request `connect_timeout` seldom.
    pub fn outraced(&self) {
        self.connect_failed();
    }

    fn connect_succeeded(&self) {
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
            self.skip_until.store(0, Relaxed);
        }
    }

    /// A new HTTP/1.1 connection, on loan from the start.
    fn http1(&self, transport: connect::EndpointStream) -> Conn<B> {
        let conn = Connection::new(transport, &self.open);
        Conn::Http1(Lease::new(conn, &self.idle, self.worker()))
    }

    /// The calling worker's index.
    fn worker(&self) -> usize {
        crate::worker::current() % self.h2.len()
    }

    /// A pooled connection, if one is ready now: the common case, with no timer and no
    /// await.
    pub fn pooled(&self, want: Want, now: Instant) -> Option<Conn<B>> {
        match (want, self.alpn.load(Relaxed)) {
            (Want::Http1, _) | (Want::Negotiate | Want::PreferHttp2, ALPN_H1) => {
                self.pop_idle(now).map(Conn::Http1)
            }
            (Want::Http2 | Want::PreferHttp2, _) | (Want::Negotiate, ALPN_H2) => {
                self.shared_h2().map(Conn::Http2)
            }
            (Want::Negotiate, _) => None,
        }
    }

    /// `want`, with what the endpoint turned out to speak when that was left open.
    fn settled(&self, want: Want) -> Want {
        match (want, self.alpn.load(Relaxed)) {
            (Want::Negotiate | Want::PreferHttp2, ALPN_H1) => Want::Http1,
            (Want::Negotiate | Want::PreferHttp2, ALPN_H2) => Want::Http2,
            (w, _) => w,
        }
    }

    /// A connection for one attempt: a pooled one when there is one, else a new one
    /// within `timeout`; `true` with a new one.
    pub async fn checkout(
        &self,
        want: Want,
        tls: Option<&TlsClient>,
        timeout: Duration,
    ) -> Result<(Conn<B>, bool), ConnectError> {
        let want = self.settled(want);
        if want == Want::Http1 {
            if let Some(lease) = self.pop_idle(Instant::now()) {
                return Ok((Conn::Http1(lease), false));
            }
            return Ok((self.connect(want, tls, timeout).await?, true));
        }
        if let Some(s) = self.shared_h2() {
            return Ok((Conn::Http2(s), false));
        }
        // One connect at a time: a burst of requests shares the connection the first
        // of them opens instead of each opening its own.
        let _one = self.h2[self.worker()].connecting.lock().await;
        if let Some(s) = self.shared_h2() {
            return Ok((Conn::Http2(s), false));
        }
        Ok((self.connect(want, tls, timeout).await?, true))
    }

    /// A connection opened for one attempt, never a pooled one: a retry to the endpoint
    /// that just failed it, which behind a Service's virtual IP may reach another pod
    /// only on a new connection. An HTTP/2 one becomes the worker's shared connection.
    pub async fn open_new(
        &self,
        want: Want,
        tls: Option<&TlsClient>,
        timeout: Duration,
    ) -> Result<(Conn<B>, bool), ConnectError> {
        let want = self.settled(want);
        Ok((self.connect(want, tls, timeout).await?, true))
    }

    /// The worker's shared HTTP/2 connection, while it is open and not too old.
    fn shared_h2(&self) -> Option<H2Sender<B>> {
        let cur = self.h2[self.worker()].conn.load();
        match cur.as_ref() {
            Some(s) if !s.sender.is_closed() && !self.aged(s.born) => Some(s.sender.clone()),
            _ => None,
        }
    }

    fn aged(&self, born: Instant) -> bool {
        self.max_age.is_some_and(|age| born.elapsed() >= age)
    }

    fn pop_idle(&self, now: Instant) -> Option<Lease> {
        self.idle.take(&self.idle, self.worker(), now)
    }

    async fn connect(
        &self,
        want: Want,
        tls: Option<&TlsClient>,
        timeout: Duration,
    ) -> Result<Conn<B>, ConnectError> {
        // Out of descriptors is this process's shortage: the endpoint is not skipped
        // and its name not looked up again for it.
        let addr = match self.resolver.resolve().await {
            Ok(a) => a,
            Err(e) => {
                let e = ConnectError::from(e);
                if !e.out_of_descriptors() {
                    self.connect_failed();
                }
                return Err(e);
            }
        };
        if self.peer.is_none() {
            let _ = self.resolved.set(addr);
        }
        let transport = match connect::open(addr, tls, timeout).await {
            Ok(t) => t,
            Err(e) => {
                if !e.out_of_descriptors() {
                    self.resolver.invalidate();
                    self.connect_failed();
                }
                return Err(e);
            }
        };
        self.connect_succeeded();
        let h2 = match want {
            Want::Http1 => false,
            Want::Http2 | Want::PreferHttp2 => true,
            Want::Negotiate => {
                let h2 = transport.alpn_h2();
                self.alpn.store(if h2 { ALPN_H2 } else { ALPN_H1 }, Relaxed);
                h2
            }
        };
        if !h2 {
            return Ok(self.http1(transport));
        }
        let sniff = want == Want::PreferHttp2;
        let (sender, task) = match connect::handshake_h2(transport, addr, &self.open, sniff).await {
            Ok(c) => c,
            Err(ConnectError::SpeaksHttp1 { .. }) => {
                // The request was not sent: it goes out as HTTP/1.1 on a connection
                // of its own, as the same attempt, and so does every later one.
                if self.alpn.swap(ALPN_H1, Relaxed) != ALPN_H1 {
                    tracing::info!(
                        upstream = %self.upstream,
                        endpoint = %self.addr,
                        "the endpoint answered HTTP/2 in HTTP/1.1: requests that came over HTTP/2 \
                         go to it as HTTP/1.1 from now on"
                    );
                }
                let transport = connect::open(addr, tls, timeout).await?;
                return Ok(self.http1(transport));
            }
            Err(e) => return Err(e),
        };
        if sniff {
            self.alpn.store(ALPN_H2, Relaxed);
        }
        // The one it replaces, if any: streams still running on it finish; hyper
        // closes it when they do.
        let _old = self.h2[self.worker()].conn.swap(Some(Arc::new(H2Conn {
            sender: sender.clone(),
            task,
            born: Instant::now(),
        })));
        Ok(Conn::Http2(sender))
    }
}

impl<B> Endpoint<B> {
    /// The address its requests go to: its own, or for a name the one its first
    /// connection reached.
    pub fn address(&self) -> Option<std::net::SocketAddr> {
        self.peer.or_else(|| self.resolved.get().copied())
    }

    /// The same endpoint with number `id` among its upstream's.
    pub fn numbered(mut self, id: usize) -> Self {
        self.id = id;
        self
    }

    /// Takes the endpoint out of its upstream's: its idle connections are closed and
    /// no connection goes back to it; its requests in flight finish (an HTTP/2
    /// connection closes once its streams have). Whether it was ejected (its place in
    /// the upstream's count of ejected endpoints is to be given back).
    pub fn retire(&self) -> bool {
        self.retired.store(true, Relaxed);
        self.idle.clear();
        self.forget_h2();
        self.health.forget()
    }

    /// Whether the endpoint was taken out of its upstream's.
    pub fn retired(&self) -> bool {
        self.retired.load(Relaxed)
    }

    /// No new stream goes on the endpoint's HTTP/2 connections: a connection that
    /// carried the endpoint's failure is not reused (behind a Service's virtual IP the
    /// next connection may reach another pod). Streams in flight on them finish.
    pub fn forget_h2(&self) {
        for w in self.h2.iter() {
            if w.conn.load().is_some() {
                // Dropping the handle, not aborting the task: hyper closes the
                // connection once its streams are done.
                w.conn.store(None);
            }
        }
    }

    /// The endpoint's name and what it resolves to.
    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// Whether new requests should avoid this endpoint: it refused a connection a
    /// moment ago. Skipping it for a while (250 ms, doubling with each failure in a row
    /// up to 30 s, then one request tries it again) keeps a dead endpoint from eating
    /// every other first attempt, and the retry budget with it.
    pub fn skipped(&self, now_ms: u64) -> bool {
        self.skip_until.load(Relaxed) > now_ms
    }

    /// The endpoint answered for an app it could not reach (a callee's inbound side said
    /// `app-unreachable`): skipped as if it had refused the connection itself, so a dead
    /// replica behind its sidecar costs its callers no more than a dead replica without
    /// one.
    pub fn unreachable_behind(&self) {
        let n = self.failures.fetch_add(1, Relaxed).min(16);
        let pause = (SKIP_FIRST_MS << n).min(SKIP_MAX_MS);
        self.skip_until.store(clock_ms() + pause, Relaxed);
    }

    /// The endpoint answered for itself: a skip it earned by answering for an app it
    /// could not reach ends.
    #[inline]
    pub fn answered(&self) {
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
            self.skip_until.store(0, Relaxed);
        }
    }

    /// Skips the endpoint until `until_ms`, as a refused connection would.
    #[cfg(test)]
    pub(super) fn skip_until(&self, until_ms: u64) {
        self.skip_until.store(until_ms, Relaxed);
    }

    pub fn idle_count(&self) -> usize {
        self.idle.count()
    }

    /// Closes the idle connections the endpoint has closed or that were kept too long.
    pub fn sweep(&self) {
        self.idle.sweep();
    }
}

/// Why sending on a connection failed.
pub enum SendError<B> {
    /// The request never left: the connection was already closed. Its body comes
    /// back untouched and may go out on another connection at no risk.
    NotSent(B, Option<hyper::Error>),
    /// The request may have reached the upstream.
    Failed(BoxError),
}

/// A connection checked out for one attempt.
pub enum Conn<B> {
    Http1(Lease),
    Http2(H2Sender<B>),
}

impl<B: OutgoingBody> Conn<B> {
    /// Keeps the connection for later requests, unused: a new HTTP/1.1 one goes to its
    /// endpoint's idle ones; an HTTP/2 one is its worker's shared connection already.
    pub fn keep(self) {
        if let Conn::Http1(lease) = self {
            lease.release();
        }
    }

    /// Sends the request and waits for the response head. An HTTP/1.1 connection
    /// travels on in the response's body, which returns it to the pool once read to
    /// the end.
    pub async fn send(
        self,
        head: &RequestHead<'_>,
        body: B,
    ) -> Result<UpstreamResponse, SendError<B>> {
        match self {
            Conn::Http1(lease) => h1::send(lease, head, body)
                .await
                .map_err(|e| SendError::Failed(e.into())),
            Conn::Http2(mut s) => match s.try_send_request(head.to_h2(body)).await {
                Ok(r) => Ok(Box::new(r.map(ByProtocol::Http2))),
                Err(mut e) => Err(match e.take_message() {
                    Some(req) => SendError::NotSent(req.into_body(), Some(e.into_error())),
                    None => SendError::Failed(e.into_error().into()),
                }),
            },
        }
    }
}
