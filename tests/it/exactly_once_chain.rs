//! Exactly once through a chain, over loopback: a caller's tollgate that mints keys, a
//! network that loses answers after the work was done, and callees' inbound tollgates
//! that deduplicate, on one replica with the memory store or on three sharing a
//! `redis-server` (started by the test, skipped loudly without one). Every order is
//! answered, none is booked twice; a keyed POST is sent again after a lost answer only
//! once the callee's answers have said it deduplicates; while Redis is down keyed
//! requests are refused or served from memory, and unkeyed ones pass.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::orders;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::config::{Config, Dedupe};
use common::*;
use http_body_util::BodyExt;
use orders::*;

/// A caller of `orders` on `endpoints` that mints a key for each POST.
fn caller_config(endpoints: &[std::net::SocketAddr]) -> String {
    caller_config_with(endpoints, |r| r)
}

/// [`caller_config`], its retry section changed by `f`.
fn caller_config_with(
    endpoints: &[std::net::SocketAddr],
    f: impl FnOnce(common::config::Retry) -> common::config::Retry,
) -> String {
    Config::new()
        .upstream("orders", |u| {
            endpoints
                .iter()
                .fold(u.authorities(["orders"]), |u, e| u.endpoint(e))
                .request_timeout("5s")
                .retry(|r| {
                    f(r.max_attempts(4)
                        .on(["connect-failure", "reset", "503"])
                        .backoff_base("1ms")
                        .backoff_max("5ms")
                        .mint_idempotency_key(["POST"]))
                })
                .budget(|b| b.ratio(1.0).min_per_sec(1000))
        })
        .to_toml()
}

/// An app recording each attempt's idempotency key; 503 on the first attempt.
#[tokio::test]
async fn a_minted_key_is_the_same_on_every_attempt_and_an_apps_own_is_kept() {
    let keys = Arc::new(std::sync::Mutex::new(Vec::<Option<String>>::new()));
    let k = keys.clone();
    let app = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let key = req
            .headers()
            .get("idempotency-key")
            .map(|v| v.to_str().unwrap().to_string());
        let mut seen = k.lock().unwrap();
        seen.push(key);
        let status = if seen.len() % 2 == 1 { 503 } else { 200 };
        async move { respond(status, "ok") }
    })
    .await;
    let tg = Tollgate::start(&caller_config(&[app.addr])).await;
    let minted = send(
        tg.addr,
        request("POST", "/orders", "orders")
            .body(full("a"))
            .unwrap(),
    )
    .await;
    assert_eq!(minted.status, 200);
    let own = send(
        tg.addr,
        request("POST", "/orders", "orders")
            .header("idempotency-key", "\"mine\"")
            .body(full("b"))
            .unwrap(),
    )
    .await;
    assert_eq!(own.status, 200);
    // A GET is not a listed method: no key, on either attempt.
    get(tg.addr, "/orders", "orders").await;
    let seen = keys.lock().unwrap().clone();
    assert_eq!(seen.len(), 6, "{seen:?}");
    let key = seen[0].clone().unwrap();
    assert!(
        key.starts_with('"') && key.ends_with('"') && key.len() == 38,
        "{key}"
    );
    assert_eq!(seen[1], seen[0], "the same key on the retry");
    assert_eq!(seen[2].as_deref(), Some("\"mine\""));
    assert_eq!(seen[3].as_deref(), Some("\"mine\""));
    assert_eq!(seen[4..], [None, None]);
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_idempotency_keys_minted_total{upstream=\"orders\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test]
async fn a_keyed_post_is_retried_after_a_lost_answer_only_where_the_callee_dedupes() {
    let (app, executed) = orders_app(Duration::ZERO).await;
    let callee = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
    // Two ways to the one callee: two endpoints of one store (one endpoint behind one
    // address would never be sent a retry, as it could be any replica).
    let relay = lossy(callee.inbound(), 0, 1).await;
    let other = lossy(callee.inbound(), 0, 2).await;
    let caller = Tollgate::start(&caller_config(&[relay.addr, other.addr])).await;
    let order = |body: &str| {
        request("POST", "/orders", "orders")
            .body(full(body.to_string()))
            .unwrap()
    };
    // Nothing has said the callee deduplicates yet: a lost answer is not sent again.
    relay.lose_next.store(1, Ordering::SeqCst);
    other.lose_next.store(1, Ordering::SeqCst);
    let unknown = send(caller.addr, order("first")).await;
    assert_eq!(unknown.status, 502, "{:?}", unknown.body);
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    relay.lose_next.store(0, Ordering::SeqCst);
    other.lose_next.store(0, Ordering::SeqCst);
    // Its answers say so now, on both ways.
    for n in ["second", "second'"] {
        let plain = send(caller.addr, order(n)).await;
        assert_eq!(plain.status, 201);
    }
    assert_eq!(executed.load(Ordering::SeqCst), 3);
    relay.lose_next.store(1, Ordering::SeqCst);
    other.lose_next.store(1, Ordering::SeqCst);
    let saved = send(caller.addr, order("third")).await;
    assert_eq!(saved.status, 201, "{:?}", saved.body);
    assert_eq!(saved.header("idempotent-replayed"), Some("true"));
    assert_eq!(&saved.body[..], b"order 4 for third");
    assert_eq!(saved.attempts(), 2);
    assert_eq!(executed.load(Ordering::SeqCst), 4, "the retry ran nothing");
    // The retry went back the way the lost answer came (the other way would have lost
    // it again): one answer lost of each order.
    let lost = relay.lost.load(Ordering::SeqCst) + other.lost.load(Ordering::SeqCst);
    assert_eq!(lost, 2);
    let armed = relay.lose_next.load(Ordering::SeqCst) + other.lose_next.load(Ordering::SeqCst);
    assert_eq!(armed, 1, "the retry took the other way");
    caller.stop().await;
    callee.stop().await;
}

type Ledger = Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>;

/// A replica of the orders service: appends each order (its body) to the shared ledger.
async fn ledger_replica(ledger: &Ledger) -> Upstream {
    let ledger = ledger.clone();
    Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let ledger = ledger.clone();
        async move {
            let order = req.into_body().collect().await.unwrap().to_bytes();
            let order = String::from_utf8_lossy(&order).into_owned();
            let n = {
                let mut l = ledger.lock().unwrap();
                let n = l.entry(order.clone()).or_insert(0);
                *n += 1;
                *n
            };
            respond(201, format!("{order} booked ({n})"))
        }
    })
    .await
}

