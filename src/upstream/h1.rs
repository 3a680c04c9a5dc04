//! HTTP/1.1 to an endpoint, driven by the request's own task.
//!
//! A request on HTTP/1.1 owns its connection from the moment it is taken from the pool
//! until its response has been read to the end, so nothing needs a task of its own: the
//! attempt writes the request and reads the response head on the connection directly,
//! and the response body it hands back reads the rest. No channel between the request
//! and a connection task, no wake-up of a second task per request, and no reading ahead
//! into a fresh buffer while the previous response still holds the old one.
//!
//! One buffer each way per connection, kept while it is pooled. The response head is
//! parsed in place (`httparse`) and its header values are slices of the same buffer.
//! Framing follows RFC 9112 section 6: a response to HEAD, a 1xx, 204 or 304 has no
//! body; Transfer-Encoding wins over Content-Length, and a connection whose framing
//! was in any way doubtful (both, a coding other than chunked last, no length at all,
//! `Connection: close`, HTTP/1.0) is never reused.

use std::io;
use std::mem::MaybeUninit;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::connect::{OpenGuard, Transport};
use super::pool::{Lease, RequestHead};
use crate::proxy::headers::names_others;
use crate::retry::replay::RequestBody;

/// The largest response head (or chunk-size line, or trailer block) accepted.
const MAX_HEAD: usize = 256 * 1024;
/// Most header fields in a response head.
const MAX_HEADERS: usize = 128;
/// Heads with up to this many fields are taken apart without an allocation.
pub(crate) const FEW_HEADERS: usize = 24;

/// Where a field of a parsed head sits in its buffer: name start and length, value
/// start and length.
pub(crate) type Span = (usize, usize, usize, usize);

/// The spans of `fields`, parsed from `buf`: in `few` when they fit, else in `many`.
/// Kept so the names and values can be taken from the head once it is split off the
/// buffer (values as slices of it, not copies).
pub(crate) fn field_spans<'s>(
    buf: &[u8],
    fields: &[httparse::Header<'_>],
    few: &'s mut [Span; FEW_HEADERS],
    many: &'s mut Vec<Span>,
) -> &'s [Span] {
    let base = buf.as_ptr() as usize;
    let spans = if fields.len() <= FEW_HEADERS {
        &mut few[..fields.len()]
    } else {
        many.resize(fields.len(), (0, 0, 0, 0));
        &mut many[..]
    };
    for (span, f) in spans.iter_mut().zip(fields) {
        *span = (
            f.name.as_ptr() as usize - base,
            f.name.len(),
            f.value.as_ptr() as usize - base,
            f.value.len(),
        );
    }
    spans
}
/// Room made in the read buffer before each read.
pub(crate) const READ_CHUNK: usize = 8 * 1024;
/// Bodies are pulled into the write buffer until it holds this much, then written.
pub(crate) const WRITE_BATCH: usize = 16 * 1024;
/// A write buffer grown past this by a large body is shrunk back when it empties.
pub(crate) const KEEP_WRITE: usize = 64 * 1024;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One HTTP/1.1 connection to an endpoint, idle or carrying one exchange.
pub struct Connection {
    io: Transport,
    rbuf: BytesMut,
    wbuf: Vec<u8>,
    _open: OpenGuard,
}

