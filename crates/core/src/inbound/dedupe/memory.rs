//! The memory store: this replica's keys, in shards with a lock each.
//!
//! Only keyed requests of the listed methods ever reach it; a request without a key
//! never takes a lock here. A shard is a map and the order its keys completed in; the
//! bound (`max_entries`) is on the whole store, kept with one atomic count: a key that
//! completes over the bound evicts the oldest completed key of the store (the oldest
//! front of the shards' orders), and a key in flight is never evicted. Keys in flight
//! are bounded apart, by the inbound concurrency limit: while they alone fill the
//! store, it holds more than `max_entries`.
//!
//! A completed key expires `ttl` after it completed; an expired key is removed when it
//! is next looked at, when its shard completes another, or by [`MemoryStore::sweep`].
//! Claims here have no lease: the claims and the store live and die with the process,
//! and a claim dropped unfinished ends itself (see [`super::claim`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus::IntGauge;
use tokio::time::Instant;

use super::scope::{Fingerprint, Scope};
use super::store::{Ending, Found, Store, StoreError, Token};
use crate::contract::dedupe::StoreId;
use crate::inbound::dedupe::kept::Kept;

/// The memory store.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    max_entries: AtomicUsize,
    /// Keys held, in flight or completed (expired ones not yet removed included).
    entries: AtomicUsize,
    /// Completion order across the store.
    seq: AtomicU64,
    /// `tollgate_inbound_dedupe_entries`.
    gauge: Option<IntGauge>,
    /// Its name, new with every store made (every process start): a caller's retry
    /// that names another was meant for keys this store never held.
    id: StoreId,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entries", &self.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<Scope, Entry>,
    /// Completed keys, oldest first, with the sequence they completed at (an item
    /// whose key has since gone, or completed again, is stale and skipped).
    order: VecDeque<(Scope, u64)>,
}

enum Entry {
    Running(Token),
    Ended {
        fingerprint: Option<Fingerprint>,
        /// `None`: not replayable.
        kept: Option<Arc<Kept>>,
        expires: Instant,
        seq: u64,
    },
}

impl MemoryStore {
    /// Shards for the store: enough that the workers rarely meet on one lock.
    pub const SHARDS: usize = 32;

    pub fn new(shards: usize, max_entries: usize, gauge: Option<IntGauge>) -> Self {
        MemoryStore {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            max_entries: AtomicUsize::new(max_entries.max(1)),
            entries: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            gauge,
            id: StoreId::random(),
        }
    }

    /// Its name, as answers carry it (`x-tollgate-dedupe: …; store=ID`).
    pub fn id(&self) -> StoreId {
        self.id
    }

    /// A new bound (a reload); it applies from the next completed key.
    pub fn set_max_entries(&self, max: usize) {
        self.max_entries.store(max.max(1), Ordering::Relaxed);
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, scope: &Scope) -> (usize, MutexGuard<'_, Shard>) {
        let i = scope.shard(self.shards.len());
        (i, lock(&self.shards[i]))
    }

