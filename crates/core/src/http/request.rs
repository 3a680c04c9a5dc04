//! Reading a request head (the server's role): parsed in place with `httparse`, its
//! header values slices of the buffer it came in, and its framing decided as RFC 9112
//! section 6 reads, refusing what could be read two ways: `Content-Length` must be
//! digits up to `i64::MAX` (repeats must agree, and are passed on as one field),
//! `Transfer-Encoding` must be `chunked` alone and never comes with a
//! `Content-Length`, and chunked is no HTTP/1.0 framing. The target must be a form its method allows (RFC 9112 section
//! 3.2). A refused head gets its status (400, or 431 for one over `max_header_bytes` or
//! `max_headers`).

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};

use super::fields::{
    FEW_HEADERS, LengthProblem, Span, TWO_HOSTS, field_spans, fold_content_length, has_token,
    host_value_problem, target_problem,
};
use super::framing::{Chunk, Framing, Step, step};
use super::spare;

/// The most fields `max_headers` may allow (the config refuses more).
pub const MOST_HEADERS: usize = 1000;

/// Why a request head is refused: the status to answer with, and the reason as its body.
pub type HeadRefusal = (StatusCode, &'static str);

fn malformed(why: &'static str) -> HeadRefusal {
    (StatusCode::BAD_REQUEST, why)
}

/// A request head taken off the read buffer, and how its body follows.
#[derive(Debug)]
pub struct ParsedHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    /// The connection may carry another request after this one.
    pub keep_alive: bool,
    pub framing: Framing,
    /// `100 Continue` is owed before the body is read.
    pub expect_continue: bool,
}

