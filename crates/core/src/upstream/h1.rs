//! HTTP/1.1 to an endpoint, driven by the request's own task.
//!
//! A request on HTTP/1.1 owns its connection from the moment it is taken from the pool
//! until its response has been read to the end, so nothing needs a task of its own: the
//! attempt writes the request and reads the response head on the connection directly,
//! and the response body it hands back reads the rest. No channel between the request
//! and a connection task, no wake-up of a second task per request, and no reading ahead
//! into a fresh buffer while the previous response still holds the old one.
//!
//! A connection goes back to its idle queue only when its response was read to the
//! end; one whose attempt was abandoned (the app left, the deadline passed, the
//! response was not wanted) is closed at once, so the upstream sees the disconnect and
//! no work continues that nobody waits for.
//!
//! A request that says `Expect: 100-continue` keeps its body until the endpoint answers
//! `100 Continue` (or for at most its `continue_wait`); a final answer first means the
//! body is never sent, and the app, whose body is read only as it goes out, is never
//! told to send it.
//!
//! One buffer each way per connection. The head is read by [`crate::http::response`],
//! in place; the body is read by [`crate::http::framing`]. The read buffer is given
//! back while the connection is pooled, and the next response's head is read into one
//! of its own size ([`crate::http::read`]); the write buffer is kept.
//! The request goes out through a [`WriteBuf`]: its head and small body chunks copied,
//! large chunks written from the app's own buffers.

use std::collections::VecDeque;
use std::io;
use std::pin::{Pin, pin};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::EXPECT;
use http::{Method, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use tokio::time::Instant;

use super::OutgoingBody;
use super::connect::{EndpointStream, OpenGuard};
use super::request::{RequestHead, encode_h1};
use super::upgraded::Upgraded;
use crate::http::ByProtocol;
use crate::http::encode::BodyEncoder;
use crate::http::framing::{Framing, Step, step};
use crate::http::read::{poll_read_head, release};
use crate::http::response::{MAX_HEAD, Parsed, RawFields, ResponseHead, parse_response_head};
use crate::http::write::WriteBuf;
use crate::http::{BoxError, KEEP_WRITE, READ_CHUNK, WRITE_BATCH};

/// One HTTP/1.1 connection to an endpoint, idle or carrying one exchange.
pub struct Connection {
    io: EndpointStream,
    rbuf: BytesMut,
    wbuf: WriteBuf,
    /// The endpoint answered `100 Continue` to the request in flight.
    continued: bool,
    /// When it was opened (for `max_connection_age`).
    born: Instant,
    _open: OpenGuard,
}

impl Connection {
    pub fn new(io: EndpointStream, open: &Arc<AtomicUsize>) -> Self {
        Connection {
            io,
            rbuf: BytesMut::new(),
            wbuf: WriteBuf::default(),
            continued: false,
            born: Instant::now(),
            _open: OpenGuard::new(open),
        }
    }

    /// Whether a pooled connection can carry another request: the endpoint has neither
    /// closed it nor sent anything unasked. Costs no system call while the socket has
    /// not been reported readable since the last response.
    pub fn usable(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        let mut buf = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        matches!(
            Pin::new(&mut self.io).poll_read(&mut cx, &mut buf),
            Poll::Pending
        )
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        self.rbuf.reserve(want);
        let read = pin!(self.io.read_buf(&mut self.rbuf));
        read.poll(cx)
    }

    /// Writes what the write queue holds, then flushes.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.wbuf.poll_write_all(&mut self.io, cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Reads until a final response head is in, skipping interim (1xx) responses and
    /// noting a `100 Continue`.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        head_request: bool,
    ) -> Poll<io::Result<ResponseHead>> {
        loop {
            if !self.rbuf.is_empty() {
                match parse_response_head(&mut self.rbuf, head_request)? {
                    Some(Parsed::Final(head)) => return Poll::Ready(Ok(head)),
                    // An interim response, consumed: look for the next.
                    Some(Parsed::Interim(status)) => {
                        self.continued |= status == http::StatusCode::CONTINUE;
                        continue;
                    }
                    None if self.rbuf.len() > MAX_HEAD => {
                        return Poll::Ready(Err(crate::http::bad("response head too large")));
                    }
                    None => {}
                }
            }
            let n = std::task::ready!(poll_read_head(&mut self.io, cx, &mut self.rbuf))?;
            if n == 0 {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    if self.rbuf.is_empty() {
                        "connection closed before a response"
                    } else {
                        "connection closed within the response head"
                    },
                )));
            }
        }
    }
}