impl Connection {
    pub fn new(io: Transport, open: &Arc<AtomicUsize>) -> Self {
        Connection {
            io,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
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

    /// Writes what the write buffer holds, then flushes.
    fn poll_drain(&mut self, cx: &mut Context<'_>, pos: &mut usize) -> Poll<io::Result<()>> {
        while *pos < self.wbuf.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.wbuf[*pos..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *pos += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        std::task::ready!(Pin::new(&mut self.io).poll_flush(cx))?;
        self.wbuf.clear();
        if self.wbuf.capacity() > KEEP_WRITE {
            self.wbuf.shrink_to(READ_CHUNK);
        }
        *pos = 0;
        Poll::Ready(Ok(()))
    }
}

/// How the request body is framed on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    Length,
    Chunked,
}

/// Why a request did not go out in full.
enum UploadError {
    /// The app's body broke (its connection failed mid-body): the exchange is over.
    Body(io::Error),
    /// The endpoint stopped taking it; its answer may still come.
    Write(io::Error),
}

/// The request on its way out: its head, then its body as the app sends it.
struct Upload {
    body: RequestBody,
    out: Out,
    /// Written up to here in the connection's write buffer.
    pos: usize,
    /// The body has ended and its last bytes are in the write buffer.
    ended: bool,
    done: bool,
}

impl Upload {
    /// Writes the head and as much body as there is; `Ready(Ok)` once all of it is out.
    fn poll(
        &mut self,
        conn: &mut Connection,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UploadError>> {
        loop {
            while !self.ended && conn.wbuf.len() < WRITE_BATCH {
                match Pin::new(&mut self.body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => self.encode(&mut conn.wbuf, frame),
                    Poll::Ready(Some(Err(e))) => {
                        return Poll::Ready(Err(UploadError::Body(io::Error::other(e))));
                    }
                    Poll::Ready(None) => self.end(&mut conn.wbuf, None),
                    Poll::Pending => break,
                }
                if !self.ended && self.body.is_end_stream() {
                    self.end(&mut conn.wbuf, None);
                }
            }
            if conn.wbuf.is_empty() {
                if self.ended {
                    self.done = true;
                    return Poll::Ready(Ok(()));
                }
                return Poll::Pending;
            }
            std::task::ready!(conn.poll_drain(cx, &mut self.pos)).map_err(UploadError::Write)?;
            if self.ended {
                self.done = true;
                return Poll::Ready(Ok(()));
            }
        }
    }

    fn encode(&mut self, wbuf: &mut Vec<u8>, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) => {
                if data.is_empty() {
                    return;
                }
                if self.out == Out::Chunked {
                    wbuf.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
                    wbuf.extend_from_slice(&data);
                    wbuf.extend_from_slice(b"\r\n");
                } else {
                    wbuf.extend_from_slice(&data);
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    self.end(wbuf, Some(trailers));
                }
            }
        }
    }

    fn end(&mut self, wbuf: &mut Vec<u8>, trailers: Option<HeaderMap>) {
        if self.ended {
            return;
        }
        self.ended = true;
        if self.out == Out::Chunked {
            wbuf.extend_from_slice(b"0\r\n");
            for (name, value) in trailers.iter().flatten() {
                write_field(wbuf, name, value);
            }
            wbuf.extend_from_slice(b"\r\n");
        }
    }
}

pub(crate) fn write_field(wbuf: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    wbuf.extend_from_slice(name.as_str().as_bytes());
    wbuf.extend_from_slice(b": ");
    wbuf.extend_from_slice(value.as_bytes());
    wbuf.extend_from_slice(b"\r\n");
}

/// Methods whose request means something with a body, so an empty one is declared.
fn declares_empty_body(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PUT || *method == Method::PATCH
}

/// Writes the request head into the connection's write buffer and says how the body
/// goes out after it.
fn encode_head(wbuf: &mut Vec<u8>, head: &RequestHead<'_>, body: &RequestBody) -> (Out, bool) {
    let fields = &head.fields;
    let pq = head.uri.path_and_query().map_or("/", |p| p.as_str());
    wbuf.extend_from_slice(head.method.as_str().as_bytes());
    wbuf.push(b' ');
    wbuf.extend_from_slice(if pq.is_empty() { b"/" } else { pq.as_bytes() });
    wbuf.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in head.headers {
        if !fields.names(name) {
            write_field(wbuf, name, value);
        }
    }
    for (name, value) in fields.iter() {
        write_field(wbuf, name, value);
    }
    let has_length = head.headers.contains_key(CONTENT_LENGTH);
    let (out, empty) = if body.is_end_stream() {
        if !has_length && declares_empty_body(head.method) {
            wbuf.extend_from_slice(b"content-length: 0\r\n");
        }
        (Out::Length, true)
    } else if has_length {
        (Out::Length, false)
    } else if let Some(n) = body.size_hint().exact() {
        wbuf.extend_from_slice(b"content-length: ");
        wbuf.extend_from_slice(n.to_string().as_bytes());
        wbuf.extend_from_slice(b"\r\n");
        (Out::Length, false)
    } else {
        wbuf.extend_from_slice(b"transfer-encoding: chunked\r\n");
        (Out::Chunked, false)
    };
    wbuf.extend_from_slice(b"\r\n");
    (out, empty)
}

/// Sends `req` on the leased connection and reads the response head. The response's
/// body holds the lease and releases it once read to its end (and once the request
/// body has gone out in full); dropped before, it closes the connection.
pub async fn send(
    mut lease: Lease,
    head: &RequestHead<'_>,
    body: RequestBody,
) -> io::Result<Response<Body1>> {
    let conn = lease.conn();
    let (out, empty) = encode_head(&mut conn.wbuf, head, &body);
    let mut upload = Upload {
        body,
        out,
        pos: 0,
        ended: empty,
        done: false,
    };
    // The request goes out while the response is awaited: an endpoint may answer
    // before it has read the whole body (and some never read it).
    let mut upload_failed = false;
    let head = std::future::poll_fn(|cx| {
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
        read_head(conn, cx, *head.method == Method::HEAD)
    })
    .await?;
    let upload = if upload.done || upload_failed {
        None
    } else {
        Some(Box::new(upload))
    };
    let mut body = Body1 {
        lease: Some(lease),
        fields: head.fields,
        framing: head.framing,
        reuse: head.reuse && !upload_failed,
        upload,
        broken: None,
    };
    body.finish_if_done();
    let mut resp = Response::new(body);
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    Ok(resp)
}

/// How the response body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// This many bytes still to come.
    Length(u64),
    Chunked(Chunk),
    /// Until the endpoint closes the connection.
    Eof,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
}

