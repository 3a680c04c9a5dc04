//! Exactly once, over loopback: an app behind a real tollgate's `[inbound]` listener
//! with `[inbound.dedupe]` on. A keyed request runs the app once, whatever arrives
//! after it: duplicates in flight join it, later ones get its kept answer, a key reused
//! for another body is refused, an answer that says the request did not run frees the
//! key, and one that may have run without an answer is not replayed. Requests without
//! a key get what the app gives.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::orders;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::config::Config;
use common::*;
use http_body_util::BodyExt;
use orders::*;

/// `x-tollgate-dedupe` of a callee deduplicating in its own memory: the header it reads,
/// and its store's ID.
fn assert_replica_dedupe(said: Option<&str>) {
    let said = said.expect("no x-tollgate-dedupe");
    let id = said
        .strip_prefix("on; header=idempotency-key; scope=replica; store=")
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{said}"
    );
}

#[tokio::test]
async fn a_duplicate_after_completion_gets_the_kept_answer_and_the_app_runs_once() {
    let (app, executed) = orders_app(Duration::ZERO).await;
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
    let first = send(tg.inbound(), post(Some("\"k-1\""), "coffee")).await;
    assert_eq!(first.status, 201);
    assert_replica_dedupe(first.header("x-tollgate-dedupe"));
    assert_eq!(first.header("idempotent-replayed"), None);
    for _ in 0..3 {
        let again = send(tg.inbound(), post(Some("\"k-1\""), "coffee")).await;
        assert_eq!(again.status, 201);
        assert_eq!(again.body, first.body);
        assert_eq!(again.header("x-order"), Some("1"));
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(
            again.header("x-tollgate-dedupe"),
            first.header("x-tollgate-dedupe")
        );
    }
    // Over HTTP/2 too.
    let h2 = send_h2(tg.inbound(), post(Some("\"k-1\""), "coffee")).await;
    assert_eq!((h2.status, &h2.body), (first.status, &first.body));
    assert_eq!(
        h2.header("x-tollgate-dedupe"),
        first.header("x-tollgate-dedupe")
    );
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
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
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
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
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
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
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
    let tg = Tollgate::start(&Config::new().inbound(addr, deduping).to_toml()).await;
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
    let tg = Tollgate::start(
        &Config::new()
            .inbound(app.addr, |i| i.dedupe(|d| d.max_response("4KiB")))
            .to_toml(),
    )
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
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
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
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
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
        assert_replica_dedupe(through.header("x-tollgate-dedupe"));
    }
    // An HTTP/2 caller is told in a header field (an HTTP/1.1 one in a line of the head).
    let h2 = send_h2(
        tg.inbound(),
        request("GET", "/thing", "app").body(full("")).unwrap(),
    )
    .await;
    assert_eq!(h2.status, 200);
    assert_replica_dedupe(h2.header("x-tollgate-dedupe"));
    // Two keyed GETs both reach the app: GET is not a listed method.
    assert_eq!(app.hits(), 7);
    tg.stop().await;
}

#[tokio::test]
async fn a_duplicate_whose_deadline_comes_first_is_told_it_is_in_progress() {
    let (app, executed) = orders_app(Duration::from_millis(800)).await;
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
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
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
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
    let tg = Tollgate::start(
        &Config::new()
            .inbound(app.addr, |i| {
                i.max_inflight(1).dedupe(|d| d.store("memory"))
            })
            .to_toml(),
    )
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
    // And that run is the key's: kept.
    let again = send(addr, post(Some("\"k\""), "x")).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(executed.load(Ordering::SeqCst), 2);
    tg.stop().await;
}

/// An app that answers each call with its number, and sets a session cookie.
async fn counting_app() -> (Upstream, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = Upstream::start(move |req: http::Request<hyper::body::Incoming>| {
        let c = c.clone();
        async move {
            req.into_body().collect().await.unwrap();
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            http::Response::builder()
                .status(201)
                .header("set-cookie", format!("session=s{n}; HttpOnly"))
                .header("x-call", n.to_string())
                .body(full(format!("call {n}")))
                .unwrap()
        }
    })
    .await;
    (app, calls)
}

