//! Shared helpers for the integration tests: real upstream servers on loopback, tollgate
//! started in-process from TOML (or as the real binary), and a small HTTP client.
//! Everything started here stops when its handle is dropped.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod clients;
pub mod config;
pub mod grpc;
pub mod manifests;
pub mod orders;
pub mod tls;

pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

pub fn full(b: impl Into<Bytes>) -> BoxBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

pub fn empty() -> BoxBody {
    full(Bytes::new())
}

/// A real HTTP server on 127.0.0.1 (HTTP/1.1 and HTTP/2 prior knowledge), counting the
/// requests it receives. Stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Upstream {
    pub async fn start<F, Fut>(handler: F) -> Self
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<BoxBody>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, handler)
    }

    /// Serves on an already bound listener (to restart on the same port).
    pub fn serve<F, Fut>(listener: TcpListener, handler: F) -> Self
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<BoxBody>> + Send + 'static,
    {
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let handler = Arc::new(handler);
        let (stop, mut stopped) = watch::channel(false);
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    r = listener.accept() => {
                        let Ok((stream, _)) = r else { continue };
                        let handler = handler.clone();
                        let counter = counter.clone();
                        conns.spawn(async move {
                            let svc = service_fn(move |req| {
                                counter.fetch_add(1, Ordering::SeqCst);
                                let fut = handler(req);
                                async move { Ok::<_, Infallible>(fut.await) }
                            });
                            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                                .serve_connection(TokioIo::new(stream), svc)
                                .await;
                        });
                    }
                }
            }
            conns.abort_all();
        });
        Upstream {
            addr,
            hits,
            stop,
            task,
        }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}

/// A loopback port with nothing listening on it: a connection to it is refused. The
/// port stays bound (not listening) until the test process ends, so no server another
/// test starts meanwhile can be given it, nor can a connection take it as its own end.
pub async fn dead_port() -> SocketAddr {
    static HELD: std::sync::Mutex<Vec<socket2::Socket>> = std::sync::Mutex::new(Vec::new());
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let addr = s.local_addr().unwrap().as_socket().unwrap();
    HELD.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    addr
}

/// Config text for one tollgate on ephemeral loopback ports; `upstreams` is appended.
pub fn config(upstreams: &str) -> String {
    format!("[listener]\naddr = \"127.0.0.1:0\"\n[admin]\naddr = \"127.0.0.1:0\"\n{upstreams}")
}

/// As [`config`], with requests for authorities no upstream lists refused (`404
/// no-route`) rather than passed through.
pub fn refusing(upstreams: &str) -> String {
    format!(
        "[listener]\naddr = \"127.0.0.1:0\"\nunknown_authorities = \"refuse\"\n\
         [admin]\naddr = \"127.0.0.1:0\"\n{upstreams}"
    )
}

/// Config text for one tollgate whose inbound side stands in front of `app` on an
/// ephemeral loopback port; `extra` is appended to the `[inbound]` section.
pub fn inbound_config(app: SocketAddr, extra: &str) -> String {
    config(&format!(
        "[inbound]\naddr = \"127.0.0.1:0\"\napp = \"{app}\"\n{extra}"
    ))
}

/// tollgate running in this process.
pub struct Tollgate {
    pub running: Option<tollgate_core::run::Running>,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
}

impl Tollgate {
    pub async fn start(toml: &str) -> Self {
        let cfg = tollgate_core::config::load_text("test.toml", toml, std::path::Path::new("."))
            .unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
        let running = tollgate_core::run::Running::start(cfg, None).await.unwrap();
        let addr = running.server.local_addr();
        let admin = running.admin.local_addr();
        Tollgate {
            running: Some(running),
            addr,
            admin,
        }
    }

    /// Starts from a config file, watching it for changes as `tollgate run` does.
    pub async fn start_file(path: &std::path::Path) -> Self {
        let cfg = tollgate_core::config::load(path)
            .unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
        let running = tollgate_core::run::Running::start(cfg, Some(path.to_path_buf()))
            .await
            .unwrap();
        let addr = running.server.local_addr();
        let admin = running.admin.local_addr();
        Tollgate {
            running: Some(running),
            addr,
            admin,
        }
    }

    /// `tollgate_config_reloads_total{result}`.
    pub async fn reloads(&self, result: &str) -> f64 {
        let m = self.metrics().await;
        metric(
            &m,
            &format!("tollgate_config_reloads_total{{result=\"{result}\"}}"),
        )
        .unwrap()
    }

