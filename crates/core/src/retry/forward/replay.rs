//! The body an attempt sends, and the recording that lets a retry send it again.
//! Generic over the app's body `A`, as linkerd2-proxy's `ReplayBody<B>`.
//!
//! The app's body is forwarded as it streams, never buffered whole before the first
//! attempt. While it streams, its frames are also kept (up to `max_body`) on a tape, so
//! a retry can replay exactly the same bytes. A body that outgrows the cap, or whose end
//! has not arrived when the upstream answers, cannot be replayed: the request becomes
//! not retryable (`body-too-large`) rather than being replayed incomplete. gRPC bodies,
//! which carry no Content-Length, are handled the same way.
//!
//! A hedge runs beside the attempt that is still sending the app's body, so it may only
//! take a copy of a recording that is already whole ([`BodySource::fork`]): reading
//! ahead of the running attempt would take frames from under it.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::http::BoxError;
use crate::retry::decide::policy::{BodyState, Replayable};

/// What an attempt sends upstream, the app's body being `A`.
pub enum ReplayBody<A> {
    /// No body.
    Empty,
    /// The app's body, forwarded as it streams and recorded (up to a cap, possibly
    /// zero) for a replay.
    Recording(Recording<A>),
    /// A complete recorded body, sent again. Boxed: every pooled connection's request
    /// queue is sized by the largest variant, and a replay is the rare one.
    Replay(Box<Replay>),
}

impl<A: RetriedBody> ReplayBody<A> {
    /// A way to tell, once this body has gone out, whether the app's body broke as it
    /// was sent.
    pub fn watch(&self) -> BodyWatch<A> {
        BodyWatch(match self {
            ReplayBody::Recording(r) => Some(r.tape.clone()),
            ReplayBody::Empty | ReplayBody::Replay(_) => None,
        })
    }
}

/// Watches the app's body an attempt sends: a recording breaks when the app's body
/// does; nothing else can.
pub struct BodyWatch<A>(Option<Arc<Mutex<Tape<A>>>>);

impl<A> BodyWatch<A> {
    /// Whether the app's body broke (malformed, or its connection failed mid-body).
    pub fn app_failed(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|t| t.lock().unwrap_or_else(|p| p.into_inner()).failed)
    }
}

impl<A> std::fmt::Debug for ReplayBody<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReplayBody::Empty => "Empty",
            ReplayBody::Recording(_) => "Recording",
            ReplayBody::Replay(_) => "Replay",
        })
    }
}

impl<A: RetriedBody> Body for ReplayBody<A> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ReplayBody::Empty => Poll::Ready(None),
            ReplayBody::Recording(r) => r.poll_frame(cx),
            ReplayBody::Replay(r) => Poll::Ready(r.next().map(Ok)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReplayBody::Empty => true,
            ReplayBody::Recording(r) => r.is_end_stream(),
            ReplayBody::Replay(r) => r.is_end(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReplayBody::Empty => SizeHint::with_exact(0),
            ReplayBody::Recording(r) => r.size_hint(),
            ReplayBody::Replay(r) => SizeHint::with_exact(r.remaining as u64),
        }
    }
}

/// The app's body and what has been read of it. The body lives here, not in the
/// attempt, so the retry loop can take what has already arrived even when the attempt
/// stopped reading it (an upstream that answers before reading a small body).
struct Tape<A> {
    body: Option<A>,
    cap: usize,
    chunks: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    len: usize,
    overflowed: bool,
    complete: bool,
    failed: bool,
    /// Something of the body was read (a frame, or its end).
    started: bool,
}

impl<A: RetriedBody> Tape<A> {
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
        self.started = true;
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
struct TapeHandle<A> {
    tape: Arc<Mutex<Tape<A>>>,
}

impl<A: RetriedBody> TapeHandle<A> {
    /// Whether the app's body has been read to its end.
    fn complete(&self) -> bool {
        let tape = self.tape.lock().unwrap_or_else(|p| p.into_inner());
        tape.complete || tape.body.as_ref().is_some_and(|b| b.is_end_stream())
    }

