//! A duplicate: a keyed request that found its key already claimed, and the answer it
//! gets instead of a run.
//!
//! Its body is read (and hashed, never kept) first: a duplicate never goes to the app,
//! and its fingerprint tells a retry (`Replay`) from a caller reusing a key for
//! another request (`422 key-mismatch`). Then:
//! - done: the kept answer, with the fingerprints equal;
//! - gone: `500 not-replayable` (it may have run; its answer is not kept);
//! - running: it waits for the first to end, within its own deadline, and gets the
//!   first's answer; at the deadline `409 in-progress`. On this replica the end of the
//!   first wakes it ([`super::wake`]); a first on another replica is seen by polling
//!   the shared store, 5 ms after the look, doubling to at most every 250 ms (a handful
//!   of small reads a second per waiting duplicate, and no subscription to keep). A
//!   pub/sub channel would wake it sooner, but it needs a connection of its own per
//!   replica and a poll anyway for a message missed while reconnecting;
//! - free (the first was released while it waited): `409 in-progress`. Its body is
//!   spent, so it cannot run now; the caller's retry will.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body::Body;
use http_body_util::BodyExt;
use tokio::time::{Instant, sleep, sleep_until};

use super::kept::Kept;
use super::scope::{Fingerprint, Fingerprinter, Scope};
use super::store::{Found, Store};
use super::{Backend, Core};
use crate::metrics::dedupe::DedupeResult;

const POLL_FIRST: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(250);

/// What a duplicate gets.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// The first's answer, replayed with `idempotent-replayed: true`.
    Replay(Arc<Kept>),
    /// `422`, outcome `key-mismatch`.
    Mismatch,
    /// `500`, outcome `not-replayable`.
    NotReplayable,
    /// `409`, outcome `in-progress`, `Retry-After: 1`.
    InProgress,
    /// `503`, outcome `dedupe-unavailable`, with `Retry-After`: the store failed.
    Unavailable,
    /// The caller's body broke before it was read: nobody is left to answer.
    BodyError,
}

impl Answer {
    /// The status and outcome of an answer tollgate makes itself (`None` for a replay,
    /// which is the app's own, and a broken body).
    pub fn refusal(&self) -> Option<(StatusCode, &'static str)> {
        match self {
            Answer::Replay(_) | Answer::BodyError => None,
            Answer::Mismatch => Some((StatusCode::UNPROCESSABLE_ENTITY, "key-mismatch")),
            Answer::NotReplayable => Some((StatusCode::INTERNAL_SERVER_ERROR, "not-replayable")),
            Answer::InProgress => Some((StatusCode::CONFLICT, "in-progress")),
            Answer::Unavailable => Some((StatusCode::SERVICE_UNAVAILABLE, "dedupe-unavailable")),
        }
    }
}

impl Answer {
    /// The `Retry-After` (seconds) of an answer that asks for a retry later: `1` for
    /// `in-progress` (the draft's answer) and `dedupe-unavailable`.
    pub fn retry_after(&self) -> Option<u32> {
        matches!(self, Answer::InProgress | Answer::Unavailable).then_some(1)
    }
}

/// A keyed request whose key another request holds or held.
pub struct Duplicate {
    pub(super) scope: Scope,
    pub(super) found: Found,
    pub(super) store: Backend,
    pub(super) core: Arc<Core>,
}

impl std::fmt::Debug for Duplicate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Duplicate")
            .field("scope", &self.scope)
            .field("found", &self.found)
            .finish_non_exhaustive()
    }
}

impl Duplicate {
    /// Reads the duplicate's body (hashing it with `f`, the request's
    /// [`Fingerprinter::of_request`], keeping nothing) within `deadline`, then settles it.
    pub async fn settle_body<B>(
        self,
        body: B,
        mut f: Fingerprinter,
        deadline: Option<Instant>,
    ) -> Answer
    where
        B: Body<Data = Bytes>,
    {
        let hashing = async {
            let mut body = std::pin::pin!(body);
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|_| ())?;
                if let Some(data) = frame.data_ref() {
                    f.update(data);
                }
            }
            Ok::<_, ()>(f.finish())
        };
        let hashed = match deadline {
            Some(d) => tokio::time::timeout_at(d, hashing).await.ok(),
            None => Some(hashing.await),
        };
        match hashed {
            Some(Ok(fingerprint)) => self.settle(fingerprint, deadline).await,
            Some(Err(())) => Answer::BodyError,
            None => self.answer(Answer::InProgress, false),
        }
    }

    /// The answer for a duplicate whose body has `fingerprint`, waiting until
    /// `deadline` for a first still running.
    pub async fn settle(self, fingerprint: Fingerprint, deadline: Option<Instant>) -> Answer {
        let mut found = self.found.clone();
        let mut waited = false;
        let mut poll = POLL_FIRST;
        loop {
            match found {
                Found::Done {
                    fingerprint: f,
                    kept,
                } => {
                    let answer = if f == fingerprint {
                        Answer::Replay(kept)
                    } else {
                        Answer::Mismatch
                    };
                    return self.answer(answer, waited);
                }
                Found::Gone {
                    fingerprint: Some(f),
                } if f != fingerprint => return self.answer(Answer::Mismatch, waited),
                Found::Gone { .. } => return self.answer(Answer::NotReplayable, waited),
                Found::Free | Found::Claimed if waited => {
                    return self.answer(Answer::InProgress, waited);
                }
                Found::Free | Found::Claimed | Found::Running => {}
            }
            // Subscribed before the look, so an end after it wakes the wait below.
            let mut ended = self.core.notices.subscribe(&self.scope);
            found = match self.core.timed(self.store.look(&self.scope)).await {
                Ok(f) => f,
                Err(e) => {
                    self.core.store_failed(&e);
                    return Answer::Unavailable;
                }
            };
            if found != Found::Running {
                waited = true;
                continue;
            }
            let shared = self.store.shared();
            tokio::select! {
                _ = ended.ended() => {}
                _ = sleep(poll), if shared => poll = (poll * 2).min(POLL_MAX),
                _ = wait_until(deadline) => return self.answer(Answer::InProgress, true),
            }
            waited = true;
        }
    }

    /// Counts the answer.
    fn answer(&self, answer: Answer, waited: bool) -> Answer {
        let result = match &answer {
            Answer::Replay(_) if waited => DedupeResult::Joined,
            Answer::Replay(_) => DedupeResult::Replayed,
            Answer::Mismatch => DedupeResult::Mismatch,
            Answer::NotReplayable => DedupeResult::NotKept,
            Answer::InProgress => DedupeResult::InProgress,
            Answer::Unavailable => DedupeResult::StoreError,
            Answer::BodyError => return answer,
        };
        self.core.metrics().count(result);
        answer
    }
}

async fn wait_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => sleep_until(d).await,
        None => std::future::pending().await,
    }
}
