//! What a store promises: the state of a key, moved only by atomic steps.
//!
//! A key is free, running (claimed by one request, under a token), done (its answer
//! kept, with the fingerprint of the body that earned it) or gone (it may have run and
//! its answer is not kept). Every step that ends a claim names the claim's token, so a
//! claim that lost its key (its lease lapsed, the store was emptied) can never end
//! what another claim holds now: the compare-and-set that makes "one run per key"
//! hold across replicas.
//!
//! The memory store ([`super::memory`]) and the Redis store ([`super::redis`]) keep
//! these promises the same way, and the tests of the state machine run against both.

use std::sync::Arc;
use std::time::Duration;

use super::kept::Kept;
use super::scope::{Fingerprint, Scope};

/// Who holds a claim: random, so no two claims share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token(pub [u8; 16]);

impl Token {
    pub fn new() -> Token {
        Token(fastrand::u128(..).to_le_bytes())
    }
}

impl Default for Token {
    fn default() -> Self {
        Token::new()
    }
}

/// What a key holds, as a store found it.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// It was free, and is now claimed with the token asked with (a claim only).
    Claimed,
    /// Nothing holds it (a look only).
    Free,
    /// Another request is running it.
    Running,
    /// It ran; its answer is kept.
    Done {
        fingerprint: Fingerprint,
        kept: Arc<Kept>,
    },
    /// It may have run, and its answer is gone (or was too large to keep). The
    /// fingerprint is unknown when the claim's lease lapsed (its replica went away).
    Gone { fingerprint: Option<Fingerprint> },
}

/// How a claim ends when it is not released.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    Kept {
        fingerprint: Fingerprint,
        kept: Arc<Kept>,
    },
    NotReplayable {
        fingerprint: Option<Fingerprint>,
    },
}

/// Why a store could not answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("no answer within store_timeout ({0:?})")]
    Timeout(Duration),
    #[error("{0}")]
    Failed(String),
    #[error("the store returned a record this version cannot read")]
    Damaged,
}

/// A place keys are kept. Each step is atomic; none waits for another request.
pub trait Store: Send + Sync + 'static {
    /// Claims `scope` with `token` if it is free (for `lease`, where claims can outlive
    /// the process that made them), or tells what holds it.
    fn claim(
        &self,
        scope: &Scope,
        token: Token,
        lease: Duration,
        ttl: Duration,
    ) -> impl Future<Output = Result<Found, StoreError>> + Send;

    /// What holds `scope`, without claiming it.
    fn look(&self, scope: &Scope) -> impl Future<Output = Result<Found, StoreError>> + Send;

    /// Ends the claim `token` holds on `scope` as `ending`, kept for `ttl`. Returns
    /// whether it was still ours (a key that vanished meanwhile is written too, unless
    /// another claim holds it).
    fn finish(
        &self,
        scope: &Scope,
        token: Token,
        ending: &Ending,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Frees `scope` if `token` still holds it.
    fn release(
        &self,
        scope: &Scope,
        token: Token,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Extends the lease of the claim `token` holds to `lease` from now, and the key's
    /// life with it (to `lease + ttl`); whether it still held it.
    fn renew(
        &self,
        scope: &Scope,
        token: Token,
        lease: Duration,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}
