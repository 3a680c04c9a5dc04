//! Waking the duplicates that wait on this replica, without polling.
//!
//! A duplicate that finds its key running subscribes to the key before it looks again,
//! and sleeps on the subscription; a claim that ends on this replica wakes every
//! subscriber of its key. Subscribing before looking closes the gap between "I saw it
//! running" and "I sleep": an end in that gap has already woken the subscription.
//!
//! An entry exists only while someone waits: the wake removes it (dropping the
//! sender is what wakes the receivers), and the last waiter to leave without a wake
//! removes it too. A claim on another replica wakes nobody here: waiters on a shared
//! store also poll it (see [`super::duplicate`]).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;

use super::scope::Scope;

type Shard = HashMap<Scope, watch::Sender<()>>;

/// The keys some duplicate on this replica waits on.
pub struct Notices {
    shards: Box<[Mutex<Shard>]>,
}

impl Default for Notices {
    fn default() -> Self {
        Notices {
            shards: (0..16).map(|_| Mutex::default()).collect(),
        }
    }
}

impl Notices {
    fn shard(&self, scope: &Scope) -> MutexGuard<'_, Shard> {
        let s = &self.shards[scope.shard(self.shards.len())];
        s.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A subscription to the end of the claim on `scope`.
    pub fn subscribe(&self, scope: &Scope) -> Subscription<'_> {
        let rx = self
            .shard(scope)
            .entry(*scope)
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        Subscription {
            notices: self,
            scope: *scope,
            rx,
        }
    }

    /// Wakes everyone waiting on `scope`.
    pub fn wake(&self, scope: &Scope) {
        let sender = self.shard(scope).remove(scope);
        drop(sender);
    }

    /// Keys someone waits on (for tests).
    pub fn waited_on(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }
}

/// One waiter's subscription.
pub struct Subscription<'a> {
    notices: &'a Notices,
    scope: Scope,
    rx: watch::Receiver<()>,
}

impl Subscription<'_> {
    /// Resolves when the claim on the key ended (at once if it already has).
    pub async fn ended(&mut self) {
        // The sender only ever goes away: `changed` resolves, with an error, then.
        let _ = self.rx.changed().await;
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut shard = self.notices.shard(&self.scope);
        // This receiver still counts: it is the last one when the count is one.
        let last = shard.get(&self.scope).is_some_and(|tx| {
            let ours = tx.subscribe().same_channel(&self.rx);
            ours && tx.receiver_count() <= 1
        });
        if last {
            shard.remove(&self.scope);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use http::{HeaderMap, HeaderValue, Method};

    fn scope() -> Scope {
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", HeaderValue::from_static("k"));
        Scope::of(
            &Method::POST,
            &"/".parse().unwrap(),
            &h,
            &Default::default(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_wake_reaches_every_waiter_and_leaves_nothing_behind() {
        let n = Notices::default();
        let s = scope();
        let mut a = n.subscribe(&s);
        let mut b = n.subscribe(&s);
        assert_eq!(n.waited_on(), 1);
        n.wake(&s);
        a.ended().await;
        b.ended().await;
        assert_eq!(n.waited_on(), 0);
        drop((a, b));
        assert_eq!(n.waited_on(), 0);
    }

    #[tokio::test]
    async fn the_last_waiter_to_leave_unwoken_takes_the_entry_away() {
        let n = Notices::default();
        let s = scope();
        let a = n.subscribe(&s);
        let b = n.subscribe(&s);
        drop(a);
        assert_eq!(n.waited_on(), 1, "b still waits");
        drop(b);
        assert_eq!(n.waited_on(), 0);
    }
}
