//! The bodies that cross the app's side: the app's request body as either protocol
//! delivers it, and the response body that goes back to it, the upstream's streamed
//! frame by frame or a short one the service writes itself.
//!
//! The response body carries the request's guard, so the in-flight count and the
//! request duration cover the whole response, not just its head; and the fields this
//! hop adds to the head, handed to the HTTP/1.1 writer as data.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderName;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use tokio::time::Instant;

use super::socket::Http1Body;
use super::watchdog::ConnState;
use crate::http::response::RawFields;
use crate::http::{BoxError, ByProtocol};
use crate::upstream::response::UpstreamBody;
use crate::upstream::upgraded::Upgraded;

/// What serves an HTTP/1.1 connection after a `2xx` to its `CONNECT`: handed the
/// socket and what the app sent after the `CONNECT`'s head, already read.
pub type Inside = Box<
    dyn FnOnce(tokio::net::TcpStream, Bytes) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send,
>;

/// The body of a request from the app, as either protocol delivers it.
pub type AppBody = ByProtocol<Http1Body>;

/// Up to three whole field lines (`name: value`) this hop adds to a response head for an
/// HTTP/1.1 app, written after the response's own and replacing any field of the same
/// name; a line with nothing after its colon (`name:`) only removes the response's own.
/// Lines from tables made once, so nothing is formatted per response and the response
/// stays small to move.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddedFields(pub [Option<&'static str>; 3]);

impl AddedFields {
    /// Whether one of the lines is a field called `name`.
    pub fn names(&self, name: &HeaderName) -> bool {
        self.names_raw(name.as_str().as_bytes())
    }

    /// Whether one of the lines is a field called `name` as it came on the wire (any
    /// case).
    pub fn names_raw(&self, name: &[u8]) -> bool {
        let n = name.len();
        for line in self.0.iter().flatten() {
            let l = line.as_bytes();
            if l.len() > n && l[n] == b':' && l[..n].eq_ignore_ascii_case(name) {
                return true;
            }
        }
        false
    }

    /// Writes the lines into an HTTP/1.1 head (but those that only remove a field).
    #[inline]
    pub fn write_to(&self, wbuf: &mut Vec<u8>) {
        for line in &self.0 {
            if let Some(l) = line
                && !l.ends_with(':')
            {
                wbuf.extend_from_slice(l.as_bytes());
                wbuf.extend_from_slice(b"\r\n");
            }
        }
    }
}

/// What admitted a request (a concurrency limit, say): it holds a place until its
/// response head is ready (a body that streams after it, for however long, holds none),
/// and hears when the whole answer has gone out, and how long that took.
pub trait Admission: Send + Sync {
    /// The request has its response head: its place is free.
    fn leave(&self);
    /// The whole answer has gone out, `took` after the request arrived.
    fn finished(&self, took: std::time::Duration);
}

/// What must hear, once, how long a request took to answer (an access log line).
pub trait Finish: Send {
    fn finish(self: Box<Self>, took: std::time::Duration);
}

/// Held for as long as a request is being answered: the whole response, body included.
pub struct RequestGuard {
    admitted: Option<Arc<dyn Admission>>,
    /// The admission's place is still held: no response head yet.
    placed: bool,
    finish: Option<Box<dyn Finish>>,
    conn: Arc<ConnState>,
    start: Instant,
}

impl RequestGuard {
    pub fn new(conn: Arc<ConnState>, start: Instant) -> Self {
        conn.request_started();
        RequestGuard {
            admitted: None,
            placed: false,
            finish: None,
            conn,
            start,
        }
    }

    /// When the request arrived.
    #[inline]
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Holds a place in `admission` until the response head is ready, and tells it when
    /// the request has been answered.
    pub fn admitted(&mut self, admission: Arc<dyn Admission>) {
        self.admitted = Some(admission);
        self.placed = true;
    }

    /// The response head is ready: the request's place is free, whatever its body does.
    fn headed(&mut self) {
        if std::mem::take(&mut self.placed)
            && let Some(a) = &self.admitted
        {
            a.leave();
        }
    }

    /// Tells `finish` how long the request took, once it has been answered.
    pub fn on_finish(&mut self, finish: Box<dyn Finish>) {
        self.finish = Some(finish);
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        // One clock read for everything that hears of the end.
        let now = Instant::now();
        let took = now.saturating_duration_since(self.start);
        self.headed();
        if let Some(a) = &self.admitted {
            a.finished(took);
        }
        if let Some(f) = self.finish.take() {
            f.finish(took);
        }
        self.conn.request_finished(now);
    }
}

enum Kind {
    Upstream(UpstreamBody),
    Full(Option<Bytes>),
    /// The rare kinds, boxed behind one variant: the two above are matched and
    /// dropped as they would be alone, and the rare ones pay an allocation.
    Rare(Box<Rare>),
}

enum Rare {
    /// The answer to a `CONNECT`: no body, and the connection to tunnel to.
    Tunnel(Option<Upgraded>),
    /// The answer to a `CONNECT` whose connection is served from here on ([`Inside`]).
    Inside(Option<Inside>),
    /// A body a service made of its own (a response kept for replay, or one relayed
    /// from another task), with every field in the head's map.
    Boxed(BoxBody<Bytes, BoxError>),
}

