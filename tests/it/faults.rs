//! Upstream faults: resets mid-response, hangs after the head, garbage instead of HTTP,
//! a close right after the head, a slow body, a name that does not resolve, a full
//! accept queue (a connect slower than `connect_timeout`, with one endpoint and with
//! several), an address that refuses beside one that answers. After
//! each, nothing leaks (the upstream's connection and in-flight gauges return to their
//! baseline) and a healthy upstream behind the same tollgate still answers.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::config::Config;
use common::*;
use http::Response;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

/// tollgate with a `faulty` upstream at `faulty`, with roomy timeouts and what `f`
/// sets, and a `healthy` one.
async fn tollgate(
    faulty: impl std::fmt::Display,
    healthy: SocketAddr,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> Tollgate {
    let roomy = |u: common::config::Upstream| {
        f(u.connect_timeout("1s")
            .attempt_timeout("5s")
            .request_timeout("10s"))
    };
    Tollgate::start(&pair(faulty, healthy, roomy)).await
}

/// The file with a `faulty` upstream at `faulty`, set by `f`, and a `healthy` one.
fn pair(
    faulty: impl std::fmt::Display,
    healthy: SocketAddr,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> String {
    Config::new()
        .upstream("faulty", |u| f(u.authorities(["faulty"]).endpoint(faulty)))
        .upstream("healthy", |u| u.authorities(["healthy"]).endpoint(healthy))
        .to_toml()
}

async fn healthy() -> Upstream {
    Upstream::start(|_req| async { Response::new(full("fine")) }).await
}

async fn gauges(tg: &Tollgate, upstream: &str) -> (f64, f64) {
    let m = tg.metrics().await;
    let get =
        |name: &str| metric(&m, &format!("{name}{{upstream=\"{upstream}\"}}")).unwrap_or(f64::NAN);
    (
        get("tollgate_upstream_connections"),
        get("tollgate_inflight_requests"),
    )
}

/// Waits (bounded) until the upstream's connection and in-flight gauges are back at
/// `baseline`.
async fn back_to(tg: &Tollgate, upstream: &str, baseline: (f64, f64)) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = gauges(tg, upstream).await;
        if now == baseline {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{upstream}: (connections, inflight) stayed at {now:?}, baseline {baseline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn healthy_still_answers(tg: &Tollgate) {
    let r = get(tg.addr, "/", "healthy").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "fine");
}

/// An HTTP/1.1 client connection whose response body may end badly.
struct Client {
    sender: hyper::client::conn::http1::SendRequest<BoxBody>,
    conn: JoinHandle<()>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Client { sender, conn }
    }

    async fn get(&mut self, host: &str) -> Response<hyper::body::Incoming> {
        self.try_get(host).await.unwrap()
    }

    /// The response head, or the error that came instead of one.
    async fn try_get(&mut self, host: &str) -> hyper::Result<Response<hyper::body::Incoming>> {
        timeout(Duration::from_secs(10), async {
            self.sender.ready().await?;
            self.sender
                .send_request(request("GET", "/", host).body(empty()).unwrap())
                .await
        })
        .await
        .expect("no response head")
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// Reads a body to its end or its error, bounded: Ok(bytes) or Err(bytes so far).
async fn drain(body: hyper::body::Incoming) -> Result<Vec<u8>, Vec<u8>> {
    let mut body = body;
    let mut got = Vec::new();
    let result = timeout(Duration::from_secs(10), async {
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Ok(d) = f.into_data() {
                        got.extend_from_slice(&d);
                    }
                }
                Err(_) => return false,
            }
        }
        true
    })
    .await
    .expect("the body neither ended nor failed");
    if result { Ok(got) } else { Err(got) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_mid_response_breaks_that_response_and_nothing_else() {
    let ok = healthy().await;
    let faulty = Scripted::start(|mut s, _| async move {
        read_head(&mut s).await;
        let mut out = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n".to_vec();
        out.extend(std::iter::repeat_n(b'x', 1000));
        let _ = s.write_all(&out).await;
        let _ = s.flush().await;
        // Give the bytes a moment to leave, then reset the connection.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = s.set_zero_linger();
        drop(s);
    })
    .await;
    let tg = tollgate(faulty.addr, ok.addr, |u| u).await;
    // No request yet, no series: the gauges start at 0 with the first one.
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_upstream_connections{upstream=\"faulty\"}"),
        None
    );
    let baseline = (0.0, 0.0);

    let mut c = Client::connect(tg.addr).await;
    let resp = c.get("faulty").await;
    assert_eq!(resp.status(), 200, "the head had already gone to the app");
    let got = drain(resp.into_body()).await;
    let partial = got.expect_err("a truncated body must not look complete");
    assert!(partial.len() <= 1000);
    drop(c);

    back_to(&tg, "faulty", baseline).await;
    healthy_still_answers(&tg).await;
    assert_eq!(faulty.accepted(), 1);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_the_head_is_retried_then_a_502() {
    let ok = healthy().await;
    let faulty = Scripted::start(|mut s, _| async move {
        read_head(&mut s).await;
        let _ = s.set_zero_linger();
        drop(s);
    })
    .await;
    let tg = tollgate(faulty.addr, ok.addr, |u| {
        u.retry(|r| r.max_attempts(3).backoff_base("1ms"))
    })
    .await;
    let r = get(tg.addr, "/", "faulty").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("attempts-exhausted"));
    assert_eq!(r.attempts(), 3);
    back_to(&tg, "faulty", (0.0, 0.0)).await;
    healthy_still_answers(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_reached_the_upstream_once_is_not_called_unreachable() {
    // The first attempt is reset after the request went out (it may have run); then the
    // upstream is gone and every retry's connect is refused. The app must not be told
    // the upstream was never reached: `attempts-exhausted`, not `upstream-unreachable`.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let once = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        read_head(&mut s).await;
        let _ = s.set_zero_linger();
        // The connection reset, and the listener closed with it.
    });
    let ok = healthy().await;
    let tg = tollgate(addr, ok.addr, |u| {
        u.retry(|r| r.max_attempts(3).backoff_base("1ms"))
    })
    .await;
    let r = get(tg.addr, "/", "faulty").await;
    once.await.unwrap();
    assert_eq!(
        (r.status.as_u16(), r.attempts(), r.outcome()),
        (502, 3, Some("attempts-exhausted"))
    );
    // Never connected at all: unreachable, as before.
    let dead = dead_port().await;
    let tg2 = tollgate(dead, ok.addr, |u| {
        u.retry(|r| r.max_attempts(3).backoff_base("1ms"))
    })
    .await;
    let r = get(tg2.addr, "/", "faulty").await;
    assert_eq!(
        (r.status.as_u16(), r.outcome()),
        (502, Some("upstream-unreachable"))
    );
    tg.stop().await;
    tg2.stop().await;
}

/// An upstream that answers the head and five of a hundred body bytes, then nothing,
/// ever: it waits for tollgate to hang up.
async fn hangs_after_first_bytes() -> Scripted {
    Scripted::start(|mut s, closed| async move {
        read_head(&mut s).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst")
            .await;
        until_peer_closes(s, closed).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_hanging_after_the_head_wedges_nothing() {
    let ok = healthy().await;
    let faulty = hangs_after_first_bytes().await;
    let tg = tollgate(faulty.addr, ok.addr, |u| u).await;

    // Three apps wait on the hung body at once.
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut c = Client::connect(tg.addr).await;
        let resp = c.get("faulty").await;
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let first = timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the first bytes stream through")
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        assert_eq!(first, "first");
        clients.push((c, body));
    }
    // Three connections held; no request waits for a head (a streaming body holds no
    // place in max_inflight).
    assert_eq!(gauges(&tg, "faulty").await, (3.0, 0.0));

    // Everyone else is served meanwhile, over new connections and the same ports.
    for _ in 0..5 {
        healthy_still_answers(&tg).await;
    }

    // The apps give up: tollgate closes the upstream connections behind them.
    drop(clients);
    assert!(
        wait_until(Duration::from_secs(10), || faulty.peer_closed() == 3).await,
        "tollgate kept {} of 3 hung upstream connections open after the apps left",
        3 - faulty.peer_closed()
    );
    back_to(&tg, "faulty", (0.0, 0.0)).await;
    healthy_still_answers(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_the_app_cancels_closes_its_hung_upstream_connection() {
    let ok = healthy().await;
    let faulty = hangs_after_first_bytes().await;
    // The app speaks HTTP/2, the upstream HTTP/1.1.
    let tg = tollgate(faulty.addr, ok.addr, |u| u.protocol("http1")).await;
    let (mut sender, conn) = h2_client(tg.addr).await;
    let resp = timeout(
        Duration::from_secs(10),
        sender.send_request(
            request("GET", "http://faulty/", "faulty")
                .body(empty())
                .unwrap(),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = timeout(Duration::from_secs(10), body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first");
    // The app cancels this stream (RST_STREAM) but keeps its connection.
    drop(body);
    assert!(
        wait_until(Duration::from_secs(10), || faulty.peer_closed() == 1).await,
        "the cancelled stream's upstream connection stayed open"
    );
    back_to(&tg, "faulty", (0.0, 0.0)).await;
    // The same HTTP/2 connection goes on serving.
    let resp = timeout(
        Duration::from_secs(10),
        sender.send_request(
            request("GET", "http://healthy/", "healthy")
                .body(empty())
                .unwrap(),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(read(resp).await.body, "fine");
    conn.abort();
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_hanging_before_the_head_is_cut_at_the_deadline() {
    let ok = healthy().await;
    let faulty = Scripted::start(|mut s, closed| async move {
        read_head(&mut s).await;
        until_peer_closes(s, closed).await;
    })
    .await;
    let tg = Tollgate::start(&pair(faulty.addr, ok.addr, |u| {
        u.attempt_timeout("300ms").request_timeout("300ms")
    }))
    .await;
    let r = get(tg.addr, "/", "faulty").await;
    assert_eq!(r.status, 504);
    assert!(
        wait_until(Duration::from_secs(10), || faulty.peer_closed() == 1).await,
        "the timed-out attempt's connection was not closed"
    );
    back_to(&tg, "faulty", (0.0, 0.0)).await;
    healthy_still_answers(&tg).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_instead_of_http_is_a_502() {
    let ok = healthy().await;
    for garbage in [
        &b"SSH-2.0-OpenSSH_9.6\r\n"[..],
        b"\x00\x01\x02\x03\xff\xfe\xfd\xfc\r\n\r\n",
        b"HTTP/1.1 abc Nope\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    ] {
        let faulty = Scripted::start(move |mut s, closed| async move {
            read_head(&mut s).await;
            let _ = s.write_all(garbage).await;
            until_peer_closes(s, closed).await;
        })
        .await;
        let tg = tollgate(faulty.addr, ok.addr, |u| u).await;
        let mut c = Client::connect(tg.addr).await;
        let what = String::from_utf8_lossy(garbage);
        match c.try_get("faulty").await {
            Ok(resp) if resp.status() == 200 => {
                // A broken chunked body is found out only after the head went back.
                let body = drain(resp.into_body()).await;
                assert!(
                    body.is_err(),
                    "{what}: garbage passed off as a complete body"
                );
            }
            Ok(resp) => {
                assert_eq!(resp.status(), 502, "{what}");
                assert!(drain(resp.into_body()).await.is_ok());
            }
            // Or the head never made it out before the body broke: the app sees its
            // connection closed, never a clean answer.
            Err(e) => assert!(e.is_incomplete_message(), "{what}: {e}"),
        }
        drop(c);
        back_to(&tg, "faulty", (0.0, 0.0)).await;
        assert!(
            wait_until(Duration::from_secs(10), || faulty.peer_closed() == 1).await,
            "{what}: the connection that spoke garbage was not closed"
        );
        healthy_still_answers(&tg).await;
        tg.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_right_after_the_head_is_a_broken_body_not_a_short_one() {
    let ok = healthy().await;
    let faulty = Scripted::start(|mut s, _| async move {
        read_head(&mut s).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
            .await;
        let _ = s.shutdown().await;
    })
    .await;
    let tg = tollgate(faulty.addr, ok.addr, |u| u).await;
    let mut c = Client::connect(tg.addr).await;
    let resp = c.get("faulty").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("content-length").map(|v| v.as_bytes()),
        Some(&b"100"[..])
    );
    let got = drain(resp.into_body()).await;
    assert!(got.is_err(), "4 of 100 bytes must not end cleanly: {got:?}");
    drop(c);
    back_to(&tg, "faulty", (0.0, 0.0)).await;

    // A response delimited by the close itself (no length, no chunking) is complete.
    let delimited = Scripted::start(|mut s, _| async move {
        read_head(&mut s).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nwhole body")
            .await;
        let _ = s.shutdown().await;
    })
    .await;
    let tg2 = tollgate(delimited.addr, ok.addr, |u| u).await;
    let mut c = Client::connect(tg2.addr).await;
    let resp = c.get("faulty").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(drain(resp.into_body()).await.unwrap(), b"whole body");
    // The app's connection stays usable: the close was the upstream's, not the app's.
    let resp = c.get("healthy").await;
    assert_eq!(drain(resp.into_body()).await.unwrap(), b"fine");
    drop(c);
    back_to(&tg2, "faulty", (0.0, 0.0)).await;
    healthy_still_answers(&tg).await;
    tg.stop().await;
    tg2.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_streams_through_past_every_timeout() {
    let ok = healthy().await;
    let (tx_tx, mut tx_rx) = mpsc::unbounded_channel::<mpsc::Sender<Bytes>>();
    let slow = Upstream::start(move |_req| {
        let (tx, rx) = mpsc::channel(1);
        let _ = tx_tx.send(tx);
        async move { Response::new(ChannelBody(rx).boxed()) }
    })
    .await;
    // Every timeout is shorter than the whole body takes: they bound the wait for the
    // head, not the body.
    let tg = Tollgate::start(&pair(slow.addr, ok.addr, |u| {
        u.attempt_timeout("300ms").request_timeout("500ms")
    }))
    .await;
    let mut c = Client::connect(tg.addr).await;
    let resp = c.get("faulty").await;
    assert_eq!(resp.status(), 200);
    let tx = timeout(Duration::from_secs(10), tx_rx.recv())
        .await
        .unwrap()
        .unwrap();
    let mut body = resp.into_body();
    let started = Instant::now();
    // Lock step: the next chunk is sent only once the app has the previous one, so a
    // tollgate that buffered the body would never finish.
    for i in 0..8 {
        let chunk = format!("chunk {i};");
        tx.send(Bytes::from(chunk.clone())).await.unwrap();
        let got = timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap_or_else(|_| panic!("chunk {i} did not stream through"))
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        assert_eq!(got, chunk);
        healthy_still_answers(&tg).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(tx);
    assert!(
        timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap()
            .is_none()
    );
    assert!(started.elapsed() > Duration::from_millis(500));
    drop(c);
    back_to(&tg, "faulty", (1.0, 0.0)).await;
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_does_not_resolve_is_a_prompt_502() {
    let ok = healthy().await;
    let tg = tollgate("nonexistent.invalid:80", ok.addr, |u| {
        u.retry(|r| r.max_attempts(3).backoff_base("1ms"))
    })
    .await;
    for i in 0..3 {
        // Distinct requests: the same one again within 2 s would be the app's retry.
        let r = timeout(
            Duration::from_secs(10),
            get(tg.addr, &format!("/{i}"), "faulty"),
        )
        .await
        .expect("a resolver failure must not hang the request");
        assert_eq!(r.status, 502);
        assert_eq!(r.outcome(), Some("upstream-unreachable"));
        healthy_still_answers(&tg).await;
    }
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"connect-failure\",upstream=\"faulty\"}"
        ),
        Some(9.0)
    );
    back_to(&tg, "faulty", (0.0, 0.0)).await;
    tg.stop().await;
}

/// Waits (bounded) until `upstream` holds `n` connections: the connect that lost a race
/// ran on, and its connection was pooled once made.
async fn pooled_loser(tg: &Tollgate, upstream: &str, n: f64) {
    let limit = Instant::now() + Duration::from_secs(10);
    loop {
        let (connections, _) = gauges(tg, upstream).await;
        if connections == n {
            return;
        }
        assert!(
            Instant::now() < limit,
            "{upstream}: {connections} connections, not {n}: the connect that lost the race \
             was not pooled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `TcpExt: ListenOverflows` of this network namespace: SYNs a full accept queue
/// dropped.
fn listen_overflows() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "ListenOverflows")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_slower_than_connect_timeout_is_waited_for_as_a_direct_call_waits() {
    // The upstream's accept queue is full: the kernel drops SYNs and the client sends
    // them again a second later. A connect timeout of 200 ms used to give up (and each
    // retry too); a direct call simply connects late. Now another connect is raced
    // beside the slow one, and the first made carries the request.
    let queue = full_accept_queue();
    let addr = queue.0.local_addr().unwrap();
    let ok = healthy().await;
    let tg = tollgate(addr, ok.addr, |u| {
        u.connect_timeout("200ms")
            .retry(|r| r.max_attempts(3).backoff_base("1ms"))
    })
    .await;
    let dropped = listen_overflows();
    let through = tokio::spawn(async move {
        let r = get(tg.addr, "/slow-connect", "faulty").await;
        (r, tg)
    });
    let direct = tokio::spawn(async move { get(addr, "/slow-connect", "faulty").await });
    // Until both clients' SYNs were dropped, and one more (tollgate's second connect,
    // or a SYN sent again): long past the connect timeout. The queue then empties.
    let overflowed = wait_until(Duration::from_secs(10), || {
        listen_overflows() >= dropped + 3
    })
    .await;
    assert!(overflowed, "the accept queue never overflowed");
    served_late(vec![queue], direct, through, "faulty", "/slow-connect").await;
}

/// A listener on loopback whose accept queue is full (`listen(0)`, its one place taken
/// by the connection returned with it): the kernel drops the SYNs of every other
/// connect until the queue has room.
fn full_accept_queue() -> (std::net::TcpListener, std::net::TcpStream) {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    sock.listen(0).unwrap();
    sock.set_nonblocking(true).unwrap();
    let listener: std::net::TcpListener = sock.into();
    let filler = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    (listener, filler)
}

/// The full queues given room (each listener served, its connection let go), then: the
/// direct call and the call through tollgate to `upstream` both answered, tollgate's in
/// one attempt and with no connect failure, and the connect that lost its race pooled
/// beside the one that carried the request, not closed.
async fn served_late(
    queues: Vec<(std::net::TcpListener, std::net::TcpStream)>,
    direct: JoinHandle<Got>,
    through: JoinHandle<(Got, Tollgate)>,
    upstream: &str,
    path: &str,
) {
    let mut servers = Vec::new();
    for (listener, filler) in queues {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        servers.push(Upstream::serve(listener, |req| async move {
            respond(200, format!("served {}", req.uri().path()))
        }));
        drop(filler);
    }
    let direct = timeout(Duration::from_secs(15), direct)
        .await
        .unwrap()
        .unwrap();
    let (r, tg) = timeout(Duration::from_secs(15), through)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(direct.status, 200, "direct");
    assert_eq!(
        (r.status.as_u16(), &r.body[..], r.attempts()),
        (200, format!("served {path}").as_bytes(), 1),
        "through tollgate, as directly: one attempt, connected late"
    );
    let m = tg.metrics().await;
    let failures =
        format!("tollgate_attempts_total{{result=\"connect-failure\",upstream=\"{upstream}\"}}");
    assert_eq!(metric(&m, &failures), Some(0.0), "{m}");
    pooled_loser(&tg, upstream, 2.0).await;
    drop(servers);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_connect_races_one_to_another_endpoint_and_is_no_failure() {
    // Two pods, one of them dropping SYNs (its accept queue full, as under a load step
    // or behind a dead node): a connect to it is slow, not failed. At `connect_timeout`
    // a connect to the other pod starts beside it and carries the request: one attempt,
    // no retry (the budget allows none), no connect failure, nothing ejected, and the
    // access log names the pod that answered.
    let (stuck, _filler) = full_accept_queue();
    let stuck_addr = stuck.local_addr().unwrap();
    let ok = Upstream::start(|req| async move { respond(200, format!("ok {}", req.uri().path())) })
        .await;
    let p = Process::start_logged(
        &Config::new()
            .upstream("pods", |u| {
                u.authorities(["pods"])
                    .endpoint(stuck_addr)
                    .endpoint(ok.addr)
                    .connect_timeout("200ms")
                    .retry(|r| r.max_attempts(3).backoff_base("1ms"))
                    .budget(|b| b.ratio(0.0).min_per_sec(0.0))
                    .outlier(|o| o.consecutive_failures(1))
            })
            .access_log(|a| a.enabled(true))
            .to_toml_for_process(),
    )
    .await;
    let dropped = listen_overflows();
    for i in 0..6 {
        let r = timeout(
            Duration::from_secs(10),
            get(p.addr, &format!("/{i}"), "pods"),
        )
        .await
        .expect("a slow connect must not hold the request past the race");
        assert_eq!(
            (r.status.as_u16(), &r.body[..], r.attempts()),
            (200, format!("ok /{i}").as_bytes(), 1),
            "request {i}: {:?}",
            r.outcome()
        );
    }
    assert!(
        listen_overflows() > dropped,
        "no request went to the pod whose accept queue is full"
    );
    let m = get(p.admin, "/metrics", "admin").await;
    let m = String::from_utf8_lossy(&m.body);
    for (series, want) in [
        (
            "tollgate_attempts_total{result=\"connect-failure\",upstream=\"pods\"}",
            0.0,
        ),
        (
            "tollgate_attempts_total{result=\"2xx\",upstream=\"pods\"}",
            6.0,
        ),
        ("tollgate_ejections_total{upstream=\"pods\"}", 0.0),
    ] {
        assert_eq!(metric(&m, series), Some(want), "{series}\n{m}");
    }
    let access = |log: &str| {
        log.lines()
            .filter(|l| l.contains(" access direction="))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let written = wait_until(Duration::from_secs(10), || access(&p.log()).len() >= 6).await;
    let lines = access(&p.log());
    assert!(written, "{} access lines, not 6:\n{}", lines.len(), p.log());
    for line in &lines {
        assert!(
            line.contains(&format!("attempts=1 peer={} ", ok.addr)),
            "the pod that answered is named, not the one that was slow: {line}"
        );
    }
    drop(stuck);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raced_connect_that_is_refused_hands_its_place_to_a_third_pod() {
    // Three pods in this order: one dropping SYNs (its accept queue full), one gone
    // (connections refused), one healthy. The first request goes to the slow one; at
    // `connect_timeout` a connect to the next pod is raced beside it and refused at
    // once; a connect to the third then takes its place (at most two in flight, three
    // pods an attempt) and carries the request. Before, the refusal left the slow
    // connect to finish alone: the request waited out its deadline.
    let (stuck, _filler) = full_accept_queue();
    let stuck_addr = stuck.local_addr().unwrap();
    let gone = dead_port().await;
    let ok = Upstream::start(|req| async move { respond(200, format!("ok {}", req.uri().path())) })
        .await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("pods", |u| {
                u.authorities(["pods"])
                    .endpoint(stuck_addr)
                    .endpoint(gone)
                    .endpoint(ok.addr)
                    .connect_timeout("200ms")
                    .retry(|r| r.max_attempts(3).backoff_base("1ms"))
                    .budget(|b| b.ratio(0.0).min_per_sec(0.0))
            })
            .to_toml(),
    )
    .await;
    let dropped = listen_overflows();
    let req = request("GET", "/first", "pods")
        .header("x-timeout-ms", "3000")
        .body(empty())
        .unwrap();
    let r = timeout(Duration::from_secs(10), send(tg.addr, req))
        .await
        .expect("the request outlived its deadline");
    assert_eq!(
        (r.status.as_u16(), &r.body[..], r.attempts()),
        (200, &b"ok /first"[..], 1),
        "{:?}",
        r.outcome()
    );
    assert!(
        listen_overflows() > dropped,
        "the request did not start at the pod whose accept queue is full"
    );
    let m = tg.metrics().await;
    for (series, want) in [
        (
            "tollgate_attempts_total{result=\"connect-failure\",upstream=\"pods\"}",
            0.0,
        ),
        (
            "tollgate_attempts_total{result=\"2xx\",upstream=\"pods\"}",
            1.0,
        ),
    ] {
        assert_eq!(metric(&m, series), Some(want), "{series}\n{m}");
    }
    tg.stop().await;
    drop(stuck);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pod_slow_to_accept_is_waited_for_as_a_direct_call_waits() {
    // Both pods' accept queues full: tollgate's connect to the first is slow, the one
    // raced beside it to the second is slow too, and whichever is made first (once the
    // queues have room and the kernel sends a SYN again) carries the request, as a
    // direct call connects late. Each slow connect used to be a connect failure, and
    // the request's attempts ran out before the queues had room.
    let (a, b) = (full_accept_queue(), full_accept_queue());
    let (a_addr, b_addr) = (a.0.local_addr().unwrap(), b.0.local_addr().unwrap());
    let ok = healthy().await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("pods", |u| {
                u.authorities(["pods"])
                    .endpoint(a_addr)
                    .endpoint(b_addr)
                    .connect_timeout("200ms")
                    .retry(|r| r.max_attempts(3).backoff_base("1ms"))
            })
            .upstream("healthy", |u| u.authorities(["healthy"]).endpoint(ok.addr))
            .to_toml(),
    )
    .await;
    let dropped = listen_overflows();
    let through = tokio::spawn(async move {
        let r = get(tg.addr, "/late", "pods").await;
        (r, tg)
    });
    let direct = tokio::spawn(async move { get(a_addr, "/late", "pods").await });
    // tollgate's connect to one pod, the direct call's, and tollgate's second connect
    // beside its first (or SYNs sent again): past the connect timeout, both pods slow.
    let overflowed = wait_until(Duration::from_secs(10), || {
        listen_overflows() >= dropped + 3
    })
    .await;
    assert!(overflowed, "the accept queues never overflowed");
    served_late(vec![a, b], direct, through, "pods", "/late").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_address_moves_the_attempt_to_the_next_without_a_retry() {
    // A name that resolves to `::1` then `127.0.0.1` with the upstream on IPv4 only (a
    // pod's `localhost`), its answers closing each connection: every request that
    // lands on `::1` first moves within its attempt to the other address, and costs no
    // retry (the budget here allows none).
    let up = Upstream::start(|req| async move {
        Response::builder()
            .header("connection", "close")
            .body(full(format!("served {}", req.uri().path())))
            .unwrap()
    })
    .await;
    let v6 = format!("[::1]:{}", up.addr.port());
    let tg = Tollgate::start(
        &Config::new()
            .upstream("dual", |u| {
                u.authorities(["dual"])
                    .endpoint(&v6)
                    .endpoint(up.addr)
                    .retry(|r| r.max_attempts(3).backoff_base("1ms"))
                    .budget(|b| b.ratio(0.0).min_per_sec(0.0))
            })
            .to_toml(),
    )
    .await;
    for i in 0..40 {
        let r = get(tg.addr, &format!("/{i}"), "dual").await;
        assert_eq!(
            (r.status.as_u16(), r.body.clone()),
            (200, bytes::Bytes::from(format!("served /{i}"))),
            "request {i}: {:?}",
            r.outcome()
        );
        assert_eq!(r.attempts(), 1);
    }
    let m = tg.metrics().await;
    let retried = m
        .lines()
        .filter(|l| l.starts_with("tollgate_retries_total{") && l.contains("upstream=\"dual\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert_eq!(retried, 0.0, "{m}");
    tg.stop().await;
}
