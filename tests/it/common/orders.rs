//! The pieces of the exactly-once tests (tests/exactly_once*.rs): an app that books
//! orders, a keyed POST, the lab's network link that loses answers, and a
//! `redis-server`.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;

use crate::common::config::Inbound;
use crate::common::*;

/// An inbound side that deduplicates in memory, with room for 1000 requests.
pub fn deduping(i: Inbound) -> Inbound {
    i.max_inflight(1000).dedupe(|d| d.store("memory"))
}

/// An app that "executes" an order: counts it, and answers `201` with its number.
pub async fn orders_app(delay: Duration) -> (Upstream, Arc<AtomicUsize>) {
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

pub fn post(key: Option<&str>, body: &str) -> http::Request<BoxBody> {
    let mut b = request("POST", "/orders", "app");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(full(body.to_string())).unwrap()
}

/// A TCP relay that loses responses after the request ran: the lab's link
/// ([`tollgate_lab::payments::Lossy`]). `lose_next` loses that many pieces of answers
/// for certain; `lose_percent` loses that share of them at random.
pub use tollgate_lab::payments::Lossy;

pub async fn lossy(to: std::net::SocketAddr, lose_percent: u32, seed: u64) -> Lossy {
    Lossy::start(to, f64::from(lose_percent) / 100.0, seed)
        .await
        .unwrap()
}

/// A `redis-server` on a free loopback port, persisting nothing; killed when dropped.
pub struct Redis {
    child: Option<std::process::Child>,
    port: u16,
}

impl Redis {
    /// `None`, said loudly, when `redis-server` is not installed.
    pub fn start(test: &str) -> Option<Redis> {
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

    pub fn restart(&mut self) {
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

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn store(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
