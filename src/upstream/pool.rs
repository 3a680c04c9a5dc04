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
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::connect::{self, ConnectError, Resolver, Sender1, Sender2};
use crate::config::{EndpointAddr, TlsConfig};
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
    sender: Sender1,
    task: AbortHandle,
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
            while let Some(idle) = local.idle.pop() {
                idle.task.abort();
            }
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
    sender: Option<Sender1>,
    task: AbortHandle,
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
        tls: Option<&TlsConfig>,
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
        while let Some(idle) = local.idle.pop() {
            if idle.sender.is_closed()
                || !idle.sender.is_ready()
                || idle.since.elapsed() > IDLE_TIMEOUT
            {
                idle.task.abort();
                continue;
            }
            return Some(Lease {
                sender: Some(idle.sender),
                task: idle.task,
                endpoint: self.clone(),
                worker,
            });
        }
        None
    }

    async fn connect(
        self: &Arc<Self>,
        want: Want,
        tls: Option<&TlsConfig>,
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
            let (sender, task) = connect::handshake_h1(transport, addr, &self.open).await?;
            Ok(Conn::Http1(Lease {
                sender: Some(sender),
                task,
                endpoint: self.clone(),
                worker: self.local().0,
            }))
        }
    }

    fn put_idle(&self, worker: usize, sender: Sender1, task: AbortHandle) {
        let idle = Idle {
            sender,
            task,
            since: Instant::now(),
        };
        let Some(local) = self.workers.get(worker) else {
            task_abort(idle);
            return;
        };
        if local.idle.len() >= MAX_IDLE {
            idle.task.abort();
        } else {
            local.idle.push(idle);
        }
    }
}

fn task_abort(idle: Idle) {
    idle.task.abort();
}

/// Why sending on a connection failed.
pub enum SendError {
    /// The request never left: the connection was already closed. The request comes
    /// back untouched and may go out on another connection at no risk.
    NotSent(Box<Request<RequestBody>>, Option<hyper::Error>),
    /// The request may have reached the upstream.
    Failed(hyper::Error),
}

impl Conn {
    pub async fn send(
        &mut self,
        req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, SendError> {
        let result = match self {
            Conn::Http1(lease) => match lease.sender.as_mut() {
                Some(s) => s.try_send_request(req).await,
                // A lease holds its sender until released; never reached.
                None => return Err(SendError::NotSent(Box::new(req), None)),
            },
            Conn::Http2(s) => s.try_send_request(req).await,
        };
        result.map_err(|mut e| match e.take_message() {
            Some(req) => SendError::NotSent(Box::new(req), Some(e.into_error())),
            None => SendError::Failed(e.into_error()),
        })
    }
}

impl Lease {
    /// The response was read to its end: the connection may serve another request.
    pub fn release(mut self) {
        let Some(mut sender) = self.sender.take() else {
            return;
        };
        let task = self.task.clone();
        let endpoint = self.endpoint.clone();
        let worker = self.worker;
        if sender.is_ready() {
            endpoint.put_idle(worker, sender, task);
        } else if !sender.is_closed() {
            // hyper marks the connection ready once it has processed the end of the
            // response, which may be a moment after the body's last byte reached us.
            tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(1), sender.ready()).await {
                    Ok(Ok(())) => endpoint.put_idle(worker, sender, task),
                    _ => task.abort(),
                }
            });
        } else {
            task.abort();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.sender.is_some() {
            // Abandoned mid-exchange: close it so the upstream sees the disconnect.
            self.task.abort();
        }
    }
}
