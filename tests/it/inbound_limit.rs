//! The adaptive concurrency limit in front of real apps. One whose capacity is fixed
//! (four workers, a queue in front of them), offered far more concurrency than it has,
//! is given a few requests at a time and the rest are refused at once with
//! `503 overloaded` and `Retry-After`; when the overload ends every request is served
//! again. One whose latency is waiting (it takes any number at once) is never shed: a
//! step in its load is served through tollgate as it is without it.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::config::Config;
use common::*;

const WORKERS: usize = 4;

/// One test at a time: the limit learns from latency measured through tollgate, and
/// another test's load on the same cores would be in it.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An app of `WORKERS` workers taking 20 ms each; records the most requests it held at
/// once (served or queued).
async fn app(peak: &Arc<AtomicUsize>) -> Upstream {
    let workers = Arc::new(tokio::sync::Semaphore::new(WORKERS));
    let inside = Arc::new(AtomicUsize::new(0));
    let peak = peak.clone();
    Upstream::start(move |_req| {
        let (workers, inside, peak) = (workers.clone(), inside.clone(), peak.clone());
        async move {
            let now = inside.fetch_add(1, SeqCst) + 1;
            peak.fetch_max(now, SeqCst);
            let slot = workers.acquire().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(slot);
            inside.fetch_sub(1, SeqCst);
            respond(200, "done")
        }
    })
    .await
}

#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    shed: AtomicUsize,
    other: AtomicUsize,
}

