//! `tollgate lab --scenario payments`: orders (POSTs) to a service of three replicas
//! that append each order to one ledger, each replica behind its own inbound tollgate,
//! through links that lose a share of the answers after the order was booked (the
//! order ran; only its answer is gone). Three runs, one after another, each on fresh
//! replicas, tollgates, links and ledger:
//!
//! - **no POST retries**: the caller's tollgate retries only idempotent methods (the
//!   default): every lost answer is an order the user sees fail, though it was booked;
//! - **retries, no dedupe**: POST listed in `methods`: lost answers are retried, and
//!   every retry books the order again;
//! - **keys + dedupe**: the caller mints an idempotency key for each POST, the
//!   replicas' tollgates deduplicate in one Redis: a retry gets the booked order's
//!   answer, and nothing is booked twice.
//!
//! It needs `redis-server` on the `PATH` (Debian's `redis-server` package): it starts
//! one on a free loopback port, persisting nothing, and stops it at the end.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::LabError;
use super::backend::serve_http1;
use tollgate_core::run::Running;

/// What the payments scenario runs.
#[derive(Clone, Debug)]
pub struct PaymentsSpec {
    pub orders: usize,
    /// Orders in flight at once (a closed loop: each user waits for its answer).
    pub concurrency: usize,
    pub replicas: usize,
    /// The share of answers each link loses, 0..=1.
    pub loss: f64,
}

impl Default for PaymentsSpec {
    fn default() -> Self {
        PaymentsSpec {
            orders: 600,
            concurrency: 20,
            replicas: 3,
            loss: 0.1,
        }
    }
}

/// One run, as the users and the ledger saw it.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub name: &'static str,
    pub orders: usize,
    /// Orders the user got a `2xx` for.
    pub answered: usize,
    /// Orders in the ledger (each counted once).
    pub booked: usize,
    /// Bookings beyond the first of an order: charges made twice.
    pub duplicates: usize,
    /// Answers the links lost.
    pub lost: usize,
    /// Answers replayed by the callee's dedupe (`idempotent-replayed: true`).
    pub replayed: usize,
    /// Of the answered orders.
    pub p50: Duration,
    pub p99: Duration,
}

pub struct PaymentsResult {
    pub spec: PaymentsSpec,
    pub runs: Vec<Outcome>,
}

/// The three runs, in order.
const RUNS: [(&str, Caller, bool); 3] = [
    ("no POST retries", Caller::Plain, false),
    ("retries, no dedupe", Caller::RetryPost, false),
    ("keys + dedupe", Caller::MintKeys, true),
];

#[derive(Clone, Copy, Debug)]
enum Caller {
    Plain,
    RetryPost,
    MintKeys,
}

pub async fn run(spec: PaymentsSpec, progress: bool) -> Result<PaymentsResult, LabError> {
    let redis = Redis::start()?;
    let mut runs = Vec::new();
    for (name, caller, dedupe) in RUNS {
        if progress {
            tollgate_core::print::stderr_line(&format!("  {name} ..."));
        }
        let store = dedupe.then(|| redis.url());
        runs.push(one(&spec, name, caller, store.as_deref()).await?);
    }
    Ok(PaymentsResult { spec, runs })
}

type Ledger = Arc<Mutex<HashMap<u64, usize>>>;

async fn one(
    spec: &PaymentsSpec,
    name: &'static str,
    caller: Caller,
    store: Option<&str>,
) -> Result<Outcome, LabError> {
    let setup = |e: &dyn std::fmt::Display| LabError::Setup(e.to_string());
    let ledger = Ledger::default();
    let mut replicas = Vec::new();
    let mut callees = Vec::new();
    let mut links = Vec::new();
    for i in 0..spec.replicas {
        let replica = LedgerReplica::start(ledger.clone())
            .await
            .map_err(|e| setup(&e))?;
        let callee = start(&callee_config(replica.addr, store)).await?;
        let inbound = callee
            .server
            .inbound_addr()
            .ok_or_else(|| LabError::Setup("the inbound side did not start".into()))?;
        let link = Lossy::start(inbound, spec.loss, 11 + i as u64)
            .await
            .map_err(|e| setup(&e))?;
        replicas.push(replica);
        callees.push(callee);
        links.push(link);
    }
    let ends: Vec<SocketAddr> = links.iter().map(|l| l.addr).collect();
    let front = start(&caller_config(&ends, caller)).await?;
    let target = front.server.local_addr();
    // One call first, as a service's first minutes would: the answers say whether the
    // callee deduplicates.
    let _ = order(target, u64::MAX).await;
    ledger
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&u64::MAX);
    let results = place(target, spec).await;
    front.shutdown(Duration::ZERO).await;
    for c in callees {
        c.shutdown(Duration::ZERO).await;
    }
    drop(replicas);
    let lost = links.iter().map(|l| l.lost.load(Ordering::Relaxed)).sum();
    let mut ok: Vec<Duration> = results.iter().filter(|r| r.ok).map(|r| r.took).collect();
    ok.sort();
    let pct = |p: f64| {
        if ok.is_empty() {
            return Duration::ZERO;
        }
        ok[((p * ok.len() as f64).ceil() as usize).clamp(1, ok.len()) - 1]
    };
    let l = ledger.lock().unwrap_or_else(|p| p.into_inner());
    Ok(Outcome {
        name,
        orders: spec.orders,
        answered: ok.len(),
        booked: l.len(),
        duplicates: l.values().map(|n| n.saturating_sub(1)).sum(),
        lost,
        replayed: results.iter().filter(|r| r.replayed).count(),
        p50: pct(0.5),
        p99: pct(0.99),
    })
}

