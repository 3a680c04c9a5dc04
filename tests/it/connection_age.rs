//! `max_connection_age` over loopback: behind a virtual address that sends each new
//! connection to whichever server is current (as a Kubernetes Service's VIP does), a
//! pool that is never idle keeps talking to the old server for ever, unless its
//! connections age out. HTTP/1.1 connections are closed after their response once too
//! old; an HTTP/2 connection is replaced for new requests while the streams running
//! on it finish. Time is the paused clock's.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A TCP address that forwards each new connection to the current target, and keeps
/// every connection it made going to the target of its time.
struct Vip {
    addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
    task: JoinHandle<()>,
}

impl Vip {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(Mutex::new(target));
        let current = target.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let to = *current.lock().unwrap();
                conns.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Vip { addr, target, task }
    }

    fn point_to(&self, target: SocketAddr) {
        *self.target.lock().unwrap() = target;
    }
}

impl Drop for Vip {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn named(name: &'static str) -> Upstream {
    Upstream::start(move |req| async move {
        if req.uri().path() == "/long" {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        respond(200, name)
    })
    .await
}

async fn tollgate(
    vip: SocketAddr,
    f: impl FnOnce(common::config::Upstream) -> common::config::Upstream,
) -> Tollgate {
    let config = Config::new().upstream("api", |u| {
        f(u.authorities(["api"])
            .endpoint(vip)
            .attempt_timeout("10s")
            .request_timeout("10s"))
    });
    Tollgate::start(&config.to_toml()).await
}

/// Sends a request every 100 ms for `secs` seconds, after pointing the VIP at `to`
/// half a second in; returns which server answered each.
async fn busy(tg: &Tollgate, vip: &Vip, to: SocketAddr, secs: u64) -> Vec<String> {
    let mut answers = Vec::new();
    for i in 0..secs * 10 {
        if i == 5 {
            vip.point_to(to);
        }
        let r = get(tg.addr, "/", "api").await;
        assert_eq!(r.status, 200);
        answers.push(String::from_utf8(r.body.to_vec()).unwrap());
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    answers
}

#[tokio::test(start_paused = true)]
async fn a_busy_http1_pool_moves_to_the_new_server_once_its_connection_is_too_old() {
    let (old, new) = (named("old").await, named("new").await);
    let vip = Vip::start(old.addr).await;
    let tg = tollgate(vip.addr, |u| u.max_connection_age("1s").protocol("http1")).await;
    let answers = busy(&tg, &vip, new.addr, 3).await;
    let first_new = answers.iter().position(|a| a == "new").unwrap();
    assert!(
        (9..=11).contains(&first_new),
        "the connection of 0 s should take no request at 1 s: {answers:?}"
    );
    assert!(
        answers[first_new..].iter().all(|a| a == "new"),
        "{answers:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn without_an_age_a_busy_pool_never_leaves_the_old_server() {
    let (old, new) = (named("old").await, named("new").await);
    let vip = Vip::start(old.addr).await;
    let tg = tollgate(vip.addr, |u| u.protocol("http1")).await;
    let answers = busy(&tg, &vip, new.addr, 3).await;
    assert!(answers.iter().all(|a| a == "old"), "{answers:?}");
}

#[tokio::test(start_paused = true)]
async fn an_old_http2_connection_is_replaced_while_its_streams_finish() {
    let (old, new) = (named("old").await, named("new").await);
    let vip = Vip::start(old.addr).await;
    let tg = tollgate(vip.addr, |u| u.max_connection_age("1s").protocol("h2c")).await;
    assert_eq!(get(tg.addr, "/", "api").await.body, "old");
    let addr = tg.addr;
    let long = tokio::spawn(async move { get(addr, "/long", "api").await });
    assert!(wait_until(Duration::from_secs(1), || old.hits() == 2).await);
    vip.point_to(new.addr);
    tokio::time::advance(Duration::from_millis(1100)).await;
    for _ in 0..3 {
        assert_eq!(get(tg.addr, "/", "api").await.body, "new");
    }
    let long = long.await.unwrap();
    assert_eq!(
        long.status, 200,
        "the stream on the old connection finished"
    );
    assert_eq!(long.body, "old");
    // With its last stream done, the old connection closes.
    let metrics = || async {
        metric(
            &tg.metrics().await,
            "tollgate_upstream_connections{upstream=\"api\"}",
        )
    };
    let mut open = metrics().await;
    for _ in 0..50 {
        if open == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        open = metrics().await;
    }
    assert_eq!(open, Some(1.0), "the old HTTP/2 connection is still open");
}
