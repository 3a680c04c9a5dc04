//! One client connection: which HTTP it speaks, how long it may dawdle, and how it ends.
//!
//! The first bytes decide the protocol: the HTTP/2 connection preface means HTTP/2 with
//! prior knowledge (gRPC in cleartext), anything else is HTTP/1.1. The bytes read to
//! decide are handed back to hyper in front of the socket.
//!
//! A watchdog enforces two limits hyper cannot tell apart: a request head must arrive
//! whole within `header_read_timeout` of its first byte (slowloris), while a keep-alive
//! connection with nothing in flight may stay open for `idle_timeout`. On shutdown the
//! connection is closed gracefully: HTTP/1.1 after the response in flight, HTTP/2 with
//! GOAWAY, letting streams finish.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};

use super::Shared;
use crate::config::ListenerConfig;

const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the watchdog knows of a connection; updated by reads and by requests.
pub struct ConnState {
    epoch: Instant,
    inflight: AtomicU32,
    /// Microseconds since `epoch` (+1) when the first byte of a request head arrived
    /// with nothing in flight; 0 when no head is being read.
    head_started: AtomicU64,
    /// Microseconds since `epoch` when the last request finished.
    idle_since: AtomicU64,
    track_heads: bool,
}

impl ConnState {
    fn new(track_heads: bool) -> Self {
        ConnState {
            epoch: Instant::now(),
            inflight: AtomicU32::new(0),
            head_started: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            track_heads,
        }
    }

    /// A state for requests that did not come over a client connection (tests, lab).
    pub fn detached() -> Arc<Self> {
        Arc::new(Self::new(false))
    }

    fn micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn at(&self, micros: u64) -> Instant {
        self.epoch + Duration::from_micros(micros)
    }

    pub fn request_started(&self) {
        self.inflight.fetch_add(1, AcqRel);
        self.head_started.store(0, Release);
    }

    pub fn request_finished(&self) {
        if self.inflight.fetch_sub(1, AcqRel) == 1 {
            self.idle_since.store(self.micros(), Release);
        }
    }

    fn bytes_read(&self) {
        if self.track_heads
            && self.head_started.load(Relaxed) == 0
            && self.inflight.load(Relaxed) == 0
        {
            self.head_started.store(self.micros() + 1, Release);
        }
    }
}

enum Verdict {
    /// Nothing to do before this instant.
    Fine(Instant),
    HeadTimeout,
    Idle,
}

fn verdict(state: &ConnState, settings: &ListenerConfig) -> Verdict {
    let now = Instant::now();
    let head = state.head_started.load(Acquire);
    if head != 0 {
        let by = state.at(head - 1) + settings.header_read_timeout;
        return if now >= by {
            Verdict::HeadTimeout
        } else {
            Verdict::Fine(by)
        };
    }
    if state.inflight.load(Acquire) == 0 {
        let by = state.at(state.idle_since.load(Acquire)) + settings.idle_timeout;
        return if now >= by {
            Verdict::Idle
        } else {
            Verdict::Fine(by)
        };
    }
    Verdict::Fine(now + settings.idle_timeout)
}

/// The socket, with the bytes already read to sniff the protocol in front.
struct Prefixed {
    prefix: Bytes,
    inner: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.bytes_read();
        }
        polled
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Reads until the bytes either are or cannot be the HTTP/2 preface.
async fn sniff(stream: &mut TcpStream, settings: &ListenerConfig) -> io::Result<(bool, Bytes)> {
    let mut buf = [0u8; 24];
    let mut n = 0;
    // Nothing sent yet: an idle connection. Bytes started: a head being read.
    let mut wait = settings.idle_timeout;
    while n < buf.len() {
        let read = timeout(wait, stream.read(&mut buf[n..]))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request"))??;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        n += read;
        if buf[..n] != H2_PREFACE[..n] {
            return Ok((false, Bytes::copy_from_slice(&buf[..n])));
        }
        wait = settings.header_read_timeout;
    }
    Ok((true, Bytes::copy_from_slice(&buf)))
}

/// Serves one accepted connection until it closes, times out or is drained.
pub async fn serve(
    mut stream: TcpStream,
    shared: Arc<Shared>,
    fixed: Option<Arc<str>>,
    settings: ListenerConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (h2, prefix) = match sniff(&mut stream, &settings).await {
        Ok(v) => v,
        Err(_) => return,
    };
    let state = Arc::new(ConnState::new(!h2));
    if !h2 {
        // The sniffed bytes were the start of a request head.
        state.bytes_read();
    }
    let io = TokioIo::new(Prefixed {
        prefix,
        inner: stream,
        state: state.clone(),
    });
    let svc = {
        let state = state.clone();
        service_fn(move |req| {
            super::handler::handle(shared.clone(), fixed.clone(), state.clone(), req)
        })
    };
    macro_rules! drive {
        ($conn:expr) => {{
            let conn = $conn;
            tokio::pin!(conn);
            let mut draining = *shutdown.borrow();
            if draining {
                conn.as_mut().graceful_shutdown();
            }
            loop {
                let wake = match verdict(&state, &settings) {
                    Verdict::Fine(at) => at,
                    Verdict::HeadTimeout => {
                        tracing::debug!("request head not received in time; closing");
                        break;
                    }
                    Verdict::Idle if draining => break,
                    Verdict::Idle => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                        Instant::now() + Duration::from_secs(1)
                    }
                };
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = shutdown.changed(), if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ = sleep_until(wake) => {}
                }
            }
        }};
    }
    if h2 {
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX))
            .max_concurrent_streams(1024)
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(10));
        drive!(b.serve_connection(io, svc));
    } else {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new())
            // The watchdog enforces head and idle limits; hyper's own timer would
            // treat every idle keep-alive connection as a slow head.
            .header_read_timeout(None)
            .max_header_size(settings.max_header_bytes)
            .max_buf_size(settings.max_header_bytes.max(8192) + 8192);
        if settings.max_headers != 100 {
            b.max_headers(settings.max_headers);
        }
        drive!(b.serve_connection(io, svc));
    }
}