/// Idle connections kept per endpoint and worker: as many as the app had in flight, up
/// to this.
const MAX_IDLE: usize = 4096;
/// An idle connection older than this is closed rather than reused: upstream servers
/// close idle keep-alive connections after a while, and reusing one they are about to
/// close turns into a needless failed attempt.
const IDLE_TIMEOUT: Duration = Duration::from_secs(50);

struct Idle {
    conn: Box<Connection>,
    /// When it has been idle too long ([`IDLE_TIMEOUT`] after it was put back): kept as
    /// the instant, so that taking it compares two instants and subtracts none.
    until: Instant,
}

impl Idle {
    /// Whether the connection may carry another request: not idle too long, not too
    /// old, and neither closed by the endpoint nor sent anything unasked.
    fn reusable(&mut self, max_age: Option<Duration>, now: Instant) -> bool {
        now <= self.until
            && max_age.is_none_or(|age| now.saturating_duration_since(self.conn.born) < age)
            && self.conn.usable()
    }
}

/// The idle HTTP/1.1 connections of one endpoint, a stack per worker: a connection is
/// used by the worker that opened it.
///
/// Last in, first out, as hyper's pool and nginx's upstream keep-alive cache take them:
/// the connection that has just answered carries the next request, so only as many
/// connections are in use as requests are in flight at once, and their memory (socket
/// buffers, this side's state) stays warm. The ones at the bottom sit idle until the
/// sweeper closes them. Taken oldest first instead, every kept connection is used in
/// turn: at 2,000 app connections each upstream connection waited some 70 ms between
/// requests, and the kernel sent a delayed ACK on its own for every response (5.7 % of
/// the CPU in `tcp_delack_timer`, against nginx's 2.6 %).
pub struct IdleQueues {
    stacks: Box<[Mutex<Vec<Idle>>]>,
    /// Its endpoint is gone: no connection is kept any more.
    closed: std::sync::atomic::AtomicBool,
    /// `max_connection_age`: an older connection is closed, not kept.
    max_age: Option<Duration>,
}

impl IdleQueues {
    pub fn new(workers: usize, max_age: Option<Duration>) -> Self {
        IdleQueues {
            stacks: (0..workers.max(1))
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            closed: std::sync::atomic::AtomicBool::new(false),
            max_age,
        }
    }

    pub fn count(&self) -> usize {
        self.stacks.iter().map(|s| lock(s).len()).sum()
    }

    /// The idle connection of `worker` that answered last, if it can still carry a
    /// request, on loan (`now`: the caller's clock reading, to judge how long it sat
    /// idle).
    pub fn take(&self, this: &Arc<IdleQueues>, worker: usize, now: Instant) -> Option<Lease> {
        let mut stack = lock(self.stacks.get(worker)?);
        while let Some(mut idle) = stack.pop() {
            // Closed by the endpoint while it sat idle, or kept too long: dropped.
            if !idle.reusable(self.max_age, now) {
                continue;
            }
            return Some(Lease {
                conn: idle.conn,
                idle: this.clone(),
                worker,
            });
        }
        None
    }

    /// Closes every idle connection, and keeps none from now on: the endpoint is gone.
    pub fn clear(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for stack in self.stacks.iter() {
            *lock(stack) = Vec::new();
        }
    }

    /// Closes the idle connections the endpoint has closed or that were kept too long,
    /// and gives back the room of a stack that has emptied.
    pub fn sweep(&self) {
        let now = Instant::now();
        for stack in self.stacks.iter() {
            let mut stack = lock(stack);
            stack.retain_mut(|idle| idle.reusable(self.max_age, now));
            let len = stack.len();
            if len < stack.capacity() / 4 {
                stack.shrink_to(len * 2);
            }
        }
    }

