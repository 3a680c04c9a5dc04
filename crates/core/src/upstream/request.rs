//! What an attempt sends ahead of its body: the request's head, borrowed (every attempt
//! of a request sends the same one), and the few fields each attempt adds to it; and
//! how that head is written, as HTTP/1.1 ([`encode_h1`]) or for hyper's HTTP/2.

use std::io;
use std::time::Duration;

use http::header::{CONTENT_LENGTH, COOKIE, HOST};
use http::uri::{self, Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};
use http_body::Body;

use crate::http::encode::{BodyFraming, write_content_length};
use crate::http::fields::{content_length, write_field};

/// A header field an attempt adds, its name borrowed.
pub type Field<'a> = (&'a HeaderName, HeaderValue);

/// The fields few requests carry: a minted idempotency key, a traced attempt's
/// `traceparent`, and the dedupe store a retry goes back to.
pub type RareFields<'a> = [Option<Field<'a>>; 3];

/// The header fields one attempt adds to the request (its number, its time, the
/// caller's own time for gRPC, the hedge mark), each replacing any field of the same
/// name. The request's header map is shared by every attempt of the request and never
/// changed for them; the names are borrowed (from statics and the config), so an
/// attempt clones no header name.
#[derive(Default)]
pub struct AttemptFields<'a>(pub [Option<Field<'a>>; 4]);

impl<'a> AttemptFields<'a> {
    pub fn iter(&self) -> impl Iterator<Item = (&'a HeaderName, &HeaderValue)> {
        self.0.iter().flatten().map(|(n, v)| (*n, v))
    }

    /// Whether one of the fields is called `name`.
    pub fn names(&self, name: &HeaderName) -> bool {
        self.0.iter().flatten().any(|(n, _)| *n == name)
    }
}

/// How long a body behind `Expect: 100-continue` waits for `100 Continue` before it
/// goes out anyway, in whole milliseconds (it is a second at most): four bytes, so
/// that a request's head, built as each attempt goes out, stays within the size moved
/// without a call to copy it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContinueWait(u32);

impl ContinueWait {
    pub const ZERO: ContinueWait = ContinueWait(0);

    pub fn of(wait: Duration) -> Self {
        ContinueWait(u32::try_from(wait.as_millis()).unwrap_or(u32::MAX))
    }

    pub fn duration(self) -> Duration {
        Duration::from_millis(u64::from(self.0))
    }
}

/// What an attempt sends ahead of its body, borrowed from the request: every attempt
/// of a request sends the same head, with its own [`AttemptFields`].
pub struct RequestHead<'a> {
    pub method: &'a Method,
    /// Origin-form (path and query).
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub fields: AttemptFields<'a>,
    /// The attempt's rare fields (a minted key, its `traceparent`), added after the
    /// others, borrowed from the attempt: `None` on nearly every request.
    pub rare: Option<&'a RareFields<'a>>,
    /// The endpoints speak TLS (the scheme of an HTTP/2 request).
    pub https: bool,
    /// How long a body behind `Expect: 100-continue` waits for `100 Continue` before it
    /// goes out anyway (HTTP/1.1).
    pub continue_wait: ContinueWait,
}

impl<'a> RequestHead<'a> {
    /// A head sent as it is, over plain HTTP: no attempt's own fields. `continue_wait`:
    /// how long a body behind `Expect: 100-continue` waits for `100 Continue`.
    pub fn as_is(
        method: &'a Method,
        uri: &'a Uri,
        headers: &'a HeaderMap,
        continue_wait: ContinueWait,
    ) -> Self {
        RequestHead {
            method,
            uri,
            headers,
            fields: AttemptFields::default(),
            https: false,
            rare: None,
            continue_wait,
        }
    }

