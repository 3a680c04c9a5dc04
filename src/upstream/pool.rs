//! One endpoint's connections: a lock-free queue of idle HTTP/1.1
//! connections, or one shared HTTP/2 connection.
//!
//! An HTTP/1.1 connection goes back to the idle queue only when its response was read
//! to the end; a connection whose attempt was abandoned (the app left, the deadline
//! passed, the response was not wanted) is closed at once, so the upstream sees the
//! disconnect and no work continues that nobody waits for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use crossbeam_queue::SegQueue;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::connect::{self, ConnectError, Resolver, Sender2};
use super::h1::{self, BoxError, Connection};
use super::tls::TlsClient;
use crate::config::EndpointAddr;
use crate::retry::replay::RequestBody;

/// Idle HTTP/1.1 connections kept per endpoint and worker: as many as the app had in
/// flight, up to this. The queue grows in small blocks as it fills, so an endpoint
/// with few connections costs little memory.
const MAX_IDLE: usize = 4096;
/// An idle connection older than this is closed rather than reused: upstream servers
/// close idle keep-alive connections after a while, and reusing one they are about to
/// close turns into a needless failed attempt.
const IDLE_TIMEOUT: Duration = Duration::from_secs(50);

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
}

const ALPN_UNKNOWN: u8 = 0;
const ALPN_H1: u8 = 1;
const ALPN_H2: u8 = 2;

struct Idle {
    conn: Box<Connection>,
    since: Instant,
}

struct Shared2 {
    sender: Sender2,
    task: AbortHandle,
}

/// One worker's connections to an endpoint: a connection's I/O task runs on the worker
/// that opened it, so requests use connections of their own worker.
struct Local {
    idle: SegQueue<Idle>,
    h2: ArcSwapOption<Shared2>,
    h2_connecting: tokio::sync::Mutex<()>,
}

pub struct Endpoint {
    pub addr: EndpointAddr,
    resolver: Resolver,
    workers: Box<[Local]>,
    alpn: AtomicU8,
    /// Connect failures in a row; reset by a successful connect.
    failures: AtomicU32,
    /// Until when (ms on [`clock_ms`]) the endpoint is skipped after a connect failure.
    skip_until: AtomicU64,
    /// Open connections (shared by every endpoint of the upstream).
    open: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for local in self.workers.iter() {
            if let Some(h2) = local.h2.swap(None) {
                h2.task.abort();
            }
        }
    }
}

/// A connection checked out for one attempt.
pub enum Conn {
    Http1(Lease),
    Http2(Sender2),
}

/// An HTTP/1.1 connection on loan: `release` returns it after a complete response;
/// dropping it otherwise closes it.
pub struct Lease {
    /// Boxed: a lease moves with the request and its response, a box is cheap to move.
    conn: Box<Connection>,
    endpoint: Arc<Endpoint>,
    worker: usize,
}

impl Endpoint {
    pub fn new(addr: EndpointAddr, open: Arc<AtomicUsize>, workers: usize) -> Self {
        Endpoint {
            resolver: Resolver::new(addr.clone()),
            addr,
            workers: (0..workers.max(1))
                .map(|_| Local {
                    idle: SegQueue::new(),
                    h2: ArcSwapOption::empty(),
                    h2_connecting: tokio::sync::Mutex::new(()),
                })
                .collect(),
            alpn: AtomicU8::new(ALPN_UNKNOWN),
            failures: AtomicU32::new(0),
            skip_until: AtomicU64::new(0),
            open,
        }
    }

    /// Whether new requests should avoid this endpoint: it refused a connection a
    /// moment ago. Skipping it for a while (250 ms, doubling with each failure in a row
    /// up to 30 s, then one request tries it again) keeps a dead endpoint from eating
    /// every other first attempt, and the retry budget with it.
    pub fn skipped(&self, now_ms: u64) -> bool {
        self.skip_until.load(Relaxed) > now_ms
    }

    fn connect_failed(&self) {
        let n = self.failures.fetch_add(1, Relaxed).min(16);
        let pause = (SKIP_FIRST_MS << n).min(SKIP_MAX_MS);
        self.skip_until.store(clock_ms() + pause, Relaxed);
    }