#[tokio::test]
async fn a_key_is_scoped_to_every_credential_the_authority_and_the_query() {
    let (app, calls) = counting_app().await;
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
    let keyed = |target: &str, host: &str, field: Option<(&str, &str)>| {
        let mut b = request("POST", target, host).header("idempotency-key", "\"same\"");
        if let Some((n, v)) = field {
            b = b.header(n, v);
        }
        b.body(full("x")).unwrap()
    };
    // Each of these is another caller, or another request: each runs.
    let distinct = [
        keyed("/orders", "app", None),
        keyed("/orders", "app", Some(("authorization", "Bearer a"))),
        keyed("/orders", "app", Some(("cookie", "session=a"))),
        keyed("/orders", "app", Some(("cookie", "session=b"))),
        keyed("/orders", "app", Some(("x-api-key", "a"))),
        keyed("/orders", "app", Some(("x-api-key", "b"))),
        keyed("/orders", "other", None),
        keyed("/orders?page=2", "app", None),
    ];
    for (i, req) in distinct.into_iter().enumerate() {
        let got = send(tg.inbound(), req).await;
        assert_eq!(got.status, 201, "request {i}");
        assert_eq!(
            got.header("idempotent-replayed"),
            None,
            "request {i} got another's answer"
        );
        assert_eq!(got.header("x-call"), Some((i + 1).to_string().as_str()));
    }
    // The same again is a replay of its own answer.
    let again = send(
        tg.inbound(),
        keyed("/orders", "app", Some(("cookie", "session=b"))),
    )
    .await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("x-call"), Some("4"));
    assert_eq!(calls.load(Ordering::SeqCst), 8);
    tg.stop().await;
}

#[tokio::test]
async fn a_kept_answer_never_gives_its_cookie_away() {
    let (app, calls) = counting_app().await;
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
    let first = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(first.header("set-cookie"), Some("session=s1; HttpOnly"));
    let again = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("x-call"), Some("1"));
    assert_eq!(again.header("set-cookie"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    tg.stop().await;
}

#[tokio::test]
async fn the_same_key_and_body_as_another_content_type_is_a_mismatch() {
    let (app, calls) = counting_app().await;
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
    let typed = |t: &str| {
        request("POST", "/orders", "app")
            .header("idempotency-key", "\"k\"")
            .header("content-type", t)
            .body(full("{}"))
            .unwrap()
    };
    assert_eq!(
        send(tg.inbound(), typed("application/json")).await.status,
        201
    );
    let other = send(tg.inbound(), typed("text/plain")).await;
    assert_eq!(
        (other.status.as_u16(), other.outcome()),
        (422, Some("key-mismatch"))
    );
    let same = send(tg.inbound(), typed("application/json")).await;
    assert_eq!(same.header("idempotent-replayed"), Some("true"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    tg.stop().await;
}

#[tokio::test]
async fn the_key_header_and_the_identity_headers_are_the_configs() {
    let (app, calls) = counting_app().await;
    let tg = Tollgate::start(
        &Config::new()
            .inbound(app.addr, |i| {
                i.dedupe(|d| d.header("x-request-key").identity_headers(["x-tenant"]))
            })
            .to_toml(),
    )
    .await;
    let req = |key: &str, tenant: &str| {
        request("POST", "/orders", "app")
            .header(key, "\"k\"")
            .header("x-tenant", tenant)
            .body(full("x"))
            .unwrap()
    };
    let first = send(tg.inbound(), req("x-request-key", "t1")).await;
    assert_eq!(first.status, 201);
    let said = first.header("x-tollgate-dedupe").unwrap();
    assert!(
        said.starts_with("on; header=x-request-key; scope=replica; store="),
        "{said}"
    );
    let again = send(tg.inbound(), req("x-request-key", "t1")).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let tenant = send(tg.inbound(), req("x-request-key", "t2")).await;
    assert_eq!(tenant.header("idempotent-replayed"), None, "another tenant");
    // `idempotency-key` is no key here.
    let plain = send(tg.inbound(), req("idempotency-key", "t1")).await;
    assert_eq!(plain.header("idempotent-replayed"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    tg.stop().await;
}

#[tokio::test]
async fn a_retry_naming_another_store_is_not_run() {
    let (app, executed) = orders_app(Duration::ZERO).await;
    let tg = Tollgate::start(&Config::new().inbound(app.addr, deduping).to_toml()).await;
    let first = send(tg.inbound(), post(Some("\"k\""), "x")).await;
    let said = first.header("x-tollgate-dedupe").unwrap().to_string();
    let own = said.rsplit("store=").next().unwrap().to_string();
    let named = |store: &str, key: &str| {
        request("POST", "/orders", "app")
            .header("idempotency-key", key)
            .header("x-tollgate-dedupe-store", store)
            .body(full("x"))
            .unwrap()
    };
    // Another store (a restarted replica, another pod): not run, whatever its key.
    for key in ["\"k\"", "\"new\""] {
        let foreign = send(tg.inbound(), named("0123456789abcdef", key)).await;
        assert_eq!(
            (foreign.status.as_u16(), foreign.outcome()),
            (500, Some("not-replayable")),
            "{key}"
        );
    }
    // Its own: a duplicate as any other, and a key it never saw runs.
    let replay = send(tg.inbound(), named(&own, "\"k\"")).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(send(tg.inbound(), named(&own, "\"new\"")).await.status, 201);
    assert_eq!(executed.load(Ordering::SeqCst), 2);
    tg.stop().await;
}

/// An h2c app that refuses its first stream once it has all of it (`REFUSED_STREAM`:
/// it processed nothing) and books the others; the streams it was sent.
async fn refusing_h2c_app() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let streams = Arc::new(AtomicUsize::new(0));
    let s = streams.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = l.accept().await {
            let s = s.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(sock).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let n = s.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        // The whole request arrives; the first is then refused unread.
                        let mut body = req.into_body();
                        while let Some(Ok(chunk)) = body.data().await {
                            let _ = body.flow_control().release_capacity(chunk.len());
                        }
                        if n == 0 {
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                            return;
                        }
                        let head = http::Response::builder().status(201).body(()).unwrap();
                        let mut out = respond.send_response(head, false).unwrap();
                        let _ = out.send_data(bytes::Bytes::from(format!("order {n}")), true);
                    });
                }
            });
        }
    });
    (addr, streams)
}

