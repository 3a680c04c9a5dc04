//! The HTTP wire layer both sides share: what a request or response head looks like
//! on the wire, how a body is framed, and the field rules every hop must keep.
//!
//! tollgate speaks HTTP/1.1 with its own codec on both sides (to the app in
//! `server`, to the endpoints in `upstream::h1`) and HTTP/2 through hyper. The
//! pieces here have one role each, as in hyper's `proto::h1` and Pingora's
//! `protocols::http::v1::common`: [`request`] reads request heads (the server's role),
//! [`response`] reads response heads (the client's role), [`framing`] reads bodies
//! either way, [`read`] fills a read buffer that a waiting connection has given back,
//! [`encode`] writes them into a [`write`] queue, [`fields`] holds the field rules of
//! RFC 9110 and 9112, [`grpc`] the few words of gRPC a hop must speak, [`spare`] the
//! allocations a thread keeps from one request for the next, and [`spawn`] how hyper's
//! HTTP/2 starts its tasks. Nothing here knows about retries, routes or
//! tollgate's own headers: a
//! caller that wants a field dropped or added says so.

pub mod encode;
pub mod fields;
pub mod framing;
pub mod grpc;
pub mod read;
pub mod request;
pub mod response;
pub mod spare;
pub mod spawn;
pub mod write;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// Room made in a read buffer before each read.
pub const READ_CHUNK: usize = 8 * 1024;
/// Bodies are pulled into a write buffer until it holds this much, then written.
pub const WRITE_BATCH: usize = 16 * 1024;
/// A write buffer grown past this by a large body is shrunk back when it empties.
pub const KEEP_WRITE: usize = 64 * 1024;

/// The error of every body that crosses tollgate.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body that came over HTTP/1.1 (read by tollgate's own codec, `H1`) or over HTTP/2
/// (hyper's). One type for both, so the code that forwards a body is written once.
pub enum ByProtocol<H1> {
    Http1(H1),
    Http2(Incoming),
}

impl<H1> Body for ByProtocol<H1>
where
    H1: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ByProtocol::Http1(b) => Pin::new(b).poll_frame(cx),
            ByProtocol::Http2(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(BoxError::from))),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            ByProtocol::Http1(b) => b.is_end_stream(),
            ByProtocol::Http2(b) => b.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            ByProtocol::Http1(b) => b.size_hint(),
            ByProtocol::Http2(b) => b.size_hint(),
        }
    }
}

/// A request without a body, for a client that sends nothing else.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoBody;

impl Body for NoBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        true
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(0)
    }
}

/// An `InvalidData` error: the peer sent something that is not HTTP as we read it.
pub(crate) fn bad(what: &'static str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// Test helpers for the readers of both sides: input cut into pieces, chunked bodies.
/// Puts `headers` where [`http::Request::new`] (or `Response::new`) left an empty map,
/// without running that map's destructor: it owns nothing ([`HeaderMap::new`] does not
/// allocate), yet dropping it costs some sixty instructions a request for nothing.
#[inline]
pub fn set_new_headers(slot: &mut http::HeaderMap, headers: http::HeaderMap) {
    debug_assert!(slot.is_empty() && slot.capacity() == 0);
    std::mem::forget(std::mem::replace(slot, headers));
}

/// Puts `uri` where [`http::Request::new`] left its `/`, static bytes that own nothing,
/// without running their destructor (as [`set_new_headers`]).
#[inline]
pub fn set_new_uri(slot: &mut http::Uri, uri: http::Uri) {
    debug_assert!(slot == "/");
    std::mem::forget(std::mem::replace(slot, uri));
}

#[cfg(test)]
pub(crate) mod testing {
    #![allow(clippy::unwrap_used)]

    /// A header map of the given fields, in order (a name given twice has two values).
    pub fn fields(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, http::HeaderValue::from_static(value));
        }
        h
    }

    /// `input` cut at the given points (taken modulo its length, in order).
    pub fn cut<'a>(input: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
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

    /// `body` in chunks of the given sizes (repeated as needed), with an extension on
    /// each chunk-size line if `ext`, then the trailers.
    pub fn chunked_body(
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
}
