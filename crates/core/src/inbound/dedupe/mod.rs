//! Exactly once on the callee's side: a request carrying an idempotency key runs once,
//! and every duplicate of it gets the first one's answer.
//!
//! A retried POST can charge a card twice: the first attempt did its work and only its
//! response was lost. The caller's side gives such requests a key (`idempotency-key`),
//! the same on every attempt; this module makes the callee's side run each key once,
//! the way payment APIs do. It is independent of the transport: the inbound service
//! asks it what to do with a keyed request and tells it how the request ended.
//!
//! # How the service uses it
//!
//! ```text
//! let Some(scope) = dedupe.scope(&method, &uri, &headers) else { /* not keyed: as before */ };
//! let hasher = Fingerprinter::of_request(&headers); // the body and its Content-Type
//! match dedupe.begin(scope).await {
//!     Begin::Run(claim) => {
//!         // send claim.body(body, hasher) to the app;
//!         // no head: claim.release() (the app never had it) or claim.failed();
//!         // a head: keeper = claim.keeper(status, &headers), fed each frame as it
//!         //         streams back, then claim.complete(keeper) at the body's end.
//!     }
//!     Begin::Duplicate(dup) => match dup.settle_body(body, hasher, deadline).await {
//!         Answer::Replay(kept) => /* kept response + idempotent-replayed: true */,
//!         other => /* other.refusal(): 409 / 422 / 500 / 503 */,
//!     },
//!     Begin::Unavailable => /* 503 dedupe-unavailable + Retry-After */,
//! }
//! ```
//!
//! Order on the inbound side: dedupe first (a replay or a join costs the app nothing),
//! then the fleet retry budget and the concurrency limit. A request without a key, or
//! of a method not listed, never reaches a store: [`Dedupe::scope`] says so from its
//! head alone.
//!
//! # The parts
//!
//! - [`scope`]: what makes two requests the same (the key's scope, the body's
//!   fingerprint); [`kept`]: the response kept for replay;
//! - [`store`]: what a store promises; [`memory`] and [`redis`]: the two stores;
//! - [`claim`]: the first arrival's right to run, and how it ends; [`duplicate`]: what
//!   every other arrival gets; [`wake`]: waking the duplicates that wait here.
//!
//! # When the store fails
//!
//! Only the Redis store can fail (or take longer than `store_timeout`). A keyed request
//! whose claim fails is counted `store-error`, a warning is logged at most once a
//! minute, and `on_store_error` decides here, so the service only applies the answer:
//! `closed` answers [`Begin::Unavailable`]; `open` claims in this replica's memory
//! store instead (duplicates landing on other replicas may run again while the store
//! is down). The keys run so are remembered: until they are written to the shared
//! store, which happens once it answers again, a keyed request first looks in this
//! replica's memory, so a duplicate here never runs one twice.

pub mod claim;
pub mod duplicate;
pub mod kept;
pub mod memory;
pub mod redis;
pub mod scope;
pub mod store;
pub mod wake;

#[cfg(test)]
mod outage_tests;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderMap, Method, Uri};
use tokio::time::Instant;

pub use claim::{Claim, Ended, Hashed};
pub use duplicate::{Answer, Duplicate};
pub use kept::{Keeper, Kept};
pub use scope::{Fingerprint, Fingerprinter, KeyFields, Scope};

use crate::config::{DedupeConfig, DedupeStore, OnStoreError};
use crate::contract::dedupe::{DedupeAdvert, DedupeScope, StoreId};
use crate::contract::headers::DEDUPE_HEADER;
use crate::metrics::Metrics;
use crate::metrics::dedupe::{DedupeMetrics, DedupeResult};
use memory::MemoryStore;
use redis::{LEASE, RENEW_EVERY, RedisStore};
use store::{Ending, Found, Store, StoreError, Token};

