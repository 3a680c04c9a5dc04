//! The real binary under a low open-file limit: more clients than it has descriptors
//! for are each answered or closed at once (none left hanging in the listen queue),
//! the upstream is never blamed for tollgate's own shortage, and the log says so in a
//! few lines, not a line per failure.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What became of one client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// A response head came back.
    Answered(u16),
    /// Closed (or reset, or refused) without an answer.
    Closed,
    /// Neither, within the wait.
    Hung,
}

/// Connects, sends a keep-alive GET and waits (bounded) for a response head or the
/// close. The connection is handed back open, as a client pool would keep it.
async fn client(addr: std::net::SocketAddr) -> (Fate, Option<TcpStream>) {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return (Fate::Closed, None);
    };
    if s.write_all(b"GET / HTTP/1.1\r\nHost: app\r\n\r\n")
        .await
        .is_err()
    {
        return (Fate::Closed, None);
    }
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let fate = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return Fate::Closed,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                let status = head
                    .get(9..12)
                    .and_then(|d| std::str::from_utf8(d).ok()?.parse().ok())
                    .unwrap_or(0);
                return Fate::Answered(status);
            }
        }
    })
    .await
    .unwrap_or(Fate::Hung);
    (fate, Some(s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_open_file_limit_sheds_clients_at_once_and_never_blames_the_upstream() {
    let up = Upstream::start(|req: http::Request<hyper::body::Incoming>| async move {
        if req.uri().path() == "/slow" {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        respond(200, "ok")
    })
    .await;
    let mut p = Process::start_limited(
        &Config::new()
            .runtime(|r| r.worker_threads(2))
            .upstream("app", |u| {
                u.authorities(["app"])
                    .endpoint(up.addr)
                    .protocol("http1")
                    .attempt_timeout("5s")
            })
            .to_toml_for_process(),
        256,
    )
    .await;

    // This test process holds every client socket and the upstream's side of
    // tollgate's connections: under a low limit of its own, fewer clients (still far
    // more than tollgate's 256 descriptors).
    let own_limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            let line = l
                .lines()
                .find(|l| l.starts_with("Max open files"))?
                .to_string();
            line["Max open files".len()..]
                .split_ascii_whitespace()
                .next()?
                .parse::<usize>()
                .ok()
        })
        .unwrap_or(usize::MAX);
    let n = 1000.min(own_limit.saturating_sub(400));
    assert!(
        n >= 500,
        "this test needs an open-file limit of 900 or more"
    );
    let clients: Vec<_> = (0..n).map(|_| tokio::spawn(client(p.addr))).collect();
    let mut kept = Vec::new();
    let (mut answered, mut closed, mut hung) = (0, 0, 0);
    let mut statuses = std::collections::BTreeMap::new();
    for c in clients {
        let (fate, stream) = c.await.unwrap();
        match fate {
            Fate::Answered(status) => {
                answered += 1;
                *statuses.entry(status).or_insert(0) += 1;
            }
            Fate::Closed => closed += 1,
            Fate::Hung => hung += 1,
        }
        kept.extend(stream);
    }
    let summary = format!("{answered} answered {statuses:?}, {closed} closed at once, {hung} hung");
    assert_eq!(hung, 0, "{summary}");
    assert!(answered > 0, "{summary}");
    assert!(
        statuses.keys().all(|s| *s == 200 || *s == 503),
        "answered by the upstream, or 503 overloaded: {summary}"
    );
    assert_eq!(answered + closed, n, "{summary}");

    // While every place is taken and held, the upstream is not blamed.
    let m = String::from_utf8(get(p.admin, "/metrics", "admin").await.body.to_vec()).unwrap();
    let series = |s: &str| metric(&m, s).unwrap_or(0.0);
    assert_eq!(
        series("tollgate_attempts_total{result=\"connect-failure\",upstream=\"app\"}"),
        0.0,
        "{summary}"
    );
    assert_eq!(
        series(
            "tollgate_requests_total{code=\"502\",outcome=\"upstream-unreachable\",upstream=\"app\"}"
        ),
        0.0,
        "{summary}"
    );
    drop(kept);

    // Places freed are reused.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (fate, _) = client(p.addr).await;
        if fate == Fate::Answered(200) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{fate:?} after the clients left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // One HTTP/2 connection asking for more upstream connections at once than there
    // are descriptors: what cannot get one is tollgate's overload, not the upstream's
    // failure.
    let (h2, conn) = h2_client(p.addr).await;
    let calls: Vec<_> = (0..400)
        .map(|_| {
            let mut h2 = h2.clone();
            tokio::spawn(async move {
                let req = request("GET", "http://app/slow", "app")
                    .version(http::Version::HTTP_2)
                    .body(empty())
                    .unwrap();
                let resp = h2.send_request(req).await.unwrap();
                let outcome = resp.headers().get("x-tollgate-outcome").cloned();
                let retry_after = resp.headers().get("retry-after").cloned();
                (resp.status().as_u16(), outcome, retry_after)
            })
        })
        .collect();
    let (mut ok, mut overloaded) = (0, 0);
    for c in calls {
        match c.await.unwrap() {
            (200, None, _) => ok += 1,
            (503, Some(o), Some(_)) if o == "overloaded" => overloaded += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    conn.abort();
    assert!(ok > 0 && overloaded > 0, "{ok} ok, {overloaded} overloaded");
    let m = String::from_utf8(get(p.admin, "/metrics", "admin").await.body.to_vec()).unwrap();
    let series = |s: &str| metric(&m, s).unwrap_or(0.0);
    assert_eq!(
        series("tollgate_attempts_total{result=\"connect-failure\",upstream=\"app\"}"),
        0.0
    );
    assert_eq!(
        series("tollgate_descriptors_exhausted_total{at=\"connect\"}"),
        f64::from(overloaded)
    );

    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(15)).await, Some(0));
    let stderr = p.log();
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .count();
    assert!(warnings <= 4, "{warnings} warning lines:\n{stderr}");
}
