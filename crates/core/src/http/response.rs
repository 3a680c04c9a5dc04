//! Reading a response head (the client's role). The head is parsed in place
//! (`httparse`) and its fields stay in the bytes they came in ([`RawFields`]): a proxy
//! reads a few of them and passes the rest on as they are. Framing follows RFC 9112
//! section 6: a response to HEAD, a 1xx, 204 or 304 has no body; Transfer-Encoding
//! wins over Content-Length, and a connection whose framing was in any way doubtful
//! (both, a coding other than chunked last, no length at all, `Connection: close`,
//! HTTP/1.0, a protocol switch) is not reused. Interim responses are skipped. A `101`
//! keeps its `Upgrade` field: the client must see which protocol it switched to.
//!
//! `Content-Length` is read as the request reader reads it ([`fold_content_length`]:
//! `3, 3` and two lines of `3` are the length 3, values that differ or exceed
//! `i64::MAX` are refused) and is not kept among the fields: the writer writes the one
//! normalised value. So no `Connection` naming it can take the length away from a body
//! that is still framed by it.

use std::io;
use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};

use super::bad;
use super::encode::write_content_length;
use super::fields::{
    FEW_HEADERS, LengthProblem, Span, field_spans, fold_content_length, has_token, is_token,
    names_others,
};
use super::framing::{Chunk, Framing, Step, step};
use super::spare;

/// The largest response head accepted: a head is limited by its size, not by a count
/// of fields. A larger one is [`HeadTooLarge`].
pub const MAX_HEAD: usize = 64 * 1024;
/// Header fields a response head is parsed with at first, in place; one with more is
/// parsed again with room for as many as it has (rare: no allocation otherwise).
const FEW_FIELDS: usize = 128;

/// A response head larger than [`MAX_HEAD`]: the answer cannot be passed on, and
/// asking again would get the same (not retried).
#[derive(Debug, thiserror::Error)]
#[error("response head larger than 64 KiB")]
pub struct HeadTooLarge;

fn too_large() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, HeadTooLarge)
}

/// Whether `e`, or an error in its chain of sources, is [`HeadTooLarge`], or an
/// HTTP/2 upstream's response head refused here: the stream reset by tollgate's own
/// HTTP/2 stack with `PROTOCOL_ERROR` before a head came (larger than the limit, or
/// malformed). Either way the same request would get the same head again.
pub fn is_head_too_large(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(e) = at {
        if e.is::<HeadTooLarge>()
            || e.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .is_some_and(|inner| inner.is::<HeadTooLarge>())
            || e.downcast_ref::<h2::Error>().is_some_and(|h| {
                h.is_library() && h.is_reset() && h.reason() == Some(h2::Reason::PROTOCOL_ERROR)
            })
        {
            return true;
        }
        at = e.source();
    }
    false
}

/// A final response head as read: its fields stay in the bytes they came in.
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    pub fields: RawFields,
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub reuse: bool,
}

/// The fields of an HTTP/1.1 response head as they came, minus the hop-by-hop ones and
/// `Content-Length`, which is kept as its value. They go on to an HTTP/1.1 peer line by
/// line from the head itself: no header map is built and torn down for the few fields a
/// proxy reads.
#[derive(Clone, Debug)]
pub struct RawFields {
    head: Bytes,
    /// Per field: where its name starts and ends, where its value starts and ends.
    lines: Vec<[u32; 4]>,
    /// The declared `Content-Length`, when it frames the response (no
    /// `Transfer-Encoding`).
    length: Option<u64>,
    has_date: bool,
    /// The lengths of the names present, a bit each ([`length_bit`]): most fields
    /// asked for are not there, and this says so without a look at any line.
    lengths: u64,
}

/// The bit of a field name's length in [`RawFields`]' `lengths`: lengths that differ
/// by a multiple of 64 share one (a shared bit only sends a look to the lines).
#[inline]
fn length_bit(len: usize) -> u64 {
    1u64.wrapping_shl(len as u32)
}