/// What the service does with a keyed request.
#[derive(Debug)]
pub enum Begin {
    /// The first arrival: send it to the app, and end the claim.
    Run(Claim),
    /// Another request holds or held the key: settle it.
    Duplicate(Duplicate),
    /// The store failed and `on_store_error = "closed"`: `503 dedupe-unavailable`.
    Unavailable,
}

/// The dedupe core, built from `[inbound.dedupe]`.
pub struct Dedupe {
    core: Arc<Core>,
    primary: Backend,
    /// This replica's memory store, standing in for a failing shared one
    /// (`on_store_error = "open"`).
    fallback: Option<Arc<MemoryStore>>,
    /// The keys the fallback ran, not yet written to the shared store (with
    /// `fallback`).
    outage: Option<Arc<Outage>>,
    /// `GET` is one of `methods` (it seldom is): a GET, nearly every request a callee
    /// gets, passes with one comparison.
    gets: bool,
    /// What every answer says (`x-tollgate-dedupe`), as a value and as a line of an
    /// HTTP/1.1 head.
    advert: (&'static str, &'static str),
}

impl std::fmt::Debug for Dedupe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dedupe")
            .field("store", &self.core.config.store.describe())
            .finish_non_exhaustive()
    }
}

/// What claims, duplicates and the core share.
pub(crate) struct Core {
    config: DedupeConfig,
    /// Where a key and its caller's identity are read from.
    keys: KeyFields,
    metrics: Arc<Metrics>,
    /// Shared with the core a reload replaces: a duplicate that began on one waits on
    /// a claim that may end on the other.
    notices: Arc<wake::Notices>,
    warned: Warned,
    /// How long a claim on a shared store holds its key unrenewed, and how often it is
    /// renewed ([`LEASE`], [`RENEW_EVERY`]; shorter in tests).
    lease: Duration,
    renew_every: Duration,
}

/// One of the two stores.
#[derive(Clone)]
pub(crate) enum Backend {
    Memory(Arc<MemoryStore>),
    Redis(Arc<RedisStore>),
}

impl Dedupe {
    /// The core of `config`. On a reload, `previous` hands over what must outlive it:
    /// the memory store's keys and the connection to Redis, while they stay the same
    /// kind of store at the same place, and the duplicates waiting on this replica.
    pub fn new(config: &DedupeConfig, metrics: Arc<Metrics>, previous: Option<&Dedupe>) -> Dedupe {
        let gauge = metrics.dedupe().entries.clone();
        let memory = |previous: Option<&Arc<MemoryStore>>| {
            let m = previous.cloned().unwrap_or_else(|| {
                Arc::new(MemoryStore::new(
                    MemoryStore::SHARDS,
                    config.max_entries,
                    Some(gauge.clone()),
                ))
            });
            m.set_max_entries(config.max_entries);
            m
        };
        let old_memory = previous.and_then(|p| match &p.primary {
            Backend::Memory(m) => Some(m),
            Backend::Redis(_) => p.fallback.as_ref(),
        });
        let primary = match &config.store {
            DedupeStore::Memory => Backend::Memory(memory(old_memory)),
            DedupeStore::Redis(addr) => {
                let same = previous.and_then(|p| match &p.primary {
                    Backend::Redis(r)
                        if r.addr() == addr && r.timeout() == config.store_timeout =>
                    {
                        Some(r.clone())
                    }
                    _ => None,
                });
                Backend::Redis(same.unwrap_or_else(|| {
                    Arc::new(RedisStore::new(addr.clone(), config.store_timeout))
                }))
            }
        };
        let fallback = match (&primary, config.on_store_error) {
            (Backend::Redis(_), OnStoreError::Open) => Some(memory(old_memory)),
            _ => None,
        };
        let outage = fallback
            .as_ref()
            .map(|_| previous.and_then(|p| p.outage.clone()).unwrap_or_default());
        let scope = match &primary {
            Backend::Memory(m) => DedupeScope::Replica(m.id()),
            Backend::Redis(_) => DedupeScope::Shared,
        };
        let advert = DedupeAdvert {
            header: config.header.clone(),
            scope,
        }
        .to_value();
        let header = DEDUPE_HEADER;
        let name = header.as_str();
        let line = intern(format!("{name}: {advert}"));
        // The value, as the line's own tail: made from a header name and hex digits, it
        // is a valid field value.
        let advert = (line.get(name.len() + 2..).unwrap_or("on"), line);
        Dedupe {
            advert,
            outage,
            core: Arc::new(Core {
                config: config.clone(),
                keys: KeyFields {
                    header: config.header.clone(),
                    identity: config.identity_headers.clone(),
                },
                metrics,
                notices: previous.map_or_else(Arc::default, |p| p.core.notices.clone()),
                warned: Warned::default(),
                lease: LEASE,
                renew_every: RENEW_EVERY,
            }),
            primary,
            fallback,
            gets: config.methods.contains(&Method::GET),
        }
    }

