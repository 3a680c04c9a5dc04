//! The pieces of the exactly-once tests (tests/exactly_once*.rs): an app that books
//! orders, a keyed POST, a network link that loses answers, and a `redis-server`.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;

use crate::common::*;

pub const DEDUPE: &str = "max_inflight = 1000\n[inbound.dedupe]\nstore = \"memory\"\n";

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

/// A TCP relay that loses responses: each piece of an answer coming back is, while
/// `lose` allows, not passed on, and the connection is closed both ways (the request
/// went through and ran; only its answer is lost). `lose_next` loses that many answers;
/// `lose_percent` loses that share of them at random.
pub struct Lossy {
    pub addr: std::net::SocketAddr,
    pub lose_next: Arc<AtomicUsize>,
    pub lost: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Lossy {
    pub async fn start(to: std::net::SocketAddr, lose_percent: u32, seed: u64) -> Lossy {
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