    /// The request as hyper's HTTP/2 client takes it: its own copy of the head, with
    /// the scheme and authority HTTP/2 requires. The authority comes from `Host`, and
    /// `Host` itself is not sent: HTTP/2 carries it as `:authority` (RFC 9113 section
    /// 8.3.1), and servers such as nginx refuse a request that has both.
    ///
    /// The header map is built afresh rather than cloned and then edited: made with room
    /// for every field it will hold (the attempt's own, and the `content-length` hyper
    /// adds for a body of known size), it never grows, and `Host` and the fields the
    /// attempt replaces are left out as the others are copied, never removed after. The
    /// `:path` is the target's own shared bytes, not parsed again.
    pub(super) fn to_h2<B>(&self, body: B) -> Request<B> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.version_mut() = Version::HTTP_2;
        crate::http::set_new_uri(req.uri_mut(), self.h2_uri());
        let added = self.fields.iter().count() + self.rare_fields().count();
        let mut headers = HeaderMap::with_capacity(self.headers.keys_len() + added + 1);
        for (name, value) in self.headers {
            if name != HOST && !self.replaces(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        for (name, value) in self.added() {
            headers.append(name.clone(), value.clone());
        }
        crate::http::set_new_headers(req.headers_mut(), headers);
        req
    }

    /// Whether one of the attempt's own fields, common or rare, is called `name`.
    #[inline]
    fn replaces(&self, name: &HeaderName) -> bool {
        self.fields.names(name)
            || self
                .rare
                .is_some_and(|r| r.iter().flatten().any(|(n, _)| *n == name))
    }

    /// Every field the attempt adds, the common ones and then the rare ones.
    pub fn added(&self) -> impl Iterator<Item = (&'a HeaderName, &HeaderValue)> {
        self.fields.iter().chain(self.rare_fields())
    }

    /// The rare fields the attempt carries.
    fn rare_fields(&self) -> impl Iterator<Item = (&'a HeaderName, &HeaderValue)> {
        self.rare
            .into_iter()
            .flatten()
            .flatten()
            .map(|(n, v)| (*n, v))
    }

    /// The target in absolute form, as HTTP/2's pseudo-header fields carry it.
    fn h2_uri(&self) -> Uri {
        if self.uri.scheme().is_some() {
            return self.uri.clone();
        }
        let authority = match self.headers.get(HOST).and_then(|h| h.to_str().ok()) {
            Some(host) => match Authority::try_from(host) {
                Ok(a) => a,
                Err(_) => return self.uri.clone(),
            },
            None => Authority::from_static("localhost"),
        };
        let mut parts = uri::Parts::default();
        parts.scheme = Some(if self.https {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        });
        parts.authority = Some(authority);
        parts.path_and_query = Some(
            self.uri
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        Uri::from_parts(parts).unwrap_or_else(|_| self.uri.clone())
    }
}

/// Writes the request's `Cookie` fields as one line.
fn write_cookies(wbuf: &mut Vec<u8>, headers: &http::HeaderMap) {
    wbuf.extend_from_slice(b"cookie: ");
    for (i, value) in headers.get_all(COOKIE).iter().enumerate() {
        if i > 0 {
            wbuf.extend_from_slice(b"; ");
        }
        wbuf.extend_from_slice(value.as_bytes());
    }
    wbuf.extend_from_slice(b"\r\n");
}

/// Methods whose request means something with a body, so an empty one is declared.
fn declares_empty_body(method: &Method) -> bool {
    *method == Method::POST || *method == Method::PUT || *method == Method::PATCH
}

/// Writes the request head as HTTP/1.1 into a connection's write buffer and says how the body
/// goes out after it: in the length the request declares (a body that does not match
/// it breaks the exchange rather than go out misframed), else in its known size, else
/// chunked.
pub(super) fn encode_h1<B: Body>(
    wbuf: &mut Vec<u8>,
    head: &RequestHead<'_>,
    body: &B,
) -> io::Result<BodyFraming> {
    let fields = &head.fields;
    let pq = head.uri.path_and_query().map_or("/", |p| p.as_str());
    wbuf.extend_from_slice(head.method.as_str().as_bytes());
    wbuf.push(b' ');
    wbuf.extend_from_slice(if pq.is_empty() { b"/" } else { pq.as_bytes() });
    wbuf.extend_from_slice(b" HTTP/1.1\r\n");
    let mut cookies = false;
    for (name, value) in head.headers {
        if *name == COOKIE {
            // An HTTP/2 app may split its cookies over several fields; HTTP/1.1 wants
            // them in one, joined by "; " (RFC 9113 section 8.2.3).
            if !cookies {
                cookies = true;
                write_cookies(wbuf, head.headers);
            }
        } else if !head.replaces(name) && name != CONTENT_LENGTH {
            // The length goes out once, as the value the body is framed by.
            write_field(wbuf, name, value);
        }
    }
    for (name, value) in fields.iter() {
        write_field(wbuf, name, value);
    }
    if head.rare.is_some() {
        for (name, value) in head.rare_fields() {
            write_field(wbuf, name, value);
        }
    }
    let ended = body.is_end_stream();
    if ended && !declares_empty_body(head.method) {
        // No body, and none expected (a GET): no length to look up or write.
        wbuf.extend_from_slice(b"\r\n");
        return Ok(BodyFraming::Length(0));
    }
    let declared = head
        .headers
        .get(CONTENT_LENGTH)
        .map(|v| content_length(v.as_bytes().trim_ascii()));
    let framing = match (declared, ended) {
        (Some(None), _) => return Err(crate::http::bad("invalid Content-Length")),
        (Some(Some(n)), _) => {
            write_content_length(wbuf, n);
            BodyFraming::Length(n)
        }
        (None, true) => {
            if declares_empty_body(head.method) {
                write_content_length(wbuf, 0);
            }
            BodyFraming::Length(0)
        }
        (None, false) => match body.size_hint().exact() {
            Some(n) => {
                write_content_length(wbuf, n);
                BodyFraming::Length(n)
            }
            None => {
                wbuf.extend_from_slice(b"transfer-encoding: chunked\r\n");
                BodyFraming::Chunked
            }
        },
    };
    wbuf.extend_from_slice(b"\r\n");
    Ok(framing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http2_request_has_the_authority_no_host_and_the_attempts_own_fields() {
        let attempt = HeaderName::from_static("x-tollgate-attempt");
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("api.example:8080"));
        headers.append("accept", HeaderValue::from_static("a/b"));
        headers.append("accept", HeaderValue::from_static("c/d"));
        headers.insert(&attempt, HeaderValue::from_static("7"));
        headers.insert("te", HeaderValue::from_static("trailers"));
        let uri = Uri::from_static("/p/q?x=1");
        let head = RequestHead {
            method: &Method::POST,
            uri: &uri,
            headers: &headers,
            fields: AttemptFields([
                Some((&attempt, HeaderValue::from_static("2"))),
                None,
                None,
                None,
            ]),
            rare: None,
            https: false,
            continue_wait: ContinueWait::ZERO,
        };
        let req = head.to_h2(());
        assert_eq!(req.uri(), "http://api.example:8080/p/q?x=1");
        assert_eq!(req.version(), Version::HTTP_2);
        assert_eq!(req.method(), Method::POST);
        let h = req.headers();
        assert!(h.get(HOST).is_none());
        let accept: Vec<_> = h.get_all("accept").iter().collect();
        assert_eq!(accept, ["a/b", "c/d"]);
        let attempts: Vec<_> = h.get_all(&attempt).iter().collect();
        assert_eq!(attempts, ["2"]);
        assert_eq!(h["te"], "trailers");
        assert_eq!(h.len(), 4);

        let https = RequestHead {
            https: true,
            fields: AttemptFields::default(),
            ..head
        };
        assert_eq!(https.to_h2(()).uri(), "https://api.example:8080/p/q?x=1");
        let no_host = HeaderMap::new();
        let bare = RequestHead {
            headers: &no_host,
            ..https
        };
        assert_eq!(bare.to_h2(()).uri(), "https://localhost/p/q?x=1");
    }
}
