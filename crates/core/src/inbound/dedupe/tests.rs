//! The state machine of a key, driven through the API the inbound service uses, on
//! both stores: the same table of cases runs on the memory store and on a real
//! `redis-server`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

use super::testing::RedisServer;
use super::*;
use crate::metrics::dedupe::DedupeResult::{self, *};

fn config(store: DedupeStore) -> DedupeConfig {
    DedupeConfig {
        store,
        max_response: 4096,
        store_timeout: Duration::from_millis(200),
        ..DedupeConfig::default()
    }
}

fn dedupe(store: DedupeStore) -> Dedupe {
    Dedupe::new(&config(store), Metrics::new(), None)
}

fn headers(key: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("idempotency-key", HeaderValue::from_str(key).unwrap());
    h
}

fn scope(d: &Dedupe, key: &str) -> Scope {
    d.scope(&Method::POST, &"/charge".parse().unwrap(), &headers(key))
        .unwrap()
}

fn count(d: &Dedupe, r: DedupeResult) -> u64 {
    d.core.metrics().counted(r)
}

async fn run(d: &Dedupe, key: &str) -> Claim {
    match d.begin(scope(d, key)).await {
        Begin::Run(c) => c,
        other => panic!("{key}: expected to run, got {other:?}"),
    }
}

async fn duplicate(d: &Dedupe, key: &str) -> Duplicate {
    match d.begin(scope(d, key)).await {
        Begin::Duplicate(dup) => dup,
        other => panic!("{key}: expected a duplicate, got {other:?}"),
    }
}

/// The app reads the whole request body through the claim.
async fn deliver(c: &Claim, body: &'static [u8]) {
    c.body(
        Full::new(Bytes::from_static(body)),
        Fingerprinter::new(None),
    )
    .collect()
    .await
    .unwrap();
}

fn answer(c: &Claim, status: u16, body: &[u8]) -> Keeper {
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    h.insert("connection", HeaderValue::from_static("keep-alive"));
    let mut k = c.keeper(StatusCode::from_u16(status).unwrap(), &h);
    k.data(body);
    k
}

async fn finish(c: Claim, status: u16, body: &[u8]) -> Ended {
    let k = answer(&c, status, body);
    c.complete(k).await
}

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(5))
}

async fn settle(d: &Dedupe, key: &str, body: &[u8]) -> Answer {
    duplicate(d, key)
        .await
        .settle(Fingerprint::of(body), soon())
        .await
}