    /// Waits (at most 10 s, then fails the test) until
    /// `tollgate_config_reloads_total{result}` reaches `at_least`.
    pub async fn wait_reloads(&self, result: &str, at_least: f64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.reloads(result).await < at_least {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {at_least} reloads with result {result} within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub fn server(&self) -> &tollgate_core::sides::Server {
        &self.running.as_ref().unwrap().server
    }

    /// Where the inbound side listens (the config must have an `[inbound]`).
    pub fn inbound(&self) -> SocketAddr {
        self.server()
            .inbound_addr()
            .expect("the config has no [inbound]")
    }

    pub async fn metrics(&self) -> String {
        let r = get(self.admin, "/metrics", "admin").await;
        String::from_utf8(r.body.to_vec()).unwrap()
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown(Duration::from_secs(5)).await;
        }
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            // Tests that did not stop explicitly: stop accepting and close everything.
            tokio::spawn(async move {
                r.shutdown(Duration::ZERO).await;
            });
        }
    }
}

/// A metric's value from Prometheus text, by its full series name with labels in the
/// exposition's (alphabetical) order, e.g.
/// `tollgate_retries_total{reason="503",upstream="api"}`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

/// A response read whole.
pub struct Got {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub trailers: Option<http::HeaderMap>,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn attempts(&self) -> u32 {
        self.header("x-tollgate-attempts").unwrap().parse().unwrap()
    }

    pub fn outcome(&self) -> Option<&str> {
        self.header("x-tollgate-outcome")
    }
}

/// Sends one request over a fresh HTTP/1.1 connection and reads the response whole.
pub async fn send(addr: SocketAddr, req: Request<BoxBody>) -> Got {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let resp = sender.send_request(req).await.unwrap();
    let got = read(resp).await;
    conn.abort();
    got
}

/// Sends one request over a fresh HTTP/1.1 connection and returns as soon as the
/// response head is in, its body still to read; abort the task to close the connection.
pub async fn send_for_head(
    addr: SocketAddr,
    req: Request<BoxBody>,
) -> (Response<Incoming>, JoinHandle<hyper::Result<()>>) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    (sender.send_request(req).await.unwrap(), conn)
}

/// An HTTP/2 connection with prior knowledge, the way gRPC clients open one; abort the
/// returned task to close it.
pub async fn h2_client(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<BoxBody>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    (sender, tokio::spawn(conn))
}

/// Sends one request over HTTP/2 with prior knowledge.
pub async fn send_h2(addr: SocketAddr, req: Request<BoxBody>) -> Got {
    let (mut sender, conn) = h2_client(addr).await;
    let resp = sender.send_request(req).await.unwrap();
    let got = read(resp).await;
    conn.abort();
    got
}

pub async fn read(resp: Response<Incoming>) -> Got {
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    }
}

/// `GET path` with `Host: host`.
/// A unary gRPC call to `host` at `path` as a client writes it: a POST of one empty
/// message, `te: trailers`.
pub fn grpc_call(host: &str, path: &str) -> Request<BoxBody> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{host}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(full(&b"\x00\x00\x00\x00\x00"[..]))
        .unwrap()
}

pub async fn get(addr: SocketAddr, path: &str, host: &str) -> Got {
    send(addr, request("GET", path, host).body(empty()).unwrap()).await
}

pub fn request(method: &str, path: &str, host: &str) -> http::request::Builder {
    Request::builder()
        .method(method)
        .uri(path)
        .header("host", host)
}

pub fn respond(status: u16, body: impl Into<Bytes>) -> Response<BoxBody> {
    Response::builder().status(status).body(full(body)).unwrap()
}

/// Polls `cond` every 10 ms for at most `limit`.
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

/// The tollgate binary built for the tests.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tollgate"))
}

/// A free loopback port (bound and released: good enough for a config file).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The tollgate binary running as a child process; killed when dropped.
pub struct Process {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempdir::TempDir,
}

pub mod tempdir {
    use std::path::{Path, PathBuf};