    /// Gives a body that is still arriving up to `limit` to finish (or to outgrow the
    /// cap, or fail). Returns whether it is complete.
    async fn finish_within(&self, limit: Duration) -> bool {
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

    /// A copy of the recording when it is whole already (ended, within the cap, not
    /// broken); reads nothing from the app's body.
    fn copy_if_whole(&self) -> Option<Replay> {
        let tape = self.tape.lock().unwrap_or_else(|p| p.into_inner());
        let ended = tape.complete || tape.body.as_ref().is_some_and(|b| b.is_end_stream());
        (ended && !tape.failed && !tape.overflowed).then(|| Replay {
            chunks: tape.chunks.clone().into_iter(),
            trailers: tape.trailers.clone(),
            remaining: tape.len,
        })
    }

    /// The recorded body, if it can be sent again byte for byte. What of the app's body
    /// has already arrived but was not read by the attempt is read now; a body whose
    /// end has not arrived is not waited for.
    fn replay(&self) -> Result<Replay, BodyState> {
        let mut tape = self.tape.lock().unwrap_or_else(|p| p.into_inner());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while !tape.complete && !tape.failed && !tape.overflowed {
            match tape.poll(&mut cx) {
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(_) | Poll::Pending => break,
            }
        }
        if tape.overflowed {
            return Err(BodyState::TooLarge);
        }
        if !tape.complete || tape.failed {
            return Err(BodyState::Incomplete);
        }
        Ok(Replay {
            chunks: tape.chunks.clone().into_iter(),
            trailers: tape.trailers.clone(),
            remaining: tape.len,
        })
    }
}

/// The app's body, forwarded as it streams and recorded on the way.
pub struct Recording<A> {
    tape: Arc<Mutex<Tape<A>>>,
}

impl<A: RetriedBody> Recording<A> {
    /// Starts recording `body`, keeping at most `cap` bytes.
    fn new(body: A, cap: usize) -> (Self, TapeHandle<A>) {
        let tape = Arc::new(Mutex::new(Tape {
            // A body whose declared length is over the cap will not be replayable;
            // knowing it now spares the copy.
            overflowed: body.size_hint().lower() > cap as u64,
            body: Some(body),
            cap,
            chunks: Vec::new(),
            trailers: None,
            len: 0,
            complete: false,
            failed: false,
            started: false,
        }));
        (Recording { tape: tape.clone() }, TapeHandle { tape })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tape<A>> {
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

/// What the retry engine asks of the app's body: one it sends, records, and may send again.
pub trait RetriedBody: Body<Data = Bytes, Error = BoxError> + Unpin + Send + 'static {}

impl<T> RetriedBody for T where T: Body<Data = Bytes, Error = BoxError> + Unpin + Send + 'static {}

/// What the next attempt sends.
enum Next<A> {
    /// Nothing: the request has no body, or the recording is not readied yet.
    Nothing,
    /// The app's body, not yet handed to any attempt.
    Fresh(A),
    /// A body handed to an attempt that never sent it (no connection): it goes out as
    /// it is.
    Unsent(ReplayBody<A>),
    /// The recording, readied to be sent again.
    Replay(Replay),
}

/// The app's body across the attempts of one request: which body each attempt sends,
/// and the recording a retry replays. One place owns that state, so every way out of
/// the attempt loop reads it the same way.
pub struct BodySource<A> {
    next: Next<A>,
    /// The recording of the app's body, once an attempt has taken it.
    tape: Option<TapeHandle<A>>,
}

impl<A: RetriedBody> BodySource<A> {
    pub fn new(body: A) -> Self {
        BodySource {
            next: if body.is_end_stream() {
                Next::Nothing
            } else {
                Next::Fresh(body)
            },
            tape: None,
        }
    }

    /// The body for the next attempt. The app's body is recorded (keeping up to `keep`
    /// bytes; 0 when no retry may follow, so the recording only notes whether the
    /// body ended) as the attempt sends it.
    pub fn take(&mut self, keep: usize) -> ReplayBody<A> {
        match std::mem::replace(&mut self.next, Next::Nothing) {
            Next::Nothing => ReplayBody::Empty,
            Next::Fresh(body) => {
                let (recording, tape) = Recording::new(body, keep);
                self.tape = Some(tape);
                ReplayBody::Recording(recording)
            }
            Next::Unsent(body) => body,
            Next::Replay(r) => ReplayBody::Replay(Box::new(r)),
        }
    }

    /// A body that never left (no connection took it): the next attempt sends it.
    pub fn give_back(&mut self, body: ReplayBody<A>) {
        if !matches!(body, ReplayBody::Empty) {
            self.next = Next::Unsent(body);
        }
    }

    /// Whether some of the app's body is still unread: the app's connection cannot
    /// carry another request.
    pub fn unread(&self) -> bool {
        matches!(self.next, Next::Fresh(_) | Next::Unsent(_))
            || self.tape.as_ref().is_some_and(|t| !t.complete())
    }

    /// The body for a hedge, sent beside the attempt in flight: nothing for a request
    /// without a body, a copy of the recording when it is whole; `None` while the app's
    /// body is still arriving (or outgrew the cap, or broke).
    pub fn fork(&self) -> Option<ReplayBody<A>> {
        match &self.tape {
            None if matches!(self.next, Next::Nothing) => Some(ReplayBody::Empty),
            None => None,
            Some(t) => t.copy_if_whole().map(|r| ReplayBody::Replay(Box::new(r))),
        }
    }

    /// Whether the next attempt can send the whole body as it is, without a replay: the
    /// request has none, or the one handed out never left (no connection took it).
    pub fn at_hand(&self) -> bool {
        !matches!(self.next, Next::Nothing) || self.tape.is_none()
    }

    /// Whether the app's body was handed to an attempt (and is recorded).
    pub fn recorded(&self) -> bool {
        self.tape.is_some()
    }

    /// Whether anything of the app's body has been read (an attempt that expected
    /// `100 Continue` and got a final answer first read none of it).
    pub fn started(&self) -> bool {
        self.tape
            .as_ref()
            .is_some_and(|t| t.tape.lock().unwrap_or_else(|p| p.into_inner()).started)
    }

    /// Gives a body still arriving up to `limit` to finish, so it can be replayed.
    pub async fn finish_within(&self, limit: Duration) {
        if let Some(t) = &self.tape {
            t.finish_within(limit).await;
        }
    }
}

impl<A: RetriedBody> Replayable for BodySource<A> {
    fn ready_for_retry(&mut self) -> Result<(), BodyState> {
        let Some(tape) = &self.tape else {
            return Ok(());
        };
        if !matches!(self.next, Next::Nothing) {
            // Never sent, or readied already.
            return Ok(());
        }
        self.next = Next::Replay(tape.replay()?);
        Ok(())
    }
}
