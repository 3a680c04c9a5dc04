//! HTTP/1.1 from the app, read and answered on the connection's own task.
//!
//! One read buffer and one write buffer per connection, kept for its life. A request
//! head is parsed in place (`httparse`) and its header values are slices of the
//! buffer; the next head is read only once the response has gone out, by which time
//! nothing holds the old one, so the buffer is reused as it is rather than replaced.
//! The response head, and as much of its body as is already there, leave in one write.
//!
//! Framing follows RFC 9112 section 6 and refuses what could be read two ways:
//! `Content-Length` must be digits (repeats must agree), `Transfer-Encoding` must be
//! `chunked` alone and wins over a `Content-Length` (which is dropped, and the
//! connection closed after the response), and chunked is no HTTP/1.0 framing.
//! A refused head gets its status (400, or 431 for one over `max_header_bytes` or
//! `max_headers`) and the connection is closed.
//!
//! While a request is answered the socket is still watched: the app closing its side
//! cancels the request (and every attempt in flight), as nobody waits for the answer.

use std::future::{Future, poll_fn};
use std::io;
use std::mem::MaybeUninit;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, EXPECT, HOST, TRANSFER_ENCODING};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version,
};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;

use super::Shared;
use super::body::{AppBody, ResponseBody};
use super::conn::{ConnState, TWO_HOSTS, host_value_problem};
use crate::upstream::h1::{
    BoxError, Chunk, FEW_HEADERS, Framing, KEEP_WRITE, READ_CHUNK, Step, WRITE_BATCH,
    content_length, field_spans, has_token, step, write_field,
};

/// The most fields `max_headers` may allow (the config refuses more).
const MOST_HEADERS: usize = 1000;
/// While a request is answered, bytes the app sends ahead (a pipelined request) are
/// read up to this much; beyond it the socket is left alone until the response is out.
const READ_AHEAD: usize = 64 * 1024;
/// After a refused head or an unread body, what the app still sends is read and thrown
/// away for up to this long (and this much) before the socket is closed, so the close
/// does not reset the connection under the response.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 1024 * 1024;

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

fn lock(io: &Mutex<Io>) -> MutexGuard<'_, Io> {
    io.lock().unwrap_or_else(|p| p.into_inner())
}

/// The socket and what has been read from it. Shared between the connection and the
/// body of the request being read; both run on the connection's task, one at a time.
struct Io {
    stream: TcpStream,
    rbuf: BytesMut,
    /// What is left of the current request's body (`Length(0)`: none, or all read).
    body: Framing,
    /// The body broke: the app went away mid-body, or sent a malformed chunk.
    body_failed: bool,
    /// Bytes of `100 Continue` still owed before the body is read.
    continue_left: usize,
    /// The app has closed its side.
    eof: bool,
}

