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
use hyper::body::Incoming;
use tokio::time::Instant;

use super::conn::ConnState;
use crate::upstream::Upstream;
use crate::upstream::pool::Lease;

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
    Upstream {
        inner: Incoming,
        lease: Option<Lease>,
    },
    Full(Option<Bytes>),
}

pub struct ResponseBody {
    kind: Kind,
    _guard: Option<RequestGuard>,
}

impl ResponseBody {
    pub fn upstream(inner: Incoming, lease: Option<Lease>, guard: RequestGuard) -> Self {
        let mut body = ResponseBody {
            kind: Kind::Upstream { inner, lease },
            _guard: Some(guard),
        };
        body.release_if_done();
        body
    }

    pub fn full(bytes: impl Into<Bytes>, guard: Option<RequestGuard>) -> Self {
        let bytes = bytes.into();
        ResponseBody {
            kind: Kind::Full((!bytes.is_empty()).then_some(bytes)),
            _guard: guard,
        }
    }

    /// Gives the connection back once the upstream's response has ended.
    fn release_if_done(&mut self) {
        if let Kind::Upstream { inner, lease } = &mut self.kind
            && inner.is_end_stream()
            && let Some(l) = lease.take()
        {
            l.release();
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        match &mut this.kind {
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Upstream { inner, lease } => {
                let polled = Pin::new(&mut *inner).poll_frame(cx);
                match &polled {
                    Poll::Ready(None) => {
                        if let Some(l) = lease.take() {
                            l.release();
                        }
                    }
                    Poll::Ready(Some(Ok(_))) => this.release_if_done(),
                    // A broken upstream body: the lease is dropped with the body,
                    // which closes the connection.
                    Poll::Ready(Some(Err(_))) | Poll::Pending => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.is_none(),
            Kind::Upstream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Upstream { inner, .. } => inner.size_hint(),
        }
    }
}