struct Run {
    answered: usize,
    replayed: usize,
    twice: usize,
    executed: usize,
}

/// `orders` orders through `caller`, 20 at a time, each checked against the ledger.
async fn place_orders(caller: std::net::SocketAddr, orders: usize, ledger: &Ledger) -> Run {
    // A plain call to each endpoint first: their answers say they deduplicate.
    for _ in 0..3 {
        assert_eq!(get(caller, "/warm", "orders").await.status, 201);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let (answered, replayed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<_> = (0..20)
        .map(|_| {
            let (next, answered, replayed) = (next.clone(), answered.clone(), replayed.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= orders {
                        return;
                    }
                    let req = request("POST", "/orders", "orders")
                        .body(full(format!("order-{i}")))
                        .unwrap();
                    let got = send(caller, req).await;
                    if got.status == 201 {
                        assert_eq!(got.body, format!("order-{i} booked (1)"));
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                    if got.header("idempotent-replayed") == Some("true") {
                        replayed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    eprintln!(
        "{orders} orders: {} answered, {} replayed",
        answered.load(Ordering::SeqCst),
        replayed.load(Ordering::SeqCst)
    );
    let l = ledger.lock().unwrap();
    let orders_only = || l.iter().filter(|(k, _)| k.starts_with("order-"));
    Run {
        answered: answered.load(Ordering::SeqCst),
        replayed: replayed.load(Ordering::SeqCst),
        twice: orders_only().filter(|(_, n)| **n > 1).count(),
        executed: orders_only().count(),
    }
}

/// Replicas, each behind its own inbound tollgate with `dedupe`, each reached through
/// its own lossy link; a caller that mints keys.
async fn fleet(
    replicas: usize,
    dedupe: impl Fn(Dedupe) -> Dedupe,
    ledger: &Ledger,
) -> (Vec<Upstream>, Vec<Tollgate>, Vec<Lossy>, Tollgate) {
    fleet_with(replicas, dedupe, ledger, |r| r).await
}

/// [`fleet`], the caller's retry section changed by `retry`.
async fn fleet_with(
    replicas: usize,
    dedupe: impl Fn(Dedupe) -> Dedupe,
    ledger: &Ledger,
    retry: impl FnOnce(common::config::Retry) -> common::config::Retry,
) -> (Vec<Upstream>, Vec<Tollgate>, Vec<Lossy>, Tollgate) {
    let (mut apps, mut callees, mut links) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..replicas {
        let app = ledger_replica(ledger).await;
        let callee = Tollgate::start(
            &Config::new()
                .inbound(app.addr, |i| i.max_inflight(1000).dedupe(&dedupe))
                .to_toml(),
        )
        .await;
        links.push(lossy(callee.inbound(), 10, 7 + i as u64).await);
        apps.push(app);
        callees.push(callee);
    }
    let ends: Vec<_> = links.iter().map(|l| l.addr).collect();
    let caller = Tollgate::start(&caller_config_with(&ends, retry)).await;
    (apps, callees, links, caller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_orders_through_a_lossy_network_and_three_replicas_each_run_once() {
    let Some(redis) = Redis::start("six_hundred_orders_…_three_replicas") else {
        return;
    };
    let ledger = Ledger::default();
    let store = |d: Dedupe| d.store(redis.store()).store_timeout("500ms");
    let (_apps, callees, links, caller) = fleet(3, store, &ledger).await;
    let run = place_orders(caller.addr, 600, &ledger).await;
    let lost: usize = links.iter().map(|l| l.lost.load(Ordering::SeqCst)).sum();
    assert!(lost > 0, "the network lost nothing");
    assert_eq!(run.twice, 0, "orders executed twice");
    assert!(run.answered >= 594, "{} of 600 answered", run.answered);
    assert!(run.executed >= run.answered);
    assert!(
        run.replayed > 0,
        "no lost answer was replayed ({lost} lost)"
    );
    caller.stop().await;
    for c in callees {
        c.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_orders_through_a_lossy_network_and_three_replicas_with_memory_run_once() {
    // With keys: a lost answer is asked again of the replica that ran it, and only there.
    let ledger = Ledger::default();
    let (_apps, callees, links, caller) = fleet(3, |d| d.store("memory"), &ledger).await;
    let run = place_orders(caller.addr, 600, &ledger).await;
    let lost: usize = links.iter().map(|l| l.lost.load(Ordering::SeqCst)).sum();
    assert!(lost > 0, "the network lost nothing");
    assert_eq!(run.twice, 0, "orders executed twice");
    assert!(
        run.replayed > 0,
        "no lost answer was replayed ({lost} lost)"
    );
    caller.stop().await;
    for c in callees {
        c.stop().await;
    }
    // Without keys: a lost answer of a POST is the caller's to reconcile.
    let without = without_keys().await;
    assert!(
        run.answered >= without.answered,
        "with keys {} answered, without {}",
        run.answered,
        without.answered
    );
    assert!(run.answered >= 594, "{} of 600 answered", run.answered);
}

/// The caller mints keys into a header the callees do not read (`x-idempotency-key`;
/// they read `idempotency-key`): their answers say so, and a lost answer is never asked
/// again, as without keys. Nothing runs twice, and as many orders are answered as
/// without keys, to within chance: the two runs lose different answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_orders_with_a_key_header_the_callees_do_not_read_run_once() {
    let ledger = Ledger::default();
    let (_apps, callees, links, caller) = fleet_with(
        3,
        |d| d.store("memory"),
        &ledger,
        |r| r.idempotency_header("x-idempotency-key"),
    )
    .await;
    let run = place_orders(caller.addr, 600, &ledger).await;
    let lost: usize = links.iter().map(|l| l.lost.load(Ordering::SeqCst)).sum();
    assert!(lost > 0, "the network lost nothing");
    assert_eq!(run.twice, 0, "orders executed twice");
    assert_eq!(run.replayed, 0, "a lost answer was asked again");
    caller.stop().await;
    for c in callees {
        c.stop().await;
    }
    let without = without_keys().await;
    // Each run loses about 10% of 600 answers (sd about 7.3 each): three standard
    // deviations of their difference.
    let chance = 3.0 * (2.0 * 600.0 * 0.1 * 0.9_f64).sqrt();
    assert!(
        run.answered as f64 >= without.answered as f64 - chance,
        "with the other header {} answered, without keys {}",
        run.answered,
        without.answered
    );
}

/// The same fleet's 600 orders from a caller that mints no key: what keys are measured
/// against. Nothing runs twice here either.
async fn without_keys() -> Run {
    let plain = Ledger::default();
    let (_apps, callees, _links, caller) = fleet_with(
        3,
        |d| d.store("memory"),
        &plain,
        |r| r.mint_idempotency_key(Vec::<String>::new()),
    )
    .await;
    let without = place_orders(caller.addr, 600, &plain).await;
    assert_eq!(without.twice, 0);
    caller.stop().await;
    for c in callees {
        c.stop().await;
    }
    without
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_in_front_of_a_memory_store_is_never_sent_what_may_have_run() {
    // One endpoint may be any replica behind a VIP: a lost answer goes back as it is.
    let ledger = Ledger::default();
    let (_apps, callees, links, caller) = fleet(1, |d| d.store("memory"), &ledger).await;
    let run = place_orders(caller.addr, 200, &ledger).await;
    let lost = links[0].lost.load(Ordering::SeqCst);
    assert!(lost > 0, "the network lost nothing");
    assert_eq!(run.twice, 0, "orders executed twice");
    assert_eq!(run.replayed, 0, "a lost answer was sent again");
    caller.stop().await;
    for c in callees {
        c.stop().await;
    }
}

#[tokio::test]
async fn a_caller_whose_key_header_the_callee_does_not_read_never_resends_what_may_have_run() {
    let (app, executed) = orders_app(Duration::ZERO).await;
    let callee = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
    let relay = lossy(callee.inbound(), 0, 1).await;
    let other = lossy(callee.inbound(), 0, 2).await;
    let caller = Tollgate::start(&caller_config_with(&[relay.addr, other.addr], |r| {
        r.idempotency_header("x-idempotency-key")
    }))
    .await;
    let order = |body: &str| {
        request("POST", "/orders", "orders")
            .body(full(body.to_string()))
            .unwrap()
    };
    // Both endpoints answer: "on", for keys in another header.
    for n in ["a", "b"] {
        assert_eq!(send(caller.addr, order(n)).await.status, 201);
    }
    relay.lose_next.store(1, Ordering::SeqCst);
    other.lose_next.store(1, Ordering::SeqCst);
    let lost = send(caller.addr, order("c")).await;
    assert_eq!(lost.status, 502, "{:?}", lost.body);
    assert_eq!(executed.load(Ordering::SeqCst), 3, "the order ran twice");
    caller.stop().await;
    callee.stop().await;
}

#[tokio::test]
async fn an_apps_empty_key_is_replaced_by_a_minted_one() {
    let keys = Arc::new(std::sync::Mutex::new(Vec::<Vec<String>>::new()));
    let k = keys.clone();
    let app = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let got = req
            .headers()
            .get_all("idempotency-key")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        k.lock().unwrap().push(got);
        async move { respond(200, "ok") }
    })
    .await;
    let tg = Tollgate::start(&caller_config(&[app.addr])).await;
    let empty = request("POST", "/orders", "orders")
        .header("idempotency-key", "")
        .body(full("a"))
        .unwrap();
    assert_eq!(send(tg.addr, empty).await.status, 200);
    let seen = keys.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].len(), 1, "{seen:?}");
    assert_eq!(seen[0][0].len(), 38, "{seen:?}");
    tg.stop().await;
}

#[tokio::test]
async fn while_redis_is_down_keyed_requests_fail_closed_or_open_and_others_pass() {
    let Some(mut redis) = Redis::start("while_redis_is_down_…") else {
        return;
    };
    let (app, _executed) = orders_app(Duration::ZERO).await;
    let store = |on: &str| {
        Config::new()
            .inbound(app.addr, |i| {
                i.dedupe(|d| {
                    d.store(redis.store())
                        .store_timeout("300ms")
                        .on_store_error(on)
                })
            })
            .to_toml()
    };
    let closed = Tollgate::start(&store("closed")).await;
    let open = Tollgate::start(&store("open")).await;
    assert_eq!(
        send(closed.inbound(), post(Some("\"a\""), "x"))
            .await
            .status,
        201
    );
    redis.kill();
    // The store is not the app: both stay ready, or every pod would leave its Service
    // at once whenever Redis does.
    for tg in [&closed, &open] {
        assert_eq!(get(tg.admin, "/readyz", "admin").await.status, 200);
    }
    let refused = send(closed.inbound(), post(Some("\"b\""), "x")).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.outcome(), Some("dedupe-unavailable"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(send(closed.inbound(), post(None, "x")).await.status, 201);
    // Open: this replica's memory stands in, and still runs a key once.
    let first = send(open.inbound(), post(Some("\"c\""), "x")).await;
    assert_eq!(first.status, 201);
    let again = send(open.inbound(), post(Some("\"c\""), "x")).await;
    assert_eq!((again.status, &again.body), (first.status, &first.body));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let m = closed.metrics().await;
    assert!(metric(&m, "tollgate_inbound_dedupe_total{result=\"store-error\"}").unwrap() >= 1.0);
    // Still ready once the store's failures are known.
    assert_eq!(get(closed.admin, "/readyz", "admin").await.status, 200);
    // Back: keyed requests are made safe again, the key kept there before is gone with it.
    redis.restart();
    let mut back = None;
    for _ in 0..100 {
        let r = send(closed.inbound(), post(Some("\"d\""), "x")).await;
        if r.status == 201 {
            back = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        back.is_some(),
        "keyed requests still refused after Redis came back"
    );
    let dup = send(closed.inbound(), post(Some("\"d\""), "x")).await;
    assert_eq!(dup.header("idempotent-replayed"), Some("true"));
    closed.stop().await;
    open.stop().await;
}

#[tokio::test]
async fn on_shutdown_a_keyed_request_whose_caller_is_gone_is_finished_and_kept() {
    use tokio::io::AsyncWriteExt;
    let Some(redis) = Redis::start("on_shutdown_a_keyed_request_…_finished_and_kept") else {
        return;
    };
    let (app, executed) = orders_app(Duration::from_millis(1500)).await;
    let config = Config::new()
        .inbound(app.addr, |i| {
            i.max_inflight(100)
                .dedupe(|d| d.store(redis.store()).store_timeout("500ms"))
        })
        .to_toml();
    let first = Tollgate::start(&config).await;
    // A caller sends a keyed order, and resets its connection once the app has it.
    let mut caller = tokio::net::TcpStream::connect(first.inbound())
        .await
        .unwrap();
    caller
        .write_all(
            b"POST /orders HTTP/1.1\r\nhost: app\r\nidempotency-key: \"k\"\r\n\
              content-length: 3\r\n\r\ntea",
        )
        .await
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || app.hits() == 1).await);
    caller.set_zero_linger().unwrap();
    drop(caller);
    // SIGTERM's drain: the exchange is finished and its key completed within it.
    first.stop().await;
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    let second = Tollgate::start(&config).await;
    let dup = request("POST", "/orders", "app")
        .header("idempotency-key", "\"k\"")
        .header("x-timeout-ms", "300")
        .body(full("tea"))
        .unwrap();
    let dup = send(second.inbound(), dup).await;
    assert_eq!(
        (dup.status.as_u16(), dup.header("idempotent-replayed")),
        (201, Some("true")),
        "{:?} {:?}",
        dup.outcome(),
        dup.body
    );
    assert_eq!(&dup.body[..], b"order 1 for tea");
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    second.stop().await;
}
