//! The body that goes back to the app: the upstream's, streamed frame by frame, or a
//! short one tollgate writes itself. It carries the request's guard, so the in-flight
//! count and the request duration cover the whole response, not just its head; and the
//! HTTP/1.1 connection it came on, which goes back to the pool only when the body was
//! read to its end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use super::conn::ConnState;
use super::h1::Http1Body;
use crate::metrics::Outcome;
use crate::upstream::Upstream;
use crate::upstream::h1::{BoxError, RawFields};
use crate::upstream::pool::{ByProtocol, UpstreamBody};

/// Held for as long as a request is being answered.
pub struct RequestGuard {
    upstream: Option<Arc<Upstream>>,
    conn: Arc<ConnState>,
    start: Instant,
}

impl RequestGuard {
    pub fn new(conn: Arc<ConnState>, start: Instant) -> Self {
        conn.request_started();
        RequestGuard {
            upstream: None,
            conn,
            start,
        }
    }

    /// Counts the request against the upstream's `max_inflight`; `false` (and nothing
    /// counted) when it is full.
    pub fn admit(&mut self, upstream: &Arc<Upstream>) -> bool {
        let max = upstream.config.max_inflight;
        let before = upstream
            .inflight
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if before >= max {
            upstream
                .inflight
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            return false;
        }
        self.upstream = Some(upstream.clone());
        true
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if let Some(up) = &self.upstream {
            up.inflight
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            up.metrics
                .request_duration
                .observe(self.start.elapsed().as_secs_f64());
        }
        self.conn.request_finished();
    }
}

enum Kind {
    Upstream(UpstreamBody),
    Full(Option<Bytes>),
}

pub struct ResponseBody {
    kind: Kind,
    stamp: Option<Stamp>,
    _guard: Option<RequestGuard>,
}

/// What this hop says about the exchange, for an HTTP/1.1 app: written into the head
/// as `x-tollgate-attempts` and `x-tollgate-outcome` without a header map.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    pub attempts: u32,
    pub outcome: Option<Outcome>,
}

impl ResponseBody {
    pub fn upstream(inner: UpstreamBody, guard: RequestGuard) -> Self {
        ResponseBody {
            kind: Kind::Upstream(inner),
            stamp: None,
            _guard: Some(guard),
        }
    }

    pub fn full(bytes: impl Into<Bytes>, guard: Option<RequestGuard>) -> Self {
        let bytes = bytes.into();
        ResponseBody {
            kind: Kind::Full((!bytes.is_empty()).then_some(bytes)),
            stamp: None,
            _guard: guard,
        }
    }
}

impl ResponseBody {
    pub fn stamped(mut self, stamp: Stamp) -> Self {
        self.stamp = Some(stamp);
        self
    }

    pub fn stamp(&self) -> Option<Stamp> {
        self.stamp
    }

    /// Fields of the upstream's HTTP/1.1 response head that are not in the response's
    /// header map, to be written after it.
    pub fn raw_fields(&self) -> Option<&RawFields> {
        match &self.kind {
            Kind::Upstream(b) => b.raw_fields(),
            Kind::Full(_) => None,
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.is_none(),
            Kind::Upstream(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Upstream(inner) => inner.size_hint(),
        }
    }
}

/// The body of a request from the app, as either protocol delivers it.
pub type AppBody = ByProtocol<Http1Body>;