#[tokio::test]
async fn a_stream_the_app_refused_never_ran_and_frees_its_key() {
    let (addr, streams) = refusing_h2c_app().await;
    let tg = Tollgate::start(&Config::new().inbound(addr, deduping).to_toml()).await;
    let first = send_h2(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(first.status, 502);
    assert_eq!(
        first.outcome(),
        Some("app-unreachable; ran=no"),
        "a refused stream never ran"
    );
    // It never ran: the retry runs, and is the key's.
    let retried = send_h2(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(
        (retried.status.as_u16(), &retried.body[..]),
        (201, &b"order 1"[..]),
        "{:?}",
        retried.outcome()
    );
    let again = send_h2(tg.inbound(), post(Some("\"k\""), "x")).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(streams.load(Ordering::SeqCst), 2);
    tg.stop().await;
}

/// An app whose accept queue is full (a `listen(0)` socket, its one place taken, nobody
/// accepting): a connect to it hangs while the kernel drops its SYNs. Served by
/// `serve` once the queue empties.
struct CloggedApp {
    listener: Option<std::net::TcpListener>,
    filler: Option<std::net::TcpStream>,
    addr: std::net::SocketAddr,
}

impl CloggedApp {
    fn new() -> Self {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sock.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        sock.listen(0).unwrap();
        sock.set_nonblocking(true).unwrap();
        let listener: std::net::TcpListener = sock.into();
        let addr = listener.local_addr().unwrap();
        let filler = std::net::TcpStream::connect(addr).unwrap();
        CloggedApp {
            listener: Some(listener),
            filler: Some(filler),
            addr,
        }
    }

    /// Accepts again, the queue's place given back: `orders_app`'s handler.
    fn serve(&mut self) -> (Upstream, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::from_std(self.listener.take().unwrap()).unwrap();
        let executed = Arc::new(AtomicUsize::new(0));
        let counter = executed.clone();
        let app = Upstream::serve(listener, move |_req| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move { respond(201, format!("order {n}")) }
        });
        self.filler = None;
        (app, executed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_whose_deadline_passed_while_connecting_never_ran_and_frees_its_key() {
    let mut clogged = CloggedApp::new();
    let tg = Tollgate::start(&Config::new().inbound(clogged.addr, deduping).to_toml()).await;
    // The caller's deadline passes while tollgate still waits for the app's connection:
    // the request never left. Its body is empty, so nothing unread tells that it did not.
    let impatient = request("POST", "/orders", "app")
        .header("idempotency-key", "\"k\"")
        .header("x-timeout-ms", "300");
    let first = send(tg.inbound(), impatient.body(full("")).unwrap()).await;
    assert_eq!(first.status, 504);
    assert_eq!(first.outcome(), Some("app-timeout"));

    // The app accepts again. The caller's retry with the same key runs (it is not held
    // as "may have run"), once, and is then the key's answer.
    let (_app, executed) = clogged.serve();
    let retried = send(tg.inbound(), post(Some("\"k\""), "")).await;
    assert_eq!(
        (retried.status.as_u16(), &retried.body[..]),
        (201, &b"order 1"[..]),
        "{:?}",
        retried.outcome()
    );
    let again = send(tg.inbound(), post(Some("\"k\""), "")).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    tg.stop().await;
}
