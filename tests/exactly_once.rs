//! Exactly once, over loopback: an app behind a real tollgate's `[inbound]` listener
//! with `[inbound.dedupe]` on. A keyed request runs the app once, whatever arrives
//! after it: duplicates in flight join it, later ones get its kept answer, a key reused
//! for another body is refused, an answer that says the request did not run frees the
//! key, and one that may have run without an answer is not replayed. Requests without
//! a key get what the app gives.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use http_body_util::BodyExt;

const DEDUPE: &str = "max_inflight = 1000\n[inbound.dedupe]\nstore = \"memory\"\n";

/// An app that "executes" an order: counts it, and answers `201` with its number.
async fn orders_app(delay: Duration) -> (Upstream, Arc<AtomicUsize>) {
    let executed = Arc::new(AtomicUsize::new(0));
    let e = executed.clone();
    let app = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let e = e.clone();
        async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            tokio::time::sleep(delay).await;
            let n = e.fetch_add(1, Ordering::SeqCst) + 1;
            http::Response::builder()
                .status(201)
                .header("x-order", n.to_string())
                .body(full(format!(
                    "order {n} for {}",
                    String::from_utf8_lossy(&body)
                )))
                .unwrap()
        }
    })
    .await;
    (app, executed)
}

fn post(key: Option<&str>, body: &str) -> http::Request<BoxBody> {
    let mut b = request("POST", "/orders", "app");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(full(body.to_string())).unwrap()
}

#[tokio::test]
async fn a_duplicate_after_completion_gets_the_kept_answer_and_the_app_runs_once() {
    let (app, executed) = orders_app(Duration::ZERO).await;
    let tg = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    let first = send(tg.inbound(), post(Some("\"k-1\""), "coffee")).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.header("x-tollgate-dedupe"), Some("on"));
    assert_eq!(first.header("idempotent-replayed"), None);
    for _ in 0..3 {
        let again = send(tg.inbound(), post(Some("\"k-1\""), "coffee")).await;
        assert_eq!(again.status, 201);
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("x-order"), Some("1"));
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.header("x-tollgate-dedupe"), Some("on"));
    }
    // Over HTTP/2 too.
    let h2 = send_h2(tg.inbound(), post(Some("\"k-1\""), "coffee")).await;
    assert_eq!((h2.status, &h2.body), (first.status, &first.body));
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_inbound_dedupe_total{result=\"replayed\"}"),
        Some(4.0)
    );
    tg.stop().await;
}

#[tokio::test]
async fn fifty_duplicates_arriving_together_run_the_app_once_and_get_one_answer() {
    let (app, executed) = orders_app(Duration::from_millis(300)).await;
    let tg = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    let addr = tg.inbound();
    let all: Vec<_> = (0..50)
        .map(|_| tokio::spawn(async move { send(addr, post(Some("\"same\""), "tea")).await }))
        .collect();
    let mut bodies = Vec::new();
    for t in all {
        let got = t.await.unwrap();
        assert_eq!(got.status, 201, "{:?}", got.body);
        bodies.push(got.body);
    }
    assert!(bodies.iter().all(|b| *b == bodies[0]));
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    tg.stop().await;
}

#[tokio::test]
async fn the_same_key_with_another_body_is_refused_without_the_app() {
    let (app, executed) = orders_app(Duration::ZERO).await;
    let tg = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    assert_eq!(
        send(tg.inbound(), post(Some("\"k\""), "one")).await.status,
        201
    );
    let other = send(tg.inbound(), post(Some("\"k\""), "two")).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.outcome(), Some("key-mismatch"));
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    tg.stop().await;
}

#[tokio::test]
async fn an_answer_that_says_the_request_did_not_run_frees_the_key() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = Upstream::start(move |_req| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move { respond(if n == 0 { 503 } else { 200 }, format!("call {n}")) }
    })
    .await;
    let tg = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    assert_eq!(
        send(tg.inbound(), post(Some("\"k\""), "x")).await.status,
        503
    );
    let retried = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(
        (retried.status.as_u16(), &retried.body[..]),
        (200, &b"call 1"[..])
    );
    assert_eq!(retried.header("idempotent-replayed"), None);
    // The 200 is kept.
    let kept = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(kept.header("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    tg.stop().await;
}

/// An app that reads the whole request and closes the connection without a word.
async fn vanishing_app() -> (
    std::net::SocketAddr,
    Arc<AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::AsyncReadExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head and its short body, then gone.
                while let Ok(n) = c.read(&mut chunk).await {
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.ends_with(b"x") {
                        s.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                }
            });
        }
    });
    (addr, seen, task)
}