struct Head {
    status: StatusCode,
    version: Version,
    fields: RawFields,
    framing: Framing,
    reuse: bool,
}

/// The fields of an HTTP/1.1 response head as they came, minus the hop-by-hop ones
/// and `x-tollgate-attempts` (each hop writes its own). They go back to an HTTP/1.1
/// app line by line from the head itself: no header map is built and torn down for
/// the few fields tollgate reads.
#[derive(Clone, Debug)]
pub struct RawFields {
    head: Bytes,
    /// Per field: where its name starts and ends, where its value starts and ends.
    lines: Vec<[u32; 4]>,
    has_length: bool,
    has_date: bool,
}

impl RawFields {
    /// The value of the first field called `name` (lowercase, as `HeaderName`s are).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.len() == name.len() && n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Every field, as name and value.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines.iter().map(|&[ns, ne, vs, ve]| {
            (
                &self.head[ns as usize..ne as usize],
                &self.head[vs as usize..ve as usize],
            )
        })
    }

    /// Writes every field as a line of an HTTP/1.1 head (without `Content-Length`
    /// when `length` is false).
    pub fn write_to(&self, wbuf: &mut Vec<u8>, length: bool) {
        for &[ns, ne, _, ve] in &self.lines {
            let line = &self.head[ns as usize..ve as usize];
            if !length && field_kind(&line[..(ne - ns) as usize]) == FieldKind::ContentLength {
                continue;
            }
            wbuf.extend_from_slice(line);
            wbuf.extend_from_slice(b"\r\n");
        }
    }

    /// Whether the fields include `Content-Length` and `Date`.
    pub fn has_length(&self) -> bool {
        self.has_length
    }

    pub fn has_date(&self) -> bool {
        self.has_date
    }

    /// Adds the fields to a header map (for an HTTP/2 app).
    pub fn append_to(&self, map: &mut HeaderMap) {
        map.reserve(self.lines.len());
        for &[ns, ne, vs, ve] in &self.lines {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&self.head[ns as usize..ne as usize]),
                HeaderValue::from_maybe_shared(self.head.slice(vs as usize..ve as usize)),
            ) {
                map.append(name, value);
            }
        }
    }
}