impl Io {
    /// Reads what the socket holds into the read buffer, first making room for `want`
    /// bytes if less than `min` is free.
    fn poll_fill(
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

    fn poll_write_all(
        &mut self,
        cx: &mut Context<'_>,
        buf: &[u8],
        pos: &mut usize,
    ) -> Poll<io::Result<()>> {
        while *pos < buf.len() {
            match ready!(Pin::new(&mut self.stream).poll_write(cx, &buf[*pos..])) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => *pos += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    fn body_done(&self) -> bool {
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

    /// While a request is being answered: `Ready` once the app has closed its side (or
    /// its socket failed). Bytes it sends ahead are kept for the next head.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // A body still being read is watched by its reader.
        while self.body_done() && !self.eof && self.rbuf.len() < READ_AHEAD {
            match ready!(self.poll_fill(cx, 512, 4096)) {
                Ok(0) | Err(_) => return Poll::Ready(()),
                Ok(_) => {}
            }
        }
        if self.eof {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// The body of a request that came over HTTP/1.1, read from the connection as the
/// request's attempts ask for it.
pub struct Http1Body {
    io: Arc<Mutex<Io>>,
}

impl Body for Http1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        lock(&self.io)
            .poll_body(cx)
            .map(|f| f.map(|r| r.map_err(BoxError::from)))
    }

    fn is_end_stream(&self) -> bool {
        lock(&self.io).body_done()
    }

    fn size_hint(&self) -> SizeHint {
        match lock(&self.io).body {
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

/// What one client connection needs to answer its requests.
pub struct Settings {
    pub shared: Arc<Shared>,
    pub fixed: Option<Arc<str>>,
    pub state: Arc<ConnState>,
    pub max_header_bytes: usize,
    pub max_headers: usize,
}

/// An HTTP/1.1 client connection being served; a future that ends when it closes.
pub struct Http1Conn {
    run: Pin<Box<dyn Future<Output = ()> + Send>>,
    closing: Arc<AtomicBool>,
}

impl Http1Conn {
    /// Serves `stream`, whose first bytes (`prefix`) were already read.
    pub fn new(stream: TcpStream, prefix: &[u8], settings: Settings) -> Self {
        let mut rbuf = BytesMut::with_capacity(READ_CHUNK.max(prefix.len()));
        rbuf.extend_from_slice(prefix);
        let io = Arc::new(Mutex::new(Io {
            stream,
            rbuf,
            body: Framing::Length(0),
            body_failed: false,
            continue_left: 0,
            eof: false,
        }));
        let closing = Arc::new(AtomicBool::new(false));
        Http1Conn {
            run: Box::pin(run(io, settings, closing.clone())),
            closing,
        }
    }

    /// Closes the connection after the response in flight, or at once when idle.
    pub fn graceful_shutdown(self: Pin<&mut Self>) {
        self.closing.store(true, Release);
    }
}

impl Future for Http1Conn {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.run.as_mut().poll(cx)
    }
}

/// A request head as read.
struct Head {
    req: Request<AppBody>,
    keep_alive: bool,
}

/// A request head as parsed, before its body is attached.
struct Parts {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    keep_alive: bool,
}

/// What waiting for the next request head found. Unboxed: it is unpacked as soon as
/// it is returned, and a box would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
enum Next {
    Request(Head),
    /// The app closed the connection, or it is being drained and nothing is pending.
    Closed,
    /// A head that will not be served.
    Refused(StatusCode, &'static str),
}

async fn run(io: Arc<Mutex<Io>>, settings: Settings, closing: Arc<AtomicBool>) {
    let mut wbuf: Vec<u8> = Vec::new();
    loop {
        let head = match poll_fn(|cx| poll_head(&io, &settings, &closing, cx)).await {
            Next::Request(head) => head,
            Next::Closed => return,
            Next::Refused(status, why) => {
                refuse(&io, &mut wbuf, status, why).await;
                return;
            }
        };
        // The Host was checked as the head was read.
        let Head { req, keep_alive } = head;
        let version = req.version();
        let head_request = req.method() == Method::HEAD;
        let answer = super::handler::handle(
            settings.shared.clone(),
            settings.fixed.clone(),
            settings.state.clone(),
            req,
        );
        let mut answer = pin!(answer);
        let answered = poll_fn(|cx| {
            if let Poll::Ready(Ok(resp)) = answer.as_mut().poll(cx) {
                return Poll::Ready(Some(resp));
            }
            // Nobody waits for the answer: dropping the request cancels it.
            match lock(&io).poll_gone(cx) {
                Poll::Ready(()) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        let Some(resp) = answered else {
            return;
        };
        let keep_alive = keep_alive && !closing.load(Acquire);
        let Ok(kept) = respond(&io, &mut wbuf, resp, version, head_request, keep_alive).await
        else {
            return;
        };
        let unread = !lock(&io).body_done();
        if !kept || unread {
            close(&io, unread).await;
            return;
        }
        if wbuf.capacity() > KEEP_WRITE {
            wbuf = Vec::new();
        }
    }
}

/// Reads until a whole request head is in the buffer, and takes it.
fn poll_head(
    shared: &Arc<Mutex<Io>>,
    settings: &Settings,
    closing: &AtomicBool,
    cx: &mut Context<'_>,
) -> Poll<Next> {
    let mut io = lock(shared);
    loop {
        if !io.rbuf.is_empty() {
            match parse(
                &mut io.rbuf,
                settings.max_header_bytes,
                settings.max_headers,
            ) {
                Ok(Some(Parsed {
                    parts: p,
                    framing,
                    expect,
                })) => {
                    io.body = framing;
                    io.body_failed = false;
                    io.continue_left = if expect { CONTINUE.len() } else { 0 };
                    let mut req = Request::new(AppBody::Http1(Http1Body { io: shared.clone() }));
                    *req.method_mut() = p.method;
                    *req.uri_mut() = p.uri;
                    *req.version_mut() = p.version;
                    *req.headers_mut() = p.headers;
                    return Poll::Ready(Next::Request(Head {
                        req,
                        keep_alive: p.keep_alive,
                    }));
                }
                Ok(None) if io.rbuf.len() >= settings.max_header_bytes => {
                    return Poll::Ready(Next::Refused(
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        "the request head is larger than this proxy accepts\n",
                    ));
                }
                // Part of a head: its timer starts (a head that arrives whole, the
                // usual case, never needs the clock).
                Ok(None) => settings.state.bytes_read(),
                Err((status, why)) => return Poll::Ready(Next::Refused(status, why)),
            }
        } else if closing.load(Acquire) {
            return Poll::Ready(Next::Closed);
        }
        if io.eof {
            // Closed, between requests or within a head: nothing to answer.
            return Poll::Ready(Next::Closed);
        }
        if let Err(_) | Ok(0) = ready!(io.poll_fill(cx, 1024, READ_CHUNK)) {
            // An error or the end: either way the next turn ends the connection.
            io.eof = true;
        }
    }
}

type Refusal = (StatusCode, &'static str);

fn malformed(why: &'static str) -> Refusal {
    (StatusCode::BAD_REQUEST, why)
}

/// A request head taken off the read buffer, and how its body follows.
struct Parsed {
    parts: Parts,
    framing: Framing,
    /// `100 Continue` is owed before the body is read.
    expect: bool,
}

/// Parses a request head at the front of the read buffer and takes it off; `None`
/// while it is incomplete.
fn parse(
    rbuf: &mut BytesMut,
    max_header_bytes: usize,
    max_headers: usize,
) -> Result<Option<Parsed>, Refusal> {
    // Uninitialised: clearing room for every allowed field on each request would cost
    // more than parsing the ones there are.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MOST_HEADERS];
    let fields = &mut fields[..max_headers.clamp(1, MOST_HEADERS)];
    let mut parsed = httparse::Request::new(&mut []);
    // Only the first `max_header_bytes` are looked at: a head is refused for its size
    // or for what is wrong in it the same way however its bytes arrived.
    let window = &rbuf[..rbuf.len().min(max_header_bytes)];
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        window,
        fields,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err((
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "the request has more header fields than this proxy accepts\n",
            ));
        }
        Err(_) => return Err(malformed("malformed request head\n")),
    };
    let method = parsed.method.unwrap_or_default();
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| malformed("invalid method\n"))?;
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Where the target and each field sit in the buffer, so they can be taken from
    // the head once it is split off (slices of it, not copies).
    let path = parsed.path.unwrap_or_default();
    let target = (path.as_ptr() as usize - rbuf.as_ptr() as usize, path.len());
    let count = parsed.headers.len();
    let (mut few, mut many) = ([(0, 0, 0, 0); FEW_HEADERS], Vec::new());
    let spans = field_spans(rbuf, parsed.headers, &mut few, &mut many);
    let head = rbuf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(head.slice(target.0..target.0 + target.1))
        .map_err(|_| malformed("invalid request target\n"))?;

    let mut headers = HeaderMap::with_capacity(count + 3);
    let mut length: Option<u64> = None;
    let mut coded = false;
    let mut chunked = false;
    let mut expect = false;
    let mut hosts = 0;
    let mut keep_alive = version == Version::HTTP_11;
    for &(ns, nl, vs, vl) in spans.iter() {
        let name = HeaderName::from_bytes(&head[ns..ns + nl])
            .map_err(|_| malformed("invalid header name\n"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(vs..vs + vl))
            .map_err(|_| malformed("invalid header value\n"))?;
        if name == CONTENT_LENGTH {
            for part in value.as_bytes().split(|&b| b == b',') {
                let v = content_length(part.trim_ascii())
                    .ok_or_else(|| malformed("invalid Content-Length\n"))?;
                if length.is_some_and(|l| l != v) {
                    return Err(malformed("conflicting Content-Length values\n"));
                }
                length = Some(v);
            }
        } else if name == TRANSFER_ENCODING {
            coded = true;
            // Only `chunked` is understood, and it must come last, once: anything else
            // could frame the body differently at the next hop.
            for coding in value.as_bytes().split(|&b| b == b',') {
                if chunked || !coding.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return Err(malformed("unsupported Transfer-Encoding\n"));
                }
                chunked = true;
            }
        } else if name == CONNECTION {
            if has_token(value.as_bytes(), b"close") {
                keep_alive = false;
            } else if version == Version::HTTP_10 && has_token(value.as_bytes(), b"keep-alive") {
                keep_alive = true;
            }
        } else if name == EXPECT {
            expect = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
        } else if name == HOST {
            // One Host, and a valid one, or routing could be fooled (see `conn`).
            if hosts > 0 {
                return Err(malformed(TWO_HOSTS));
            }
            hosts += 1;
            if let Some(why) = host_value_problem(value.as_bytes()) {
                return Err(malformed(why));
            }
        }
        headers.append(name, value);
    }
    let framing = if coded {
        if version == Version::HTTP_10 {
            return Err(malformed("Transfer-Encoding in an HTTP/1.0 request\n"));
        }
        if length.is_some() {
            // Both: chunked wins (RFC 9112 section 6.3), the stale length is not passed
            // on, and the connection, whose framing was doubtful, serves no more.
            headers.remove(CONTENT_LENGTH);
            keep_alive = false;
        }
        Framing::Chunked(Chunk::Size)
    } else {
        Framing::Length(length.unwrap_or(0))
    };
    let expect = expect && framing != Framing::Length(0) && version == Version::HTTP_11;
    Ok(Some(Parsed {
        parts: Parts {
            method,
            uri,
            version,
            headers,
            keep_alive,
        },
        framing,
        expect,
    }))
}

/// A request as the connection would read it (for tests and fuzzing).
#[derive(Debug, PartialEq)]
pub struct ParsedRequest {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: Option<HeaderMap>,
    pub keep_alive: bool,
}

/// How reading a request ended without one: the status of a refused head (400, 431),
/// or 0 for a body that broke off or was malformed.
pub type Refused = u16;

/// The requests a connection would read from `pieces` arriving one after another and
/// then the app closing its side: the same head parser and body framing as the real
/// thing, without a socket. Reading stops after a refused head, a broken body, a
/// request that ends the connection, or a head the input ends within.
pub fn parse_requests(
    pieces: &[&[u8]],
    max_header_bytes: usize,
    max_headers: usize,
) -> Vec<Result<ParsedRequest, Refused>> {
    let mut rbuf = BytesMut::new();
    let mut pieces = pieces.iter();
    let mut eof = false;
    let mut fill = |rbuf: &mut BytesMut, eof: &mut bool| match pieces.next() {
        Some(p) => rbuf.extend_from_slice(p),
        None => *eof = true,
    };
    let mut out = Vec::new();
    loop {
        let parsed = loop {
            if !rbuf.is_empty() {
                match parse(&mut rbuf, max_header_bytes, max_headers) {
                    Ok(Some(p)) => break Some(p),
                    Ok(None) if rbuf.len() >= max_header_bytes => {
                        out.push(Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE.as_u16()));
                        return out;
                    }
                    Ok(None) => {}
                    Err((status, _)) => {
                        out.push(Err(status.as_u16()));
                        return out;
                    }
                }
            }
            if eof {
                break None;
            }
            fill(&mut rbuf, &mut eof);
        };
        let Some(Parsed {
            parts, mut framing, ..
        }) = parsed
        else {
            return out;
        };
        let mut body = Vec::new();
        let mut trailers = None;
        loop {
            match step(&mut rbuf, &mut framing, eof) {
                Ok(Step::Data(d)) => body.extend_from_slice(&d),
                Ok(Step::Trailers(t)) => trailers = Some(t),
                Ok(Step::End) => break,
                Ok(Step::More) => fill(&mut rbuf, &mut eof),
                Err(_) => {
                    out.push(Err(0));
                    return out;
                }
            }
        }
        let keep_alive = parts.keep_alive;
        out.push(Ok(ParsedRequest {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            headers: parts.headers,
            body,
            trailers,
            keep_alive,
        }));
        if !keep_alive {
            return out;
        }
    }
}

/// How the response body goes out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// No body (HEAD, 1xx, 204, 304).
    None,
    /// This many bytes still to write.
    Length(u64),
    Chunked,
    /// Until the connection closes (an HTTP/1.0 app, no length known).
    Close,
}

/// Writes the response; `Ok(true)` when the connection may carry another request.
async fn respond(
    io: &Mutex<Io>,
    wbuf: &mut Vec<u8>,
    resp: Response<ResponseBody>,
    version: Version,
    head_request: bool,
    mut keep_alive: bool,
) -> io::Result<bool> {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status;
    let code = status.as_u16();
    let bodiless = head_request || status.is_informational() || code == 204 || code == 304;
    // The answer is final: no `100 Continue` may follow it, whoever reads the body
    // later (an HTTP/2 upstream's connection reads it on a task of its own).
    lock(io).continue_left = 0;
    wbuf.clear();
    wbuf.extend_from_slice(if version == Version::HTTP_10 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    wbuf.extend_from_slice(&itoa3(code));
    wbuf.push(b' ');
    wbuf.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    wbuf.extend_from_slice(b"\r\n");
    let mut length = None;
    let mut dated = false;
    for (name, value) in &parts.headers {
        if name == CONNECTION {
            if has_token(value.as_bytes(), b"close") {
                keep_alive = false;
            }
            continue;
        }
        if name == TRANSFER_ENCODING {
            continue;
        }
        if name == CONTENT_LENGTH {
            if status.is_informational() || code == 204 {
                continue;
            }
            length = content_length(value.as_bytes().trim_ascii());
            if length.is_none() {
                continue;
            }
        }
        dated |= name == DATE;
        write_field(wbuf, name, value);
    }
    if let Some(stamp) = body.stamp() {
        wbuf.extend_from_slice(b"x-tollgate-attempts: ");
        let mut digits = [0u8; 10];
        wbuf.extend_from_slice(decimal(stamp.attempts, &mut digits));
        wbuf.extend_from_slice(b"\r\n");
        if let Some(outcome) = stamp.outcome {
            wbuf.extend_from_slice(b"x-tollgate-outcome: ");
            wbuf.extend_from_slice(outcome.as_str().as_bytes());
            wbuf.extend_from_slice(b"\r\n");
        }
    }
    if let Some(raw) = body.raw_fields() {
        let lengthless = status.is_informational() || code == 204;
        raw.write_to(wbuf, !lengthless);
        dated |= raw.has_date();
        if raw.has_length() && !lengthless {
            // The upstream's own length, which its body is framed by.
            length = body.size_hint().exact().or(Some(0));
        }
    }
    let mut out = if bodiless {
        Out::None
    } else if let Some(n) = length {
        Out::Length(n)
    } else if let Some(n) = body.size_hint().exact() {
        wbuf.extend_from_slice(b"content-length: ");
        wbuf.extend_from_slice(n.to_string().as_bytes());
        wbuf.extend_from_slice(b"\r\n");
        Out::Length(n)
    } else if version == Version::HTTP_11 {
        wbuf.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Out::Chunked
    } else {
        keep_alive = false;
        Out::Close
    };
    if !keep_alive {
        wbuf.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 {
        wbuf.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if !dated {
        wbuf.extend_from_slice(b"date: ");
        date(wbuf);
        wbuf.extend_from_slice(b"\r\n");
    }
    wbuf.extend_from_slice(b"\r\n");

    let mut ended = out == Out::None || out == Out::Length(0);
    let mut broken = false;
    let mut pos = 0;
    poll_fn(|cx| {
        loop {
            let mut waiting = false;
            while !ended && wbuf.len() < WRITE_BATCH {
                match Pin::new(&mut body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        encode(wbuf, &mut out, frame, &mut ended, &mut broken);
                    }
                    Poll::Ready(Some(Err(e))) => {
                        tracing::debug!(error = %e, "response body broke; closing");
                        ended = true;
                        broken = true;
                    }
                    Poll::Ready(None) => finish(wbuf, &mut out, None, &mut ended, &mut broken),
                    Poll::Pending => {
                        waiting = true;
                        break;
                    }
                }
                if !ended && body.is_end_stream() {
                    finish(wbuf, &mut out, None, &mut ended, &mut broken);
                }
            }
            let mut io = lock(io);
            ready!(io.poll_write_all(cx, wbuf, &mut pos))?;
            wbuf.clear();
            pos = 0;
            if ended {
                return Poll::Ready(Ok::<(), io::Error>(()));
            }
            if waiting {
                // Nobody left to send the rest to.
                if io.poll_gone(cx).is_ready() {
                    return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
                }
                return Poll::Pending;
            }
        }
    })
    .await?;
    Ok(keep_alive && !broken && out != Out::Close)
}

/// Puts one frame of the response body into the write buffer.
fn encode(
    wbuf: &mut Vec<u8>,
    out: &mut Out,
    frame: Frame<Bytes>,
    ended: &mut bool,
    broken: &mut bool,
) {
    let data = match frame.into_data() {
        Ok(data) => data,
        Err(frame) => {
            finish(wbuf, out, frame.into_trailers().ok(), ended, broken);
            return;
        }
    };
    if data.is_empty() {
        return;
    }
    match out {
        Out::None => {}
        Out::Length(left) => {
            let n = (*left).min(data.len() as u64);
            wbuf.extend_from_slice(&data[..n as usize]);
            *left -= n;
            if n < data.len() as u64 {
                // More than the length said: the rest cannot be sent in this framing.
                *broken = true;
                *ended = true;
            } else if *left == 0 {
                *ended = true;
            }
        }
        Out::Chunked => {
            let mut hex = [0u8; 16];
            let digits = hex_digits(data.len(), &mut hex);
            wbuf.extend_from_slice(digits);
            wbuf.extend_from_slice(b"\r\n");
            wbuf.extend_from_slice(&data);
            wbuf.extend_from_slice(b"\r\n");
        }
        Out::Close => wbuf.extend_from_slice(&data),
    }
}

/// The body has ended (with these trailers).
fn finish(
    wbuf: &mut Vec<u8>,
    out: &mut Out,
    trailers: Option<HeaderMap>,
    ended: &mut bool,
    broken: &mut bool,
) {
    if *ended {
        return;
    }
    *ended = true;
    match out {
        Out::Chunked => {
            wbuf.extend_from_slice(b"0\r\n");
            for (name, value) in trailers.iter().flatten() {
                write_field(wbuf, name, value);
            }
            wbuf.extend_from_slice(b"\r\n");
        }
        // Shorter than its length: the app must see it cut short.
        Out::Length(left) if *left > 0 => *broken = true,
        _ => {}
    }
}

fn itoa3(code: u16) -> [u8; 3] {
    [
        b'0' + (code / 100 % 10) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]
}

fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

fn hex_digits(mut n: usize, buf: &mut [u8; 16]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

thread_local! {
    /// The `Date` value of the current second, formatted once per second per thread.
    static TODAY: std::cell::RefCell<(u64, [u8; 29])> = const { std::cell::RefCell::new((0, [0; 29])) };
}

fn date(wbuf: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    TODAY.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                cached.1.copy_from_slice(text.as_bytes());
                cached.0 = secs;
            }
        }
        wbuf.extend_from_slice(&cached.1);
    });
}

/// Answers a head that will not be served, and closes.
async fn refuse(io: &Mutex<Io>, wbuf: &mut Vec<u8>, status: StatusCode, why: &'static str) {
    tracing::debug!(
        status = status.as_u16(),
        reason = why.trim_end(),
        "request head refused"
    );
    let mut resp = Response::new(ResponseBody::full(why, None));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if respond(io, wbuf, resp, Version::HTTP_11, false, false)
        .await
        .is_ok()
    {
        close(io, true).await;
    }
}

/// Ends the connection: the write side first, then, when the app may still be
/// sending (a body or head not read), a short wait for it to finish, so that closing
/// with unread bytes does not reset the connection before the app has read the answer.
async fn close(io: &Mutex<Io>, linger: bool) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::upstream::h1::tests::{chunked_body, cut};
    use proptest::prelude::*;

    fn whole(input: &[u8]) -> Vec<Result<ParsedRequest, Refused>> {
        parse_requests(&[input], 32 * 1024, 100)
    }

    fn statuses(input: &[u8]) -> Vec<Result<(String, Vec<u8>), Refused>> {
        whole(input)
            .into_iter()
            .map(|r| r.map(|r| (format!("{} {}", r.method, r.uri), r.body)))
            .collect()
    }

    #[test]
    fn framing_that_could_be_read_two_ways_is_refused() {
        for framing in [
            "Content-Length: 5\r\nContent-Length: 6\r\n",
            "Content-Length: 5, 6\r\n",
            "Content-Length: +5\r\n",
            "Content-Length: -5\r\n",
            "Content-Length: 0x5\r\n",
            "Content-Length: 5 5\r\n",
            "Transfer-Encoding: chunked, identity\r\n",
            "Transfer-Encoding: identity\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        ] {
            let input = format!("POST / HTTP/1.1\r\nHost: a\r\n{framing}\r\nhello");
            assert_eq!(statuses(input.as_bytes()), [Err(400)], "{framing:?}");
        }
        assert_eq!(
            statuses(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
            [Err(400)]
        );
    }

    #[test]
    fn chunked_wins_over_a_length_and_ends_the_connection() {
        let got = whole(
            b"POST /a HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
        );
        assert_eq!(got.len(), 1, "nothing is read after it");
        let r = got[0].as_ref().unwrap();
        assert_eq!(r.body, b"hello");
        assert!(r.headers.get(CONTENT_LENGTH).is_none());
        assert!(!r.keep_alive);
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_field() {
        let keep = |input: &[u8]| whole(input)[0].as_ref().unwrap().keep_alive;
        assert!(keep(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(!keep(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n"));
        assert!(!keep(b"GET / HTTP/1.1\r\nConnection: foo, Close\r\n\r\n"));
        assert!(!keep(b"GET / HTTP/1.0\r\n\r\n"));
        assert!(keep(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    }

    #[test]
    fn heads_over_the_limits_get_431() {
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(100));
        assert_eq!(
            parse_requests(&[big.as_bytes()], 64, 100)
                .into_iter()
                .map(|r| r.map(|_| ()))
                .collect::<Vec<_>>(),
            [Err(431)]
        );
        let many: String = (0..5).map(|i| format!("X-{i}: v\r\n")).collect();
        let input = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert!(matches!(
            parse_requests(&[input.as_bytes()], 1024, 4)[..],
            [Err(431)]
        ));
        assert!(matches!(
            parse_requests(&[input.as_bytes()], 1024, 5)[..],
            [Ok(_)]
        ));
    }

    #[test]
    fn the_size_limit_is_applied_before_what_lies_past_it() {
        let input = format!("GET / HTTP/1.1\r\nX: {}\r\n\x01\r\n\r\n", "a".repeat(300));
        for step in [1, 2, 7, 256, input.len()] {
            let pieces: Vec<&[u8]> = input.as_bytes().chunks(step).collect();
            assert!(
                matches!(parse_requests(&pieces, 256, 100)[..], [Err(431)]),
                "read in {step}-byte pieces"
            );
        }
    }

    #[test]
    fn a_body_cut_short_or_malformed_is_no_request() {
        assert_eq!(
            statuses(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nhello"),
            [Err(0)]
        );
        assert_eq!(
            statuses(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            [Err(0)]
        );
    }

    proptest! {
        #[test]
        fn pipelined_requests_read_the_same_in_any_pieces(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..4),
            sizes in proptest::collection::vec(1usize..50, 1..5),
            cuts in proptest::collection::vec(0usize..2000, 0..12),
        ) {
            let mut input = Vec::new();
            for (i, body) in bodies.iter().enumerate() {
                if i % 2 == 0 {
                    input.extend_from_slice(
                        format!("POST /{i} HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
                    );
                    input.extend_from_slice(body);
                } else {
                    input.extend_from_slice(
                        format!("PUT /{i} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes(),
                    );
                    input.extend_from_slice(&chunked_body(body, &sizes, i % 4 == 1, &[]));
                }
            }
            let pieces = cut(&input, &cuts);
            let read = parse_requests(&pieces, 32 * 1024, 100);
            prop_assert_eq!(read.len(), bodies.len());
            for (i, (r, body)) in read.iter().zip(&bodies).enumerate() {
                let r = r.as_ref().unwrap();
                prop_assert_eq!(r.uri.path(), format!("/{i}"));
                prop_assert_eq!(&r.body, body);
            }
        }

        #[test]
        fn any_bytes_in_any_pieces_read_the_same(
            input in proptest::collection::vec(any::<u8>(), 0..400),
            step in 1usize..40,
        ) {
            let pieces: Vec<&[u8]> = input.chunks(step).collect();
            prop_assert_eq!(whole(&input), parse_requests(&pieces, 32 * 1024, 100));
        }
    }
}