#[tokio::test]
async fn an_app_gone_after_the_whole_request_leaves_the_key_not_replayable() {
    let (addr, seen, task) = vanishing_app().await;
    let tg = Tollgate::start(&inbound_config(addr, DEDUPE)).await;
    let first = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(first.status, 502);
    let dup = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(dup.status, 500);
    assert_eq!(dup.outcome(), Some("not-replayable"));
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    tg.stop().await;
    task.abort();
}

#[tokio::test]
async fn a_response_larger_than_max_response_streams_and_is_not_kept() {
    let big = "b".repeat(64 * 1024);
    let b = big.clone();
    let app = Upstream::start(move |_req| {
        let b = b.clone();
        async move { respond(200, b) }
    })
    .await;
    let tg = Tollgate::start(&inbound_config(
        app.addr,
        "[inbound.dedupe]\nmax_response = \"4KiB\"\n",
    ))
    .await;
    let first = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), big.len());
    let dup = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(
        (dup.status.as_u16(), dup.outcome()),
        (500, Some("not-replayable"))
    );
    assert_eq!(app.hits(), 1);
    tg.stop().await;
}

#[tokio::test]
async fn a_caller_that_goes_away_does_not_lose_the_answer_of_the_work_done() {
    let (app, executed) = orders_app(Duration::from_millis(300)).await;
    let tg = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    let addr = tg.inbound();
    let gone = tokio::spawn(async move { send(addr, post(Some("\"k\""), "cake")).await });
    assert!(wait_until(Duration::from_secs(5), || app.hits() == 1).await);
    gone.abort();
    assert!(
        wait_until(Duration::from_secs(5), || executed.load(Ordering::SeqCst)
            == 1)
        .await
    );
    let dup = send(addr, post(Some("\"k\""), "cake")).await;
    assert_eq!(dup.status, 201);
    assert_eq!(&dup.body[..], b"order 1 for cake");
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    tg.stop().await;
}

#[tokio::test]
async fn requests_without_a_key_get_what_the_app_gives() {
    let app = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        let m = req.method().clone();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        http::Response::builder()
            .status(if m == http::Method::POST { 202 } else { 200 })
            .header("x-app", "yes")
            .body(full(format!("{m} {}", body.len())))
            .unwrap()
    })
    .await;
    let tg = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    for (method, key) in [("POST", None), ("GET", None), ("GET", Some("\"k\""))] {
        let req = |to: &str| {
            let mut b = request(method, "/thing", to);
            if let Some(k) = key {
                b = b.header("idempotency-key", k);
            }
            b.body(full("abc")).unwrap()
        };
        let direct = send(app.addr, req("app")).await;
        let through = send(tg.inbound(), req("app")).await;
        assert_eq!(through.status, direct.status, "{method}");
        assert_eq!(through.body, direct.body, "{method}");
        assert_eq!(through.header("x-app"), Some("yes"));
        assert_eq!(through.header("idempotent-replayed"), None);
        assert_eq!(through.header("x-tollgate-dedupe"), Some("on"));
    }
    // Two keyed GETs both reach the app: GET is not a listed method.
    assert_eq!(app.hits(), 6);
    tg.stop().await;
}

// ---- The caller's side and the whole chain ----

/// A TCP relay that loses responses: each piece of an answer coming back is, while
/// `lose` allows, not passed on, and the connection is closed both ways (the request
/// went through and ran; only its answer is lost). `lose_next` loses that many answers;
/// `lose_percent` loses that share of them at random.
struct Lossy {
    addr: std::net::SocketAddr,
    lose_next: Arc<AtomicUsize>,
    lost: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Lossy {
    async fn start(to: std::net::SocketAddr, lose_percent: u32, seed: u64) -> Lossy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let lose_next = Arc::new(AtomicUsize::new(0));
        let lost = Arc::new(AtomicUsize::new(0));
        let (next, count) = (lose_next.clone(), lost.clone());
        let rng = Arc::new(std::sync::Mutex::new(fastrand::Rng::with_seed(seed)));
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = l.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(to).await else {
                    continue;
                };
                let (next, count, rng) = (next.clone(), count.clone(), rng.clone());
                conns.spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                        let _ = sw.shutdown().await;
                    };
                    let down = async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let by_count = next
                                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                                    n.checked_sub(1)
                                })
                                .is_ok();
                            let by_chance = rng.lock().unwrap().u32(0..100) < lose_percent;
                            if by_count || by_chance {
                                count.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    // The first side to end ends both: a lost answer closes the caller's
                    // connection at once.
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                    }
                });
            }
        });
        Lossy {
            addr,
            lose_next,
            lost,
            task,
        }
    }
}