/// Every row of the table, on one store. Each row uses keys of its own.
async fn the_table(d: &Dedupe, store: &str) {
    // A completed key replays its answer, hop-by-hop fields gone; the app is not called.
    let c = run(d, "done").await;
    deliver(&c, b"amount=10").await;
    assert_eq!(finish(c, 201, b"{\"id\":1}").await, Ended::Kept);
    let Answer::Replay(kept) = settle(d, "done", b"amount=10").await else {
        panic!("{store}: no replay")
    };
    assert_eq!(kept.status, StatusCode::CREATED);
    assert_eq!(kept.body, Bytes::from_static(b"{\"id\":1}"));
    assert_eq!(
        kept.headers.get("content-type").unwrap(),
        "application/json"
    );
    assert!(kept.headers.get("connection").is_none());

    // Same key, different body: 422, never someone else's answer.
    assert_eq!(
        settle(d, "done", b"amount=99").await,
        Answer::Mismatch,
        "{store}"
    );
    // The same key on another target or with another credential is another request.
    let mut other = headers("done");
    other.insert("authorization", HeaderValue::from_static("Bearer other"));
    let s = d
        .scope(&Method::POST, &"/charge".parse().unwrap(), &other)
        .unwrap();
    assert!(matches!(d.begin(s).await, Begin::Run(_)), "{store}");

    // Statuses that say it did not run release the key: a retry runs.
    for (i, status) in [408u16, 425, 429, 502, 503, 504].into_iter().enumerate() {
        let key = format!("status-{i}");
        let c = run(d, &key).await;
        deliver(&c, b"x").await;
        assert_eq!(
            finish(c, status, b"busy").await,
            Ended::Released,
            "{store} {status}"
        );
        let again = run(d, &key).await;
        assert_eq!(again.release().await, Ended::Released);
    }

    // Tollgate answered in the app's place: released.
    let c = run(d, "refused").await;
    assert_eq!(c.release().await, Ended::Released);
    drop(run(d, "refused").await);

    // The app had the whole request, then no head: not replayable.
    let c = run(d, "reset").await;
    deliver(&c, b"pay").await;
    assert_eq!(c.failed().await, Ended::NotReplayable, "{store}");
    assert_eq!(
        settle(d, "reset", b"pay").await,
        Answer::NotReplayable,
        "{store}"
    );
    assert_eq!(
        settle(d, "reset", b"other").await,
        Answer::Mismatch,
        "{store}"
    );
    // ... but without the whole request it cannot have run: released.
    let c = run(d, "half").await;
    assert_eq!(c.failed().await, Ended::Released, "{store}");
    run(d, "half").await.release().await;

    // A response over max_response streams on but is not kept.
    let c = run(d, "large").await;
    deliver(&c, b"big").await;
    let mut k = answer(&c, 200, b"");
    assert!(!k.data(&[b'x'; 5000]));
    assert_eq!(c.complete(k).await, Ended::NotReplayable, "{store}");
    assert_eq!(
        settle(d, "large", b"big").await,
        Answer::NotReplayable,
        "{store}"
    );

    // A duplicate while the first runs waits for it and gets its answer (joined).
    let c = run(d, "join").await;
    deliver(&c, b"j").await;
    let dup = duplicate(d, "join").await;
    let waiter = tokio::spawn(async move { dup.settle(Fingerprint::of(b"j"), soon()).await });
    tokio::task::yield_now().await;
    finish(c, 200, b"joined").await;
    let Answer::Replay(kept) = waiter.await.unwrap() else {
        panic!("{store}: the waiter got no replay")
    };
    assert_eq!(kept.body, Bytes::from_static(b"joined"));

    // ... and at its own deadline, 409 in-progress.
    let c = run(d, "slow").await;
    let dup = duplicate(d, "slow").await;
    let at = Some(Instant::now() + Duration::from_millis(50));
    assert_eq!(
        dup.settle(Fingerprint::of(b""), at).await,
        Answer::InProgress
    );
    // A first released while a duplicate waits: the duplicate's body is spent, 409.
    let dup = duplicate(d, "slow").await;
    let waiter = tokio::spawn(async move { dup.settle(Fingerprint::of(b""), soon()).await });
    tokio::task::yield_now().await;
    c.release().await;
    assert_eq!(waiter.await.unwrap(), Answer::InProgress, "{store}");

    // A cancelled request (its claim dropped) never leaves the key claimed.
    let c = run(d, "cancelled-early").await;
    drop(c);
    wait_for(d, "cancelled-early", |f| f == Found::Free).await;
    let c = run(d, "cancelled-late").await;
    deliver(&c, b"late").await;
    drop(c);
    wait_for(d, "cancelled-late", |f| matches!(f, Found::Gone { .. })).await;
    assert_eq!(
        settle(d, "cancelled-late", b"late").await,
        Answer::NotReplayable
    );

    for (r, n) in [
        (First, 24),
        (Replayed, 1),
        (Joined, 1),
        (Mismatch, 2),
        (NotKept, 3),
        (InProgress, 2),
    ] {
        assert_eq!(count(d, r), n, "{store}: {}", r.as_str());
    }
    assert_eq!(count(d, StoreError), 0, "{store}");
}