/// What a response field is to the reader of the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FieldKind {
    ContentLength,
    TransferEncoding,
    Connection,
    /// Another hop-by-hop field (RFC 9110 section 7.6.1), or `TE`.
    HopByHop,
    /// `x-tollgate-attempts`: replaced by this hop's own.
    Attempts,
    Date,
    Other,
}

/// Classifies a field name as it came (any case), by length first.
fn field_kind(name: &[u8]) -> FieldKind {
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    match name.len() {
        2 if is("te") => FieldKind::HopByHop,
        4 if is("date") => FieldKind::Date,
        7 if is("trailer") || is("upgrade") => FieldKind::HopByHop,
        10 if is("connection") => FieldKind::Connection,
        10 if is("keep-alive") => FieldKind::HopByHop,
        14 if is("content-length") => FieldKind::ContentLength,
        16 if is("proxy-connection") => FieldKind::HopByHop,
        17 if is("transfer-encoding") => FieldKind::TransferEncoding,
        18 if is("proxy-authenticate") => FieldKind::HopByHop,
        19 if is("proxy-authorization") => FieldKind::HopByHop,
        19 if is("x-tollgate-attempts") => FieldKind::Attempts,
        _ => FieldKind::Other,
    }
}

pub(crate) fn bad(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Reads until a final response head is in, skipping interim (1xx) responses.
fn read_head(
    conn: &mut Connection,
    cx: &mut Context<'_>,
    head_request: bool,
) -> Poll<io::Result<Head>> {
    loop {
        if !conn.rbuf.is_empty() {
            match parse_head(&mut conn.rbuf, head_request)? {
                Some(Some(head)) => return Poll::Ready(Ok(head)),
                // An interim response, consumed: look for the next.
                Some(None) => continue,
                None if conn.rbuf.len() > MAX_HEAD => {
                    return Poll::Ready(Err(bad("response head too large")));
                }
                None => {}
            }
        }
        let n = std::task::ready!(conn.poll_fill(cx, READ_CHUNK))?;
        if n == 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                if conn.rbuf.is_empty() {
                    "connection closed before a response"
                } else {
                    "connection closed within the response head"
                },
            )));
        }
    }
}