    /// A directory under the system temp dir, removed when dropped.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> Self {
            let unique = format!(
                "tollgate-{tag}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            );
            let p = std::env::temp_dir().join(unique);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Process {
    /// Starts `tollgate run` on a config made of fixed listener/admin ports and
    /// `upstreams`, and waits (bounded) until `/readyz` answers 200.
    pub async fn start(upstreams: &str) -> Self {
        Self::spawn("", upstreams, None, false, &[]).await
    }

    /// As [`Process::start_logged`], `bin run` rather than the tests' `tollgate run`, with
    /// `env` set for it.
    pub async fn start_binary(
        bin: &std::path::Path,
        upstreams: &str,
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_binary(bin, "", upstreams, None, true, env).await
    }

    /// As [`Process::start`], with `env` set for the process (as a pod's downward API
    /// sets `POD_NAMESPACE`).
    pub async fn start_with_env(upstreams: &str, env: &[(&str, &str)]) -> Self {
        Self::spawn("", upstreams, None, false, env).await
    }

    /// As [`Process::start`], with its log (at info) kept for [`Process::log`].
    pub async fn start_logged(upstreams: &str) -> Self {
        Self::spawn("", upstreams, None, true, &[]).await
    }

    /// As [`Process::start_logged`], with `listener` added to the `[listener]` section.
    pub async fn start_logged_listening(listener: &str, upstreams: &str) -> Self {
        Self::spawn(listener, upstreams, None, true, &[]).await
    }

    /// As [`Process::start`], with the open-file limit set to `nofile` (soft and hard)
    /// and its log (at warn) kept for [`Process::log`].
    pub async fn start_limited(upstreams: &str, nofile: u64) -> Self {
        Self::spawn("", upstreams, Some(nofile), false, &[]).await
    }

    /// What the process has logged so far, when started by [`Process::start_logged`]
    /// or [`Process::start_limited`].
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tollgate.log")).unwrap_or_default()
    }

    async fn spawn(
        listener: &str,
        upstreams: &str,
        nofile: Option<u64>,
        logged: bool,
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_binary(&binary(), listener, upstreams, nofile, logged, env).await
    }

    async fn spawn_binary(
        bin: &std::path::Path,
        listener: &str,
        upstreams: &str,
        nofile: Option<u64>,
        logged: bool,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempdir::TempDir::new("proc");
        let port = free_port();
        let admin_port = free_port();
        let text = format!(
            "[listener]\naddr = \"127.0.0.1:{port}\"\ndrain_timeout = \"10s\"\n{listener}\n[admin]\naddr = \"127.0.0.1:{admin_port}\"\n{upstreams}"
        );
        let path = dir.path().join("tollgate.toml");
        std::fs::write(&path, text).unwrap();
        let mut cmd = match nofile {
            None => Command::new(bin),
            Some(n) => {
                // The shell sets the limit and becomes tollgate (`exec`), so the pid
                // and the signals are tollgate's.
                let mut c = Command::new("bash");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(bin);
                c
            }
        };
        let level = if logged { "info" } else { "warn" };
        let stderr = if logged || nofile.is_some() {
            std::fs::File::create(dir.path().join("tollgate.log"))
                .unwrap()
                .into()
        } else {
            Stdio::inherit()
        };
        let child = cmd
            .args(["run", "--config"])
            .arg(&path)
            .env("RUST_LOG", level)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let p = Process {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
            dir,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = TcpStream::connect(p.admin).await {
                drop(s);
                let r = get(p.admin, "/readyz", "admin").await;
                if r.status == 200 {
                    break;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "tollgate did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        p
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of /proc/PID/status in KiB (VmRSS, VmHWM).
    pub fn status_kib(&self, field: &str) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits (bounded) for the process to exit and returns its exit code.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A body of `len` pseudo-random bytes from `seed`, produced in 64 KiB chunks as it is
/// polled (never held whole), with an optional pause between chunks.
pub struct Generated {
    rng: fastrand::Rng,
    remaining: usize,
    pause: Option<(Duration, std::pin::Pin<Box<tokio::time::Sleep>>)>,
}

impl Generated {
    pub fn new(seed: u64, len: usize) -> Self {
        Generated {
            rng: fastrand::Rng::with_seed(seed),
            remaining: len,
            pause: None,
        }
    }

    pub fn paced(mut self, every: Duration) -> Self {
        self.pause = Some((every, Box::pin(tokio::time::sleep(every))));
        self
    }

    /// The hash of the bytes `Generated::new(seed, len)` yields.
    pub fn expected_hash(seed: u64, len: usize) -> u64 {
        let mut g = Generated::new(seed, len);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        while let Some(c) = g.chunk() {
            std::hash::Hasher::write(&mut h, &c);
        }
        std::hash::Hasher::finish(&h)
    }

    fn chunk(&mut self) -> Option<Bytes> {
        if self.remaining == 0 {
            return None;
        }
        let n = self.remaining.min(64 * 1024);
        self.remaining -= n;
        let mut v = vec![0u8; n];
        self.rng.fill(&mut v);
        Some(Bytes::from(v))
    }
}

impl http_body::Body for Generated {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        if let Some((every, sleep)) = &mut self.pause {
            if sleep.as_mut().poll(cx).is_pending() {
                return std::task::Poll::Pending;
            }
            let next = tokio::time::Instant::now() + *every;
            sleep.as_mut().reset(next);
        }
        std::task::Poll::Ready(self.chunk().map(|c| Ok(http_body::Frame::data(c))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining as u64)
    }
}

/// Hashes a body as it streams in.
pub async fn hash_body(mut body: Incoming) -> (u64, usize) {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            len += data.len();
            std::hash::Hasher::write(&mut h, &data);
        }
    }
    (std::hash::Hasher::finish(&h), len)
}

/// A body of one chunk followed by trailers (the shape of a gRPC response).
pub struct WithTrailers {
    pub data: Option<Bytes>,
    pub trailers: Option<http::HeaderMap>,
}

impl http_body::Body for WithTrailers {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        if let Some(d) = self.data.take() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(d))));
        }
        std::task::Poll::Ready(
            self.trailers
                .take()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        )
    }
}

