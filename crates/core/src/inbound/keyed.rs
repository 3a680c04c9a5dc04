//! A keyed request on the inbound side: [`super::dedupe`] applied to the transport.
//!
//! The first arrival's exchange with the app runs in a task of its own, not in the
//! caller's request: a caller that goes away once the app has its request must not
//! turn a key whose work is done into one whose answer is lost, so the task reads the
//! app's answer to its end and ends the claim whether or not anyone still listens. The
//! caller gets the answer's head through a oneshot and its body frame by frame through
//! a channel, as the app sends it: a response larger than `max_response` streams on
//! and is not kept.
//!
//! A duplicate gets the kept answer ([`replay`]), with `idempotent-replayed: true`, or
//! one of dedupe's own answers.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Response, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use prometheus::IntCounter;
use tokio::sync::{Notify, mpsc, oneshot};

use super::KeyedApp;
use super::app::{AppWire, DeadlineFields};
use super::dedupe::{Answer, Claim, Fingerprinter, Kept};
use crate::answer::{self, Refusal};
use crate::contract::outcome::outcome_of;
use crate::deadline::Deadline;
use crate::fault::Fault;
use crate::http::BoxError;
use crate::http::response::Fields;
use crate::metrics::Outcome;
use crate::server::{AppBody, RequestGuard, ResponseBody};
use crate::upstream::pool::Want;
use crate::upstream::request::{ContinueWait, RequestHead};
use crate::upstream::response::relayed;

pub use crate::contract::headers::{DEDUPE_HEADER, REPLAYED_HEADER as REPLAYED};

/// Once its caller has gone, how long the task waits for each further piece of the
/// app's answer before it gives the answer up (the key is then not replayable).
const ORPHAN_IDLE: Duration = Duration::from_secs(30);

/// What the task sends the app: the request's head, owned.
pub(super) struct HeadForApp {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub want: Want,
    pub deadline: Deadline,
    pub header: HeaderName,
    pub grpc: bool,
    /// The request's SERVER span as the app's parent, when it is traced.
    pub traceparent: Option<http::HeaderValue>,
}

/// The app's answer to a first arrival: its head, every field in the map, and its
/// outcome (`ok`, or another tollgate's verdict the app passed on).
pub(super) struct Head {
    pub parts: http::response::Parts,
    pub outcome: Outcome,
    pub body: Relayed,
}

/// The first arrivals' exchanges with the app still running, which a drain waits for:
/// on SIGTERM each is finished and its key completed within `drain_timeout`, whether
/// or not its caller still listens (a caller gone frees its connection at once, and
/// the drain would otherwise end the process under the exchange, leaving its key
/// running until its lease lapsed, and then not replayable).
#[derive(Debug, Default)]
pub struct Exchanges {
    running: AtomicUsize,
    ended: Notify,
}

/// One exchange counted in [`Exchanges`] while it lives.
struct Running(Arc<Exchanges>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.ended.notify_waiters();
        }
    }
}

impl Exchanges {
    fn start(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(self.clone())
    }

    /// Waits until none is running, for at most `limit`; whether none is.
    pub async fn finished_within(&self, limit: Duration) -> bool {
        let all = async {
            loop {
                let ended = self.ended.notified();
                let mut ended = std::pin::pin!(ended);
                ended.as_mut().enable();
                if self.running.load(Ordering::Acquire) == 0 {
                    return;
                }
                ended.await;
            }
        };
        tokio::time::timeout(limit, all).await.is_ok()
    }
}

/// Runs a first arrival's exchange with the app (carried by `wire`) in a task of its
/// own (counted in `exchanges`), and hands back the head of its answer (or why there is
/// none).
pub(super) async fn run<W: AppWire>(
    claim: Claim,
    app: (Arc<KeyedApp>, W),
    (exchange, exchanges): (HeadForApp, &Arc<Exchanges>),
    body: AppBody,
    exhausted: IntCounter,
) -> Result<Head, Fault> {
    let (tx, rx) = oneshot::channel();
    let running = exchanges.start();
    tokio::spawn(async move {
        drive(claim, app, exchange, body, exhausted, tx).await;
        drop(running);
    });
    // A task that panicked gave no answer: as if the app had broken the connection.
    rx.await.unwrap_or(Err(Fault::Reset))
}