async fn start(text: &str) -> Result<Running, LabError> {
    let config = tollgate_core::config::parse("lab.toml", text, Path::new("."))
        .map_err(|e| LabError::Setup(e.to_string()))?;
    Running::start(config, None)
        .await
        .map_err(|e| LabError::Setup(e.to_string()))
}

const HEAD: &str = "[listener]\naddr = \"127.0.0.1:0\"\n[admin]\naddr = \"127.0.0.1:0\"\n";

fn callee_config(app: SocketAddr, store: Option<&str>) -> String {
    let dedupe = store.map_or(String::new(), |s| {
        format!("[inbound.dedupe]\nstore = \"{s}\"\nstore_timeout = \"500ms\"\n")
    });
    format!(
        "{HEAD}[inbound]\naddr = \"127.0.0.1:0\"\napp = \"{app}\"\nmax_inflight = 1000\n\
         request_timeout = \"5s\"\n{dedupe}"
    )
}

fn caller_config(ends: &[SocketAddr], caller: Caller) -> String {
    let list: Vec<String> = ends.iter().map(|a| format!("\"{a}\"")).collect();
    let how = match caller {
        Caller::Plain => "",
        Caller::RetryPost => {
            "methods = [\"GET\", \"HEAD\", \"OPTIONS\", \"PUT\", \"DELETE\", \"POST\"]\n"
        }
        Caller::MintKeys => "mint_idempotency_key = [\"POST\"]\n",
    };
    format!(
        "{HEAD}[upstreams.ledger]\nauthorities = [\"ledger\"]\nendpoints = [{}]\n\
         request_timeout = \"5s\"\n[upstreams.ledger.retry]\nmax_attempts = 4\n\
         on = [\"connect-failure\", \"reset\", \"503\"]\nbackoff_base = \"2ms\"\nbackoff_max = \"10ms\"\n\
         {how}[upstreams.ledger.budget]\nratio = 1.0\nmin_per_sec = 1000\n",
        list.join(", ")
    )
}

/// One order as its user saw it.
struct Placed {
    ok: bool,
    replayed: bool,
    took: Duration,
}

/// Every order, `concurrency` at a time.
async fn place(target: SocketAddr, spec: &PaymentsSpec) -> Vec<Placed> {
    let next = Arc::new(AtomicUsize::new(0));
    let out: Arc<Mutex<Vec<Placed>>> = Arc::default();
    let mut users = JoinSet::new();
    for _ in 0..spec.concurrency {
        let (next, out, orders) = (next.clone(), out.clone(), spec.orders);
        users.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= orders {
                    return;
                }
                let sent = Instant::now();
                let (ok, replayed) = order(target, i as u64).await.unwrap_or((false, false));
                let placed = Placed {
                    ok,
                    replayed,
                    took: sent.elapsed(),
                };
                out.lock().unwrap_or_else(|p| p.into_inner()).push(placed);
            }
        });
    }
    while users.join_next().await.is_some() {}
    std::mem::take(&mut *out.lock().unwrap_or_else(|p| p.into_inner()))
}

/// POSTs order `n` to tollgate over a connection of its own: whether it was answered
/// `2xx`, and replayed.
async fn order(target: SocketAddr, n: u64) -> Option<(bool, bool)> {
    let stream = TcpStream::connect(target).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    let conn = tokio::spawn(conn);
    let req = http::Request::post("/orders")
        .header(http::header::HOST, "ledger")
        .body(Full::new(Bytes::from(n.to_string())))
        .ok()?;
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        let resp = sender.send_request(req).await.ok()?;
        let replayed = resp.headers().contains_key("idempotent-replayed");
        let ok = resp.status().is_success();
        resp.into_body().collect().await.ok()?;
        Some((ok, replayed))
    })
    .await
    .ok()
    .flatten();
    conn.abort();
    got
}

/// A replica of the ledger service: books each order (its body) and answers `201`.
struct LedgerReplica {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl LedgerReplica {
    async fn start(ledger: Ledger) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let ledger = ledger.clone();
                conns.spawn(serve_http1(stream, move |req| {
                    let ledger = ledger.clone();
                    async move { book(&ledger, req).await }
                }));
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(LedgerReplica { addr, task })
    }
}