    pub fn config(&self) -> &DedupeConfig {
        &self.core.config
    }

    /// The scope of a request this dedupes: a listed method with an idempotency key.
    /// `None`: it passes through untouched. Reads the head only.
    #[inline]
    pub fn scope(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Option<Scope> {
        if *method == Method::GET && !self.gets {
            return None;
        }
        self.listed_scope(method, uri, headers)
    }

    fn listed_scope(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Option<Scope> {
        if !self.core.config.methods.contains(method) {
            return None;
        }
        Scope::of(method, uri, headers, &self.core.keys)
    }

    /// The header a key is read from.
    pub fn header(&self) -> &http::HeaderName {
        &self.core.keys.header
    }

    /// What every answer says: `x-tollgate-dedupe` as a value, and as a line of an
    /// HTTP/1.1 head. Both static text: an answer's field is made from it (no count shared by every
    /// worker is touched), and only when it is not written as a line.
    pub fn advert(&self) -> (&'static str, &'static str) {
        self.advert
    }

    /// Whether a keyed request names a store (`x-tollgate-dedupe-store`, `named`) that
    /// is not this replica's: a caller's retry of a request that may have run on a
    /// replica whose keys this one never held (it restarted, or the retry went to
    /// another pod behind one address). It must not run here: `500 not-replayable`.
    pub fn foreign_store(&self, named: Option<StoreId>) -> bool {
        let Some(named) = named else {
            return false;
        };
        let foreign = match &self.primary {
            Backend::Memory(m) => named != m.id(),
            // Every replica's keys are in the shared store.
            Backend::Redis(_) => false,
        };
        if foreign {
            self.core.metrics().count(DedupeResult::NotKept);
        }
        foreign
    }

    /// Claims `scope` for a request about to run, or finds what holds it.
    pub async fn begin(&self, scope: Scope) -> Begin {
        // A key this replica ran while the shared store failed is answered from its
        // memory until the store has it: a duplicate here never runs it again.
        if let (Some(fallback), Some(outage)) = (&self.fallback, &self.outage)
            && outage.pending()
        {
            let found = fallback.look_now(&scope);
            if found != Found::Free {
                return Begin::Duplicate(Duplicate {
                    scope,
                    found,
                    store: Backend::Memory(fallback.clone()),
                    core: self.core.clone(),
                });
            }
        }
        let token = Token::new();
        let ttl = self.core.config.ttl;
        let claimed = self
            .core
            .timed(self.primary.claim(&scope, token, self.core.lease, ttl))
            .await;
        let (found, store) = match claimed {
            Ok(found) => {
                self.write_outage();
                (found, self.primary.clone())
            }
            Err(e) => {
                self.core.store_failed(&e);
                self.forget(scope, token);
                let (Some(fallback), Some(outage)) = (&self.fallback, &self.outage) else {
                    return Begin::Unavailable;
                };
                let found = fallback.claim_now(&scope, token);
                if found == Found::Claimed {
                    outage.add(scope);
                }
                (found, Backend::Memory(fallback.clone()))
            }
        };
        if found == Found::Claimed {
            self.core.metrics().count(DedupeResult::First);
            // Claimed in the shared store: should it fail when the request ends, the
            // ending is kept in this replica's memory (`on_store_error = "open"`).
            let fallback = match (&store, &self.fallback, &self.outage) {
                (Backend::Redis(_), Some(f), Some(o)) => Some((f.clone(), o.clone())),
                _ => None,
            };
            return Begin::Run(Claim::new(scope, token, store, self.core.clone(), fallback));
        }
        Begin::Duplicate(Duplicate {
            scope,
            found,
            store,
            core: self.core.clone(),
        })
    }

    /// A claim that failed here (too slow) may still reach the store later, and would
    /// hold the key for nobody until its lease lapsed (and then leave it not
    /// replayable, though the request never ran here). A release sent behind it on the
    /// same connection, which Redis runs in order, frees it again.
    fn forget(&self, scope: Scope, token: Token) {
        if let Backend::Redis(r) = &self.primary {
            let r = r.clone();
            tokio::spawn(async move { r.release(&scope, token).await });
        }
    }

    /// The shared store answers again: writes the keys the fallback ran meanwhile to
    /// it, in a task of its own (one at a time).
    fn write_outage(&self) {
        let (Some(outage), Some(fallback), Backend::Redis(redis)) =
            (&self.outage, &self.fallback, &self.primary)
        else {
            return;
        };
        if !outage.pending() || outage.writing.swap(true, Ordering::Acquire) {
            return;
        }
        let (outage, fallback, redis) = (outage.clone(), fallback.clone(), redis.clone());
        let ttl = self.core.config.ttl;
        tokio::spawn(async move {
            for scope in outage.keys() {
                let ending = match fallback.look_now(&scope) {
                    // Written once it ends (at a later turn).
                    Found::Running => continue,
                    Found::Done { fingerprint, kept } => Ending::Kept { fingerprint, kept },
                    Found::Gone { fingerprint } => Ending::NotReplayable { fingerprint },
                    // Released, or expired: nothing to write.
                    Found::Free | Found::Claimed => {
                        outage.remove(&scope);
                        continue;
                    }
                };
                match redis.put(&scope, &ending, ttl).await {
                    Ok(_) => outage.remove(&scope),
                    // Down again: the next answer tries again.
                    Err(_) => break,
                }
            }
            outage.writing.store(false, Ordering::Release);
        });
    }

    /// A shorter lease and renewal, for tests that watch a lease lapse or be renewed.
    #[cfg(test)]
    pub(crate) fn set_lease(&mut self, lease: Duration, renew_every: Duration) {
        if let Some(core) = Arc::get_mut(&mut self.core) {
            core.lease = lease;
            core.renew_every = renew_every;
        }
    }

    /// Removes the memory store's expired keys (on the inbound side's sweep timer).
    pub fn sweep(&self) {
        if let Some(m) = self.memory() {
            m.sweep();
        }
    }

    /// The memory store in use, primary or fallback.
    pub fn memory(&self) -> Option<&Arc<MemoryStore>> {
        match &self.primary {
            Backend::Memory(m) => Some(m),
            Backend::Redis(_) => self.fallback.as_ref(),
        }
    }
}

impl Core {
    fn metrics(&self) -> &DedupeMetrics {
        self.metrics.dedupe()
    }

    /// Runs one store operation, timed.
    async fn timed<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let result = op.await;
        self.metrics()
            .store_seconds
            .observe(start.elapsed().as_secs_f64());
        result
    }

    /// Counts a failed store operation, and warns about it at most once a minute.
    fn store_failed(&self, e: &StoreError) {
        self.metrics().count(DedupeResult::StoreError);
        if self.warned.now_and_then(Instant::now()) {
            tracing::warn!(
                store = %self.config.store.describe(),
                error = %e,
                on_store_error = self.config.on_store_error.as_str(),
                "the dedupe store failed: keyed requests are {} (this warning repeats at most once a minute)",
                match self.config.on_store_error {
                    OnStoreError::Closed => "answered 503 dedupe-unavailable",
                    OnStoreError::Open => "deduplicated on this replica only",
                },
            );
        }
    }
}

/// The keys the fallback memory store ran while the shared store failed, until they
/// are written to it. Looked at by every keyed request only while there are some.
#[derive(Debug, Default)]
pub(super) struct Outage {
    keys: std::sync::Mutex<Vec<Scope>>,
    /// `keys.len()`, read without the lock.
    count: AtomicUsize,
    /// A task is writing them.
    writing: AtomicBool,
}

impl Outage {
    fn pending(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Scope>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn add(&self, scope: Scope) {
        let mut keys = self.lock();
        keys.push(scope);
        self.count.store(keys.len(), Ordering::Release);
    }

    fn keys(&self) -> Vec<Scope> {
        self.lock().clone()
    }

    fn remove(&self, scope: &Scope) {
        let mut keys = self.lock();
        keys.retain(|k| k != scope);
        self.count.store(keys.len(), Ordering::Release);
    }
}

/// A line made once per distinct value and kept for the process's life: the HTTP/1.1
/// writer takes a `&'static str`. A value changes only with `[inbound.dedupe] header`
/// or a new memory store, so there are a handful.
fn intern(line: String) -> &'static str {
    static LINES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut lines = LINES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = lines.iter().find(|l| **l == line) {
        return l;
    }
    let l: &'static str = Box::leak(line.into_boxed_str());
    lines.push(l);
    l
}

/// "At most once a minute", without a lock.
#[derive(Debug)]
struct Warned {
    since: Instant,
    /// Milliseconds after `since` of the last warning, plus one; 0: never.
    last: AtomicU64,
}

impl Default for Warned {
    fn default() -> Self {
        Warned {
            since: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl Warned {
    const EVERY: Duration = Duration::from_secs(60);

    /// Whether to warn now (and then not again for a minute).
    fn now_and_then(&self, now: Instant) -> bool {
        let at = now.saturating_duration_since(self.since).as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        if last != 0 && at < last + Self::EVERY.as_millis() as u64 {
            return false;
        }
        self.last
            .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

impl Backend {
    /// Whether other replicas share it (their claims end without waking anyone here).
    fn shared(&self) -> bool {
        matches!(self, Backend::Redis(_))
    }
}

impl Store for Backend {
    async fn claim(
        &self,
        scope: &Scope,
        token: Token,
        lease: Duration,
        ttl: Duration,
    ) -> Result<Found, StoreError> {
        match self {
            Backend::Memory(m) => m.claim(scope, token, lease, ttl).await,
            Backend::Redis(r) => r.claim(scope, token, lease, ttl).await,
        }
    }

    async fn look(&self, scope: &Scope) -> Result<Found, StoreError> {
        match self {
            Backend::Memory(m) => m.look(scope).await,
            Backend::Redis(r) => r.look(scope).await,
        }
    }

    async fn finish(
        &self,
        scope: &Scope,
        token: Token,
        ending: &Ending,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        match self {
            Backend::Memory(m) => m.finish(scope, token, ending, ttl).await,
            Backend::Redis(r) => r.finish(scope, token, ending, ttl).await,
        }
    }

    async fn release(&self, scope: &Scope, token: Token) -> Result<(), StoreError> {
        match self {
            Backend::Memory(m) => m.release(scope, token).await,
            Backend::Redis(r) => r.release(scope, token).await,
        }
    }

    async fn renew(
        &self,
        scope: &Scope,
        token: Token,
        lease: Duration,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        match self {
            Backend::Memory(m) => m.renew(scope, token, lease, ttl).await,
            Backend::Redis(r) => r.renew(scope, token, lease, ttl).await,
        }
    }
}
