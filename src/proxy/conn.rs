//! One client connection: which HTTP it speaks, how long it may dawdle, and how it ends.
//!
//! The first bytes decide the protocol: the HTTP/2 connection preface means HTTP/2 with
//! prior knowledge (gRPC in cleartext), served by hyper; anything else is HTTP/1.1,
//! served by tollgate's own codec (`h1`). The bytes read to decide are handed on in
//! front of the socket.
//!
//! A watchdog enforces two limits a server cannot tell apart on its own: a request head
//! must arrive whole within `header_read_timeout` of its first byte (slowloris), while a
//! keep-alive connection with nothing in flight may stay open for `idle_timeout`. On
//! shutdown the connection is closed gracefully: HTTP/1.1 after the response in flight,
//! HTTP/2 with GOAWAY, letting streams finish.
//!
//! Malformed messages (framing, sizes) are refused by the codec; what it lets through
//! and routing could be fooled by, an ambiguous or malformed `Host`, is refused here
//! with a 400 before the request is handed over.

use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header::{CONNECTION, CONTENT_TYPE, HOST};
use http::{HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::Shared;
use super::body::{AppBody, ResponseBody};
use super::h1::{Http1Conn, Settings};
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
    fn new(track_heads: bool, epoch: Instant) -> Self {
        ConnState {
            epoch,
            inflight: AtomicU32::new(0),
            head_started: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            track_heads,
        }
    }

    /// A state for requests that did not come over a client connection (tests, lab).
    pub fn detached() -> Arc<Self> {
        Arc::new(Self::new(false, Instant::now()))
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

    /// The first request head began with the connection's first byte, the epoch.
    fn head_began_at_epoch(&self) {
        if self.track_heads {
            self.head_started.store(1, Release);
        }
    }

    pub(super) fn bytes_read(&self) {
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
        let prefixed = !self.prefix.is_empty();
        if prefixed {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
        }
        // After the prefix, the same read takes what else the socket holds: the head
        // arrives in one piece, so the HTTP reader never grows its buffer to append
        // the rest (which would double it for the life of the connection).
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.bytes_read();
        }
        if prefixed {
            // The prefix is data: an error or nothing more yet shows on the next read.
            return Poll::Ready(Ok(()));
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
///
/// Nothing sent yet is an idle connection (`idle_timeout`); once the first byte is in,
/// the rest of the preface must follow within `header_read_timeout` of it, counted
/// once for all reads, so a preface dribbled a byte at a time is cut off like any
/// other slow head. Returns when the first byte arrived, for the head limit after it.
async fn sniff(
    stream: &mut TcpStream,
    settings: &ListenerConfig,
) -> io::Result<(bool, Bytes, Instant)> {
    let mut buf = [0u8; 24];
    let mut n = 0;
    let mut by = Instant::now() + settings.idle_timeout;
    let mut first = None;
    while n < buf.len() {
        let read = timeout_at(by, stream.read(&mut buf[n..]))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request"))??;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        let at = *first.get_or_insert_with(Instant::now);
        n += read;
        if buf[..n] != H2_PREFACE[..n] {
            return Ok((false, Bytes::copy_from_slice(&buf[..n]), at));
        }
        by = at + settings.header_read_timeout;
    }
    let at = first.unwrap_or_else(Instant::now);
    Ok((true, Bytes::copy_from_slice(&buf), at))
}

/// Why a request's `Host` cannot be trusted to route it, if it cannot: more than one
/// `Host` line, or a value that is no `host[:port]` (RFC 9112 section 3.2 asks for a
/// 400 for both). Two `Host` lines are the classic way to make two hops route one
/// request differently; tollgate refuses rather than pick one. An empty `Host` is
/// allowed (the URI may have no authority) and routes nowhere.
pub(super) fn host_problem<B>(req: &Request<B>) -> Option<&'static str> {
    let mut hosts = req.headers().get_all(HOST).iter();
    let first = hosts.next()?;
    if hosts.next().is_some() {
        return Some(TWO_HOSTS);
    }
    host_value_problem(first.as_bytes())
}

pub(super) const TWO_HOSTS: &str = "more than one Host header\n";

/// Why one `Host` value cannot be trusted to route a request, if it cannot.
pub(super) fn host_value_problem(value: &[u8]) -> Option<&'static str> {
    let valid = value.is_empty() || authority_syntax(value);
    (!valid).then_some("the Host header is not a valid host[:port]\n")
}

/// The characters of a reg-name (RFC 3986): unreserved, percent-encoded, sub-delims.
const REG_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            );
        b += 1;
    }
    t
};

/// `uri-host [ ":" port ]` (RFC 3986): an IP literal in brackets or a reg-name, then
/// nothing or a colon and digits. Checked in place: this runs on every request.
fn authority_syntax(value: &[u8]) -> bool {
    let (host, port) = if value.first() == Some(&b'[') {
        let Some(end) = value.iter().position(|b| *b == b']') else {
            return false;
        };
        let literal = &value[1..end];
        if literal.is_empty()
            || !literal
                .iter()
                .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
        {
            return false;
        }
        (&value[..=end], &value[end + 1..])
    } else {
        match value.iter().rposition(|b| *b == b':') {
            Some(i) => (&value[..i], &value[i..]),
            None => (value, &value[value.len()..]),
        }
    };
    let reg_name = host.first() == Some(&b'[')
        || (!host.is_empty() && host.iter().all(|&b| REG_NAME[usize::from(b)]));
    let port_ok = port.is_empty() || (port[0] == b':' && port[1..].iter().all(u8::is_ascii_digit));
    reg_name && port_ok
}