/// `clients` clients sending one request after another for `run`.
async fn load(addr: std::net::SocketAddr, clients: usize, run: Duration) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let until = tokio::time::Instant::now() + run;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let tally = tally.clone();
        tasks.push(tokio::spawn(async move {
            while tokio::time::Instant::now() < until {
                let r = get(addr, "/work", "app").await;
                let shed = r.status == 503
                    && r.outcome() == Some("overloaded")
                    && r.header("retry-after") == Some("1");
                let counter = match r.status.as_u16() {
                    200 => &tally.ok,
                    _ if shed => &tally.shed,
                    _ => &tally.other,
                };
                counter.fetch_add(1, SeqCst);
                if shed {
                    // As a caller told to back off would, a little.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_sheds_under_overload_and_serves_everything_after() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let peak = Arc::new(AtomicUsize::new(0));
    let app = app(&peak).await;
    let tg = Tollgate::start(
        &Config::new()
            .inbound(app.addr, |i| i.max_inflight("adaptive"))
            .to_toml(),
    )
    .await;
    let limit = |m: &str| metric(m, "tollgate_inbound_concurrency_limit").unwrap();
    assert_eq!(
        limit(&tg.metrics().await),
        20.0,
        "the initial limit: nothing pinned at the start"
    );

    // 40 clients against 4 workers.
    let overload = load(tg.inbound(), 40, Duration::from_secs(3)).await;
    let (ok, shed, other) = (
        overload.ok.load(SeqCst),
        overload.shed.load(SeqCst),
        overload.other.load(SeqCst),
    );
    assert_eq!(other, 0, "only 200s and 503 overloaded with Retry-After");
    assert!(ok > 0 && shed > 0, "ok {ok}, shed {shed}");
    let learned = limit(&tg.metrics().await);
    assert!(
        learned < 20.0,
        "the limit did not come down from 20 towards the {WORKERS} workers: {learned}"
    );
    let held = peak.load(SeqCst);
    assert!(
        held <= 25,
        "the app was given {held} requests at once, of the 40 offered"
    );
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_inbound_denied_total{reason=\"overloaded\"}"),
        Some(shed as f64)
    );

    // The overload is over: everything is served again.
    for _ in 0..20 {
        assert_eq!(get(tg.inbound(), "/work", "app").await.status, 200);
    }
    let after = load(tg.inbound(), 1, Duration::from_secs(1)).await;
    assert_eq!(after.shed.load(SeqCst) + after.other.load(SeqCst), 0);
    tg.stop().await;
}

/// A healthy app whose latency is waiting, not work: every request sleeps 50 to 200 ms
/// (as if on a database), however many there are at once.
async fn waiting_app() -> Upstream {
    let rng = Arc::new(std::sync::Mutex::new(fastrand::Rng::with_seed(11)));
    Upstream::start(move |_req| {
        let ms = rng.lock().unwrap().u64(50..=200);
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            respond(200, "done")
        }
    })
    .await
}

/// Open-loop load: `quiet` at 5 requests a second, evenly spaced, then `busy` at 150 a
/// second with Poisson arrivals (bursts included), each request sent whatever became of
/// the others, as users send them. Every run sends the same schedule (a fixed seed).
async fn step(addr: std::net::SocketAddr, quiet: Duration, busy: Duration) -> Arc<Tally> {
    let tally = Arc::new(Tally::default());
    let mut rng = fastrand::Rng::with_seed(7);
    let start = tokio::time::Instant::now();
    let mut at = Duration::ZERO;
    let mut sent = Vec::new();
    while at < quiet + busy {
        tokio::time::sleep_until(start + at).await;
        let tally = tally.clone();
        sent.push(tokio::spawn(async move {
            let r = get(addr, "/work", "app").await;
            let counter = match (r.status.as_u16(), r.outcome()) {
                (200, _) => &tally.ok,
                (503, Some("overloaded")) => &tally.shed,
                _ => &tally.other,
            };
            counter.fetch_add(1, SeqCst);
        }));
        at += if at < quiet {
            Duration::from_millis(200)
        } else {
            Duration::from_secs_f64(-(1.0 - rng.f64()).ln() / 150.0)
        };
    }
    for s in sent {
        tokio::time::timeout(Duration::from_secs(5), s)
            .await
            .expect("every request is answered")
            .unwrap();
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_step_onto_a_healthy_app_is_served_as_without_tollgate() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let app = waiting_app().await;
    let tg = Tollgate::start(
        &Config::new()
            .inbound(app.addr, |i| i.max_inflight("adaptive"))
            .to_toml(),
    )
    .await;

    // The same schedule at the same time, through tollgate and straight to the app.
    let (quiet, busy) = (Duration::from_secs(3), Duration::from_secs(4));
    let (through, direct) =
        tokio::join!(step(tg.inbound(), quiet, busy), step(app.addr, quiet, busy));
    let count = |t: &Tally| (t.ok.load(SeqCst), t.shed.load(SeqCst), t.other.load(SeqCst));
    let (direct_ok, _, direct_failed) = count(&direct);
    assert_eq!(direct_failed, 0, "the app itself serves every request");
    let (ok, shed, other) = count(&through);
    assert_eq!(
        (shed, other),
        (0, 0),
        "through tollgate: {ok} served, {shed} shed `overloaded`, {other} otherwise failed; \
         straight to the app: {direct_ok} served"
    );
    assert_eq!(ok, direct_ok);
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_inbound_denied_total{reason=\"overloaded\"}").unwrap_or(0.0),
        0.0
    );
    tg.stop().await;
}

/// An app that works on what it is given whatever its caller does (it never looks at
/// the connection while it works): reads a head, works 300 ms, answers. Records the
/// most it worked on at once and how many it finished.
async fn heedless_app(peak: &Arc<AtomicUsize>, done: &Arc<AtomicUsize>) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let (peak, done) = (peak.clone(), done.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (inside, peak, done) = (inside.clone(), peak.clone(), done.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.clear();
                    peak.fetch_max(inside.fetch_add(1, SeqCst) + 1, SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    inside.fetch_sub(1, SeqCst);
                    done.fetch_add(1, SeqCst);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ndone";
                    if s.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Waits (bounded) until every request tollgate read is settled, answered by the app
/// or shed, then checks the app never had more than `max_inflight = 2` at once.
async fn settled_within_the_limit(tg: &Tollgate, peak: &AtomicUsize, done: &AtomicUsize) {
    let settled = |m: &str| {
        let served = metric(m, "tollgate_inbound_inflight").unwrap_or(1.0) == 0.0;
        let shed = metric(m, "tollgate_inbound_denied_total{reason=\"overloaded\"}").unwrap_or(0.0);
        served && shed + done.load(SeqCst) as f64 >= 2.0
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = tg.metrics().await;
        if settled(&m) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "not settled in 10 s:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = peak.load(SeqCst);
    assert!(held >= 1, "no request reached the app");
    assert!(
        held <= 2,
        "the app was given {held} requests at once with max_inflight = 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_send_and_hang_up_free_no_place_while_the_app_works() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (peak, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let app = heedless_app(&peak, &done).await;
    let tg = Tollgate::start(&Config::new().inbound(app, |i| i.max_inflight(2)).to_toml()).await;
    let inbound = tg.inbound();
    // 20 callers send a whole request and hang up at once: half with a reset, half
    // with a plain close.
    let mut callers = Vec::new();
    for i in 0..20 {
        callers.push(tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut s = tokio::net::TcpStream::connect(inbound).await.unwrap();
            s.write_all(b"GET /work HTTP/1.1\r\nHost: app\r\n\r\n")
                .await
                .unwrap();
            if i % 2 == 0 {
                s.set_zero_linger().unwrap();
            }
            drop(s);
        }));
        tokio::task::yield_now().await;
    }
    for c in callers {
        c.await.unwrap();
    }
    settled_within_the_limit(&tg, &peak, &done).await;
    tg.stop().await;
}

/// The same over HTTP/2: callers that reset their stream once their request is out (a
/// gRPC client's cancel, 50 ms into the app's 300 ms) free no place while the app works
/// on it, however many come after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_callers_that_reset_their_streams_free_no_place_while_the_app_works() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let (peak, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let app = heedless_app(&peak, &done).await;
    let tg = Tollgate::start(&Config::new().inbound(app, |i| i.max_inflight(2)).to_toml()).await;
    let (mut sender, conn) = h2_client(tg.inbound()).await;
    // One caller after another, each giving up after 50 ms: the response future
    // dropped resets the stream. Six come and go while the app works on the first.
    for _ in 0..20 {
        let req = http::Request::get("http://app/work").body(empty()).unwrap();
        let answer = tokio::time::timeout(Duration::from_millis(50), sender.send_request(req));
        let _ = answer.await;
    }
    settled_within_the_limit(&tg, &peak, &done).await;
    conn.abort();
    tg.stop().await;
}