impl Drop for LedgerReplica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn book(ledger: &Ledger, req: http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let order = body
        .ok()
        .and_then(|b| std::str::from_utf8(&b).ok()?.parse::<u64>().ok());
    let mut resp = http::Response::new(Full::new(Bytes::new()));
    let Some(order) = order else {
        *resp.status_mut() = http::StatusCode::BAD_REQUEST;
        return resp;
    };
    *ledger
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(order)
        .or_insert(0) += 1;
    *resp.status_mut() = http::StatusCode::CREATED;
    *resp.body_mut() = Full::new(Bytes::from(format!("order {order} booked\n")));
    resp
}

/// A link that loses answers after the work was done: each piece of an answer coming
/// back is lost with probability `loss` (and the next `lose_next` pieces for certain),
/// and the connection closed both ways. The lab's links, and the tests'.
pub struct Lossy {
    pub addr: SocketAddr,
    /// Pieces of answers lost so far.
    pub lost: Arc<AtomicUsize>,
    /// Pieces still to be lost for certain, whatever the chance says.
    pub lose_next: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// How a link loses: by chance, and on demand.
struct Losing {
    loss: f64,
    rng: Mutex<fastrand::Rng>,
    lose_next: Arc<AtomicUsize>,
    lost: Arc<AtomicUsize>,
}

impl Losing {
    /// Whether this piece is lost (and counted).
    fn loses(&self) -> bool {
        let on_demand = self
            .lose_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let by_chance = self.rng.lock().unwrap_or_else(|p| p.into_inner()).f64() < self.loss;
        if on_demand || by_chance {
            self.lost.fetch_add(1, Ordering::SeqCst);
        }
        on_demand || by_chance
    }
}

impl Lossy {
    /// A link to `to` on a loopback port of its own, losing pieces of answers with
    /// probability `loss` (0.0 to 1.0).
    pub async fn start(to: SocketAddr, loss: f64, seed: u64) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let losing = Arc::new(Losing {
            loss,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            lose_next: Arc::new(AtomicUsize::new(0)),
            lost: Arc::new(AtomicUsize::new(0)),
        });
        let (lost, lose_next) = (losing.lost.clone(), losing.lose_next.clone());
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(to).await else {
                    continue;
                };
                conns.spawn(relay(client, server, losing.clone()));
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Lossy {
            addr,
            lost,
            lose_next,
            task,
        })
    }
}

impl Drop for Lossy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, server: TcpStream, losing: Arc<Losing>) {
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
            if losing.loses() {
                return;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // A lost answer closes the caller's connection at once.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// A `redis-server` on a free loopback port, persisting nothing; stopped when dropped.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Result<Redis, LabError> {
        let missing = || {
            LabError::Setup(
                "the payments scenario needs redis-server on the PATH (apt-get install \
                 redis-server)"
                    .into(),
            )
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| LabError::Setup(e.to_string()))?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|_| missing())?;
        let redis = Redis { child, port };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            if std::time::Instant::now() > until {
                return Err(LabError::Setup(
                    "redis-server did not listen within 10 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(redis)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn table(r: &PaymentsResult) -> String {
    let s = &r.spec;
    let mut out = format!(
        "tollgate lab: payments\n\
         {} orders (POST), {} at a time, to {} replicas booking them in one ledger, each behind its\n\
         own inbound tollgate, through links that lose {:.0}% of answers after the order was booked.\n\n",
        s.orders,
        s.concurrency,
        s.replicas,
        s.loss * 100.0,
    );
    out.push_str(
        "  run                  answered   booked   booked twice   lost   replayed   p50 ms   p99 ms\n",
    );
    for o in &r.runs {
        out.push_str(&format!(
            "  {:<19}  {:>8}   {:>6}   {:>12}   {:>4}   {:>8}   {:>6.1}   {:>6.1}\n",
            o.name,
            o.answered,
            o.booked,
            o.duplicates,
            o.lost,
            o.replayed,
            ms(o.p50),
            ms(o.p99),
        ));
    }
    out
}

pub fn to_json(r: &PaymentsResult) -> Value {
    let s = &r.spec;
    json!({
        "scenario": "payments",
        "orders": s.orders,
        "concurrency": s.concurrency,
        "replicas": s.replicas,
        "loss": s.loss,
        "runs": r.runs.iter().map(|o| json!({
            "run": o.name,
            "answered": o.answered,
            "booked": o.booked,
            "booked_twice": o.duplicates,
            "lost": o.lost,
            "replayed": o.replayed,
            "p50_ms": ms(o.p50),
            "p99_ms": ms(o.p99),
        })).collect::<Vec<_>>(),
    })
}

/// `tollgate lab --scenario payments`; returns the exit code. `--error-rate` is the
/// links' loss.
pub fn main(args: &super::LabArgs) -> i32 {
    if args.plot.is_some() || args.rps.is_some() || args.duration.is_some() {
        eprintln!("tollgate lab: --plot, --rps and --duration are not for the payments scenario");
        return 2;
    }
    let mut spec = PaymentsSpec::default();
    if let Some(loss) = args.error_rate {
        spec.loss = loss;
    }
    let Some(r) = super::run_scenario(args, |progress| run(spec, progress)) else {
        return 1;
    };
    tollgate_core::print::stdout(&super::report_text(args, || to_json(&r), || table(&r)));
    0
}