    fn count(&self, added: bool) {
        if added {
            self.entries.fetch_add(1, Ordering::Relaxed);
        } else {
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(g) = &self.gauge {
            if added { g.inc() } else { g.dec() }
        }
    }

    /// What `scope` holds now, an expired key removed first.
    fn current<'s>(&self, shard: &'s mut Shard, scope: &Scope, now: Instant) -> Option<&'s Entry> {
        let expired =
            matches!(shard.map.get(scope), Some(Entry::Ended { expires, .. }) if *expires <= now);
        if expired {
            shard.map.remove(scope);
            self.count(false);
        }
        shard.map.get(scope)
    }

    pub fn claim_now(&self, scope: &Scope, token: Token) -> Found {
        let now = Instant::now();
        let (_, mut shard) = self.shard(scope);
        if let Some(e) = self.current(&mut shard, scope, now) {
            return found(e);
        }
        shard.map.insert(*scope, Entry::Running(token));
        self.count(true);
        Found::Claimed
    }

    pub fn look_now(&self, scope: &Scope) -> Found {
        let now = Instant::now();
        let (_, mut shard) = self.shard(scope);
        self.current(&mut shard, scope, now)
            .map_or(Found::Free, found)
    }

    pub fn finish_now(&self, scope: &Scope, token: Token, ending: &Ending, ttl: Duration) -> bool {
        let now = Instant::now();
        let (_, mut shard) = self.shard(scope);
        if !matches!(shard.map.get(scope), Some(Entry::Running(t)) if *t == token) {
            return false;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let (fingerprint, kept) = match ending {
            Ending::Kept { fingerprint, kept } => (Some(*fingerprint), Some(kept.clone())),
            Ending::NotReplayable { fingerprint } => (*fingerprint, None),
        };
        shard.map.insert(
            *scope,
            Entry::Ended {
                fingerprint,
                kept,
                expires: now + ttl,
                seq,
            },
        );
        shard.order.push_back((*scope, seq));
        self.drop_expired(&mut shard, now);
        drop(shard);
        self.evict();
        true
    }

    pub fn release_now(&self, scope: &Scope, token: Token) {
        let (_, mut shard) = self.shard(scope);
        if matches!(shard.map.get(scope), Some(Entry::Running(t)) if *t == token) {
            shard.map.remove(scope);
            self.count(false);
        }
    }

    /// Removes the expired keys of every shard.
    pub fn sweep(&self) {
        let now = Instant::now();
        for s in self.shards.iter() {
            self.drop_expired(&mut lock(s), now);
        }
    }

    /// Removes the expired keys at the front of a shard's order (and stale items).
    fn drop_expired(&self, shard: &mut Shard, now: Instant) {
        while let Some((scope, seq)) = shard.order.front().copied() {
            match shard.map.get(&scope) {
                Some(Entry::Ended {
                    expires, seq: s, ..
                }) if *s == seq => {
                    if *expires > now {
                        return;
                    }
                    shard.map.remove(&scope);
                    self.count(false);
                }
                _ => {}
            }
            shard.order.pop_front();
        }
    }

    /// Evicts the oldest completed keys while the store is over its bound: the shard
    /// whose oldest completed key is the oldest of all gives it up. Never holds two
    /// locks; a look at every shard per eviction, which happens only while the store
    /// is full, and only when a keyed request completes.
    fn evict(&self) {
        while self.len() > self.max_entries.load(Ordering::Relaxed) {
            let mut oldest: Option<(u64, usize)> = None;
            for (i, s) in self.shards.iter().enumerate() {
                let mut shard = lock(s);
                Self::drop_stale(&mut shard);
                if let Some(&(_, seq)) = shard.order.front()
                    && oldest.is_none_or(|(o, _)| seq < o)
                {
                    oldest = Some((seq, i));
                }
            }
            let Some((_, i)) = oldest else {
                return;
            };
            self.evict_one(&mut lock(&self.shards[i]));
        }
    }

    /// Drops the items at the front of a shard's order whose key has gone.
    fn drop_stale(shard: &mut Shard) {
        while let Some((scope, seq)) = shard.order.front() {
            match shard.map.get(scope) {
                Some(Entry::Ended { seq: s, .. }) if s == seq => return,
                _ => {
                    shard.order.pop_front();
                }
            }
        }
    }

    /// Evicts the oldest completed key of a shard; whether there was one.
    fn evict_one(&self, shard: &mut Shard) -> bool {
        while let Some((scope, seq)) = shard.order.pop_front() {
            if matches!(shard.map.get(&scope), Some(Entry::Ended { seq: s, .. }) if *s == seq) {
                shard.map.remove(&scope);
                self.count(false);
                return true;
            }
        }
        false
    }
}

impl Drop for MemoryStore {
    /// A store replaced on a reload takes its keys out of the gauge with it.
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.sub(self.len() as i64);
        }
    }
}

fn found(e: &Entry) -> Found {
    match e {
        Entry::Running(_) => Found::Running,
        Entry::Ended {
            fingerprint: Some(fingerprint),
            kept: Some(kept),
            ..
        } => Found::Done {
            fingerprint: *fingerprint,
            kept: kept.clone(),
        },
        Entry::Ended { fingerprint, .. } => Found::Gone {
            fingerprint: *fingerprint,
        },
    }
}

