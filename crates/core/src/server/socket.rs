//! The socket of an HTTP/1.1 client connection and what has been read from it, shared
//! between the connection's loop and the body of the request being read (both run on
//! the connection's task, one at a time): the request body as the attempts ask for it,
//! `100 Continue` owed before it, the app leaving while it is answered, and the
//! lingering close after a refused head or an unread body.

use std::future::poll_fn;
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;

use crate::http::framing::{Framing, Step, step};
use crate::http::read::poll_read_head;
use crate::http::write::WriteBuf;
use crate::http::{BoxError, READ_CHUNK};

/// While a request is answered, bytes the app sends ahead (a pipelined request) are
/// read up to this much; beyond it the socket is left alone until the response is out.
const READ_AHEAD: usize = 64 * 1024;
/// After a refused head or an unread body, what the app still sends is read and thrown
/// away for up to this long (and this much) before the socket is closed, so the close
/// does not reset the connection under the response.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1024 * 1024;
/// After an answer that came before its request's body was read (an upstream that
/// answers without reading it), the rest of a body this small is read and thrown away,
/// for up to this long, so the connection carries the app's next request rather than
/// closing under it (a pooled connection closed as the app reuses it is an error there).
const DISCARD_BYTES: u64 = 64 * 1024;
const DISCARD_WAIT: Duration = Duration::from_secs(1);

pub(super) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Request heads acknowledged at once ([`Io::quick_ack`]), in this process.
static QUICK_ACKS: AtomicU64 = AtomicU64::new(0);

/// How many request heads that came without their body were acknowledged at once
/// (`TCP_QUICKACK`) in this process: what tests and benches read to see that only
/// those are.
pub fn quick_acks() -> u64 {
    QUICK_ACKS.load(Relaxed)
}

/// The app's connection: its socket, or, in the tests of the HTTP/1.1 driver, an
/// in-memory pipe whose other end the test writes and reads.
pub enum AppStream {
    Tcp(TcpStream),
    #[cfg(test)]
    Memory(tokio::io::DuplexStream),
}

impl AppStream {
    /// The socket; `None` for a pipe.
    #[cfg(target_os = "linux")]
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            AppStream::Tcp(s) => Some(s),
            #[cfg(test)]
            AppStream::Memory(_) => None,
        }
    }

    /// The socket, to be handed on whole (a `CONNECT`'s inside); `None` for a pipe.
    pub(super) fn into_tcp(self) -> Option<TcpStream> {
        match self {
            AppStream::Tcp(s) => Some(s),
            #[cfg(test)]
            AppStream::Memory(_) => None,
        }
    }
}