/// Parses a response head at the front of `rbuf` and takes it off: `None` while it is
/// incomplete, `Some(None)` for an interim response.
fn parse_head(rbuf: &mut BytesMut, head_request: bool) -> io::Result<Option<Option<Head>>> {
    // Uninitialised: clearing room for every possible field on each response would
    // cost more than parsing the ones there are.
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        rbuf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(bad("too many response header fields")),
        Err(_) => return Err(bad("malformed response head")),
    };
    let code = res.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| bad("invalid response status"))?;
    if status.is_informational() && code != 101 {
        rbuf.advance(len);
        return Ok(Some(None));
    }
    let version = if res.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let count = res.headers.len();
    let (mut few, mut many) = ([(0, 0, 0, 0); FEW_HEADERS], Vec::new());
    let spans = field_spans(rbuf, res.headers, &mut few, &mut many);
    // The fields stay in the head, not copied. The read buffer is shared with it until
    // the response has gone back to the app, which is before this connection reads
    // again, so the buffer is then reused as it is.
    let head = rbuf.split_to(len).freeze();
    let mut lines = Vec::with_capacity(count);
    let mut reuse = version == Version::HTTP_11;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut coded = false;
    let mut has_date = false;
    // `Connection` values naming fields of their own: those fields go too.
    let mut named: Vec<(usize, usize)> = Vec::new();
    for &(ns, nl, vs, vl) in spans.iter() {
        let name = &head[ns..ns + nl];
        let value = &head[vs..vs + vl];
        match field_kind(name) {
            FieldKind::ContentLength => {
                let v = content_length(value.trim_ascii())
                    .ok_or_else(|| bad("invalid Content-Length"))?;
                if length.is_some_and(|l| l != v) {
                    return Err(bad("conflicting Content-Length"));
                }
                length = Some(v);
            }
            FieldKind::TransferEncoding => {
                coded = true;
                chunked = value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                continue;
            }
            FieldKind::Connection => {
                if has_token(value, b"close") {
                    reuse = false;
                }
                if names_others(value) {
                    named.push((vs, vl));
                }
                continue;
            }
            FieldKind::HopByHop | FieldKind::Attempts => continue,
            FieldKind::Date => has_date = true,
            FieldKind::Other => {}
        }
        let at = |i: usize| u32::try_from(i).map_err(|_| bad("response head too large"));
        lines.push([at(ns)?, at(ns + nl)?, at(vs)?, at(vs + vl)?]);
    }
    if coded && length.is_some() {
        // Transfer-Encoding wins; the stale length is not passed on.
        lines.retain(|&[ns, ne, _, _]| {
            field_kind(&head[ns as usize..ne as usize]) != FieldKind::ContentLength
        });
    }
    for &(vs, vl) in &named {
        let value = &head[vs..vs + vl];
        lines.retain(|&[ns, ne, _, _]| {
            let name = &head[ns as usize..ne as usize];
            !value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(name))
        });
    }
    let has_length = length.is_some() && !coded;
    let fields = RawFields {
        head,
        lines,
        has_length,
        has_date,
    };
    let no_body = head_request || status.is_informational() || code == 204 || code == 304;
    let framing = if no_body {
        Framing::Length(0)
    } else if coded {
        // Both framings at once: Transfer-Encoding wins, and the connection is not
        // trusted with another request.
        if length.is_some() {
            reuse = false;
        }
        if chunked {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::Eof
        }
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::Eof
    };
    // A body that runs to the close, or a switch to another protocol, ends the
    // connection's use for HTTP.
    if framing == Framing::Eof || code == 101 {
        reuse = false;
    }
    Ok(Some(Some(Head {
        status,
        version,
        fields,
        framing,
        reuse,
    })))
}

/// A `Content-Length` value: digits only (no sign, no spaces inside, no hex).
pub(crate) fn content_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

pub(crate) fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// The response body, read from the connection as the app's side asks for it.
pub struct Body1 {
    lease: Option<Lease>,
    /// The response head's fields (the response's header map is left empty).
    fields: RawFields,
    framing: Framing,
    reuse: bool,
    /// The request body, still going out (rarely: boxed).
    upload: Option<Box<Upload>>,
    /// The body broke; reported on the next poll, so that what arrived before the
    /// break is flushed to the app first.
    broken: Option<io::Error>,
}

impl Body1 {
    pub fn fields(&self) -> &RawFields {
        &self.fields
    }

    fn ended(&self) -> bool {
        self.framing == Framing::Length(0)
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
            match up.poll(conn, cx) {
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

/// What the next step of reading a response body found in the buffer.
pub(crate) enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    End,
    /// The buffer holds too little: read more.
    More,
}

/// Takes the next piece of a message body off the front of `rbuf`, moving `framing`
/// on. `eof`: the endpoint has closed the connection, so nothing more will come (and
/// `More` is never the answer).
pub(crate) fn step(rbuf: &mut BytesMut, framing: &mut Framing, eof: bool) -> io::Result<Step> {
    loop {
        match *framing {
            Framing::Length(0) => return Ok(Step::End),
            Framing::Length(left) => {
                if !rbuf.is_empty() {
                    let n = (rbuf.len() as u64).min(left) as usize;
                    *framing = Framing::Length(left - n as u64);
                    return Ok(Step::Data(take(rbuf, n)));
                }
                if eof {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed within the body",
                    ));
                }
                return Ok(Step::More);
            }
            Framing::Eof => {
                if !rbuf.is_empty() {
                    let n = rbuf.len();
                    return Ok(Step::Data(take(rbuf, n)));
                }
                if eof {
                    *framing = Framing::Length(0);
                    return Ok(Step::End);
                }
                return Ok(Step::More);
            }
            Framing::Chunked(state) => match decode_chunk(rbuf, state)? {
                Decoded::Data(data, next) => {
                    *framing = Framing::Chunked(next);
                    return Ok(Step::Data(data));
                }
                Decoded::Next(next) => *framing = Framing::Chunked(next),
                Decoded::End(trailers) => {
                    *framing = Framing::Length(0);
                    return Ok(trailers.map_or(Step::End, Step::Trailers));
                }
                Decoded::More => {
                    if rbuf.len() > MAX_HEAD {
                        return Err(bad("chunk header or trailers too large"));
                    }
                    if eof {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed within the chunked body",
                        ));
                    }
                    return Ok(Step::More);
                }
            },
        }
    }
}