/// Parses a request head at the front of the read buffer and takes it off; `None`
/// while it is incomplete.
pub fn parse_request_head(
    rbuf: &mut BytesMut,
    max_header_bytes: usize,
    max_headers: usize,
) -> Result<Option<ParsedHead>, HeadRefusal> {
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
    let (mut few, mut many) = ([[0; 4]; FEW_HEADERS], Vec::new());
    let spans = field_spans(rbuf, parsed.headers, &mut few, &mut many);
    let head = rbuf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(head.slice(target.0..target.0 + target.1))
        .map_err(|_| malformed("invalid request target\n"))?;
    if let Some(why) = target_problem(&method, &uri) {
        return Err(malformed(why));
    }
    let RequestFields {
        mut headers,
        length,
        length_rewritten,
        coded,
        expect,
        keep_alive,
    } = read_fields(&head, spans, version)?;
    let framing = if coded {
        if version == Version::HTTP_10 {
            return Err(malformed("Transfer-Encoding in an HTTP/1.0 request\n"));
        }
        if length.is_some() {
            // Both (RFC 9112 section 6.3 allows either refusing or reading it chunked
            // and closing): the classic way to make two hops frame one request two
            // ways. Refused, as nginx does, so no hop behind tollgate meets it.
            return Err(malformed("both Content-Length and Transfer-Encoding\n"));
        }
        Framing::Chunked(Chunk::Size)
    } else {
        if let Some(n) = length.filter(|_| length_rewritten) {
            // `5, 5`, two lines of `5`, or `005`: the next hop gets one field, one
            // value, in its one decimal spelling.
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
        Framing::Length(length.unwrap_or(0))
    };
    let expect = expect && framing != Framing::Length(0) && version == Version::HTTP_11;
    Ok(Some(ParsedHead {
        method,
        uri,
        version,
        headers,
        keep_alive,
        framing,
        expect_continue: expect,
    }))
}

/// What the fields of a request head say.
struct RequestFields {
    headers: HeaderMap,
    length: Option<u64>,
    /// The length came as more than one value (a list, or repeated lines).
    length_rewritten: bool,
    /// `Transfer-Encoding: chunked` (the only coding accepted).
    coded: bool,
    /// `Expect: 100-continue`.
    expect: bool,
    keep_alive: bool,
}

/// Reads the fields of a request head into a header map (values as slices of the
/// head), refusing framing that could be read two ways and a `Host` that could route
/// two ways.
fn read_fields(
    head: &Bytes,
    spans: &[Span],
    version: Version,
) -> Result<RequestFields, HeadRefusal> {
    let mut read = RequestFields {
        headers: spare::header_map(spans.len() + 3),
        length: None,
        length_rewritten: false,
        coded: false,
        expect: false,
        keep_alive: version == Version::HTTP_11,
    };
    let mut hosts = 0;
    for span in spans {
        let [ns, ne, vs, ve] = span.map(|i| i as usize);
        let name = HeaderName::from_bytes(&head[ns..ne])
            .map_err(|_| malformed("invalid header name\n"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(vs..ve))
            .map_err(|_| malformed("invalid header value\n"))?;
        if name == CONTENT_LENGTH {
            let v = value.as_bytes();
            read.length_rewritten |= read.length.is_some()
                || !v.iter().all(u8::is_ascii_digit)
                || (v.len() > 1 && v[0] == b'0');
            read.length = Some(fold_content_length(read.length, value.as_bytes()).map_err(
                |p| match p {
                    LengthProblem::Invalid => malformed("invalid Content-Length\n"),
                    LengthProblem::Conflicting => malformed("conflicting Content-Length values\n"),
                },
            )?);
        } else if name == TRANSFER_ENCODING {
            // Only `chunked` is understood, and it must come last, once: anything else
            // could frame the body differently at the next hop.
            for coding in value.as_bytes().split(|&b| b == b',') {
                if read.coded || !coding.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return Err(malformed("unsupported Transfer-Encoding\n"));
                }
                read.coded = true;
            }
        } else if name == CONNECTION {
            if has_token(value.as_bytes(), b"close") {
                read.keep_alive = false;
            } else if version == Version::HTTP_10 && has_token(value.as_bytes(), b"keep-alive") {
                read.keep_alive = true;
            }
        } else if name == EXPECT {
            read.expect = value.as_bytes().eq_ignore_ascii_case(b"100-continue");
        } else if name == HOST {
            // One Host, and a valid one, or routing could be fooled.
            if hosts > 0 {
                return Err(malformed(TWO_HOSTS));
            }
            hosts += 1;
            if let Some(why) = host_value_problem(value.as_bytes()) {
                return Err(malformed(why));
            }
        }
        read.headers.append(name, value);
    }
    Ok(read)
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
                match parse_request_head(&mut rbuf, max_header_bytes, max_headers) {
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
        let Some(head) = parsed else {
            return out;
        };
        let mut framing = head.framing;
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
        let keep_alive = head.keep_alive;
        out.push(Ok(ParsedRequest {
            method: head.method,
            uri: head.uri,
            version: head.version,
            headers: head.headers,
            body,
            trailers,
            keep_alive,
        }));
        if !keep_alive {
            return out;
        }
    }
}

/// A request target as it goes to a server, in origin-form: the path and query alone.
/// An absolute-form target (`http://host/path`, as an app using `http_proxy` sends) or an
/// HTTP/2 request's scheme and authority are left out, and an empty path means `/`
/// (RFC 9112 section 3.2.2): `http://up?x=1` is `/?x=1`.
pub fn origin_form(uri: Uri) -> Uri {
    if uri.scheme().is_none() && uri.authority().is_none() {
        return uri;
    }
    match uri.path_and_query() {
        Some(pq) if pq.as_str().starts_with('/') || pq.as_str() == "*" => Uri::from(pq.clone()),
        Some(pq) => {
            Uri::try_from(format!("/{}", pq.as_str())).unwrap_or_else(|_| Uri::from_static("/"))
        }
        None => Uri::from_static("/"),
    }
}

#[cfg(test)]
mod tests {

    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_target_goes_on_in_origin_form() {
        let of = |t: &'static str| super::origin_form(http::Uri::from_static(t)).to_string();
        assert_eq!(of("/a?b=1"), "/a?b=1");
        assert_eq!(of("http://up/a?b=1"), "/a?b=1");
        assert_eq!(of("http://up?x=1"), "/?x=1");
        assert_eq!(of("http://up"), "/");
        assert_eq!(of("*"), "*");
    }

    use crate::http::testing::{chunked_body, cut};
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
    fn repeated_lengths_pass_on_as_one_field_and_huge_ones_are_refused() {
        for framing in [
            "Content-Length: 5, 5\r\n",
            "Content-Length: 5\r\nContent-Length: 5\r\n",
            "Content-Length: 5,5\r\nContent-Length: 5\r\n",
        ] {
            let input = format!("POST / HTTP/1.1\r\nHost: a\r\n{framing}\r\nhello");
            let got = whole(input.as_bytes());
            let r = got[0].as_ref().unwrap();
            assert_eq!(r.body, b"hello", "{framing:?}");
            let lengths: Vec<_> = r.headers.get_all(CONTENT_LENGTH).iter().collect();
            assert_eq!(lengths, ["5"], "{framing:?}");
        }
        let got = whole(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 005\r\n\r\nhello");
        let lengths: Vec<_> = got[0]
            .as_ref()
            .unwrap()
            .headers
            .get_all(CONTENT_LENGTH)
            .iter()
            .collect();
        assert_eq!(lengths, ["5"], "one decimal spelling");
        for huge in [
            "9223372036854775808",
            "18446744073709551615",
            "99999999999999999999",
        ] {
            let input = format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {huge}\r\n\r\n");
            assert_eq!(statuses(input.as_bytes()), [Err(400)], "{huge}");
        }
    }

    #[test]
    fn a_target_its_method_does_not_allow_is_refused() {
        for line in [
            "POST * HTTP/1.1",
            "GET * HTTP/1.1",
            "GET up:80 HTTP/1.1",
            "CONNECT / HTTP/1.1",
            "GET ftp://up/ HTTP/1.1",
            "GET ?x=1 HTTP/1.1",
        ] {
            let input = format!("{line}\r\nHost: up\r\n\r\n");
            assert_eq!(statuses(input.as_bytes()), [Err(400)], "{line}");
        }
        for line in [
            "OPTIONS * HTTP/1.1",
            "GET http://up?x=1 HTTP/1.1",
            "GET http://up HTTP/1.1",
            "CONNECT up:443 HTTP/1.1",
        ] {
            let input = format!("{line}\r\nHost: up\r\n\r\n");
            assert!(whole(input.as_bytes())[0].is_ok(), "{line}");
        }
    }

    #[test]
    fn a_length_with_chunked_is_refused_and_nothing_after_it_is_read() {
        for framing in [
            "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
            "Content-Length: 0\r\nTransfer-Encoding: chunked\r\n",
        ] {
            let input = format!(
                "POST /a HTTP/1.1\r\n{framing}\r\n5\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n"
            );
            assert_eq!(statuses(input.as_bytes()), [Err(400)], "{framing:?}");
        }
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
