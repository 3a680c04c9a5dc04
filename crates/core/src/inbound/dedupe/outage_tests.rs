//! The Redis store when Redis fails: killed, restarted, stalled, and a replica that
//! dies holding a claim. Each test starts its own `redis-server` and stops it at the
//! end, passing or failing.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

use super::testing::RedisServer;
use super::*;
use crate::metrics::dedupe::DedupeResult;

fn dedupe(redis: &RedisServer, on_store_error: OnStoreError) -> Dedupe {
    let config = DedupeConfig {
        store: DedupeStore::Redis(redis.addr()),
        store_timeout: Duration::from_millis(200),
        on_store_error,
        ..DedupeConfig::default()
    };
    Dedupe::new(&config, Metrics::new(), None)
}

fn scope(d: &Dedupe, key: &str) -> Scope {
    let mut h = HeaderMap::new();
    h.insert("idempotency-key", HeaderValue::from_str(key).unwrap());
    d.scope(&Method::POST, &"/charge".parse().unwrap(), &h)
        .unwrap()
}

async fn complete(c: Claim, body: &'static [u8]) -> Ended {
    c.body(
        Full::new(Bytes::from_static(body)),
        Fingerprinter::new(None),
    )
    .collect()
    .await
    .unwrap();
    let mut k = c.keeper(StatusCode::OK, &HeaderMap::new());
    k.data(b"done");
    c.complete(k).await
}

fn store_errors(d: &Dedupe) -> u64 {
    d.core.metrics().counted(DedupeResult::StoreError)
}