/// tollgate's own 400 for a request it will not route. An HTTP/1.x connection is closed
/// after it, as after any malformed request.
pub(super) fn bad_request(why: &'static str, version: Version) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::full(why, None));
    *resp.status_mut() = StatusCode::BAD_REQUEST;
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if version < Version::HTTP_2 {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// What ended a wait in [`serve`].
enum Event {
    Closed,
    Shutdown,
    Watchdog,
}

/// The waker of the shutdown signal and the watchdog's timer: notes that one of them
/// fired, then wakes the connection's task.
#[derive(Default)]
struct SideWake {
    fired: std::sync::atomic::AtomicBool,
    task: std::sync::Mutex<Option<Waker>>,
}

impl SideWake {
    fn set_task(&self, waker: &Waker) {
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(waker.clone());
    }
}

impl Wake for SideWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Release);
        if let Some(w) = self.task.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            w.wake_by_ref();
        }
    }
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
    let (h2, prefix, first_byte) = match sniff(&mut stream, &settings).await {
        Ok(v) => v,
        Err(_) => return,
    };
    let state = Arc::new(ConnState::new(!h2, first_byte));
    if !h2 {
        // The sniffed bytes were the start of a request head.
        state.head_began_at_epoch();
    }
    macro_rules! drive {
        ($conn:expr) => {{
            // Boxed: an HTTP/2 connection's state is far larger than an HTTP/1.1
            // one's, and inline in this future every connection would pay for it.
            let mut conn = Box::pin($conn);
            let mut draining = *shutdown.borrow();
            if draining {
                conn.as_mut().graceful_shutdown();
            }
            let side = Arc::new(SideWake::default());
            let side_waker = Waker::from(side.clone());
            let mut task_waker = Waker::noop().clone();
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
                let mut changed = pin!(shutdown.changed());
                let mut sleep = pin!(sleep_until(wake));
                side.fired.store(true, Release);
                // The connection is polled on every wake-up; the shutdown signal and
                // the watchdog's timer only when their own wakers fired, not on each
                // of the two or more wake-ups every request brings.
                let event = std::future::poll_fn(|cx| {
                    if !cx.waker().will_wake(&task_waker) {
                        task_waker = cx.waker().clone();
                        side.set_task(&task_waker);
                    }
                    if conn.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Event::Closed);
                    }
                    if side.fired.swap(false, AcqRel) {
                        let mut side_cx = Context::from_waker(&side_waker);
                        if !draining && changed.as_mut().poll(&mut side_cx).is_ready() {
                            return Poll::Ready(Event::Shutdown);
                        }
                        if sleep.as_mut().poll(&mut side_cx).is_ready() {
                            return Poll::Ready(Event::Watchdog);
                        }
                    }
                    Poll::Pending
                })
                .await;
                match event {
                    Event::Closed => break,
                    Event::Shutdown => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    Event::Watchdog => {}
                }
            }
        }};
    }
    if h2 {
        let io = TokioIo::new(Prefixed {
            prefix,
            inner: stream,
            state: state.clone(),
        });
        let svc = {
            let state = state.clone();
            service_fn(move |req: Request<Incoming>| {
                let (shared, fixed, state) = (shared.clone(), fixed.clone(), state.clone());
                let req = req.map(AppBody::Http2);
                async move {
                    if let Some(why) = host_problem(&req) {
                        // Counted as a request of the connection, so the watchdog sees the
                        // head as read and the connection as idle again once answered.
                        state.request_started();
                        state.request_finished();
                        return Ok(bad_request(why, req.version()));
                    }
                    super::handler::handle(shared, fixed, state, req).await
                }
            })
        };
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX))
            .max_concurrent_streams(1024)
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(10));
        drive!(b.serve_connection(io, svc));
    } else {
        let conn = Http1Conn::new(
            stream,
            &prefix,
            Settings {
                shared,
                fixed,
                state: state.clone(),
                max_header_bytes: settings.max_header_bytes,
                max_headers: settings.max_headers,
            },
        );
        drive!(conn);
    }
}

#[cfg(test)]
mod tests {
    use super::authority_syntax;

    #[test]
    fn host_values_are_checked_in_place() {
        for good in [
            &b"payments"[..],
            b"payments:8080",
            b"payments.default.svc.cluster.local",
            b"10.0.0.5:80",
            b"[::1]:8080",
            b"[fe80::1]",
            b"my_host~x",
        ] {
            assert!(authority_syntax(good), "{}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b""[..],
            b":80",
            b"pay ments",
            b"payments:80x",
            b"user@payments",
            b"payments/x",
            b"[::1",
            b"[zz]:80",
            b"payments:80:90",
        ] {
            assert!(!authority_syntax(bad), "{}", String::from_utf8_lossy(bad));
        }
    }
}