impl tokio::io::AsyncRead for AppStream {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(test)]
            AppStream::Memory(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AppStream {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(test)]
            AppStream::Memory(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            #[cfg(test)]
            AppStream::Memory(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        match self {
            AppStream::Tcp(s) => s.is_write_vectored(),
            #[cfg(test)]
            AppStream::Memory(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            #[cfg(test)]
            AppStream::Memory(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AppStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(test)]
            AppStream::Memory(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

pub(super) fn lock(io: &Mutex<Io>) -> MutexGuard<'_, Io> {
    io.lock().unwrap_or_else(|p| p.into_inner())
}

/// The socket and what has been read from it. Shared between the connection and the
/// body of the request being read; both run on the connection's task, one at a time.
pub(super) struct Io {
    pub(super) stream: AppStream,
    pub(super) rbuf: BytesMut,
    /// What is left of the current request's body (`Length(0)`: none, or all read).
    pub(super) body: Framing,
    /// The body broke: the app went away mid-body, or sent a malformed chunk.
    pub(super) body_failed: bool,
    /// Bytes of `100 Continue` still owed before the body is read.
    pub(super) continue_left: usize,
    /// The app has closed its side.
    pub(super) eof: bool,
    /// The app's socket failed (a reset): it is gone, whatever it sent.
    pub(super) reset: bool,
}

impl Io {
    /// Reads what the socket holds into the read buffer, first making room for `want`
    /// bytes if less than `min` is free.
    pub(super) fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        min: usize,
        want: usize,
    ) -> Poll<io::Result<usize>> {
        if self.rbuf.capacity() - self.rbuf.len() < min {
            self.rbuf.reserve(want);
        }
        let read = pin!(self.stream.read_buf(&mut self.rbuf));
        let n = ready!(read.poll(cx))?;
        if n == 0 {
            self.eof = true;
        }
        Poll::Ready(Ok(n))
    }

    /// Reads what the socket holds without making room ahead of the read
    /// ([`poll_read_head`]): for heads and what the app sends ahead while it is
    /// answered, not for bodies.
    pub(super) fn poll_fill_small(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let n = ready!(poll_read_head(&mut self.stream, cx, &mut self.rbuf))?;
        if n == 0 {
            self.eof = true;
        }
        Poll::Ready(Ok(n))
    }

    /// Writes everything `wbuf` holds.
    pub(super) fn poll_write_all(
        &mut self,
        cx: &mut Context<'_>,
        wbuf: &mut WriteBuf,
    ) -> Poll<io::Result<()>> {
        wbuf.poll_write_all(&mut self.stream, cx)
    }

    /// Acknowledges what has been read at once (`TCP_QUICKACK`), rather than with the
    /// next write or after the kernel's delayed-ACK timer.
    #[cold]
    pub(super) fn quick_ack(&self) {
        QUICK_ACKS.fetch_add(1, Relaxed);
        #[cfg(target_os = "linux")]
        if let Some(s) = self.stream.tcp() {
            let _ = socket2::SockRef::from(s).set_tcp_quickack(true);
        }
    }

    pub(super) fn body_done(&self) -> bool {
        self.body == Framing::Length(0) && !self.body_failed
    }

    /// The next piece of the request body.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        if self.body_failed {
            return Poll::Ready(None);
        }
        while self.continue_left > 0 {
            let at = CONTINUE.len() - self.continue_left;
            match ready!(Pin::new(&mut self.stream).poll_write(cx, &CONTINUE[at..])) {
                Ok(n) if n > 0 => self.continue_left -= n,
                Ok(_) => return self.fail(io::ErrorKind::WriteZero.into()),
                Err(e) => return self.fail(e),
            }
        }
        loop {
            match step(&mut self.rbuf, &mut self.body, self.eof) {
                Ok(Step::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Step::Trailers(t)) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Ok(Step::End) => return Poll::Ready(None),
                Ok(Step::More) => {
                    let want = match self.body {
                        Framing::Length(left) => left.clamp(READ_CHUNK as u64, 64 * 1024) as usize,
                        _ => READ_CHUNK,
                    };
                    if let Err(e) = ready!(self.poll_fill(cx, 1024, want)) {
                        return self.fail(e);
                    }
                }
                Err(e) => return self.fail(e),
            }
        }
    }

    fn fail(&mut self, e: io::Error) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        self.body_failed = true;
        Poll::Ready(Some(Err(e)))
    }

    /// While a request is being answered: `Ready` once the app has gone: its socket
    /// failed (a reset), or it closed its side before its request was whole. A close
    /// after a whole request is a half-close, not a cancellation: the app still reads
    /// its answer (a plain `close()` shows only when the answer is written). Bytes it
    /// sends ahead are kept for the next head.
    pub(super) fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // A body still being read is watched by its reader.
        while self.body_done() && !self.eof && self.rbuf.len() < READ_AHEAD {
            match ready!(self.poll_fill_small(cx)) {
                Ok(_) => {}
                Err(_) => {
                    self.eof = true;
                    self.reset = true;
                }
            }
        }
        if self.reset || (self.eof && !self.body_done()) {
            Poll::Ready(())
        } else {
            // Nothing more to read: the socket is not polled again, and only the answer
            // (or a failed write of it) wakes the connection.
            Poll::Pending
        }
    }
}