    /// Keeps a connection whose response ended, unless it is too old or the stack is
    /// full: then it is closed.
    fn put(&self, worker: usize, conn: Box<Connection>) {
        let now = Instant::now();
        let young = self
            .max_age
            .is_none_or(|age| now.saturating_duration_since(conn.born) < age);
        if let Some(stack) = self.stacks.get(worker)
            && young
            && !self.closed.load(std::sync::atomic::Ordering::Relaxed)
        {
            let mut stack = lock(stack);
            if stack.len() < MAX_IDLE {
                stack.push(Idle {
                    conn,
                    until: now + IDLE_TIMEOUT,
                });
            }
        }
    }
}

/// The lock of a worker's idle stack; a panic while it was held left nothing half done
/// (a push or a pop), so a poisoned lock is taken as it is.
fn lock(stack: &Mutex<Vec<Idle>>) -> std::sync::MutexGuard<'_, Vec<Idle>> {
    stack
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An HTTP/1.1 connection on loan: `release` returns it after a complete response;
/// dropping it otherwise closes it.
pub struct Lease {
    /// Boxed: a lease moves with the request and its response, a box is cheap to move.
    conn: Box<Connection>,
    idle: Arc<IdleQueues>,
    worker: usize,
}

impl Lease {
    /// A new connection, on loan from its endpoint's idle queues from the start.
    pub fn new(conn: Connection, idle: &Arc<IdleQueues>, worker: usize) -> Self {
        Lease {
            conn: Box::new(conn),
            idle: idle.clone(),
            worker,
        }
    }