impl Drop for RawFields {
    fn drop(&mut self) {
        spare::give_lines(std::mem::take(&mut self.lines));
    }
}

impl RawFields {
    /// The value of the first field called `name` (lowercase, as `HeaderName`s are).
    #[inline]
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        if self.lengths & length_bit(name.len()) == 0 {
            return None;
        }
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

    /// Writes every field as a line of an HTTP/1.1 head, except the fields `replaced`
    /// names (the writer adds its own), then the `Content-Length` unless `length` is
    /// false. Lines that follow one another in the head as they are written go in one
    /// copy.
    pub fn write_to(&self, wbuf: &mut Vec<u8>, length: bool, replaced: impl Fn(&[u8]) -> bool) {
        // The lines not yet written: from `run` to `end` in the head.
        let (mut run, mut end) = (0, 0);
        for &[ns, ne, _, ve] in &self.lines {
            let (ns, ve) = (ns as usize, ve as usize);
            if replaced(&self.head[ns..ne as usize]) {
                continue;
            }
            if ns != end {
                wbuf.extend_from_slice(&self.head[run..end]);
                run = ns;
            }
            if self.head.get(ve..ve + 2) == Some(b"\r\n") {
                end = ve + 2;
            } else {
                // A line that ended otherwise (a bare LF, or blanks after the value):
                // written up to its value, with a CRLF.
                wbuf.extend_from_slice(&self.head[run..ve]);
                wbuf.extend_from_slice(b"\r\n");
                (run, end) = (0, 0);
            }
        }
        wbuf.extend_from_slice(&self.head[run..end]);
        if let Some(n) = self.length.filter(|_| length) {
            write_content_length(wbuf, n);
        }
    }

    /// Whether the fields include `Content-Length` and `Date`.
    pub fn has_length(&self) -> bool {
        self.length.is_some()
    }

    pub fn has_date(&self) -> bool {
        self.has_date
    }