async fn drive<W: AppWire>(
    claim: Claim,
    (app, wire): (Arc<KeyedApp>, W),
    x: HeadForApp,
    body: AppBody,
    exhausted: IntCounter,
    head_tx: oneshot::Sender<Result<Head, Fault>>,
) {
    let head = RequestHead::as_is(&x.method, &x.uri, &x.headers, ContinueWait::ZERO);
    let fields = DeadlineFields {
        deadline: x.deadline,
        header: &x.header,
        grpc: x.grpc,
        traceparent: x.traceparent.clone(),
    };
    let body = claim.body(body, Fingerprinter::of_request(&x.headers));
    let sent = wire.send(&app, x.want, &head, body, &fields, &exhausted);
    let resp = match sent.await {
        Ok(resp) => resp,
        Err(no) => {
            let _ = head_tx.send(Err(no.fault));
            // Never sent (no connection before the deadline, a stream it refused): the
            // app never had it. Otherwise it may have run, if it had all of the request.
            if no.sent {
                claim.failed().await;
            } else {
                claim.release().await;
            }
            return;
        }
    };
    let outcome = outcome_of(resp.status(), Fields::of(&resp));
    // Every field in the map: the answer goes back as a body of the service's own.
    let (parts, mut from_app) = relayed(resp, Version::HTTP_2);
    let mut keeper = claim.keeper(parts.status, &parts.headers);
    let (frames, rx) = mpsc::channel(4);
    let mut listening = head_tx
        .send(Ok(Head {
            parts,
            outcome,
            body: Relayed(rx),
        }))
        .is_ok();
    loop {
        let next = if listening {
            Some(from_app.frame().await)
        } else {
            tokio::time::timeout(ORPHAN_IDLE, from_app.frame())
                .await
                .ok()
        };
        match next {
            Some(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    keeper.data(data);
                } else if let Some(t) = frame.trailers_ref() {
                    keeper.trailers(t);
                }
                if listening {
                    listening = frames.send(Ok(frame)).await.is_ok();
                }
                // Nobody listens and nothing will be kept: no reason to read on.
                if !listening && !keeper.within() {
                    claim.not_replayable().await;
                    return;
                }
            }
            Some(None) => {
                claim.complete(keeper).await;
                return;
            }
            Some(Some(Err(e))) => {
                if listening {
                    let _ = frames.send(Err(e)).await;
                }
                claim.failed().await;
                return;
            }
            None => {
                claim.failed().await;
                return;
            }
        }
    }
}

/// The app's answer's body, as the task relays it.
pub(super) struct Relayed(mpsc::Receiver<Result<Frame<Bytes>, BoxError>>);

impl Body for Relayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx)
    }
}

/// A kept answer as a body: its data, then its trailers.
struct KeptBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for KeptBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(d) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.data, &self.trailers) {
            // With trailers to come the body is chunked, not of a length.
            (_, Some(_)) => SizeHint::default(),
            (d, None) => SizeHint::with_exact(d.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

/// The kept answer, replayed: the app is not called.
pub(super) fn replay(kept: &Kept, version: Version, guard: RequestGuard) -> Response<ResponseBody> {
    let body = KeptBody {
        data: (!kept.body.is_empty()).then(|| kept.body.clone()),
        trailers: kept.trailers.clone(),
    };
    let mut resp = Response::new(ResponseBody::boxed(body.boxed(), guard));
    *resp.status_mut() = kept.status;
    *resp.version_mut() = version;
    *resp.headers_mut() = kept.headers.clone();
    resp.headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    resp
}

/// The answer dedupe makes itself to a duplicate (all but a replay).
pub(super) fn refusal(answer: &Answer) -> Option<&'static Refusal> {
    Some(match answer {
        Answer::Replay(_) | Answer::BodyError => return None,
        Answer::Mismatch => &answer::KEY_MISMATCH,
        Answer::NotReplayable => &answer::NOT_REPLAYABLE,
        Answer::InProgress => &answer::IN_PROGRESS,
        Answer::Unavailable => &answer::DEDUPE_UNAVAILABLE,
    })
}
