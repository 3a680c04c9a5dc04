//! The body an attempt sends, and the recording that lets a retry send it again.
//!
//! The app's body is forwarded as it streams, never buffered whole before the first
//! attempt. While it streams, its frames are also kept (up to `max_body`) on a tape, so
//! a retry can replay exactly the same bytes. A body that outgrows the cap, or whose end
//! has not arrived when the upstream answers, cannot be replayed: the request becomes
//! not retryable (`body-too-large`) rather than being replayed incomplete. gRPC bodies,
//! which carry no Content-Length, are handled the same way.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::proxy::body::AppBody;
use crate::upstream::h1::BoxError;
use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// What an attempt sends upstream.
pub enum RequestBody {
    /// No body.
    Empty,
    /// The app's body, forwarded as it streams and recorded (up to a cap, possibly
    /// zero) for a replay.
    Recording(Recording),
    /// A complete recorded body, sent again. Boxed: every pooled connection's request
    /// queue is sized by the largest variant, and a replay is the rare one.
    Replay(Box<Replay>),
}

impl std::fmt::Debug for RequestBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RequestBody::Empty => "Empty",
            RequestBody::Recording(_) => "Recording",
            RequestBody::Replay(_) => "Replay",
        })
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::Recording(r) => r.poll_frame(cx),
            RequestBody::Replay(r) => Poll::Ready(r.next().map(Ok)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Empty => true,
            RequestBody::Recording(r) => r.is_end_stream(),
            RequestBody::Replay(r) => r.is_end(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Empty => SizeHint::with_exact(0),
            RequestBody::Recording(r) => r.size_hint(),
            RequestBody::Replay(r) => SizeHint::with_exact(r.remaining as u64),
        }
    }
}

/// The app's body and what has been read of it. The body lives here, not in the
/// attempt, so the retry loop can take what has already arrived even when the attempt
/// stopped reading it (an upstream that answers before reading a small body).
#[derive(Default)]
struct Tape {
    body: Option<AppBody>,
    cap: usize,
    chunks: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    len: usize,
    overflowed: bool,
    complete: bool,
    failed: bool,
}

impl Tape {
    /// Polls the app's body once and records what it yields.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let Poll::Ready(item) = Pin::new(&mut *body).poll_frame(cx) else {
            return Poll::Pending;
        };
        // hyper stops polling once a body says it has ended, so the end may never be
        // seen as `None`.
        let ended = body.is_end_stream();
        match &item {
            None => self.complete = true,
            Some(Err(_)) => self.failed = true,
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if !self.overflowed {
                        if self.len + data.len() > self.cap {
                            self.overflowed = true;
                            self.chunks = Vec::new();
                        } else {
                            self.len += data.len();
                            self.chunks.push(data.clone());
                        }
                    }
                } else if let Some(t) = frame.trailers_ref() {
                    self.trailers = Some(t.clone());
                }
                self.complete |= ended;
            }
        }
        Poll::Ready(item)
    }
}

/// The recorder's handle on the tape, kept by the retry loop.
#[derive(Clone)]
pub struct TapeHandle {
    tape: Arc<Mutex<Tape>>,
}

impl std::fmt::Debug for TapeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TapeHandle")
    }
}

/// Why a recorded body cannot be replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotReplayable {
    /// Larger than `max_body`.
    TooLarge,
    /// Its end had not arrived (or the app's upload failed) when the answer came.
    Incomplete,
}

impl TapeHandle {
    /// Whether the app's body has been read to its end.
    pub fn complete(&self) -> bool {
        let tape = self.tape.lock().unwrap_or_else(|p| p.into_inner());
        tape.complete || tape.body.as_ref().is_some_and(|b| b.is_end_stream())
    }

    /// Gives a body that is still arriving up to `limit` to finish (or to outgrow the
    /// cap, or fail). Returns whether it is complete.
    pub async fn finish_within(&self, limit: Duration) -> bool {
        let reading = std::future::poll_fn(|cx| {
            let mut tape = self.tape.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if tape.complete || tape.failed || tape.overflowed || tape.body.is_none() {
                    return Poll::Ready(());
                }
                match tape.poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(_))) => {}
                    Poll::Ready(_) => return Poll::Ready(()),
                }
            }
        });
        let _ = tokio::time::timeout(limit, reading).await;
        self.complete()
    }

    /// The recorded body, if it can be sent again byte for byte. What of the app's body
    /// has already arrived but was not read by the attempt is read now; a body whose
    /// end has not arrived is not waited for.
    pub fn replay(&self) -> Result<Replay, NotReplayable> {
        let mut tape = self.tape.lock().unwrap_or_else(|p| p.into_inner());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while !tape.complete && !tape.failed && !tape.overflowed {
            match tape.poll(&mut cx) {
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(_) | Poll::Pending => break,
            }
        }
        if tape.overflowed {
            return Err(NotReplayable::TooLarge);
        }
        if !tape.complete || tape.failed {
            return Err(NotReplayable::Incomplete);
        }
        Ok(Replay {
            chunks: tape.chunks.clone().into_iter(),
            trailers: tape.trailers.clone(),
            remaining: tape.len,
        })
    }
}

/// The app's body, forwarded as it streams and recorded on the way.
pub struct Recording {
    tape: Arc<Mutex<Tape>>,
}

impl Recording {
    /// Starts recording `body`, keeping at most `cap` bytes.
    pub fn new(body: AppBody, cap: usize) -> (Self, TapeHandle) {
        let tape = Arc::new(Mutex::new(Tape {
            // A body whose declared length is over the cap will not be replayable;
            // knowing it now spares the copy.
            overflowed: body.size_hint().lower() > cap as u64,
            body: Some(body),
            cap,
            ..Tape::default()
        }));
        (Recording { tape: tape.clone() }, TapeHandle { tape })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tape> {
        self.tape.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_end_stream(&self) -> bool {
        let tape = self.lock();
        tape.complete || tape.body.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.lock()
            .body
            .as_ref()
            .map_or(SizeHint::with_exact(0), |b| b.size_hint())
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.lock().poll(cx)
    }
}

/// A recorded body being sent again.
pub struct Replay {
    chunks: std::vec::IntoIter<Bytes>,
    trailers: Option<HeaderMap>,
    remaining: usize,
}

impl Replay {
    fn next(&mut self) -> Option<Frame<Bytes>> {
        if let Some(c) = self.chunks.next() {
            self.remaining -= c.len();
            return Some(Frame::data(c));
        }
        self.trailers.take().map(Frame::trailers)
    }

    fn is_end(&self) -> bool {
        self.chunks.len() == 0 && self.trailers.is_none()
    }
}