/// Set when a handler's future is dropped before it finished: the upstream saw the
/// client (tollgate) go away.
pub struct Abandoned {
    flag: Arc<std::sync::atomic::AtomicBool>,
    done: bool,
}

impl Abandoned {
    pub fn new(flag: &Arc<std::sync::atomic::AtomicBool>) -> Self {
        Abandoned {
            flag: flag.clone(),
            done: false,
        }
    }

    pub fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.done {
            self.flag.store(true, Ordering::SeqCst);
        }
    }
}

/// Logs to the test output when `RUST_LOG` is set (e.g. `RUST_LOG=tollgate=debug`).
pub fn logs() {
    use tracing_subscriber::prelude::*;
    if let Some(filter) = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
    {
        let _ = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(filter),
            )
            .try_init();
    }
}

/// A TCP server that plays a script on every connection, instead of speaking HTTP
/// properly. Counts connections accepted and connections the peer (tollgate) closed.
pub struct Scripted {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    peer_closed: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Scripted {
    pub async fn start<F, Fut>(script: F) -> Self
    where
        F: Fn(TcpStream, Arc<AtomicUsize>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let peer_closed = Arc::new(AtomicUsize::new(0));
        let task = {
            let (accepted, peer_closed) = (accepted.clone(), peer_closed.clone());
            tokio::spawn(async move {
                let mut conns = tokio::task::JoinSet::new();
                while let Ok((s, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    conns.spawn(script(s, peer_closed.clone()));
                }
            })
        };
        Scripted {
            addr,
            accepted,
            peer_closed,
            task,
        }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn peer_closed(&self) -> usize {
        self.peer_closed.load(Ordering::SeqCst)
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        // Aborting the accept task drops the JoinSet, which aborts every script.
        self.task.abort();
    }
}

/// Reads one request head (up to the blank line).
pub async fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    head
}

/// Waits until the peer closes the connection, then counts it.
pub async fn until_peer_closes(mut s: TcpStream, closed: Arc<AtomicUsize>) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    closed.fetch_add(1, Ordering::SeqCst);
}

/// A body fed from a channel, one frame per message, with no length known ahead.
pub struct ChannelBody(pub tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|c| c.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// Writes `bytes` on a fresh connection and reads until tollgate closes it (bounded).
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::AsyncWriteExt;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    read_until_close(&mut s).await
}

/// Reads until the peer closes the connection (or resets it), at most 10 s.
pub async fn read_until_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let limit = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(limit, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "the connection was not closed; read so far: {}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads one response with a `Content-Length` body off `s` (bounded: 10 s), leaving the
/// connection open; panics, with what came, if it closes first.
pub async fn read_one_response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let limit = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + len {
                return String::from_utf8_lossy(&got).into_owned();
            }
        }
        let n = tokio::time::timeout_at(limit, s.read(&mut buf))
            .await
            .expect("no whole response in 10 s")
            .unwrap();
        assert!(
            n > 0,
            "closed before a whole response: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
}
