//! Graceful shutdown of the real binary: SIGTERM stops accepting new connections, lets
//! the request in flight finish, and exits 0.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::config::Config;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_refuses_new_connections() {
    drains_on("TERM").await;
}

/// Ctrl-C in a terminal drains as a pod's termination does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_drains_as_sigterm_does() {
    drains_on("INT").await;
}

/// Signal `sig` with a request in flight: the listener closes, the request finishes,
/// the process exits 0.
async fn drains_on(sig: &str) {
    let up = Upstream::start(|_req| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        respond(200, "finished")
    })
    .await;
    let mut p = Process::start(
        &Config::new()
            .upstream("slow", |u| {
                u.authorities(["slow"])
                    .endpoint(up.addr)
                    .request_timeout("10s")
                    .attempt_timeout("10s")
            })
            .to_toml_for_process(),
    )
    .await;
    let addr = p.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/", "slow").await });
    assert!(wait_until(Duration::from_secs(5), || up.hits() == 1).await);

    p.signal(sig);
    // The listener closes: new connections are refused while the old one finishes.
    let refused = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                break true;
            }
            if tokio::time::Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    assert!(
        refused,
        "new connections were still accepted after SIG{sig}"
    );

    let r = in_flight.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, "finished");
    assert_eq!(
        p.wait_exit(Duration::from_secs(10)).await,
        Some(0),
        "exit code after a clean drain"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_or_a_taken_port_exits_2() {
    let dir = tempdir::TempDir::new("exit2");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[listener]\naddr = \"nowhere\"\n").unwrap();
    let out = std::process::Command::new(binary())
        .args(["run", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml:2:8: listener.addr"), "{err}");

    // With JSON logs, the reasons come as JSON log records too.
    let out = std::process::Command::new(binary())
        .args(["run", "--log-format", "json", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let records: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        records.iter().any(|r| r["level"] == "ERROR"
            && r["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("bad.toml:2:8: listener.addr"))),
        "{err}"
    );

    // A config that serves nothing is refused before anything is bound.
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    let out = std::process::Command::new(binary())
        .args(["run", "--config"])
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("empty.toml:1:1: upstreams: no upstream is configured"),
        "{err}"
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    let cfg = dir.path().join("taken.toml");
    std::fs::write(
        &cfg,
        Config::new()
            .listener(|l| l.addr(taken_addr))
            .upstream("a", |u| u.authorities(["a"]).endpoint("127.0.0.1:1"))
            .to_toml(),
    )
    .unwrap();
    let out = std::process::Command::new(binary())
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));
}

/// A second tollgate on the same listener would share its port through SO_REUSEPORT
/// and silently take part of the connections: it refuses to start instead, and the
/// first keeps every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_tollgate_on_the_same_port_refuses_to_start() {
    let up = Upstream::start(|_req| async { respond(200, "first") }).await;
    let first = Process::start(
        &Config::new()
            .upstream("a", |u| u.authorities(["a"]).endpoint(up.addr))
            .to_toml_for_process(),
    )
    .await;
    let dir = tempdir::TempDir::new("second");
    let cfg = dir.path().join("second.toml");
    std::fs::write(
        &cfg,
        Config::new()
            .listener(|l| l.addr(first.addr))
            .upstream("a", |u| u.authorities(["a"]).endpoint("127.0.0.1:1"))
            .to_toml(),
    )
    .unwrap();
    let mut second = std::process::Command::new(binary())
        .args(["run", "--config"])
        .arg(&cfg)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a second that started would serve until killed.
    let mut code = None;
    for _ in 0..200 {
        if let Some(status) = second.try_wait().unwrap() {
            code = status.code();
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    if code.is_none() {
        let _ = second.kill();
    }
    let out = second.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, Some(2), "the second tollgate started: {err}");
    assert!(
        err.contains("another process already listens there"),
        "{err}"
    );
    for _ in 0..10 {
        assert_eq!(get(first.addr, "/", "a").await.body, "first");
    }
}

/// A connection that has not sent a byte has nothing in flight: the drain closes it at
/// once instead of waiting for it until `drain_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_spoke_does_not_hold_the_drain() {
    use tokio::io::AsyncReadExt;

    let up = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("app", |u| u.authorities(["app"]).endpoint(up.addr))
            .to_toml(),
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(tg.addr).await.unwrap();
    // And one that has spoken and sits idle, kept alive.
    let (mut idle, conn) = {
        let stream = tokio::net::TcpStream::connect(tg.addr).await.unwrap();
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        (sender, tokio::spawn(conn))
    };
    let r = idle
        .send_request(request("GET", "/", "app").body(empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        wait_until(Duration::from_secs(5), || tg
            .server()
            .shared()
            .connections()
            == 2)
        .await
    );

    let drain_timeout = Duration::from_secs(8);
    let cut = tg.server().shutdown(drain_timeout).await;
    assert_eq!(cut, 0, "connections were still open at drain_timeout");
    // tollgate closed the silent connection without a word.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent connection is closed: {read:?}"
    );
    conn.abort();
    tg.stop().await;
}

/// The path of the program a process runs now (`/proc/PID/exe`).
fn program(p: &Process) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/{}/exe", p.pid())).unwrap()
}

/// Serves one request through `p` and drains it with SIGTERM: exit 0.
async fn serves_and_drains(mut p: Process) {
    let got = get(p.addr, "/", "app").await;
    assert_eq!(got.status, 200);
    assert_eq!(&got.body[..], b"served");
    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(15)).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_run_hands_over_to_the_server_beside_it_and_serves_alone_without_it() {
    let up = Upstream::start(|_req| async { respond(200, "served") }).await;
    let upstreams = Config::new()
        .upstream("app", |u| u.authorities(["app"]).endpoint(up.addr))
        .to_toml_for_process();

    // Built beside it, as `cargo build --release` and the image put them: the process
    // `tollgate run` started is now the server alone, the tools' pages not mapped.
    let proxy = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tollgate-proxy"));
    assert_eq!(proxy.parent(), binary().parent());
    let p = Process::start(&upstreams).await;
    assert_eq!(program(&p), proxy.canonicalize().unwrap());
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid())).unwrap();
    assert!(
        cmdline.starts_with(binary().as_os_str().as_encoded_bytes()),
        "ps shows the command that was started"
    );
    serves_and_drains(p).await;

    // `tollgate` alone (copied without its neighbour): it serves by itself.
    let alone = common::tempdir::TempDir::new("alone");
    let copy = alone.path().join("tollgate");
    if std::fs::hard_link(binary(), &copy).is_err() {
        std::fs::copy(binary(), &copy).unwrap();
    }
    let p = Process::start_binary(&copy, &upstreams, &[]).await;
    assert_eq!(program(&p), copy.canonicalize().unwrap());
    serves_and_drains(p).await;

    // Handed over by a `tollgate` of another build (as `cargo run` leaves the one beside
    // it): it hands the process back, and that `tollgate` serves, saying why.
    let other_build = format!("0123456789abcdef {}", binary().display());
    let p = Process::start_binary(&proxy, &upstreams, &[("TOLLGATE_HANDOVER", &other_build)]).await;
    assert_eq!(program(&p), binary().canonicalize().unwrap());
    assert!(p.log().contains("is from another build"), "{}", p.log());
    serves_and_drains(p).await;
}
