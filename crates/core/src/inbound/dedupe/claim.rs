//! A claim: the right of one request to run its key, and the duty to say how it ended.
//!
//! The request's body goes to the app through [`Claim::body`], which hashes it as it
//! streams and notes the moment the app has had all of it. That moment decides what
//! an unanswered request leaves behind: before it, the app never had the whole
//! request, so the key is released and a retry may run it; after it, the app may have
//! done the work, so the key is kept as not replayable.
//!
//! Ending a claim:
//! - [`Claim::complete`]: the app's final response, gathered by a [`Keeper`]. Kept
//!   when its status is one that is kept, it fit `max_response`, and the app had the
//!   whole request; a status that says the request did not run releases the key; a
//!   response too large to keep leaves it not replayable.
//! - [`Claim::release`]: tollgate answered in the app's place before the app had the
//!   request (refused connection, no descriptor, overloaded).
//! - [`Claim::failed`]: the app reset, closed or timed out before its head.
//! - Dropped without any of these (the request was cancelled): as `failed`. A claim on
//!   a shared store ends in a task of its own then; if that fails too, the lease
//!   lapses and the key is not replayable (see [`super::redis`]).
//!
//! While a claim on a shared store runs, a task renews its lease (every 10 s, for 30 s
//! from then), and moves the key's expiry forward with it, until the exchange ends.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::task::JoinHandle;

use super::kept::{Keeper, keeps};
use super::memory::MemoryStore;
use super::scope::{Fingerprint, Fingerprinter, Scope};
use super::store::{Ending, Found, Store, Token};
use super::{Backend, Core, Outage};

/// How a claim ended, for the service's log and for tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The response is kept: duplicates replay it.
    Kept,
    /// The key is free again: a retry runs.
    Released,
    /// Duplicates get `500 not-replayable`.
    NotReplayable,
    /// The claim no longer held its key (its lease lapsed), or the store failed: what
    /// duplicates see is what the store holds.
    Lost,
}

/// What the app has had of the request: the body's fingerprint, once all of it went.
#[derive(Debug, Default)]
pub struct Delivery(OnceLock<Fingerprint>);

impl Delivery {
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.0.get().copied()
    }
}

/// The right to run a key.
pub struct Claim {
    held: Option<Held>,
}

struct Held {
    scope: Scope,
    token: Token,
    store: Backend,
    core: Arc<Core>,
    delivery: Arc<Delivery>,
    renewal: Option<JoinHandle<()>>,
    /// With `on_store_error = "open"` and the claim in the shared store: this replica's
    /// memory, where the ending goes when the shared store fails as the request ends
    /// (written to the shared store once it answers again).
    fallback: Option<(Arc<MemoryStore>, Arc<Outage>)>,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("scope", &self.held.as_ref().map(|h| h.scope))
            .finish_non_exhaustive()
    }
}

