//! What comes back from an endpoint: the response body, whichever HTTP carried it, and
//! its head's fields, wherever they are kept.

use http::response::Parts;
use http::{Response, Version};

use super::h1::Http1Response;
use crate::http::ByProtocol;
use crate::http::fields::strip;
use crate::http::response::{Fields, RawFields};

/// A response body from an endpoint, whichever HTTP carried it.
pub type UpstreamBody = ByProtocol<Http1Response>;

/// A response from an endpoint, boxed once where its head is read. It passes from the
/// attempt through the race and the judgement to the answer, and in a box each of
/// those moves is one word rather than the response's few hundred bytes.
pub type UpstreamResponse = Box<Response<UpstreamBody>>;

impl UpstreamBody {
    /// An HTTP/1.1 response's fields, kept in its head (its header map is empty).
    pub fn raw_fields(&self) -> Option<&RawFields> {
        match self {
            ByProtocol::Http1(b) => Some(b.fields()),
            ByProtocol::Http2(_) => None,
        }
    }
}

/// A response from an endpoint, as it goes on to a client that spoke `version`: its
/// hop-by-hop fields dropped, at that version.
pub fn relayed(resp: UpstreamResponse, version: Version) -> (Parts, UpstreamBody) {
    let (mut parts, body) = (*resp).into_parts();
    match &body {
        ByProtocol::Http2(_) => strip(&mut parts.headers),
        // An HTTP/1.1 response lost its hop-by-hop fields as it was parsed and keeps
        // the rest in its head, from where they go to an HTTP/1.1 client as they are;
        // an HTTP/2 client needs them in the map.
        ByProtocol::Http1(b) if version == Version::HTTP_2 => {
            b.fields().append_to(&mut parts.headers);
        }
        ByProtocol::Http1(_) => {}
    }
    parts.version = version;
    (parts, body)
}

/// The fields of an endpoint's response head, wherever they are kept ([`Fields`]).
impl<'a> Fields<'a> {
    pub fn of(resp: &'a Response<UpstreamBody>) -> Self {
        Fields::new(resp.headers(), resp.body().raw_fields())
    }
}
