//! One client connection: which HTTP it speaks, how long it may dawdle, and how it ends.
//!
//! The first bytes decide the protocol: the HTTP/2 connection preface means HTTP/2 with
//! prior knowledge (gRPC in cleartext), served by hyper; anything else is HTTP/1.1,
//! served by tollgate's own codec (`h1`). The bytes read to decide are handed on in
//! front of the socket.
//!
//! Its [`watchdog`](super::watchdog) closes it when a head is too slow or it sat idle
//! too long. On shutdown the connection is closed gracefully: HTTP/1.1 after the
//! response in flight, HTTP/2 with GOAWAY, letting streams finish.
//!
//! Malformed messages (framing, sizes, targets) are refused by the codec; what hyper's
//! HTTP/2 lets through and routing could be fooled by, an ambiguous or malformed `Host`
//! or a target its method does not allow, is refused with a 400 before the request is
//! handed to the service.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};

use super::body::{AppBody, ResponseBody};
use super::h1::{self, Settings};
use super::service::{AppResponse, Service};
use super::watchdog::{ConnState, Finding, inspect};
use crate::config::ListenerConfig;
use crate::http::fields::{host_problem, target_problem};
use crate::http::read::hand_on_ahead;
use crate::http::spawn::BoxedSpawn;

const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

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
        let prefixed = hand_on_ahead(&mut self.prefix, buf);
        if prefixed && buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
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
/// Nothing sent yet is an idle connection (`idle_timeout`), and one with nothing in
/// flight: on shutdown it is closed at once, so it never holds the drain. Once the
/// first byte is in, the rest of the preface must follow within `header_read_timeout`
/// of it, counted once for all reads, so a preface dribbled a byte at a time is cut off
/// like any other slow head. Returns when the first byte arrived, for the head limit
/// after it.
async fn sniff(
    stream: &mut TcpStream,
    ahead: Bytes,
    settings: &ListenerConfig,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<(bool, Bytes, Instant)> {
    let mut buf = [0u8; 24];
    let mut n = ahead.len().min(buf.len());
    buf[..n].copy_from_slice(&ahead[..n]);
    let mut first = (n > 0).then(Instant::now);
    if ahead.len() > buf.len() || buf[..n] != H2_PREFACE[..n] {
        return Ok((
            ahead.starts_with(H2_PREFACE),
            ahead,
            first.unwrap_or_else(Instant::now),
        ));
    }
    let mut by = match first {
        Some(at) => at + settings.header_read_timeout,
        None => Instant::now() + settings.idle_timeout,
    };
    let drained = || io::Error::new(io::ErrorKind::Interrupted, "drained before a request");
    while n < buf.len() {
        let reading = timeout_at(by, stream.read(&mut buf[n..]));
        let read = if first.is_none() {
            tokio::select! {
                read = reading => read,
                _ = shutdown.wait_for(|draining| *draining) => return Err(drained()),
            }
        } else {
            reading.await
        };
        let read = read.map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request"))??;
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

/// Drives a served connection until it closes, its watchdog closes it, or it has been
/// drained: on shutdown or when idle, `finish` asks it to end gracefully.
async fn drive<C: Future + ?Sized>(
    mut conn: Pin<&mut C>,
    finish: impl Fn(Pin<&mut C>),
    state: &Arc<ConnState>,
    settings: &ListenerConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut draining = *shutdown.borrow();
    if draining {
        finish(conn.as_mut());
    }
    let side_waker = Waker::from(state.clone());
    let mut task_waker = Waker::noop().clone();
    loop {
        let wake = match inspect(state, settings) {
            Finding::Fine(at) => at,
            Finding::HeadTimeout => {
                tracing::debug!("request head not received in time; closing");
                return;
            }
            Finding::Idle if draining => return,
            Finding::Idle => {
                draining = true;
                finish(conn.as_mut());
                Instant::now() + Duration::from_secs(1)
            }
        };
        let mut changed = pin!(shutdown.changed());
        let mut sleep = pin!(sleep_until(wake));
        state.mark_side_fired();
        // The connection is polled on every wake-up; the shutdown signal and the
        // watchdog's timer only when their own wakers fired, not on each of the two or
        // more wake-ups every request brings.
        let event = std::future::poll_fn(|cx| {
            if !cx.waker().will_wake(&task_waker) {
                task_waker = cx.waker().clone();
                state.set_task(&task_waker);
            }
            if conn.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Closed);
            }
            if state.take_side_fired() {
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
            Event::Closed => return,
            Event::Shutdown => {
                draining = true;
                finish(conn.as_mut());
            }
            Event::Watchdog => {}
        }
    }
}

/// An HTTP/2 stream's answer, as hyper polls it.
type Answering = Pin<Box<dyn Future<Output = AppResponse> + Send>>;

/// An HTTP/2 stream's answer from a service whose work outlives its caller
/// ([`Service::OUTLIVES_CALLER`]: the inbound side, whose place in `max_inflight` must
/// stay taken while its app works). hyper drops a stream's future when its caller resets
/// the stream, so the work runs on a task of its own, to its answer, which nobody reads
/// then, as an HTTP/1.1 connection's loop runs it.
fn outliving<F>(call: F) -> impl Future<Output = AppResponse> + Send
where
    F: Future<Output = AppResponse> + Send + 'static,
{
    let work = tokio::spawn(call);
    async move {
        match work.await {
            Ok(answer) => answer,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: only as the runtime shuts down, when nothing waits for an answer.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Serves one accepted connection from `peer` until it closes, times out or is drained.
pub async fn serve<S: Service>(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    service: S,
    settings: ListenerConfig,
    shutdown: watch::Receiver<bool>,
) {
    serve_after(stream, Bytes::new(), peer, service, settings, shutdown).await;
}

/// As [`serve`], for a connection whose first bytes, `ahead`, were already read (the
/// connection inside a `CONNECT` tunnel, say).
pub async fn serve_after<S: Service>(
    mut stream: TcpStream,
    ahead: Bytes,
    peer: std::net::SocketAddr,
    service: S,
    settings: ListenerConfig,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let sniffed = sniff(&mut stream, ahead, &settings, shutdown.clone()).await;
    let (h2, prefix, first_byte) = match sniffed {
        Ok(v) => v,
        Err(_) => return,
    };
    let state = Arc::new(ConnState::new(!h2, first_byte, peer.ip().to_canonical()));
    if !h2 {
        // The sniffed bytes were the start of a request head.
        state.head_began_at_epoch();
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
                let req = req.map(AppBody::Http2);
                let problem =
                    host_problem(&req).or_else(|| target_problem(req.method(), req.uri()));
                let answer = match problem {
                    Some(why) => {
                        // Counted as a request of the connection, so the watchdog sees the
                        // head as read and the connection as idle again once answered.
                        state.request_started();
                        state.request_finished(tokio::time::Instant::now());
                        Err(bad_request(why, req.version()))
                    }
                    // Boxed: hyper moves a stream's future several times on its way
                    // into the stream's task (and tokio once more as the task ends), and
                    // a request's future is kilobytes: one allocation costs far less than
                    // copying it each time. HTTP/1.1 pins it in place and needs no box.
                    None => {
                        let call = service.call(Box::new(req), &state);
                        let answering: Answering = if S::OUTLIVES_CALLER {
                            Box::pin(outliving(call))
                        } else {
                            Box::pin(call)
                        };
                        Ok(answering)
                    }
                };
                async move {
                    Ok::<_, Infallible>(match answer {
                        Ok(answering) => *answering.await,
                        Err(refused) => refused,
                    })
                }
            })
        };
        let mut b = hyper::server::conn::http2::Builder::new(BoxedSpawn);
        b.timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX))
            .max_concurrent_streams(1024)
            // Pings find a peer gone without a word; over loopback (the app beside the
            // sidecar) the kernel says so at once, and hyper's pinger reads the clock
            // under a lock at every frame received.
            .keep_alive_interval(
                (!peer.ip().to_canonical().is_loopback()).then_some(Duration::from_secs(30)),
            )
            .keep_alive_timeout(Duration::from_secs(10));
        // Boxed: an HTTP/2 connection's state is far larger than an HTTP/1.1 one's, and
        // inline in this future every connection would pay for it.
        let mut conn = Box::pin(b.serve_connection(io, svc));
        drive(
            conn.as_mut(),
            |c| c.graceful_shutdown(),
            &state,
            &settings,
            shutdown,
        )
        .await;
    } else {
        let conn = h1::connection(
            stream,
            &prefix,
            Settings {
                service,
                state: state.clone(),
                max_header_bytes: settings.max_header_bytes,
                max_headers: settings.max_headers,
                drain_timeout: settings.drain_timeout,
            },
        );
        // In this task's own future, not boxed apart: a connection's task touches it on
        // every wake-up, and one allocation is one fewer cache line to fetch each time.
        let close = |_: Pin<&mut _>| state.close_gracefully();
        drive(pin!(conn), close, &state, &settings, shutdown).await;
    }
}