impl Drop for Lossy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn caller_config(endpoints: &[std::net::SocketAddr], extra_retry: &str) -> String {
    let list: Vec<String> = endpoints.iter().map(|a| format!("\"{a}\"")).collect();
    config(&format!(
        "[upstreams.orders]\nauthorities = [\"orders\"]\nendpoints = [{}]\nrequest_timeout = \"5s\"\n\
         [upstreams.orders.retry]\nmax_attempts = 4\non = [\"connect-failure\", \"reset\", \"503\"]\n\
         backoff_base = \"1ms\"\nbackoff_max = \"5ms\"\n{extra_retry}\n\
         [upstreams.orders.budget]\nratio = 1.0\nmin_per_sec = 1000\n",
        list.join(", ")
    ))
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
    let tg = Tollgate::start(&caller_config(
        &[app.addr],
        "mint_idempotency_key = [\"POST\"]",
    ))
    .await;
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
    let callee = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    let relay = Lossy::start(callee.inbound(), 0, 1).await;
    let caller = Tollgate::start(&caller_config(
        &[relay.addr],
        "mint_idempotency_key = [\"POST\"]",
    ))
    .await;
    let order = |body: &str| {
        request("POST", "/orders", "orders")
            .body(full(body.to_string()))
            .unwrap()
    };
    // Nothing has said the callee deduplicates yet: a lost answer is not sent again.
    relay.lose_next.store(1, Ordering::SeqCst);
    let unknown = send(caller.addr, order("first")).await;
    assert_eq!(unknown.status, 502, "{:?}", unknown.body);
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    // Its answers say so now.
    let plain = send(caller.addr, order("second")).await;
    assert_eq!(plain.status, 201);
    assert_eq!(executed.load(Ordering::SeqCst), 2);
    relay.lose_next.store(1, Ordering::SeqCst);
    let saved = send(caller.addr, order("third")).await;
    assert_eq!(saved.status, 201, "{:?}", saved.body);
    assert_eq!(saved.header("idempotent-replayed"), Some("true"));
    assert_eq!(&saved.body[..], b"order 3 for third");
    assert_eq!(saved.attempts(), 2);
    assert_eq!(executed.load(Ordering::SeqCst), 3, "the retry ran nothing");
    assert_eq!(relay.lost.load(Ordering::SeqCst), 2);
    caller.stop().await;
    callee.stop().await;
}

// ---- A fleet: replicas behind their own tollgates, one Redis, a lossy network ----

/// A `redis-server` on a free loopback port, persisting nothing; killed when dropped.
struct Redis {
    child: Option<std::process::Child>,
    port: u16,
}

impl Redis {
    /// `None`, said loudly, when `redis-server` is not installed.
    fn start(test: &str) -> Option<Redis> {
        let installed = std::process::Command::new("redis-server")
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok();
        if !installed {
            eprintln!(
                "\n*** SKIPPED {test}: redis-server is not installed \
                 (apt-get install redis-server); the shared store was NOT tested ***\n"
            );
            return None;
        }
        let mut r = Redis {
            child: None,
            port: free_port(),
        };
        r.restart();
        Some(r)
    }

