//! The degraded dependency at the bottom of the lab's chain: a real HTTP server on
//! loopback whose capacity, latency, error rate and availability follow a schedule.
//!
//! It behaves like a real service under load, which is what makes retry storms
//! possible: a fixed pool of workers serves a FIFO queue, work that was started runs to
//! the end even when the caller has gone (the database does not know the socket
//! closed), and a request whose caller's deadline (`x-timeout-ms`) leaves less time than
//! the work takes is dropped without work when its turn comes, as a deadline-aware
//! server does. Every request that arrives is counted: amplification is measured here,
//! never computed. So is every request whose caller went away before its answer (a
//! hedge's loser, cancelled): the work goes on, the answer is never read.
//!
//! It listens on as many addresses as its upstream has endpoints, all served by the
//! same workers, as the pods behind one Service share one database. Beside it,
//! [`Silent`] is an endpoint that accepts connections and never reads from them: a pod
//! that hangs without failing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What the dependency is like at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Condition {
    /// Median time a worker spends on a request.
    pub service: Duration,
    /// Share of completed requests that fail with 503.
    pub error_rate: f64,
    /// Share of requests that take ten times their drawn time (a slow tail: a pause, a
    /// cold cache, a slow disk).
    pub slow_share: f64,
    /// Refusing connections (the process is gone).
    pub down: bool,
}

impl Condition {
    /// Answering every request well, in `service` at the median.
    pub const fn healthy(service: Duration) -> Condition {
        Condition {
            service,
            error_rate: 0.0,
            slow_share: 0.0,
            down: false,
        }
    }
}

/// The dependency's conditions over the run.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub workers: usize,
    pub normal: Condition,
    /// `(from, to, condition)` windows, relative to the start of the run.
    pub episodes: Vec<(Duration, Duration, Condition)>,
}

impl Schedule {
    pub fn at(&self, t: Duration) -> Condition {
        self.episodes
            .iter()
            .find(|(from, to, _)| t >= *from && t < *to)
            .map_or(self.normal, |(_, _, c)| *c)
    }

    /// Requests per second the workers can complete under `c`.
    pub fn capacity(&self, c: &Condition) -> f64 {
        self.workers as f64 / c.service.as_secs_f64()
    }
}

/// Arrivals counted in buckets of `BUCKET` since the start.
pub const BUCKET: Duration = Duration::from_millis(100);

pub struct Counters {
    pub arrivals: Vec<AtomicU64>,
    pub total: AtomicU64,
    pub skipped: AtomicU64,
    /// Requests whose caller went away before the answer.
    pub abandoned: AtomicU64,
}

impl Counters {
    fn new(run: Duration) -> Self {
        let n = (run.as_millis() / BUCKET.as_millis()) as usize + 200;
        Counters {
            arrivals: (0..n).map(|_| AtomicU64::new(0)).collect(),
            total: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
        }
    }

    fn arrive(&self, since_start: Duration) {
        self.total.fetch_add(1, Relaxed);
        let i = (since_start.as_millis() / BUCKET.as_millis()) as usize;
        if let Some(b) = self.arrivals.get(i) {
            b.fetch_add(1, Relaxed);
        }
    }
}