    fn conn(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The response was read to its end: the connection may serve another request.
    /// Its write buffer is kept through the exchange and bounded only now, so a large
    /// head is not followed by a reallocation at every write.
    pub fn release(mut self) {
        self.conn.wbuf.clear_and_bound(KEEP_WRITE);
        // A pooled connection holds no read buffer: the next response's head is read
        // into one of its own size.
        release(&mut self.conn.rbuf);
        self.idle.put(self.worker, self.conn);
    }
}

/// Why a request did not go out in full.
enum UploadError {
    /// The app's body broke (its connection failed mid-body, or it did not fit its
    /// length): the exchange is over.
    Body(io::Error),
    /// The endpoint stopped taking it; its answer may still come.
    Write(io::Error),
}

/// The request on its way out: its head, then its body as the app sends it.
struct Upload<B> {
    body: B,
    encoder: BodyEncoder,
    done: bool,
    /// `Expect: 100-continue`: the body waits for the endpoint's `100 Continue` (or a
    /// final answer, which means it is never sent), at most until this timer fires.
    /// The app's body is not read before, so the app hears `100 Continue` only once
    /// the endpoint said it.
    expecting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> Upload<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    /// Writes the head and as much body as there is; `Ready(Ok)` once all of it is out.
    fn poll(
        &mut self,
        conn: &mut Connection,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UploadError>> {
        if let Some(timer) = self.expecting.as_mut() {
            // The head goes out; the body waits.
            if !conn.wbuf.is_empty() {
                std::task::ready!(conn.poll_drain(cx)).map_err(UploadError::Write)?;
            }
            if !conn.continued && timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.expecting = None;
        }
        loop {
            while !self.encoder.ended() && conn.wbuf.len() < WRITE_BATCH {
                match Pin::new(&mut self.body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => self.encoder.frame(&mut conn.wbuf, frame),
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(UploadError::Body(io::Error::other(e))));
                    }
                    Poll::Ready(None) => self.encoder.finish(&mut conn.wbuf, None),
                    Poll::Pending => break,
                }
                if !self.encoder.ended() && self.body.is_end_stream() {
                    self.encoder.finish(&mut conn.wbuf, None);
                }
            }
            if self.encoder.broken() {
                return Poll::Ready(Err(UploadError::Body(crate::http::bad(
                    "the request body does not match its length",
                ))));
            }
            if conn.wbuf.is_empty() {
                if self.encoder.ended() {
                    self.done = true;
                    return Poll::Ready(Ok(()));
                }
                return Poll::Pending;
            }
            std::task::ready!(conn.poll_drain(cx)).map_err(UploadError::Write)?;
            if self.encoder.ended() {
                self.done = true;
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// A request body still going out after the response head came: its type erased, so
/// the response body does not carry the request body's type (it is rare, and boxed).
trait PendingUpload: Send + Sync {
    fn poll_upload(
        &mut self,
        conn: &mut Connection,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UploadError>>;
}

impl<B: OutgoingBody> PendingUpload for Upload<B> {
    fn poll_upload(
        &mut self,
        conn: &mut Connection,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UploadError>> {
        self.poll(conn, cx)
    }
}

/// Sends the request on the leased connection and reads the response head. The
/// response's body holds the lease and releases it once read to its end (and once the
/// request body has gone out in full); dropped before, it closes the connection. The
/// response is made in its box (see [`UpstreamResponse`](super::response::UpstreamResponse)).
pub async fn send<B>(
    mut lease: Lease,
    head: &RequestHead<'_>,
    body: B,
) -> io::Result<Box<Response<ByProtocol<Http1Response>>>>
where
    B: OutgoingBody,
{
    let conn = lease.conn();
    let framing = encode_h1(conn.wbuf.bytes_mut(), head, &body)?;
    conn.continued = false;
    let expects = !body.is_end_stream()
        && head
            .headers
            .get(EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let mut upload = Upload {
        body,
        encoder: BodyEncoder::new(framing),
        done: false,
        expecting: expects.then(|| Box::pin(tokio::time::sleep(head.continue_wait.duration()))),
    };
    // The request goes out while the response is awaited: an endpoint may answer
    // before it has read the whole body (and some never read it).
    let mut upload_failed = false;
    let head = std::future::poll_fn(|cx| {
        loop {
            if !upload.done && !upload_failed {
                match upload.poll(conn, cx) {
                    Poll::Ready(Err(UploadError::Body(e))) => return Poll::Ready(Err(e)),
                    Poll::Ready(Err(UploadError::Write(e))) => {
                        tracing::trace!(error = %e, "request body not sent in full");
                        upload_failed = true;
                    }
                    _ => {}
                }
            }
            let continued = conn.continued;
            let polled = conn.poll_head(cx, *head.method == Method::HEAD);
            // A `100 Continue` just read lets the body go: once more round.
            if polled.is_pending() && !continued && conn.continued && upload.expecting.is_some() {
                continue;
            }
            return polled;
        }
    })
    .await?;
    // A final answer before the `100 Continue`: the body is never sent, and the
    // connection, whose endpoint may still wait for it, is not used again.
    let refused = upload.expecting.is_some();
    let upload: Option<Box<dyn PendingUpload>> = if upload.done || upload_failed || refused {
        None
    } else {
        Some(Box::new(upload))
    };
    let mut body = Http1Response {
        lease: Some(lease),
        fields: head.fields,
        framing: head.framing,
        reuse: head.reuse && !upload_failed && !refused,
        upload,
        broken: None,
        ahead: VecDeque::new(),
    };
    // A protocol switch keeps its connection for the tunnel (see `take_upgraded`).
    if head.status != http::StatusCode::SWITCHING_PROTOCOLS {
        body.finish_if_done();
    }
    let mut resp = Box::new(Response::new(ByProtocol::Http1(body)));
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    Ok(resp)
}

/// The body of a response that came over HTTP/1.1, read from the connection as the
/// app's side asks for it.
pub struct Http1Response {
    lease: Option<Lease>,
    /// The response head's fields (the response's header map is left empty).
    fields: RawFields,
    framing: Framing,
    reuse: bool,
    /// The request body, still going out (rarely: boxed).
    upload: Option<Box<dyn PendingUpload>>,
    /// The body broke; reported on the next poll, so that what arrived before the
    /// break is flushed to the app first.
    broken: Option<io::Error>,
    /// What [`Http1Response::read_ahead`] read into memory, given out first.
    ahead: VecDeque<Result<Frame<Bytes>, BoxError>>,
}

impl Http1Response {
    pub fn fields(&self) -> &RawFields {
        &self.fields
    }

    /// The connection of a `101 Switching Protocols`, to tunnel: what the endpoint
    /// sent after the head comes first. `None` once taken (or for any other response,
    /// whose connection was released when it ended).
    pub fn take_upgraded(&mut self) -> Option<Upgraded> {
        let conn = *self.lease.take()?.conn;
        Some(Upgraded::new(conn.io, conn.rbuf, conn._open))
    }

    fn ended(&self) -> bool {
        self.framing == Framing::Length(0)
    }

    /// Reads the rest of the body into memory, up to about `limit` bytes, so that its
    /// connection goes back to the pool now while the response is kept to be answered
    /// later (a failed response kept while its retry runs). `true` once the body has
    /// ended; what was read is given out first either way.
    pub async fn read_ahead(&mut self, limit: usize) -> bool {
        let mut size = 0;
        while size <= limit {
            match std::future::poll_fn(|cx| self.poll_wire(cx)).await {
                None => return true,
                Some(Ok(frame)) => {
                    size += frame.data_ref().map_or(0, Bytes::len);
                    self.ahead.push_back(Ok(frame));
                }
                Some(Err(e)) => {
                    self.ahead.push_back(Err(e));
                    return false;
                }
            }
        }
        false
    }

    /// Once the response has ended: the connection goes back to the pool if it can
    /// carry another request, else it is closed.
    fn finish_if_done(&mut self) {
        if !self.ended() {
            return;
        }
        if let Some(lease) = self.lease.take()
            && self.reuse
            && self.upload.is_none()
        {
            lease.release();
        }
        self.upload = None;
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Frame<Bytes>>>> {
        let Some(lease) = self.lease.as_mut() else {
            return Poll::Ready(None);
        };
        let conn = lease.conn();
        if let Some(up) = self.upload.as_mut() {
            match up.poll_upload(conn, cx) {
                Poll::Ready(Ok(())) => self.upload = None,
                Poll::Ready(Err(UploadError::Body(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Err(UploadError::Write(_))) => {
                    // The endpoint stopped reading the request; its answer may still
                    // be whole, but the connection cannot be reused.
                    self.upload = None;
                    self.reuse = false;
                }
                Poll::Pending => {}
            }
        }
        let mut eof = false;
        loop {
            match step(&mut conn.rbuf, &mut self.framing, eof)? {
                Step::Data(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Step::Trailers(t) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Step::End => return Poll::Ready(None),
                Step::More => {
                    let want = match self.framing {
                        Framing::Length(left) => left.clamp(READ_CHUNK as u64, 64 * 1024) as usize,
                        Framing::Eof => 16 * 1024,
                        Framing::Chunked(_) => READ_CHUNK,
                    };
                    eof = std::task::ready!(conn.poll_fill(cx, want))? == 0;
                }
            }
        }
    }
}

impl Body for Http1Response {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match this.ahead.pop_front() {
            Some(frame) => Poll::Ready(Some(frame)),
            None => this.poll_wire(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.is_empty() && (self.ended() || (self.lease.is_none() && self.broken.is_none()))
    }

    fn size_hint(&self) -> SizeHint {
        let wire = self.framing.size_hint();
        if self.ahead.is_empty() {
            return wire;
        }
        let n: u64 = self
            .ahead
            .iter()
            .filter_map(|f| f.as_ref().ok()?.data_ref().map(|d| d.len() as u64))
            .sum();
        let mut hint = SizeHint::new();
        hint.set_lower(wire.lower() + n);
        if let Some(upper) = wire.upper() {
            hint.set_upper(upper + n);
        }
        hint
    }
}

impl Http1Response {
    /// The body as it comes off the connection.
    fn poll_wire(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self;
        if let Some(e) = this.broken.take() {
            return Poll::Ready(Some(Err(e.into())));
        }
        match this.poll_next(cx) {
            Poll::Ready(Some(Err(e))) => {
                // A broken body: the connection is closed with it. The app's side
                // is told on the next poll, after it has had the chance to send on
                // what it holds (the head, above all): the app then sees a body cut
                // short, not a connection closed before any answer.
                this.lease = None;
                this.upload = None;
                this.broken = Some(e);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(frame) => {
                this.finish_if_done();
                Poll::Ready(frame.map(|r| r.map_err(BoxError::from)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