    /// Adds the fields to a header map (for an HTTP/2 app).
    pub fn append_to(&self, map: &mut HeaderMap) {
        map.reserve(self.lines.len() + 1);
        for &[ns, ne, vs, ve] in &self.lines {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(&self.head[ns as usize..ne as usize]),
                HeaderValue::from_maybe_shared(self.head.slice(vs as usize..ve as usize)),
            ) {
                map.append(name, value);
            }
        }
        if let Some(n) = self.length {
            map.append(http::header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
}

/// The fields of a response head, wherever they are kept: an HTTP/1.1 response's in
/// its head as they came ([`RawFields`]), an HTTP/2 one's in its map. Fields in the
/// map come first.
#[derive(Clone, Copy, Debug)]
pub struct Fields<'a> {
    map: &'a HeaderMap,
    raw: Option<&'a RawFields>,
}

impl<'a> Fields<'a> {
    /// The fields in `map`, then those in `raw`.
    pub fn new(map: &'a HeaderMap, raw: Option<&'a RawFields>) -> Self {
        Fields { map, raw }
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

/// What a response field is to the reader of the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FieldKind {
    ContentLength,
    TransferEncoding,
    Connection,
    /// Another hop-by-hop field (RFC 9110 section 7.6.1), or `TE`.
    HopByHop,
    Date,
    Other,
}

/// Classifies a field name as it came (any case), by length first.
fn field_kind(name: &[u8]) -> FieldKind {
    let is = |n: &str| is_token(name, n.as_bytes());
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
        _ => FieldKind::Other,
    }
}

/// A response head taken off the buffer.
pub enum Parsed {
    /// An interim response (1xx but 101), consumed: its status.
    Interim(StatusCode),
    Final(ResponseHead),
}

/// Parses a response head at the front of `rbuf` and takes it off: `None` while it is
/// incomplete.
pub fn parse_response_head(rbuf: &mut BytesMut, head_request: bool) -> io::Result<Option<Parsed>> {
    match parse_with(rbuf, head_request, None) {
        Err(Unparsed::Many) => parse_many(rbuf, head_request),
        Err(Unparsed::Error(e)) => Err(e),
        Ok(parsed) => Ok(parsed),
    }
}

/// Why [`parse_with`] gave no head.
enum Unparsed {
    /// More fields than it had room for.
    Many,
    Error(io::Error),
}

impl From<io::Error> for Unparsed {
    fn from(e: io::Error) -> Self {
        Unparsed::Error(e)
    }
}

/// A head of more than [`FEW_FIELDS`] fields, parsed with room for every line the
/// head can hold (it is no larger than [`MAX_HEAD`]).
#[cold]
#[inline(never)]
fn parse_many(rbuf: &mut BytesMut, head_request: bool) -> io::Result<Option<Parsed>> {
    let within = &rbuf[..rbuf.len().min(MAX_HEAD)];
    let lines = within.iter().filter(|&&b| b == b'\n').count() + 1;
    match parse_with(rbuf, head_request, Some(lines)) {
        Ok(parsed) => Ok(parsed),
        Err(Unparsed::Many) => Err(too_large()),
        Err(Unparsed::Error(e)) => Err(e),
    }
}

/// Parses with room for [`FEW_FIELDS`] fields in place, or for `lines` on the heap.
#[inline(always)]
fn parse_with(
    rbuf: &mut BytesMut,
    head_request: bool,
    lines: Option<usize>,
) -> Result<Option<Parsed>, Unparsed> {
    // Uninitialised: clearing room for every possible field on each response would
    // cost more than parsing the ones there are.
    let mut few = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; FEW_FIELDS];
    let mut many = Vec::new();
    let fields = match lines {
        None => &mut few[..],
        Some(n) => {
            many.resize_with(n, MaybeUninit::<httparse::Header<'_>>::uninit);
            &mut many[..]
        }
    };
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, rbuf, fields)
    {
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
            return Err(Unparsed::Error(too_large()));
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if rbuf.len() > MAX_HEAD => {
            return Err(Unparsed::Error(too_large()));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(Unparsed::Many),
        Err(_) => return Err(Unparsed::Error(bad("malformed response head"))),
    };
    let code = res.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| bad("invalid response status"))?;
    if status.is_informational() && code != 101 {
        rbuf.advance(len);
        return Ok(Some(Parsed::Interim(status)));
    }
    let version = if res.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let (mut few, mut many) = ([[0; 4]; FEW_HEADERS], Vec::new());
    let spans = field_spans(rbuf, res.headers, &mut few, &mut many);
    // The fields stay in the head, not copied. The read buffer is shared with it until
    // the response has gone back to the app, which is before this connection reads
    // again, so the buffer is then reused as it is.
    let head = rbuf.split_to(len).freeze();
    let read = read_fields(&head, spans, code == 101)?;
    let length = read.length;
    let coded = read.coded;
    let mut reuse = version == Version::HTTP_11 && !read.close;
    let fields = RawFields {
        head,
        lines: read.lines,
        length: length.filter(|_| !coded),
        has_date: read.has_date,
        lengths: read.lengths,
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
        if read.chunked {
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
    Ok(Some(Parsed::Final(ResponseHead {
        status,
        version,
        fields,
        framing,
        reuse,
    })))
}

/// What the fields of a response head say, and which of them pass on.
struct ReadFields {
    /// The fields that pass on: where each name and value starts and ends in the head.
    lines: Vec<[u32; 4]>,
    length: Option<u64>,
    /// `Transfer-Encoding` is present; `chunked` is its last coding.
    coded: bool,
    chunked: bool,
    has_date: bool,
    /// The lengths of the names in `lines` ([`length_bit`]).
    lengths: u64,
    /// `Connection: close`.
    close: bool,
}

/// Reads the fields of a response head: framing and `Connection` are noted and not
/// passed on (the length is passed on as its value), nor is any other hop-by-hop field
/// or one a `Connection` names, but for the `Upgrade` of a protocol switch
/// (`switching`), which the client must see.
fn read_fields(head: &Bytes, spans: &[Span], switching: bool) -> io::Result<ReadFields> {
    let mut read = ReadFields {
        lines: spare::lines(spans.len()),
        length: None,
        coded: false,
        chunked: false,
        has_date: false,
        lengths: 0,
        close: false,
    };
    // `Connection` values naming fields of their own: those fields go too.
    let mut named: Vec<(usize, usize)> = Vec::new();
    for &span in spans {
        let [ns, ne, vs, ve] = span.map(|i| i as usize);
        let name = &head[ns..ne];
        let value = &head[vs..ve];
        match field_kind(name) {
            FieldKind::ContentLength => {
                read.length = Some(fold_content_length(read.length, value).map_err(|p| {
                    bad(match p {
                        LengthProblem::Invalid => "invalid Content-Length",
                        LengthProblem::Conflicting => "conflicting Content-Length",
                    })
                })?);
                continue;
            }
            FieldKind::TransferEncoding => {
                read.coded = true;
                read.chunked = value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                continue;
            }
            // The usual value, told at once.
            FieldKind::Connection if is_token(value, b"keep-alive") => continue,
            FieldKind::Connection => {
                read.close |= has_token(value, b"close");
                if names_others(value) {
                    named.push((vs, ve));
                }
                continue;
            }
            FieldKind::HopByHop if switching && name.eq_ignore_ascii_case(b"upgrade") => {}
            FieldKind::HopByHop => continue,
            FieldKind::Date => read.has_date = true,
            FieldKind::Other => {}
        }
        read.lengths |= length_bit(name.len());
        read.lines.push(span);
    }
    for &(vs, ve) in &named {
        let value = &head[vs..ve];
        read.lines.retain(|&[ns, ne, _, _]| {
            let name = &head[ns as usize..ne as usize];
            (switching && name.eq_ignore_ascii_case(b"upgrade"))
                || !value
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(name))
        });
    }
    if !named.is_empty() {
        read.has_date = read
            .lines
            .iter()
            .any(|&[ns, ne, _, _]| field_kind(&head[ns as usize..ne as usize]) == FieldKind::Date);
    }
    Ok(read)
}

/// A whole response as the connection would read it, from `pieces` arriving one after
/// another and then the endpoint closing: the same parser and framing as the real
/// thing, without a socket (for tests and fuzzing).
#[derive(Debug, PartialEq)]
pub struct ParsedResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: Option<HeaderMap>,
    /// The connection could carry another request afterwards.
    pub reusable: bool,
}