/// A whole response as the connection would read it, from `pieces` arriving one after
/// another and then the endpoint closing: the same parser and framing as the real
/// thing, without a socket (for tests and fuzzing).
#[derive(Debug, PartialEq)]
pub struct Parsed {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: Option<HeaderMap>,
    /// The connection could carry another request afterwards.
    pub reusable: bool,
}

pub fn parse_response(pieces: &[&[u8]], head_request: bool) -> io::Result<Parsed> {
    let mut rbuf = BytesMut::new();
    let mut pieces = pieces.iter();
    let mut eof = false;
    let fill = |rbuf: &mut BytesMut, eof: &mut bool, pieces: &mut std::slice::Iter<'_, &[u8]>| {
        match pieces.next() {
            Some(p) => rbuf.extend_from_slice(p),
            None => *eof = true,
        }
    };
    let head = loop {
        match parse_head(&mut rbuf, head_request)? {
            Some(Some(head)) => break head,
            Some(None) => continue,
            None if rbuf.len() > MAX_HEAD => return Err(bad("response head too large")),
            None if eof => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed within the response head",
                ));
            }
            None => fill(&mut rbuf, &mut eof, &mut pieces),
        }
    };
    let mut framing = head.framing;
    let mut body = Vec::new();
    let mut trailers = None;
    loop {
        match step(&mut rbuf, &mut framing, eof)? {
            Step::Data(d) => body.extend_from_slice(&d),
            Step::Trailers(t) => trailers = Some(t),
            Step::End => break,
            Step::More => fill(&mut rbuf, &mut eof, &mut pieces),
        }
    }
    // Bytes after the response: not reused (a pooled connection with unasked bytes is
    // dropped before its next request).
    let reusable = head.reuse && rbuf.is_empty() && pieces.all(|p| p.is_empty());
    Ok(Parsed {
        status: head.status,
        headers: {
            let mut map = HeaderMap::new();
            head.fields.append_to(&mut map);
            map
        },
        body,
        trailers,
        reusable,
    })
}

/// Takes `n` bytes off the front of the read buffer, without a copy.
fn take(rbuf: &mut BytesMut, n: usize) -> Bytes {
    rbuf.split_to(n).freeze()
}

enum Decoded {
    Data(Bytes, Chunk),
    Next(Chunk),
    End(Option<HeaderMap>),
    More,
}