    fn connect_succeeded(&self) {
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
            self.skip_until.store(0, Relaxed);
        }
    }

    pub fn idle_count(&self) -> usize {
        self.workers.iter().map(|l| l.idle.len()).sum()
    }

    /// The calling worker's index and its connections.
    fn local(&self) -> (usize, &Local) {
        let i = crate::proxy::worker() % self.workers.len();
        (i, &self.workers[i])
    }

    /// A pooled connection, if one is ready now: the common case, with no timer and no
    /// await.
    pub fn pooled(self: &Arc<Self>, want: Want) -> Option<Conn> {
        match (want, self.alpn.load(Relaxed)) {
            (Want::Http1, _) | (Want::Negotiate, ALPN_H1) => self.pop_idle().map(Conn::Http1),
            (Want::Http2, _) | (Want::Negotiate, ALPN_H2) => self.shared_h2().map(Conn::Http2),
            (Want::Negotiate, _) => None,
        }
    }

    /// A connection for one attempt: a pooled one when there is one, else a new one
    /// within `timeout`.
    pub async fn checkout(
        self: &Arc<Self>,
        want: Want,
        tls: Option<&TlsClient>,
        timeout: Duration,
    ) -> Result<Conn, ConnectError> {
        let want = match (want, self.alpn.load(Relaxed)) {
            (Want::Negotiate, ALPN_H1) => Want::Http1,
            (Want::Negotiate, ALPN_H2) => Want::Http2,
            (w, _) => w,
        };
        match want {
            Want::Http1 => {
                if let Some(lease) = self.pop_idle() {
                    return Ok(Conn::Http1(lease));
                }
                self.connect(want, tls, timeout).await
            }
            Want::Http2 => {
                if let Some(s) = self.shared_h2() {
                    return Ok(Conn::Http2(s));
                }
                // One connect at a time: a burst of requests shares the connection the
                // first of them opens instead of each opening its own.
                let _one = self.local().1.h2_connecting.lock().await;
                if let Some(s) = self.shared_h2() {
                    return Ok(Conn::Http2(s));
                }
                self.connect(want, tls, timeout).await
            }
            Want::Negotiate => {
                let _one = self.local().1.h2_connecting.lock().await;
                if let Some(s) = self.shared_h2() {
                    return Ok(Conn::Http2(s));
                }
                self.connect(want, tls, timeout).await
            }
        }
    }

    fn shared_h2(&self) -> Option<Sender2> {
        let cur = self.local().1.h2.load();
        match cur.as_ref() {
            Some(s) if !s.sender.is_closed() => Some(s.sender.clone()),
            _ => None,
        }
    }

    fn pop_idle(self: &Arc<Self>) -> Option<Lease> {
        let (worker, local) = self.local();
        while let Some(mut idle) = local.idle.pop() {
            // Closed by the endpoint while it sat idle, or kept too long: dropped.
            if idle.since.elapsed() > IDLE_TIMEOUT || !idle.conn.usable() {
                continue;
            }
            return Some(Lease {
                conn: idle.conn,
                endpoint: self.clone(),
                worker,
            });
        }
        None
    }

    async fn connect(
        self: &Arc<Self>,
        want: Want,
        tls: Option<&TlsClient>,
        timeout: Duration,
    ) -> Result<Conn, ConnectError> {
        let addr = match self.resolver.resolve().await {
            Ok(a) => a,
            Err(e) => {
                self.connect_failed();
                return Err(e);
            }
        };
        let transport = match connect::open(addr, tls, timeout).await {
            Ok(t) => t,
            Err(e) => {
                self.resolver.invalidate();
                self.connect_failed();
                return Err(e);
            }
        };
        self.connect_succeeded();
        let h2 = match want {
            Want::Http1 => false,
            Want::Http2 => true,
            Want::Negotiate => {
                let h2 = transport.alpn_h2();
                self.alpn.store(if h2 { ALPN_H2 } else { ALPN_H1 }, Relaxed);
                h2
            }
        };
        if h2 {
            let (sender, task) = connect::handshake_h2(transport, addr, &self.open).await?;
            let old = self.local().1.h2.swap(Some(Arc::new(Shared2 {
                sender: sender.clone(),
                task,
            })));
            if let Some(old) = old {
                // Streams still running on it finish; hyper closes it when they do.
                drop(old);
            }
            Ok(Conn::Http2(sender))
        } else {
            Ok(Conn::Http1(Lease {
                conn: Box::new(Connection::new(transport, &self.open)),
                endpoint: self.clone(),
                worker: self.local().0,
            }))
        }
    }

    /// Closes the idle connections the endpoint has closed or that were kept too long.
    pub fn sweep(&self) {
        for local in self.workers.iter() {
            for _ in 0..local.idle.len() {
                let Some(mut idle) = local.idle.pop() else {
                    break;
                };
                if idle.since.elapsed() <= IDLE_TIMEOUT && idle.conn.usable() {
                    local.idle.push(idle);
                }
            }
        }
    }

    fn put_idle(&self, worker: usize, conn: Box<Connection>) {
        if let Some(local) = self.workers.get(worker)
            && local.idle.len() < MAX_IDLE
        {
            local.idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}

/// Why sending on a connection failed.
pub enum SendError {
    /// The request never left: the connection was already closed. Its body comes
    /// back untouched and may go out on another connection at no risk.
    NotSent(RequestBody, Option<hyper::Error>),
    /// The request may have reached the upstream.
    Failed(BoxError),
}

/// The header fields one attempt adds to the request, each replacing any field of
/// the same name. Kept apart from the request's header map: an HTTP/1.1 attempt
/// writes them straight after the request's own, and the map (shared by every
/// attempt of the request) is never grown or rehashed for them.
#[derive(Default)]
pub struct AttemptFields(pub [Option<(HeaderName, HeaderValue)>; 3]);

impl AttemptFields {
    pub fn iter(&self) -> impl Iterator<Item = &(HeaderName, HeaderValue)> {
        self.0.iter().flatten()
    }

    pub fn names(&self, name: &HeaderName) -> bool {
        self.iter().any(|(n, _)| n == name)
    }
}

/// What an attempt sends ahead of its body, borrowed from the request: every attempt
/// of a request sends the same head, with its own [`AttemptFields`].
pub struct RequestHead<'a> {
    pub method: &'a Method,
    /// Origin-form (path and query).
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub fields: AttemptFields,
    /// The endpoints speak TLS (the scheme of an HTTP/2 request).
    pub https: bool,
}