/// Waits, bounded, for `key`'s ending to be in Redis.
async fn written_to_redis(d: &Dedupe, key: &str) {
    let Backend::Redis(store) = &d.primary else {
        panic!("not redis")
    };
    let start = Instant::now();
    while !matches!(store.look(&scope(d, key)).await, Ok(Found::Done { .. })) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "not written to the store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Begins `key` until it runs, for at most `bound`; how long that took.
async fn runs_within(d: &Dedupe, key: &str, bound: Duration) -> (Claim, Duration) {
    let start = Instant::now();
    loop {
        if let Begin::Run(c) = d.begin(scope(d, key)).await {
            return (c, start.elapsed());
        }
        assert!(
            start.elapsed() < bound,
            "{key}: not running again within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_killed_redis_is_a_store_error_and_normal_again_soon_after_it_returns() {
    let Some(mut redis) = RedisServer::start("a_killed_redis_is_a_store_error") else {
        return;
    };
    let d = dedupe(&redis, OnStoreError::Closed);
    let (c, _) = runs_within(&d, "before", Duration::from_secs(5)).await;
    assert_eq!(complete(c, b"b").await, Ended::Kept);
    // A claim in flight when Redis dies cannot be ended: it is lost, and counted.
    let (in_flight, _) = runs_within(&d, "in-flight", Duration::from_secs(5)).await;

    redis.kill();
    let start = Instant::now();
    assert!(matches!(
        d.begin(scope(&d, "during")).await,
        Begin::Unavailable
    ));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "bounded by store_timeout"
    );
    assert_eq!(complete(in_flight, b"f").await, Ended::Lost);
    assert!(store_errors(&d) >= 2);

    redis.restart();
    let (c, took) = runs_within(&d, "after", Duration::from_secs(10)).await;
    eprintln!("the Redis store answered again {took:?} after Redis came back");
    assert_eq!(complete(c, b"a").await, Ended::Kept);
    // A Redis that persists nothing forgot what it kept: the outage window.
    let (c, _) = runs_within(&d, "before", Duration::from_secs(1)).await;
    c.release().await;
}

#[tokio::test]
async fn with_on_store_error_open_this_replicas_memory_stands_in() {
    let Some(mut redis) = RedisServer::start("with_on_store_error_open") else {
        return;
    };
    let d = dedupe(&redis, OnStoreError::Open);
    redis.kill();
    let Begin::Run(first) = d.begin(scope(&d, "k")).await else {
        panic!("the memory store did not stand in")
    };
    // A duplicate on this replica is still one.
    let Begin::Duplicate(dup) = d.begin(scope(&d, "k")).await else {
        panic!("no duplicate on the stand-in")
    };
    assert_eq!(complete(first, b"x").await, Ended::Kept);
    let answer = dup.settle(Fingerprint::of(b"x"), None).await;
    assert!(matches!(answer, Answer::Replay(_)), "{answer:?}");
    // (The duplicate of a key run here is answered here, without asking the store.)
    assert!(store_errors(&d) >= 1, "each failing store call counted");
    assert_eq!(d.memory().unwrap().len(), 1);

    redis.restart();
    let (c, _) = runs_within(&d, "probe", Duration::from_secs(10)).await;
    c.release().await;
    // Back: what ran meanwhile is still this replica's to answer, never run again ...
    let Begin::Duplicate(dup) = d.begin(scope(&d, "k")).await else {
        panic!("a key run during the outage ran again on the same replica")
    };
    let answer = dup.settle(Fingerprint::of(b"x"), None).await;
    assert!(matches!(answer, Answer::Replay(_)), "{answer:?}");
    // ... and it is written to the store, where every replica finds it.
    written_to_redis(&d, "k").await;
    let other = dedupe(&redis, OnStoreError::Open);
    let Begin::Duplicate(dup) = other.begin(scope(&other, "k")).await else {
        panic!("another replica ran it again")
    };
    let answer = dup.settle(Fingerprint::of(b"x"), None).await;
    assert!(matches!(answer, Answer::Replay(_)), "{answer:?}");
}

#[tokio::test]
async fn open_a_request_claimed_in_redis_that_ends_while_it_is_down_never_runs_twice_here() {
    // Claimed in Redis; Redis dies while the app runs it; it ends. A duplicate on this
    // replica is answered from its memory (replayed), never run again, and the key is
    // written to Redis once it is back.
    let Some(mut redis) = RedisServer::start("claimed_in_redis_ends_while_down") else {
        return;
    };
    let d = dedupe(&redis, OnStoreError::Open);
    let Begin::Run(first) = d.begin(scope(&d, "k")).await else {
        panic!("the first did not run")
    };
    redis.kill();
    assert_eq!(complete(first, b"x").await, Ended::Kept, "kept in memory");
    let Begin::Duplicate(dup) = d.begin(scope(&d, "k")).await else {
        panic!("a duplicate on the same replica ran again")
    };
    let answer = dup.settle(Fingerprint::of(b"x"), None).await;
    assert!(matches!(answer, Answer::Replay(_)), "{answer:?}");

    redis.restart();
    let (c, _) = runs_within(&d, "probe", Duration::from_secs(10)).await;
    c.release().await;
    written_to_redis(&d, "k").await;
    // Closed: nothing to fall back on, the ending is lost as before.
    let Some(mut redis) = RedisServer::start("claimed_in_redis_ends_while_down_closed") else {
        return;
    };
    let d = dedupe(&redis, OnStoreError::Closed);
    let Begin::Run(first) = d.begin(scope(&d, "k")).await else {
        panic!("the first did not run")
    };
    redis.kill();
    assert_eq!(complete(first, b"x").await, Ended::Lost);
}

#[tokio::test]
async fn a_stalled_redis_counts_as_failing_after_store_timeout() {
    let Some(mut redis) = RedisServer::start("a_stalled_redis_counts_as_failing") else {
        return;
    };
    let d = dedupe(&redis, OnStoreError::Closed);
    let (c, _) = runs_within(&d, "warm", Duration::from_secs(5)).await;
    c.release().await;
    redis.pause();
    let start = Instant::now();
    assert!(matches!(d.begin(scope(&d, "k")).await, Begin::Unavailable));
    let took = start.elapsed();
    redis.resume();
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let (c, _) = runs_within(&d, "k", Duration::from_secs(5)).await;
    c.release().await;
}

#[tokio::test]
async fn a_claim_whose_replica_died_turns_not_replayable_when_its_lease_lapses() {
    let Some(redis) = RedisServer::start("a_claim_whose_replica_died") else {
        return;
    };
    let d = dedupe(&redis, OnStoreError::Closed);
    let Backend::Redis(store) = &d.primary else {
        panic!("not redis")
    };
    // A replica claims with a short lease, then is gone: nothing renews or ends it.
    let s = scope(&d, "orphan");
    let gone = Token::new();
    let lease = Duration::from_millis(100);
    let ttl = Duration::from_secs(60);
    assert_eq!(
        store.claim(&s, gone, lease, ttl).await.unwrap(),
        Found::Claimed
    );
    let Begin::Duplicate(dup) = d.begin(s).await else {
        panic!("the orphan's key was free")
    };
    // A duplicate waiting on it sees the lapse by polling, and never runs it again.
    let answer = dup
        .settle(
            Fingerprint::of(b""),
            Some(Instant::now() + Duration::from_secs(5)),
        )
        .await;
    assert_eq!(answer, Answer::NotReplayable);
    assert_eq!(
        store.look(&s).await.unwrap(),
        Found::Gone { fingerprint: None }
    );
    // The orphan's own end, were it to come, changes nothing.
    let end = Ending::NotReplayable { fingerprint: None };
    assert!(!store.finish(&s, gone, &end, ttl).await.unwrap());
    assert!(!store.renew(&s, gone, lease, ttl).await.unwrap());
}

#[tokio::test]
async fn a_running_claim_renews_its_lease() {
    let Some(redis) = RedisServer::start("a_running_claim_renews_its_lease") else {
        return;
    };
    let d = dedupe(&redis, OnStoreError::Closed);
    let Backend::Redis(store) = &d.primary else {
        panic!("not redis")
    };
    let s = scope(&d, "renewed");
    let t = Token::new();
    let short = Duration::from_millis(300);
    // A ttl shorter than the run: the key's expiry must move with the lease.
    let ttl = Duration::from_millis(200);
    store.claim(&s, t, short, ttl).await.unwrap();
    // Renewed past the first lease and the key's first expiry: still running, neither
    // lapsed nor gone (a free key would run the request twice).
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(store.renew(&s, t, short, ttl).await.unwrap());
    }
    assert_eq!(store.look(&s).await.unwrap(), Found::Running);
    store.release(&s, t).await.unwrap();
    assert_eq!(store.look(&s).await.unwrap(), Found::Free);
}

#[tokio::test]
async fn a_duplicate_long_after_the_first_lease_joins_a_first_still_running() {
    let Some(redis) = RedisServer::start("a_duplicate_long_after_the_first_lease") else {
        return;
    };
    let mut d = Dedupe::new(
        &DedupeConfig {
            store: DedupeStore::Redis(redis.addr()),
            store_timeout: Duration::from_millis(500),
            ttl: Duration::from_millis(300),
            ..DedupeConfig::default()
        },
        Metrics::new(),
        None,
    );
    // A lease of 200 ms renewed every 50 ms, on a key that lives 300 ms more.
    d.set_lease(Duration::from_millis(200), Duration::from_millis(50));
    let Begin::Run(first) = d.begin(scope(&d, "long")).await else {
        panic!("the first did not run")
    };
    // The app has the whole request, and works on.
    first
        .body(
            Full::new(Bytes::from_static(b"x")),
            Fingerprinter::new(None),
        )
        .collect()
        .await
        .unwrap();
    // Well past the first lease and the key's first expiry, the first still runs.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let Begin::Duplicate(dup) = d.begin(scope(&d, "long")).await else {
        panic!("the key was free while its first still ran")
    };
    let waiting = tokio::spawn(async move {
        dup.settle(
            Fingerprint::of(b"x"),
            Some(Instant::now() + Duration::from_secs(5)),
        )
        .await
    });
    let mut keeper = first.keeper(StatusCode::CREATED, &HeaderMap::new());
    keeper.data(b"booked");
    assert_eq!(first.complete(keeper).await, Ended::Kept);
    let Answer::Replay(kept) = waiting.await.unwrap() else {
        panic!("the duplicate did not join the first")
    };
    assert_eq!(&kept.body[..], b"booked");
}