/// Waits (bounded) until the store shows `key` as `ok` says.
async fn wait_for(d: &Dedupe, key: &str, ok: impl Fn(Found) -> bool) {
    let s = scope(d, key);
    for _ in 0..500 {
        if ok(d.primary.look(&s).await.unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} never reached the state wanted");
}

#[tokio::test]
async fn the_state_machine_on_the_memory_store() {
    the_table(&dedupe(DedupeStore::Memory), "memory").await;
}

#[tokio::test]
async fn the_state_machine_on_the_redis_store() {
    let Some(redis) = RedisServer::start("the_state_machine_on_the_redis_store") else {
        return;
    };
    the_table(&dedupe(DedupeStore::Redis(redis.addr())), "redis").await;
}

/// 50 duplicates of one key arrive together: one runs, all others get its answer.
async fn fifty_at_once(d: Arc<Dedupe>, store: &str) {
    let begun = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (d, begun) = (d.clone(), begun.clone());
            tokio::spawn(async move {
                let s = scope(&d, "fifty");
                let begin = d.begin(s).await;
                begun.fetch_add(1, Ordering::SeqCst);
                match begin {
                    Begin::Run(c) => {
                        // The app answers once every duplicate has arrived.
                        for _ in 0..1000 {
                            if begun.load(Ordering::SeqCst) == 50 {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        deliver(&c, b"once").await;
                        finish(c, 200, b"ran once").await;
                        None
                    }
                    Begin::Duplicate(dup) => {
                        Some(dup.settle(Fingerprint::of(b"once"), soon()).await)
                    }
                    Begin::Unavailable => panic!("store unavailable"),
                }
            })
        })
        .collect();
    let mut runs = 0;
    for t in tasks {
        match t.await.unwrap() {
            None => runs += 1,
            Some(Answer::Replay(kept)) => assert_eq!(kept.body, Bytes::from_static(b"ran once")),
            Some(other) => panic!("{store}: a duplicate got {other:?}"),
        }
    }
    assert_eq!(runs, 1, "{store}: exactly one run");
    assert_eq!(count(&d, First), 1);
    assert_eq!(count(&d, Joined) + count(&d, Replayed), 49, "{store}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_duplicates_run_once_on_the_memory_store() {
    fifty_at_once(Arc::new(dedupe(DedupeStore::Memory)), "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_duplicates_run_once_on_the_redis_store() {
    let Some(redis) = RedisServer::start("fifty_duplicates_run_once_on_the_redis_store") else {
        return;
    };
    fifty_at_once(Arc::new(dedupe(DedupeStore::Redis(redis.addr()))), "redis").await;
}

#[tokio::test(start_paused = true)]
async fn a_completed_key_expires_after_its_ttl_on_the_memory_store() {
    let d = dedupe(DedupeStore::Memory);
    let c = run(&d, "ttl").await;
    deliver(&c, b"t").await;
    finish(c, 200, b"kept").await;
    tokio::time::advance(d.config().ttl - Duration::from_secs(1)).await;
    assert!(matches!(settle(&d, "ttl", b"t").await, Answer::Replay(_)));
    tokio::time::advance(Duration::from_secs(1)).await;
    drop(run(&d, "ttl").await);
    // The sweep removes expired keys nobody looks at again.
    let c = run(&d, "swept").await;
    deliver(&c, b"s").await;
    finish(c, 200, b"kept").await;
    assert_eq!(d.memory().unwrap().len(), 1);
    tokio::time::advance(d.config().ttl).await;
    d.sweep();
    assert_eq!(d.memory().unwrap().len(), 0);
}

#[tokio::test]
async fn a_completed_key_expires_after_its_ttl_on_the_redis_store() {
    let Some(redis) =
        RedisServer::start("a_completed_key_expires_after_its_ttl_on_the_redis_store")
    else {
        return;
    };
    let config = DedupeConfig {
        ttl: Duration::from_secs(1),
        ..config(DedupeStore::Redis(redis.addr()))
    };
    let d = Dedupe::new(&config, Metrics::new(), None);
    let c = run(&d, "ttl").await;
    deliver(&c, b"t").await;
    finish(c, 200, b"kept").await;
    assert!(matches!(settle(&d, "ttl", b"t").await, Answer::Replay(_)));
    wait_for(&d, "ttl", |f| f == Found::Free).await;
    drop(run(&d, "ttl").await);
}

#[tokio::test]
async fn the_memory_store_evicts_the_oldest_completed_keys_never_one_in_flight() {
    let d = Dedupe::new(
        &DedupeConfig {
            max_entries: 3,
            ..config(DedupeStore::Memory)
        },
        Metrics::new(),
        None,
    );
    let running = run(&d, "in-flight").await;
    for key in ["a", "b", "c", "e"] {
        let c = run(&d, key).await;
        deliver(&c, b"x").await;
        finish(c, 200, b"ok").await;
    }
    let m = d.memory().unwrap();
    assert_eq!(m.len(), 3);
    let gauge = d.core.metrics.dedupe().entries.get();
    assert_eq!(gauge, 3, "the entries gauge follows the store");
    // The two oldest completed keys went, across the shards.
    for key in ["c", "e"] {
        assert!(
            matches!(settle(&d, key, b"x").await, Answer::Replay(_)),
            "{key} stays"
        );
    }
    for key in ["a", "b"] {
        run(&d, key).await.release().await;
    }
    assert!(
        matches!(duplicate(&d, "in-flight").await.found, Found::Running),
        "never in flight"
    );
    drop(running);
}

#[tokio::test]
async fn with_one_shard_eviction_is_strictly_oldest_first() {
    let m = memory::MemoryStore::new(1, 2, None);
    let ttl = Duration::from_secs(60);
    let d = dedupe(DedupeStore::Memory);
    let end = Ending::NotReplayable { fingerprint: None };
    let scopes: Vec<Scope> = ["1", "2", "3"].iter().map(|k| scope(&d, k)).collect();
    for s in &scopes {
        let t = Token::new();
        assert_eq!(m.claim_now(s, t), Found::Claimed);
        assert!(m.finish_now(s, t, &end, ttl));
    }
    assert_eq!(m.look_now(&scopes[0]), Found::Free, "the oldest went");
    assert_eq!(m.look_now(&scopes[1]), Found::Gone { fingerprint: None });
    assert_eq!(m.look_now(&scopes[2]), Found::Gone { fingerprint: None });
}

#[tokio::test]
async fn a_reload_keeps_the_keys_and_the_waiters() {
    let metrics = Metrics::new();
    let before = Dedupe::new(&config(DedupeStore::Memory), metrics.clone(), None);
    let c = run(&before, "k").await;
    deliver(&c, b"k").await;
    let changed = DedupeConfig {
        ttl: Duration::from_secs(60),
        max_entries: 10,
        ..config(DedupeStore::Memory)
    };
    let after = Dedupe::new(&changed, metrics, Some(&before));
    assert!(Arc::ptr_eq(
        before.memory().unwrap(),
        after.memory().unwrap()
    ));
    // A duplicate that begins after the reload waits on the claim made before it.
    let dup = duplicate(&after, "k").await;
    let waiter = tokio::spawn(async move { dup.settle(Fingerprint::of(b"k"), soon()).await });
    tokio::task::yield_now().await;
    finish(c, 200, b"before").await;
    assert!(matches!(waiter.await.unwrap(), Answer::Replay(_)));
}

#[tokio::test]
async fn a_request_without_a_key_or_of_another_method_is_not_the_dedupes() {
    let d = dedupe(DedupeStore::Memory);
    let uri = "/charge".parse().unwrap();
    assert!(d.scope(&Method::POST, &uri, &HeaderMap::new()).is_none());
    assert!(d.scope(&Method::PUT, &uri, &headers("k")).is_none());
    assert!(d.scope(&Method::PATCH, &uri, &headers("k")).is_some());
    assert!(d.scope(&Method::GET, &uri, &headers("k")).is_none());
    assert_eq!(d.memory().unwrap().len(), 0);
    // A GET is the dedupe's when `methods` lists it.
    let gets = DedupeConfig {
        methods: vec![Method::GET],
        ..config(DedupeStore::Memory)
    };
    let d = Dedupe::new(&gets, Metrics::new(), None);
    assert!(d.scope(&Method::GET, &uri, &headers("k")).is_some());
    assert!(d.scope(&Method::POST, &uri, &headers("k")).is_none());
}

#[tokio::test(start_paused = true)]
async fn store_errors_are_warned_about_at_most_once_a_minute() {
    let w = Warned::default();
    let t = Instant::now();
    assert!(w.now_and_then(t));
    assert!(!w.now_and_then(t + Duration::from_secs(30)));
    assert!(!w.now_and_then(t + Duration::from_millis(59_999)));
    assert!(w.now_and_then(t + Duration::from_secs(61)));
    assert!(!w.now_and_then(t + Duration::from_secs(90)));
}