impl RequestHead<'_> {
    /// The request as hyper's HTTP/2 client takes it: its own copy of the head, with
    /// the scheme and authority HTTP/2 requires.
    fn to_h2(&self, body: RequestBody) -> Request<RequestBody> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.version_mut() = Version::HTTP_2;
        *req.uri_mut() = if self.uri.scheme().is_some() {
            self.uri.clone()
        } else {
            let authority = self
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost");
            let pq = self.uri.path_and_query().map_or("/", |p| p.as_str());
            Uri::builder()
                .scheme(if self.https { "https" } else { "http" })
                .authority(authority)
                .path_and_query(pq)
                .build()
                .unwrap_or_else(|_| self.uri.clone())
        };
        let mut headers = self.headers.clone();
        for (name, value) in self.fields.iter() {
            headers.insert(name.clone(), value.clone());
        }
        *req.headers_mut() = headers;
        req
    }
}

/// The fields of an upstream response head, wherever they are kept: an HTTP/1.1
/// response's in its head as it came (`h1::RawFields`), an HTTP/2 one's in its map.
/// Fields in the map come first.
#[derive(Clone, Copy, Debug)]
pub struct Fields<'a> {
    map: &'a HeaderMap,
    raw: Option<&'a h1::RawFields>,
}

impl<'a> Fields<'a> {
    pub fn of(resp: &'a Response<UpstreamBody>) -> Self {
        Fields {
            map: resp.headers(),
            raw: resp.body().raw_fields(),
        }
    }

    pub fn get(&self, name: &HeaderName) -> Option<&'a [u8]> {
        if let Some(v) = self.map.get(name) {
            return Some(v.as_bytes());
        }
        self.raw?.get(name.as_str())
    }

    pub fn contains(&self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }
}

impl<'a> From<&'a HeaderMap> for Fields<'a> {
    fn from(map: &'a HeaderMap) -> Self {
        Fields { map, raw: None }
    }
}

/// A response body from an endpoint, whichever HTTP carried it.
pub type UpstreamBody = ByProtocol<h1::Body1>;

/// A body that came over HTTP/1.1 (read by tollgate's own codec) or HTTP/2 (hyper's).
pub enum ByProtocol<H1> {
    Http1(H1),
    Http2(Incoming),
}

impl UpstreamBody {
    /// An HTTP/1.1 response's fields, kept in its head (its header map is empty).
    pub fn raw_fields(&self) -> Option<&h1::RawFields> {
        match self {
            UpstreamBody::Http1(b) => Some(b.fields()),
            UpstreamBody::Http2(_) => None,
        }
    }
}

impl<H1> Body for ByProtocol<H1>
where
    H1: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ByProtocol::Http1(b) => Pin::new(b).poll_frame(cx),
            ByProtocol::Http2(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(BoxError::from))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ByProtocol::Http1(b) => b.is_end_stream(),
            ByProtocol::Http2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ByProtocol::Http1(b) => b.size_hint(),
            ByProtocol::Http2(b) => b.size_hint(),
        }
    }
}

impl Conn {
    /// Sends `req` and waits for the response head. An HTTP/1.1 connection travels on
    /// in the response's body, which returns it to the pool once read to the end.
    pub async fn send(
        self,
        head: &RequestHead<'_>,
        body: RequestBody,
    ) -> Result<Response<UpstreamBody>, SendError> {
        match self {
            Conn::Http1(lease) => h1::send(lease, head, body)
                .await
                .map(|r| r.map(UpstreamBody::Http1))
                .map_err(|e| SendError::Failed(e.into())),
            Conn::Http2(mut s) => match s.try_send_request(head.to_h2(body)).await {
                Ok(r) => Ok(r.map(UpstreamBody::Http2)),
                Err(mut e) => Err(match e.take_message() {
                    Some(req) => SendError::NotSent(req.into_body(), Some(e.into_error())),
                    None => SendError::Failed(e.into_error().into()),
                }),
            },
        }
    }
}

impl Lease {
    pub(super) fn conn(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The response was read to its end: the connection may serve another request.
    pub fn release(self) {
        self.endpoint.put_idle(self.worker, self.conn);
    }
}