    fn restart(&mut self) {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            assert!(
                std::time::Instant::now() < until,
                "redis-server did not listen"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn store(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
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
    // One plain call first: the answers say the callee deduplicates.
    assert_eq!(get(caller, "/warm", "orders").await.status, 201);
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
    dedupe: &str,
    ledger: &Ledger,
) -> (Vec<Upstream>, Vec<Tollgate>, Vec<Lossy>, Tollgate) {
    let (mut apps, mut callees, mut links) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..replicas {
        let app = ledger_replica(ledger).await;
        let callee = Tollgate::start(&inbound_config(
            app.addr,
            &format!("max_inflight = 1000\n[inbound.dedupe]\n{dedupe}"),
        ))
        .await;
        links.push(Lossy::start(callee.inbound(), 10, 7 + i as u64).await);
        apps.push(app);
        callees.push(callee);
    }
    let ends: Vec<_> = links.iter().map(|l| l.addr).collect();
    let caller = Tollgate::start(&caller_config(&ends, "mint_idempotency_key = [\"POST\"]")).await;
    (apps, callees, links, caller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_hundred_orders_through_a_lossy_network_and_three_replicas_each_run_once() {
    let Some(redis) = Redis::start("six_hundred_orders_…_three_replicas") else {
        return;
    };
    let ledger = Ledger::default();
    let store = format!("store = \"{}\"\nstore_timeout = \"500ms\"\n", redis.store());
    let (_apps, callees, links, caller) = fleet(3, &store, &ledger).await;
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
async fn six_hundred_orders_through_a_lossy_network_and_one_replica_with_memory_run_once() {
    let ledger = Ledger::default();
    let (_apps, callees, _links, caller) = fleet(1, "store = \"memory\"\n", &ledger).await;
    let run = place_orders(caller.addr, 600, &ledger).await;
    assert_eq!(run.twice, 0, "orders executed twice");
    assert!(run.answered >= 594, "{} of 600 answered", run.answered);
    assert!(run.replayed > 0);
    caller.stop().await;
    for c in callees {
        c.stop().await;
    }
}

#[tokio::test]
async fn while_redis_is_down_keyed_requests_fail_closed_or_open_and_others_pass() {
    let Some(mut redis) = Redis::start("while_redis_is_down_…") else {
        return;
    };
    let (app, _executed) = orders_app(Duration::ZERO).await;
    let store = |on: &str| {
        format!(
            "[inbound.dedupe]\nstore = \"{}\"\nstore_timeout = \"300ms\"\non_store_error = \"{on}\"\n",
            redis.store()
        )
    };
    let closed = Tollgate::start(&inbound_config(app.addr, &store("closed"))).await;
    let open = Tollgate::start(&inbound_config(app.addr, &store("open"))).await;
    assert_eq!(
        send(closed.inbound(), post(Some("\"a\""), "x"))
            .await
            .status,
        201
    );
    redis.kill();
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
async fn a_duplicate_whose_deadline_comes_first_is_told_it_is_in_progress() {
    let (app, executed) = orders_app(Duration::from_millis(800)).await;
    let tg = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    let addr = tg.inbound();
    let first = tokio::spawn(async move { send(addr, post(Some("\"slow\""), "x")).await });
    assert!(wait_until(Duration::from_secs(5), || app.hits() == 1).await);
    let impatient = request("POST", "/orders", "app")
        .header("idempotency-key", "\"slow\"")
        .header("x-timeout-ms", "100");
    let dup = send(addr, impatient.body(full("x")).unwrap()).await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.outcome(), Some("in-progress"));
    assert_eq!(dup.header("retry-after"), Some("1"));
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_inbound_dedupe_total{result=\"in-progress\"}"),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test]
async fn a_grpc_answer_is_replayed_with_its_trailers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        c.fetch_add(1, Ordering::SeqCst);
        async move {
            // Read whole: an answer given before the request is is not kept.
            req.into_body().collect().await.unwrap();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            trailers.insert("x-order", http::HeaderValue::from_static("42"));
            let body = WithTrailers {
                data: Some(bytes::Bytes::from_static(b"\0\0\0\0\x02ok")),
                trailers: Some(trailers),
            };
            http::Response::builder()
                .header("content-type", "application/grpc")
                .body(http_body_util::BodyExt::boxed(body))
                .unwrap()
        }
    })
    .await;
    let tg = Tollgate::start(&inbound_config(app.addr, DEDUPE)).await;
    let call = || {
        request("POST", "/shop.Orders/Place", "app")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("idempotency-key", "\"g-1\"")
            .body(full(&b"\0\0\0\0\x01x"[..]))
            .unwrap()
    };
    let first = send_h2(tg.inbound(), call()).await;
    let again = send_h2(tg.inbound(), call()).await;
    for got in [&first, &again] {
        assert_eq!(got.status, 200);
        assert_eq!(&got.body[..], b"\0\0\0\0\x02ok");
        let t = got.trailers.as_ref().expect("trailers");
        assert_eq!(t.get("grpc-status").unwrap(), "0");
        assert_eq!(t.get("x-order").unwrap(), "42");
    }
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    tg.stop().await;
}

#[tokio::test]
async fn a_keyed_request_refused_at_the_limit_frees_its_key() {
    let (app, executed) = orders_app(Duration::from_millis(400)).await;
    let tg = Tollgate::start(&inbound_config(
        app.addr,
        "max_inflight = 1\n[inbound.dedupe]\nstore = \"memory\"\n",
    ))
    .await;
    let addr = tg.inbound();
    let busy = tokio::spawn(async move { send(addr, post(None, "other")).await });
    assert!(wait_until(Duration::from_secs(5), || app.hits() == 1).await);
    let refused = send(addr, post(Some("\"k\""), "x")).await;
    assert_eq!(
        (refused.status.as_u16(), refused.outcome()),
        (503, Some("overloaded"))
    );
    assert_eq!(busy.await.unwrap().status, 201);
    // The app never had it: the retry runs.
    let retried = send(addr, post(Some("\"k\""), "x")).await;
    assert_eq!(retried.status, 201);
    assert_eq!(retried.header("idempotent-replayed"), None);
    assert_eq!(executed.load(Ordering::SeqCst), 2);
    tg.stop().await;
}