/// One step of the chunked decoder on what the buffer holds.
fn decode_chunk(rbuf: &mut BytesMut, state: Chunk) -> io::Result<Decoded> {
    match state {
        Chunk::Size => {
            let Some(eol) = rbuf.windows(2).position(|w| w == b"\r\n") else {
                return Ok(Decoded::More);
            };
            let line = &rbuf[..eol];
            let digits = line
                .iter()
                .position(|&b| b == b';' || b == b' ' || b == b'\t')
                .map_or(line, |i| &line[..i]);
            if digits.is_empty() || digits.len() > 15 {
                return Err(bad("invalid chunk size"));
            }
            let mut size = 0u64;
            for &d in digits {
                let v = match d {
                    b'0'..=b'9' => d - b'0',
                    b'a'..=b'f' => d - b'a' + 10,
                    b'A'..=b'F' => d - b'A' + 10,
                    _ => return Err(bad("invalid chunk size")),
                };
                size = size * 16 + u64::from(v);
            }
            rbuf.advance(eol + 2);
            Ok(Decoded::Next(if size == 0 {
                Chunk::Trailers
            } else {
                Chunk::Data(size)
            }))
        }
        Chunk::Data(left) => {
            if rbuf.is_empty() {
                return Ok(Decoded::More);
            }
            let n = (rbuf.len() as u64).min(left) as usize;
            let data = take(rbuf, n);
            let next = if n as u64 == left {
                Chunk::DataEnd
            } else {
                Chunk::Data(left - n as u64)
            };
            Ok(Decoded::Data(data, next))
        }
        Chunk::DataEnd => {
            if rbuf.len() < 2 {
                return Ok(Decoded::More);
            }
            if &rbuf[..2] != b"\r\n" {
                return Err(bad("chunk data not followed by CRLF"));
            }
            rbuf.advance(2);
            Ok(Decoded::Next(Chunk::Size))
        }
        Chunk::Trailers => {
            if rbuf.starts_with(b"\r\n") {
                rbuf.advance(2);
                return Ok(Decoded::End(None));
            }
            let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let (len, trailers) = match httparse::parse_headers(rbuf, &mut fields) {
                Ok(httparse::Status::Complete((len, fields))) => {
                    let mut map = HeaderMap::with_capacity(fields.len());
                    for f in fields {
                        if let (Ok(name), Ok(value)) = (
                            HeaderName::from_bytes(f.name.as_bytes()),
                            HeaderValue::from_bytes(f.value),
                        ) {
                            map.append(name, value);
                        }
                    }
                    (len, map)
                }
                Ok(httparse::Status::Partial) => return Ok(Decoded::More),
                Err(_) => return Err(bad("malformed trailers")),
            };
            rbuf.advance(len);
            Ok(Decoded::End((!trailers.is_empty()).then_some(trailers)))
        }
    }
}

impl Body for Body1 {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
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