impl Rare {
    #[inline(never)]
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self {
            Rare::Boxed(inner) => Pin::new(inner).poll_frame(cx),
            Rare::Tunnel(_) | Rare::Inside(_) => Poll::Ready(None),
        }
    }

    #[inline(never)]
    fn is_end_stream(&self) -> bool {
        match self {
            Rare::Boxed(inner) => inner.is_end_stream(),
            Rare::Tunnel(_) | Rare::Inside(_) => true,
        }
    }

    #[inline(never)]
    fn size_hint(&self) -> SizeHint {
        match self {
            Rare::Boxed(inner) => inner.size_hint(),
            Rare::Tunnel(_) | Rare::Inside(_) => SizeHint::with_exact(0),
        }
    }
}

pub struct ResponseBody {
    kind: Kind,
    added: AddedFields,
    _guard: Option<RequestGuard>,
}

impl ResponseBody {
    /// The upstream's body, with the fields this hop adds to its head.
    pub fn upstream(inner: UpstreamBody, mut guard: RequestGuard, added: AddedFields) -> Self {
        guard.headed();
        ResponseBody {
            kind: Kind::Upstream(inner),
            added,
            _guard: Some(guard),
        }
    }

    pub fn full(bytes: impl Into<Bytes>, mut guard: Option<RequestGuard>) -> Self {
        if let Some(g) = guard.as_mut() {
            g.headed();
        }
        let bytes = bytes.into();
        ResponseBody {
            kind: Kind::Full((!bytes.is_empty()).then_some(bytes)),
            added: AddedFields::default(),
            _guard: guard,
        }
    }

    /// A body the service made itself; the head's map holds all its fields.
    pub fn boxed(body: BoxBody<Bytes, BoxError>, mut guard: RequestGuard) -> Self {
        guard.headed();
        ResponseBody {
            kind: Kind::Rare(Box::new(Rare::Boxed(body))),
            added: AddedFields::default(),
            _guard: Some(guard),
        }
    }

    /// The answer to a `CONNECT` that opened `tunnel`: the HTTP/1.1 writer sends the
    /// head, then carries bytes between the app and it.
    pub fn tunnel(tunnel: Upgraded, guard: RequestGuard) -> Self {
        ResponseBody {
            kind: Kind::Rare(Box::new(Rare::Tunnel(Some(tunnel)))),
            added: AddedFields::default(),
            _guard: Some(guard),
        }
    }

    /// The answer to a `CONNECT` whose connection `inside` serves once the head (a
    /// `2xx`, no framing) has gone out.
    pub fn inside(inside: Inside, guard: RequestGuard) -> Self {
        ResponseBody {
            kind: Kind::Rare(Box::new(Rare::Inside(Some(inside)))),
            added: AddedFields::default(),
            _guard: Some(guard),
        }
    }

    /// What serves the connection after this answer to a `CONNECT`, and the request's
    /// guard.
    pub fn take_inside(&mut self) -> Option<(Inside, Option<RequestGuard>)> {
        let Kind::Rare(rare) = &mut self.kind else {
            return None;
        };
        let Rare::Inside(inside) = &mut **rare else {
            return None;
        };
        Some((inside.take()?, self._guard.take()))
    }

    pub fn added_fields(&self) -> AddedFields {
        self.added
    }

    /// Adds `line` (`name: value`) to the fields this hop writes into an HTTP/1.1 head,
    /// with no header map to grow; `false` when the lines are full.
    pub fn add_line(&mut self, line: &'static str) -> bool {
        match self.added.0.iter_mut().find(|l| l.is_none()) {
            Some(slot) => {
                *slot = Some(line);
                true
            }
            None => false,
        }
    }

    /// A `101`'s connection to the upstream, or a `CONNECT`'s to its authority, to
    /// tunnel, and the request's guard, which the tunnel holds for as long as it lasts
    /// (the request is still being answered).
    pub fn take_upgrade(&mut self) -> Option<(Upgraded, Option<RequestGuard>)> {
        let upgraded = match &mut self.kind {
            Kind::Upstream(ByProtocol::Http1(b)) => b.take_upgraded()?,
            Kind::Rare(rare) => match &mut **rare {
                Rare::Tunnel(t) => t.take()?,
                Rare::Boxed(_) | Rare::Inside(_) => return None,
            },
            _ => return None,
        };
        Some((upgraded, self._guard.take()))
    }

    /// Fields of the upstream's HTTP/1.1 response head that are not in the response's
    /// header map, to be written after it.
    pub fn raw_fields(&self) -> Option<&RawFields> {
        match &self.kind {
            Kind::Upstream(b) => b.raw_fields(),
            Kind::Full(_) | Kind::Rare(_) => None,
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Upstream(inner) => Pin::new(inner).poll_frame(cx),
            Kind::Rare(rare) => rare.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.is_none(),
            Kind::Upstream(inner) => inner.is_end_stream(),
            Kind::Rare(rare) => rare.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Upstream(inner) => inner.size_hint(),
            Kind::Rare(rare) => rare.size_hint(),
        }
    }
}