fn lock(s: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store for MemoryStore {
    async fn claim(
        &self,
        scope: &Scope,
        token: Token,
        _: Duration,
        _: Duration,
    ) -> Result<Found, StoreError> {
        Ok(self.claim_now(scope, token))
    }

    async fn look(&self, scope: &Scope) -> Result<Found, StoreError> {
        Ok(self.look_now(scope))
    }

    async fn finish(
        &self,
        scope: &Scope,
        token: Token,
        ending: &Ending,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.finish_now(scope, token, ending, ttl))
    }

    async fn release(&self, scope: &Scope, token: Token) -> Result<(), StoreError> {
        self.release_now(scope, token);
        Ok(())
    }

    async fn renew(
        &self,
        scope: &Scope,
        token: Token,
        _: Duration,
        _: Duration,
    ) -> Result<bool, StoreError> {
        let (_, shard) = self.shard(scope);
        Ok(matches!(shard.map.get(scope), Some(Entry::Running(t)) if *t == token))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use http::{HeaderMap, HeaderValue, Method};
    use proptest::prelude::*;

    fn scope(k: u8) -> Scope {
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", HeaderValue::from(u16::from(k)));
        Scope::of(
            &Method::POST,
            &"/".parse().unwrap(),
            &h,
            &Default::default(),
        )
        .unwrap()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Claim(u8),
        Finish(u8, bool),
        Release(u8),
        /// With a token that never claimed anything.
        Stray(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6).prop_map(Op::Claim),
            (0u8..6, any::<bool>()).prop_map(|(k, keep)| Op::Finish(k, keep)),
            (0u8..6).prop_map(Op::Release),
            (0u8..6).prop_map(Op::Stray),
        ]
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Model {
        Running(Token),
        Ended(u64),
    }

    proptest! {
        /// Against a plain model: one claim per key at a time, only its token ends it,
        /// the bound holds while completed keys remain, the oldest completed key goes
        /// first, and a key in flight is never evicted.
        #[test]
        fn the_memory_store_follows_its_model(
            shards in 1usize..5,
            max in 1usize..5,
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let _entered = rt.enter();
            let m = MemoryStore::new(shards, max, None);
            let mut model: HashMap<u8, Model> = HashMap::new();
            let mut seq = 0u64;
            let ttl = Duration::from_secs(600);
            let end = |keep: bool| if keep {
                Ending::Kept {
                    fingerprint: Fingerprint::of(b"f"),
                    kept: Arc::new(Kept {
                        status: http::StatusCode::OK,
                        headers: HeaderMap::new(),
                        body: bytes::Bytes::new(),
                        trailers: None,
                    }),
                }
            } else {
                Ending::NotReplayable { fingerprint: None }
            };
            for op in ops {
                match op {
                    Op::Claim(k) => {
                        let t = Token::new();
                        let got = m.claim_now(&scope(k), t);
                        prop_assert_eq!(got == Found::Claimed, !model.contains_key(&k));
                        model.entry(k).or_insert(Model::Running(t));
                    }
                    Op::Finish(k, keep) => {
                        let ours = match model.get(&k) {
                            Some(Model::Running(t)) => Some(*t),
                            _ => None,
                        };
                        let done = m.finish_now(&scope(k), ours.unwrap_or_default(), &end(keep), ttl);
                        prop_assert_eq!(done, ours.is_some());
                        if done {
                            model.insert(k, Model::Ended(seq));
                            seq += 1;
                            // The model evicts the oldest completed keys.
                            while model.len() > max {
                                let oldest = model
                                    .iter()
                                    .filter_map(|(k, s)| match s {
                                        Model::Ended(s) => Some((*s, *k)),
                                        Model::Running(_) => None,
                                    })
                                    .min();
                                match oldest {
                                    Some((_, k)) => { model.remove(&k); }
                                    None => break,
                                }
                            }
                        }
                    }
                    Op::Release(k) => {
                        if let Some(Model::Running(t)) = model.get(&k).copied() {
                            m.release_now(&scope(k), t);
                            model.remove(&k);
                        }
                    }
                    Op::Stray(k) => {
                        m.release_now(&scope(k), Token::new());
                        let fake = m.finish_now(&scope(k), Token::new(), &end(true), ttl);
                        prop_assert!(!fake, "a token that never claimed ends nothing");
                    }
                }
                prop_assert_eq!(m.len(), model.len());
                for k in 0u8..6 {
                    let held = !matches!(m.look_now(&scope(k)), Found::Free);
                    prop_assert_eq!(held, model.contains_key(&k), "key {}", k);
                    if let Some(Model::Running(_)) = model.get(&k) {
                        prop_assert_eq!(m.look_now(&scope(k)), Found::Running);
                    }
                }
            }
        }
    }
}