pub fn parse_response(pieces: &[&[u8]], head_request: bool) -> io::Result<ParsedResponse> {
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
        match parse_response_head(&mut rbuf, head_request)? {
            Some(Parsed::Final(head)) => break head,
            Some(Parsed::Interim(_)) => continue,
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
    Ok(ParsedResponse {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::http::testing::{chunked_body, cut};
    use proptest::prelude::*;

    fn whole(input: &[u8]) -> io::Result<ParsedResponse> {
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
    fn a_field_is_found_by_name_whatever_the_lengths_of_the_others() {
        let long = "x".repeat(70);
        let longer = "y".repeat(70);
        let input = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Tollgate-Outcome: ok\r\nA: 1\r\n\
             {long}: 2\r\nConnection: x-gone\r\nX-Gone: 3\r\n\r\n"
        );
        let mut buf = BytesMut::from(input.as_bytes());
        let Some(Parsed::Final(head)) = parse_response_head(&mut buf, false).unwrap() else {
            panic!("a final head");
        };
        let f = &head.fields;
        assert_eq!(f.get("x-tollgate-outcome"), Some(&b"ok"[..]));
        assert_eq!(f.get("a"), Some(&b"1"[..]));
        assert_eq!(f.get(&long), Some(&b"2"[..]));
        // Absent: of a length no field has, of one a field has, of one a removed
        // field had, and of the length of a field that is there.
        for name in [
            "grpc-status",
            "b",
            "x-gone",
            "connection",
            "content-length",
            &longer,
        ] {
            assert_eq!(f.get(name), None, "{name}");
        }
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
    fn the_fields_pass_on_line_by_line_as_they_came_with_crlf() {
        let written = |input: &[u8], replaced: &dyn Fn(&[u8]) -> bool| {
            let mut rbuf = BytesMut::from(input);
            let Some(Parsed::Final(head)) = parse_response_head(&mut rbuf, false).unwrap() else {
                panic!("no final head")
            };
            let mut out = Vec::new();
            head.fields.write_to(&mut out, true, replaced);
            String::from_utf8(out).unwrap()
        };
        let none = |_: &[u8]| false;
        // Runs of lines broken by fields that do not pass on, or that are replaced.
        let input = b"HTTP/1.1 200 OK\r\nServer: s\r\nDate: d\r\nConnection: keep-alive\r\n\
                      X-A: 1\r\nX-Tollgate-Attempts: 9\r\nX-B: 2\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(
            written(input, &none),
            "Server: s\r\nDate: d\r\nX-A: 1\r\nX-Tollgate-Attempts: 9\r\nX-B: 2\r\n\
             content-length: 0\r\n"
        );
        let ours = |n: &[u8]| n.eq_ignore_ascii_case(b"x-tollgate-attempts");
        assert_eq!(
            written(input, &ours),
            "Server: s\r\nDate: d\r\nX-A: 1\r\nX-B: 2\r\ncontent-length: 0\r\n"
        );
        // Lines that end in a bare LF, or with blanks after the value, go out with CRLF
        // right after the value, whatever comes before or after them.
        let input = b"HTTP/1.1 200 OK\nX-A: 1\nX-B: 2 \t\r\nX-C: 3\r\nX-D: 4\n\r\n";
        assert_eq!(
            written(input, &none),
            "X-A: 1\r\nX-B: 2\r\nX-C: 3\r\nX-D: 4\r\n"
        );
    }

    #[test]
    fn lengths_are_read_as_requests_read_them_and_pass_on_as_one() {
        for framing in [
            "Content-Length: 3, 3\r\n",
            "Content-Length: 3\r\nContent-Length: 3\r\n",
            "Connection: content-length\r\nContent-Length: 3\r\n",
            "Content-Length: 3\r\nConnection: keep-alive, Content-Length\r\n",
        ] {
            let input = format!("HTTP/1.1 200 OK\r\n{framing}\r\nabcHTTP/1.1 200 OK\r\n");
            let r = whole(input.as_bytes()).unwrap();
            assert_eq!(r.body, b"abc", "{framing:?}");
            let lengths: Vec<_> = r.headers.get_all("content-length").iter().collect();
            assert_eq!(lengths, ["3"], "{framing:?}");
            let mut written = Vec::new();
            let mut rbuf = BytesMut::from(input.as_bytes());
            let Some(Parsed::Final(head)) = parse_response_head(&mut rbuf, false).unwrap() else {
                panic!("no final head")
            };
            head.fields.write_to(&mut written, true, |_| false);
            assert_eq!(written, b"content-length: 3\r\n", "{framing:?}");
        }
        for framing in [
            "Content-Length: 3, 4\r\n",
            "Content-Length: 3\r\nContent-Length: 4\r\n",
            "Content-Length: 9223372036854775808\r\n",
        ] {
            let input = format!("HTTP/1.1 200 OK\r\n{framing}\r\nabc");
            assert!(whole(input.as_bytes()).is_err(), "{framing:?}");
        }
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