pub struct Backend {
    /// One address per endpoint.
    pub addrs: Vec<SocketAddr>,
    pub counters: Arc<Counters>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

struct State {
    schedule: Schedule,
    start: Instant,
    workers: Semaphore,
    counters: Arc<Counters>,
    inflight: AtomicUsize,
}

/// A log-normal draw around `median` (sigma 0.3): service times are skewed, never negative.
fn service_time(median: Duration, rng: &mut fastrand::Rng) -> Duration {
    let (u1, u2) = (rng.f64().max(1e-12), rng.f64());
    let normal = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    median.mul_f64((0.3 * normal).exp())
}

/// Counts a request whose handler is dropped before it answers: hyper drops it when
/// its caller closes the connection or resets the stream.
struct Answering<'a> {
    counters: &'a Counters,
    answered: bool,
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.counters.abandoned.fetch_add(1, Relaxed);
        }
    }
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let arrived = Instant::now();
    state.counters.arrive(arrived - state.start);
    let counters = state.counters.clone();
    let mut answering = Answering {
        counters: &counters,
        answered: false,
    };
    let deadline = req
        .headers()
        .get("x-timeout-ms")
        .and_then(|v| tollgate_core::deadline::parse_millis(v.as_bytes()))
        .map(|d| arrived + d);
    let seed = state.counters.total.load(Relaxed);
    // The work runs in its own task: a caller that goes away does not stop it.
    let work = tokio::spawn(async move {
        let _slot = match state.workers.acquire().await {
            Ok(p) => p,
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
        };
        let cond = state.schedule.at(state.start.elapsed());
        if deadline.is_some_and(|d| Instant::now() + cond.service >= d) {
            // Not enough time left to do the work: nobody would read the answer.
            state.counters.skipped.fetch_add(1, Relaxed);
            return StatusCode::GATEWAY_TIMEOUT;
        }
        let mut rng = fastrand::Rng::with_seed(seed);
        state.inflight.fetch_add(1, Relaxed);
        let mut took = service_time(cond.service, &mut rng);
        if rng.f64() < cond.slow_share {
            took *= 10;
        }
        tokio::time::sleep(took).await;
        state.inflight.fetch_sub(1, Relaxed);
        if rng.f64() < cond.error_rate {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        }
    });
    let status = work.await.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    answering.answered = true;
    let mut resp = Response::new(Full::new(Bytes::from_static(b"done")));
    *resp.status_mut() = status;
    resp
}

impl Backend {
    /// The backend on `endpoints` addresses of its own.
    pub async fn start(
        schedule: Schedule,
        run: Duration,
        start: Instant,
        endpoints: usize,
    ) -> std::io::Result<Self> {
        let counters = Arc::new(Counters::new(run));
        let state = Arc::new(State {
            workers: Semaphore::new(schedule.workers),
            schedule,
            start,
            counters: counters.clone(),
            inflight: AtomicUsize::new(0),
        });
        let (stop, stopped) = watch::channel(false);
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..endpoints.max(1) {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            addrs.push(addr);
            tasks.push(tokio::spawn(serve(
                listener,
                addr,
                state.clone(),
                stopped.clone(),
            )));
        }
        Ok(Backend {
            addrs,
            counters,
            stop,
            tasks,
        })
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// An endpoint that accepts connections and never reads a byte from them, nor closes
/// them: every request sent to it waits for an answer that never comes.
pub struct Silent {
    pub addr: SocketAddr,
    /// Connections accepted.
    pub accepted: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl Silent {
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Relaxed);
                held.push(stream);
            }
        });
        Ok(Silent {
            addr,
            accepted,
            task,
        })
    }

    /// Closes the listener and every connection it holds.
    pub fn stop(self) {
        self.task.abort();
    }
}

/// Accepts connections while the schedule says up; while down, the port is closed and
/// every open connection is cut, then it listens again on the same address.
async fn serve(
    mut listener: TcpListener,
    addr: SocketAddr,
    state: Arc<State>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let now = state.start.elapsed();
        if state.schedule.at(now).down {
            drop(listener);
            conns.abort_all();
            // Up again at the end of this episode.
            let until = state
                .schedule
                .episodes
                .iter()
                .find(|(from, to, c)| c.down && now >= *from && now < *to)
                .map_or(now, |(_, to, _)| *to);
            tokio::select! {
                _ = tokio::time::sleep_until(state.start + until) => {}
                _ = stopped.changed() => return,
            }
            listener = match TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(_) => return,
            };
            continue;
        }
        let next_down = state
            .schedule
            .episodes
            .iter()
            .filter(|(from, _, c)| c.down && *from > now)
            .map(|(from, _, _)| *from)
            .min();
        let down_at = next_down.map_or(state.start + Duration::from_secs(86_400), |d| {
            state.start + d
        });
        tokio::select! {
            _ = stopped.changed() => break,
            _ = tokio::time::sleep_until(down_at) => continue,
            r = listener.accept() => {
                let Ok((stream, _)) = r else { continue };
                let state = state.clone();
                conns.spawn(serve_http1(stream, move |req| handle(state.clone(), req)));
            }
        }
    }
    conns.abort_all();
}

/// Answers HTTP/1.1 on one accepted connection with `answer`, until it closes.
pub async fn serve_http1<F, Fut, B>(stream: TcpStream, answer: F)
where
    F: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let _ = stream.set_nodelay(true);
    let svc = service_fn(move |req| {
        let answered = answer(req);
        async move { Ok::<_, Infallible>(answered.await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}