impl Claim {
    pub(super) fn new(
        scope: Scope,
        token: Token,
        store: Backend,
        core: Arc<Core>,
        fallback: Option<(Arc<MemoryStore>, Arc<Outage>)>,
    ) -> Claim {
        let renewal = store.shared().then(|| {
            let store = store.clone();
            let (lease, every, ttl) = (core.lease, core.renew_every, core.config.ttl);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    // A failed renewal is retried at the next turn; a lost claim stops.
                    if let Ok(false) = store.renew(&scope, token, lease, ttl).await {
                        return;
                    }
                }
            })
        });
        Claim {
            held: Some(Held {
                scope,
                token,
                store,
                core,
                delivery: Arc::default(),
                renewal,
                fallback,
            }),
        }
    }

    /// The request's body on its way to the app: hashed as it streams, and the app
    /// counted as having the whole request once its end has been read.
    /// `hasher` is the request's ([`Fingerprinter::of_request`]).
    pub fn body<B: Body<Data = Bytes> + Unpin>(&self, body: B, hasher: Fingerprinter) -> Hashed<B> {
        let delivery = self.delivery();
        let mut hashed = Hashed {
            inner: body,
            hasher: Some(hasher),
            delivery,
        };
        // A body that is over before it starts may never be polled: the head carries
        // the whole request.
        if hashed.inner.is_end_stream() {
            hashed.done();
        }
        hashed
    }

    /// What the app has had of the request.
    pub fn delivery(&self) -> Arc<Delivery> {
        self.held
            .as_ref()
            .map_or_else(Arc::default, |h| h.delivery.clone())
    }

    /// A keeper for the app's response, bounded by `max_response`.
    pub fn keeper(&self, status: StatusCode, headers: &HeaderMap) -> Keeper {
        let limit = self.held.as_ref().map_or(0, |h| h.core.config.max_response);
        Keeper::new(status, headers, limit)
    }

    /// Ends the claim with the app's final response.
    pub async fn complete(mut self, keeper: Keeper) -> Ended {
        let Some(held) = self.held.take() else {
            return Ended::Lost;
        };
        let status = keeper.status();
        let fingerprint = held.delivery.fingerprint();
        match (keeps(status), fingerprint, keeper.finish()) {
            // The request did not run, or may be asked again; or the app answered
            // before it had the whole request (it cannot have run what it never got).
            (false, _, _) | (true, None, _) => held.release().await,
            (true, Some(fingerprint), Some(kept)) => {
                held.end(Ending::Kept {
                    fingerprint,
                    kept: Arc::new(kept),
                })
                .await
            }
            (true, Some(fingerprint), None) => {
                let fingerprint = Some(fingerprint);
                held.end(Ending::NotReplayable { fingerprint }).await
            }
        }
    }

    /// Frees the key: the app never had the request (tollgate answered in its place).
    pub async fn release(mut self) -> Ended {
        match self.held.take() {
            Some(held) => held.release().await,
            None => Ended::Lost,
        }
    }

    /// The app gave no response head (reset, closed, timed out): not replayable if it
    /// had the whole request, released if not.
    pub async fn failed(mut self) -> Ended {
        match self.held.take() {
            Some(held) => held.failed().await,
            None => Ended::Lost,
        }
    }

    /// Marks the key not replayable whatever the app had.
    pub async fn not_replayable(mut self) -> Ended {
        let Some(held) = self.held.take() else {
            return Ended::Lost;
        };
        let fingerprint = held.delivery.fingerprint();
        held.end(Ending::NotReplayable { fingerprint }).await
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        match (&held.store, tokio::runtime::Handle::try_current()) {
            // The memory store answers at once: end it here, so a duplicate arriving
            // next sees it ended.
            (Backend::Memory(m), _) => {
                if let Some(renewal) = &held.renewal {
                    renewal.abort();
                }
                match held.delivery.fingerprint() {
                    Some(fingerprint) => {
                        let ending = Ending::NotReplayable {
                            fingerprint: Some(fingerprint),
                        };
                        let ttl = held.core.config.ttl;
                        m.finish_now(&held.scope, held.token, &ending, ttl);
                    }
                    None => m.release_now(&held.scope, held.token),
                }
                held.core.notices.wake(&held.scope);
            }
            (Backend::Redis(_), Ok(rt)) => {
                rt.spawn(held.failed());
            }
            // No runtime to end it on: the lease will.
            (Backend::Redis(_), Err(_)) => {}
        }
    }
}

impl Held {
    async fn failed(self) -> Ended {
        match self.delivery.fingerprint() {
            Some(fingerprint) => {
                let fingerprint = Some(fingerprint);
                self.end(Ending::NotReplayable { fingerprint }).await
            }
            None => self.release().await,
        }
    }

    async fn end(self, ending: Ending) -> Ended {
        self.stop_renewal();
        let ttl = self.core.config.ttl;
        let kept = matches!(ending, Ending::Kept { .. });
        let result = self
            .core
            .timed(self.store.finish(&self.scope, self.token, &ending, ttl))
            .await;
        self.core.notices.wake(&self.scope);
        match result {
            Ok(true) if kept => Ended::Kept,
            Ok(true) => Ended::NotReplayable,
            Ok(false) => Ended::Lost,
            Err(e) => {
                self.core.store_failed(&e);
                // The request ran: kept in this replica's memory until the shared store
                // has it, so a duplicate here never runs it again.
                let Some((memory, outage)) = &self.fallback else {
                    return Ended::Lost;
                };
                let held = memory.claim_now(&self.scope, self.token) == Found::Claimed
                    && memory.finish_now(&self.scope, self.token, &ending, ttl);
                if !held {
                    return Ended::Lost;
                }
                outage.add(self.scope);
                self.core.notices.wake(&self.scope);
                if kept {
                    Ended::Kept
                } else {
                    Ended::NotReplayable
                }
            }
        }
    }

    async fn release(self) -> Ended {
        self.stop_renewal();
        let result = self
            .core
            .timed(self.store.release(&self.scope, self.token))
            .await;
        self.core.notices.wake(&self.scope);
        match result {
            Ok(()) => Ended::Released,
            Err(e) => {
                self.core.store_failed(&e);
                Ended::Lost
            }
        }
    }

    fn stop_renewal(&self) {
        if let Some(r) = &self.renewal {
            r.abort();
        }
    }
}

/// A request body on its way to the app, hashed as it passes.
#[derive(Debug)]
pub struct Hashed<B> {
    inner: B,
    hasher: Option<Fingerprinter>,
    delivery: Arc<Delivery>,
}

impl<B> Hashed<B> {
    fn done(&mut self) {
        if let Some(h) = self.hasher.take() {
            let _ = self.delivery.0.set(h.finish());
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Hashed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(h)) = (frame.data_ref(), this.hasher.as_mut()) {
                    h.update(data);
                }
                // A sender may stop polling once the body says it is over.
                if this.inner.is_end_stream() {
                    this.done();
                }
            }
            Poll::Ready(None) => this.done(),
            // A broken body never reached the app whole.
            Poll::Ready(Some(Err(_))) => this.hasher = None,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