    fn is_end_stream(&self) -> bool {
        self.ended() || (self.lease.is_none() && self.broken.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    /// `input` cut at the given points (taken modulo its length, in order).
    pub(crate) fn cut<'a>(input: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
        let mut at: Vec<usize> = points.iter().map(|p| p % (input.len() + 1)).collect();
        at.sort_unstable();
        let mut pieces = Vec::new();
        let mut from = 0;
        for p in at {
            pieces.push(&input[from..p]);
            from = p;
        }
        pieces.push(&input[from..]);
        pieces
    }

    fn whole(input: &[u8]) -> io::Result<Parsed> {
        parse_response(&[input], false)
    }

    #[test]
    fn framing_decides_reuse() {
        let ok = whole(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        assert_eq!((ok.body.as_slice(), ok.reusable), (&b"ok"[..], true));
        for (input, why) in [
            (&b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"[..], "close"),
            (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "HTTP/1.0"),
            (b"HTTP/1.1 200 OK\r\n\r\nok", "ends at the close"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", "bytes after it"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                "both framings",
            ),
        ] {
            let r = whole(input).unwrap();
            assert_eq!(&r.body[..2], b"ok", "{why}");
            assert!(!r.reusable, "{why}");
        }
    }

    #[test]
    fn bodiless_responses_and_interim_ones() {
        let head =
            parse_response(&[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"], true).unwrap();
        assert_eq!((head.body.len(), head.reusable), (0, true));
        assert_eq!(
            head.headers["content-length"], "5",
            "HEAD keeps the length it would have"
        );
        for status in ["204 No Content", "304 Not Modified"] {
            let r = whole(format!("HTTP/1.1 {status}\r\nContent-Length: 5\r\n\r\n").as_bytes())
                .unwrap();
            assert_eq!((r.body.len(), r.reusable), (0, true), "{status}");
        }
        let r = whole(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n").unwrap();
        assert_eq!(r.status, StatusCode::CREATED);
        assert!(!r.headers.contains_key("link"));
    }

    #[test]
    fn hop_by_hop_fields_are_dropped_as_the_head_is_read() {
        let r = whole(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, x-secret\r\nKeep-Alive: timeout=5\r\n\
              X-Secret: 1\r\nX-Kept: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        )
        .unwrap();
        for gone in ["connection", "keep-alive", "x-secret", "transfer-encoding"] {
            assert!(!r.headers.contains_key(gone), "{gone}");
        }
        assert_eq!(r.headers["x-kept"], "2");

        // Both framings: chunked wins and the stale length is not passed on.
        let r = whole(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, b"hello");
        assert!(!r.headers.contains_key("content-length"));
        assert!(!r.reusable);
    }

    #[test]
    fn broken_responses_are_errors_not_short_bodies() {
        for input in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nok",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokX\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Len",
            b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
            b"",
        ] {
            assert!(whole(input).is_err(), "{}", String::from_utf8_lossy(input));
        }
    }

    /// A chunked encoding of `body` in chunks of the given sizes (0 sizes skipped).
    fn chunked(body: &[u8], sizes: &[usize], ext: bool, trailers: &[(String, String)]) -> Vec<u8> {
        let mut out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        out.extend_from_slice(&chunked_body(body, sizes, ext, trailers));
        out
    }

    /// `body` in chunks of the given sizes (repeated as needed), with an extension on
    /// each chunk-size line if `ext`, then the trailers.
    pub(crate) fn chunked_body(
        body: &[u8],
        sizes: &[usize],
        ext: bool,
        trailers: &[(String, String)],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = body;
        let mut sizes = sizes.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap()).clamp(1, rest.len());
            out.extend_from_slice(format!("{n:X}").as_bytes());
            if ext {
                out.extend_from_slice(b";name=\"v\"");
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(&rest[..n]);
            out.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        out.extend_from_slice(b"0\r\n");
        for (k, v) in trailers {
            out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        out
    }

    proptest! {
        /// Whatever the chunk sizes, extensions, trailers, and wherever the reads fall,
        /// a chunked body comes out byte for byte, trailers with it, and the connection
        /// is reusable.
        #[test]
        fn chunked_bodies_survive_any_chunking_and_any_reads(
            body in prop::collection::vec(any::<u8>(), 0..3000),
            sizes in prop::collection::vec(1usize..700, 1..8),
            ext in any::<bool>(),
            trailers in prop::collection::vec(("x-[a-z]{1,8}", "[a-zA-Z0-9 ]{0,12}"), 0..3),
            points in prop::collection::vec(any::<usize>(), 0..40),
        ) {
            let input = chunked(&body, &sizes, ext, &trailers);
            let r = parse_response(&cut(&input, &points), false).unwrap();
            prop_assert_eq!(&r.body, &body);
            prop_assert!(r.reusable);
            match r.trailers {
                None => prop_assert!(trailers.is_empty()),
                Some(t) => {
                    for (k, v) in &trailers {
                        prop_assert!(t.get_all(k.as_str()).iter().any(|x| x.as_bytes() == v.trim().as_bytes()));
                    }
                }
            }
        }

        /// Any bytes, read in any pieces: no panic, and the answer does not depend on
        /// where the reads fell.
        #[test]
        fn any_input_in_any_pieces_reads_the_same(
            input in prop::collection::vec(any::<u8>(), 0..600),
            prefix in prop::sample::select(vec![
                &b""[..],
                b"HTTP/1.1 200 OK\r\n",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
            ]),
            points in prop::collection::vec(any::<usize>(), 0..20),
            head_request in any::<bool>(),
        ) {
            let input = [prefix, &input[..]].concat();
            let one = parse_response(&[&input], head_request);
            let many = parse_response(&cut(&input, &points), head_request);
            match (&one, &many) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                _ => prop_assert!(false, "{:?} read whole, {:?} in pieces", one, many),
            }
            if let Ok(r) = one {
                prop_assert!(r.body.len() <= input.len());
            }
        }
    }
}
