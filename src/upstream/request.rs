//! What an attempt sends ahead of its body: the request's head, borrowed (every attempt
//! of a request sends the same one), and the few fields each attempt adds to it.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};

/// The header fields one attempt adds to the request (its number, its time, the
/// caller's own time for gRPC, the hedge mark), each replacing any field of the same
/// name. The request's header map is shared by every attempt of the request and never
/// changed for them; the names are borrowed (from statics and the config), so an
/// attempt clones no header name.
#[derive(Default)]
pub struct AttemptFields<'a>(pub [Option<(&'a HeaderName, HeaderValue)>; 4]);

impl<'a> AttemptFields<'a> {
    pub fn iter(&self) -> impl Iterator<Item = (&'a HeaderName, &HeaderValue)> {
        self.0.iter().flatten().map(|(n, v)| (*n, v))
    }

    /// Whether one of the fields is called `name`.
    pub fn names(&self, name: &HeaderName) -> bool {
        self.0.iter().flatten().any(|(n, _)| *n == name)
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
    /// The endpoints speak TLS (the scheme of an HTTP/2 request).
    pub https: bool,
    /// How long a body behind `Expect: 100-continue` waits for `100 Continue` before it
    /// goes out anyway (HTTP/1.1).
    pub continue_wait: Duration,
}

impl RequestHead<'_> {
    /// The request as hyper's HTTP/2 client takes it: its own copy of the head, with
    /// the scheme and authority HTTP/2 requires. The authority comes from `Host`, and
    /// `Host` itself is not sent: HTTP/2 carries it as `:authority` (RFC 9113 section
    /// 8.3.1), and servers such as nginx refuse a request that has both.
    pub(super) fn to_h2<B>(&self, body: B) -> Request<B> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.version_mut() = Version::HTTP_2;
        *req.uri_mut() = if self.uri.scheme().is_some() {
            self.uri.clone()
        } else {
            let authority = self
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost");
            let pq = self.uri.path_and_query().map_or("/", |p| p.as_str());
            Uri::builder()
                .scheme(if self.https { "https" } else { "http" })
                .authority(authority)
                .path_and_query(pq)
                .build()
                .unwrap_or_else(|_| self.uri.clone())
        };
        let mut headers = self.headers.clone();
        headers.remove(http::header::HOST);
        for (name, value) in self.fields.iter() {
            headers.insert(name.clone(), value.clone());
        }
        *req.headers_mut() = headers;
        req
    }
}