/// The body of a request that came over HTTP/1.1, read from the connection as the
/// request's attempts ask for it.
pub struct Http1Body {
    pub(super) io: Arc<Mutex<Io>>,
    /// The head said there is no body (and asked for no `100 Continue`): it has ended
    /// before it began, known without a look at the connection (most requests).
    pub(super) empty: bool,
}

impl Http1Body {
    /// A request body of `bytes`, all of it already read into its connection's buffer,
    /// and the app gone after it: for the tests of the services, with no socket.
    #[cfg(test)]
    pub fn read_ahead(bytes: &[u8]) -> Http1Body {
        let (ours, _app) = tokio::io::duplex(64);
        Http1Body {
            io: Arc::new(Mutex::new(Io {
                stream: AppStream::Memory(ours),
                rbuf: BytesMut::from(bytes),
                body: Framing::Length(bytes.len() as u64),
                body_failed: false,
                continue_left: 0,
                eof: true,
                reset: false,
            })),
            empty: bytes.is_empty(),
        }
    }

    /// Whether the connection reads what is left of this body by itself once its
    /// answer is out, if nothing else has ([`discard_body`]): a small body of known
    /// length, sent without waiting for `100 Continue`. Any other body an answer leaves
    /// unread closes the connection, and the answer must say so.
    pub fn read_after_answer(&self) -> bool {
        let io = lock(&self.io);
        io.continue_left == 0 && matches!(io.body, Framing::Length(n) if n <= DISCARD_BYTES)
    }
}

impl Body for Http1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.empty {
            return Poll::Ready(None);
        }
        lock(&self.io)
            .poll_body(cx)
            .map(|f| f.map(|r| r.map_err(BoxError::from)))
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.empty || lock(&self.io).body_done()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        if self.empty {
            return SizeHint::with_exact(0);
        }
        lock(&self.io).body.size_hint()
    }
}

/// After the answer: reads and throws away the rest of a small request body of known
/// length that was not read (up to [`DISCARD_BYTES`] within [`DISCARD_WAIT`]); `true` when the body
/// has ended whole and the connection may carry another request.
pub(super) async fn discard_body(io: &Mutex<Io>) -> bool {
    if !matches!(lock(io).body, Framing::Length(left) if left <= DISCARD_BYTES) {
        return false;
    }
    let mut thrown = 0u64;
    let read = poll_fn(|cx| {
        let mut io = lock(io);
        loop {
            if io.body_done() {
                return Poll::Ready(true);
            }
            match ready!(io.poll_body(cx)) {
                Some(Ok(frame)) => {
                    thrown += frame.data_ref().map_or(0, |d| d.len() as u64);
                    if thrown > DISCARD_BYTES {
                        return Poll::Ready(false);
                    }
                }
                Some(Err(_)) => return Poll::Ready(false),
                None => return Poll::Ready(io.body_done()),
            }
        }
    });
    tokio::time::timeout(DISCARD_WAIT, read)
        .await
        .unwrap_or(false)
}

/// Ends the connection: the write side first, then, when the app may still be
/// sending (a body or head not read), a short wait for it to finish, so that closing
/// with unread bytes does not reset the connection before the app has read the answer.
pub(super) async fn close(io: &Mutex<Io>, linger: bool) {
    let shut = poll_fn(|cx| Pin::new(&mut lock(io).stream).poll_shutdown(cx)).await;
    if shut.is_err() || !linger {
        return;
    }
    let mut thrown = 0usize;
    let drain = poll_fn(|cx| {
        let mut io = lock(io);
        loop {
            io.rbuf.clear();
            match ready!(io.poll_fill(cx, 4096, 16 * 1024)) {
                Ok(0) | Err(_) => return Poll::Ready(()),
                Ok(n) => {
                    thrown += n;
                    if thrown > LINGER_BYTES {
                        return Poll::Ready(());
                    }
                }
            }
        }
    });
    let _ = tokio::time::timeout(LINGER, drain).await;
}
