//! The upstream of the harm scenario: an HTTP server whose latency is bound by waiting,
//! not by CPU (each request sleeps its drawn time; nothing queues), so a proxy in front
//! of it is judged on what it does, not on a machine too small for the app.
//!
//! Every column of a row talks to the same process at the same time. A request says
//! which column sent it (`x-harm-column`) and which request of the row it is
//! (`x-harm-seq`): the app counts its calls per column, and draws the fate of a first
//! attempt (latency, failure) from the row's seed and that number, so the same request
//! meets the same upstream whether it came straight or through tollgate (common random
//! numbers: what differs between the columns is the path, not the luck). A copy of a
//! request that has already arrived (a retry, a hedge) gets a draw of its own: the app
//! knows it by its number, as it would through any path (an inbound tollgate keeps its
//! `x-tollgate-attempt` to itself).
//!
//! Beside it, the replicas that fail: [`dead`], an address where nothing listens, and
//! the lab's [`Silent`](crate::backend::Silent), which accepts and never answers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

/// The most columns a row has.
pub const MAX_COLUMNS: usize = 4;

/// The header a request names its column in.
pub const COLUMN: &str = "x-harm-column";
/// The header a request names its number within the row in.
pub const SEQ: &str = "x-harm-seq";

/// How long an answer takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Latency {
    /// At once.
    None,
    Fixed(Duration),
    /// Log-normal around `median`, with this sigma (1.0: the p99 is ten times the median).
    LogNormal {
        median: Duration,
        sigma: f64,
    },
}

/// What the upstream does with each request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Behaviour {
    /// Until the response head.
    pub latency: Latency,
    /// The share of answers that fail, and their status (503, 500).
    pub failures: Option<(f64, u16)>,
    /// The body streams in 16 pieces over this long after the head (a download, a
    /// server-sent event stream); `None`: a small body with the head.
    pub stream: Option<Duration>,
    /// From..to since the start of the row: every request answered 503 at once (the
    /// service gone behind its load balancer).
    pub outage: Option<(Duration, Duration)>,
    /// Every answer closes its connection (`Connection: close`), so every call
    /// connects anew: what a row about connecting needs.
    pub close: bool,
    /// Every `.0` from the start of the row, the upstream stops accepting for `.1`
    /// (a busy accept loop) with an accept queue of [`ACCEPT_QUEUE`]: the SYNs that
    /// find the queue full are dropped, and the kernel sends them again a second later.
    pub accept_pauses: Option<(Duration, Duration)>,
    /// Header fields every answer carries besides its own (`x-field-N: N`): a head
    /// with more fields than a parser makes room for by default.
    pub fields: u16,
}

impl Behaviour {
    pub const HEALTHY: Behaviour = Behaviour {
        latency: Latency::None,
        failures: None,
        stream: None,
        outage: None,
        close: false,
        accept_pauses: None,
        fields: 0,
    };
}

/// The accept queue of an upstream that pauses its accepting: room for the calls of
/// a moment (a short wait for the accept loop is no overflow), not for a pause's.
pub const ACCEPT_QUEUE: i32 = 32;

/// Pieces of a streamed body.
pub const STREAM_PIECES: u32 = 16;

/// What the app counted, per column.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests that arrived.
    pub calls: [AtomicU64; MAX_COLUMNS],
    /// Of them, copies of a request that had already arrived (retries and hedges).
    pub retries: [AtomicU64; MAX_COLUMNS],
    /// How often each request of each column has arrived.
    arrivals: Mutex<HashMap<(usize, u64), u64>>,
    /// Per replica and column: the first and the last arrival, from the app's start,
    /// and how many (which replicas a column's calls reached, and when).
    by_replica: Mutex<HashMap<(usize, usize), Reached>>,
    /// Waiting for their response head now, and the most ever at once.
    inflight: [AtomicU64; MAX_COLUMNS],
    peak: [AtomicU64; MAX_COLUMNS],
}

impl Counters {
    pub fn calls(&self, column: usize) -> u64 {
        self.calls.get(column).map_or(0, |c| c.load(Relaxed))
    }

    pub fn retries(&self, column: usize) -> u64 {
        self.retries.get(column).map_or(0, |c| c.load(Relaxed))
    }

    /// Counts an arrival of request `seq` of `column`: which one it is, from 1.
    fn arrived(&self, column: usize, seq: u64) -> u64 {
        let mut arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        let n = arrivals.entry((column, seq)).or_insert(0);
        *n += 1;
        *n
    }

    /// Per replica and column, what reached it.
    pub fn by_replica(&self) -> Vec<((usize, usize), Reached)> {
        let all = self.by_replica.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = all.iter().map(|(k, v)| (*k, *v)).collect();
        out.sort_by_key(|(k, _)| *k);
        out
    }

    fn reached(&self, replica: usize, column: usize, at: Duration) {
        let mut all = self.by_replica.lock().unwrap_or_else(|p| p.into_inner());
        let r = all.entry((replica, column)).or_insert(Reached {
            first: at,
            last: at,
            calls: 0,
        });
        r.last = r.last.max(at);
        r.calls += 1;
    }

    /// The most calls of `column` that waited for their response head at once.
    pub fn peak(&self, column: usize) -> u64 {
        self.peak.get(column).map_or(0, |c| c.load(Relaxed))
    }
}

/// The calls of one column that reached one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reached {
    /// From the app's start.
    pub first: Duration,
    pub last: Duration,
    pub calls: u64,
}

/// A call waiting for its response head, counted until it has one or is dropped.
struct Waiting<'a> {
    counters: &'a Counters,
    column: usize,
}

impl<'a> Waiting<'a> {
    fn new(counters: &'a Counters, column: usize) -> Self {
        if let (Some(now), Some(peak)) = (counters.inflight.get(column), counters.peak.get(column))
        {
            let n = now.fetch_add(1, Relaxed) + 1;
            peak.fetch_max(n, Relaxed);
        }
        Waiting { counters, column }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(now) = self.counters.inflight.get(self.column) {
            now.fetch_sub(1, Relaxed);
        }
    }
}

struct State {
    behaviour: Behaviour,
    seed: u64,
    start: Instant,
    counters: Arc<Counters>,
    /// The behaviour's extra header fields.
    fields: http::HeaderMap,
}

/// The app: one process listening on one address per replica, all alike.
pub struct App {
    pub addrs: Vec<SocketAddr>,
    pub counters: Arc<Counters>,
    tasks: Vec<JoinHandle<()>>,
}

impl App {
    /// `replicas` addresses served alike; `start` is the row's start (for outages).
    pub async fn start(
        behaviour: Behaviour,
        seed: u64,
        start: Instant,
        replicas: usize,
    ) -> std::io::Result<App> {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        App::start_on(behaviour, seed, start, &vec![loopback; replicas.max(1)]).await
    }

    /// The same, one replica at each of `addrs` (a pod's address, in a network
    /// namespace).
    pub async fn start_on(
        behaviour: Behaviour,
        seed: u64,
        start: Instant,
        at: &[SocketAddr],
    ) -> std::io::Result<App> {
        let counters = Arc::new(Counters::default());
        let state = Arc::new(State {
            behaviour,
            seed,
            start,
            counters: counters.clone(),
            fields: extra_fields(behaviour.fields),
        });
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for &addr in at {
            let listener = if behaviour.accept_pauses.is_some() {
                small_queue(addr)?
            } else {
                TcpListener::bind(addr).await?
            };
            addrs.push(listener.local_addr()?);
            let replica = tasks.len();
            tasks.push(tokio::spawn(serve(listener, state.clone(), replica)));
        }
        Ok(App {
            addrs,
            counters,
            tasks,
        })
    }

    /// Closes the listeners and every connection.
    pub fn stop(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

/// An address where nothing listens: connections to it are refused (a replica whose
/// process is gone). The port was just free; nothing in this process binds it again.
pub async fn dead() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    listener.local_addr()
}

/// A listener at `addr` whose accept queue holds [`ACCEPT_QUEUE`] connections.
fn small_queue(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    sock.bind(&addr.into())?;
    sock.listen(ACCEPT_QUEUE)?;
    sock.set_nonblocking(true)?;
    TcpListener::from_std(sock.into())
}

/// Whether the upstream accepts `t` after the start of the row: `Err(until)` while it
/// pauses, `Ok(until)` while it accepts (`None`: always); `until` from the start too.
fn accepting(
    pauses: Option<(Duration, Duration)>,
    t: Duration,
) -> Result<Option<Duration>, Duration> {
    let Some((every, length)) = pauses.filter(|(every, _)| !every.is_zero()) else {
        return Ok(None);
    };
    let k = (t.as_nanos() / every.as_nanos()) as u32;
    let from = every * k;
    // The first pause comes a period in, after the first calls.
    if k >= 1 && t < from + length {
        Err(from + length)
    } else {
        Ok(Some(from + every))
    }
}

async fn serve(listener: TcpListener, state: Arc<State>, replica: usize) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let start = state.start;
        let until = match accepting(state.behaviour.accept_pauses, start.elapsed()) {
            Ok(until) => until.map(|u| start + u),
            Err(resume) => {
                tokio::time::sleep_until(start + resume).await;
                continue;
            }
        };
        tokio::select! {
            r = listener.accept() => {
                let Ok((stream, _)) = r else { continue };
                let state = state.clone();
                conns.spawn(serve_conn(stream, state, replica));
            }
            // Reap finished connections so the set stays small.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            // A pause begins.
            () = tokio::time::sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => {}
        }
    }
}

/// Spawns the tasks of an HTTP/2 connection on the runtime.
#[derive(Clone, Copy)]
struct Spawn;

impl<F> hyper::rt::Executor<F> for Spawn
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(fut);
    }
}

/// One connection: HTTP/2 when it opens with the preface (prior knowledge, as gRPC
/// clients speak cleartext), else HTTP/1.1. A client that half-closes its connection
/// after its request still gets its answer, as from most servers (hyper's own default
/// takes the end of input for a client gone).
async fn serve_conn(stream: TcpStream, state: Arc<State>, replica: usize) {
    let mut first = [0u8; 3];
    let h2 = matches!(stream.peek(&mut first).await, Ok(3)) && &first == b"PRI";
    let _ = stream.set_nodelay(true);
    let svc = hyper::service::service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(&state, req, replica).await) }
    });
    let io = TokioIo::new(stream);
    if h2 {
        let _ = hyper::server::conn::http2::Builder::new(Spawn)
            .serve_connection(io, svc)
            .await;
    } else {
        let _ = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(io, svc)
            .await;
    }
}

fn header_u64(req: &Request<Incoming>, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The draws of one attempt: the same for the same row, request and attempt number.
pub fn draws(seed: u64, seq: u64, attempt: u64) -> fastrand::Rng {
    // splitmix64 of the three, so that neighbouring numbers draw unrelated values.
    let mut z = seed
        ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ attempt.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    fastrand::Rng::with_seed(z ^ (z >> 31))
}

/// A log-normal draw around `median`.
fn log_normal(median: Duration, sigma: f64, rng: &mut fastrand::Rng) -> Duration {
    let (u1, u2) = (rng.f64().max(1e-12), rng.f64());
    let normal = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    // Capped at a minute: the row waits for its slowest answer.
    median.mul_f64(
        (sigma * normal)
            .exp()
            .min(60.0 / median.as_secs_f64().max(1e-3)),
    )
}

type AnswerBody = Either<Either<Full<Bytes>, Dribble>, GrpcAnswer>;

/// Whether a request is a gRPC call (`content-type: application/grpc…`).
fn is_grpc(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

async fn handle(state: &State, req: Request<Incoming>, replica: usize) -> Response<AnswerBody> {
    let grpc = is_grpc(&req);
    let close = state.behaviour.close && req.version() == http::Version::HTTP_11;
    let mut resp = fate(state, req, replica).await;
    if grpc {
        resp = as_grpc(resp.status());
    }
    if close {
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    let headers = resp.headers_mut();
    for (name, value) in &state.fields {
        headers.append(name.clone(), value.clone());
    }
    resp
}

/// `x-field-N: N` for N below `n`, made once for every answer.
fn extra_fields(n: u16) -> http::HeaderMap {
    let mut fields = http::HeaderMap::new();
    for i in 0..n {
        if let Ok(name) = http::HeaderName::try_from(format!("x-field-{i}")) {
            fields.insert(name, http::HeaderValue::from(i));
        }
    }
    fields
}

/// The answer the row's upstream draws for a request.
async fn fate(state: &State, req: Request<Incoming>, replica: usize) -> Response<AnswerBody> {
    let column = header_u64(&req, COLUMN).map_or(usize::MAX, |c| c as usize);
    let seq = header_u64(&req, SEQ);
    let attempt = seq.map_or(1, |seq| state.counters.arrived(column, seq));
    state
        .counters
        .reached(replica, column, state.start.elapsed());
    if let Some(c) = state.counters.calls.get(column) {
        c.fetch_add(1, Relaxed);
    }
    if attempt >= 2
        && let Some(c) = state.counters.retries.get(column)
    {
        c.fetch_add(1, Relaxed);
    }
    let _waiting = Waiting::new(&state.counters, column);
    let mut rng = match seq {
        Some(seq) => draws(state.seed, seq, attempt),
        None => fastrand::Rng::new(),
    };
    let b = state.behaviour;
    let now = state.start.elapsed();
    if b.outage.is_some_and(|(from, to)| now >= from && now < to) {
        return answer(StatusCode::SERVICE_UNAVAILABLE, None);
    }
    // The request's body is read to its end, as an app does before it answers.
    let _ = req.into_body().collect().await;
    let took = match b.latency {
        Latency::None => Duration::ZERO,
        Latency::Fixed(d) => d,
        Latency::LogNormal { median, sigma } => log_normal(median, sigma, &mut rng),
    };
    if !took.is_zero() {
        tokio::time::sleep(took).await;
    }
    let status = match b.failures {
        Some((share, status)) if rng.f64() < share => {
            StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
        }
        _ => StatusCode::OK,
    };
    answer(status, b.stream.filter(|_| status == StatusCode::OK))
}

fn answer(status: StatusCode, stream: Option<Duration>) -> Response<AnswerBody> {
    let body = match stream {
        Some(over) => Either::Left(Either::Right(Dribble::new(over))),
        None => Either::Left(Either::Left(Full::new(Bytes::from_static(b"done")))),
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp
}

/// The same fate as a gRPC server says it: a `200` with one message (`done`) and
/// `grpc-status: 0` in the trailers; a failure as trailers-only, `UNAVAILABLE` (14)
/// for a 503 and `INTERNAL` (13) for anything else.
fn as_grpc(status: StatusCode) -> Response<AnswerBody> {
    let grpc_status = match status {
        StatusCode::OK => None,
        StatusCode::SERVICE_UNAVAILABLE => Some("14"),
        _ => Some("13"),
    };
    let body = match grpc_status {
        None => GrpcAnswer::message(b"done"),
        Some(_) => GrpcAnswer::empty(),
    };
    let mut resp = Response::new(Either::Right(body));
    let h = resp.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    if let Some(code) = grpc_status {
        h.insert("grpc-status", http::HeaderValue::from_static(code));
    }
    resp
}

/// A gRPC answer's body: one length-prefixed message, then `grpc-status: 0` in the
/// trailers; or nothing at all (trailers-only: the status is in the head).
pub struct GrpcAnswer {
    message: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl GrpcAnswer {
    fn message(payload: &[u8]) -> Self {
        let mut framed = Vec::with_capacity(5 + payload.len());
        framed.push(0);
        framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        framed.extend_from_slice(payload);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        GrpcAnswer {
            message: Some(Bytes::from(framed)),
            trailers: Some(trailers),
        }
    }

    fn empty() -> Self {
        GrpcAnswer {
            message: None,
            trailers: None,
        }
    }
}

impl Body for GrpcAnswer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(m) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(m))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }
}

/// A body that sends [`STREAM_PIECES`] pieces, evenly over its duration.
pub struct Dribble {
    left: u32,
    every: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl Dribble {
    fn new(over: Duration) -> Self {
        let every = over / STREAM_PIECES;
        Dribble {
            left: STREAM_PIECES,
            every,
            sleep: Box::pin(tokio::time::sleep(every)),
        }
    }
}

impl Body for Dribble {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.left -= 1;
        let next = Instant::now() + self.every;
        self.sleep.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"piece\n")))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_request_draws_the_same_and_a_retry_draws_anew() {
        let a: Vec<u64> = (0..4).map(|_| draws(7, 42, 1).u64(..)).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(draws(7, 42, 1).u64(..), draws(7, 42, 2).u64(..));
        assert_ne!(draws(7, 42, 1).u64(..), draws(7, 43, 1).u64(..));
        // A share of 30% drawn over many requests is near 30%.
        let failed = (0..10_000u64)
            .filter(|&s| draws(1, s, 1).f64() < 0.3)
            .count();
        assert!((2_800..3_200).contains(&failed), "{failed}");
    }

    #[test]
    fn an_upstream_that_pauses_accepts_between_its_pauses() {
        let ms = Duration::from_millis;
        let p = Some((ms(1700), ms(400)));
        assert_eq!(accepting(p, ms(500)), Ok(Some(ms(1700))));
        assert_eq!(accepting(p, ms(1800)), Err(ms(2100)));
        assert_eq!(accepting(p, ms(2100)), Ok(Some(ms(3400))));
        assert_eq!(accepting(p, ms(3500)), Err(ms(3800)));
        assert_eq!(accepting(None, ms(1800)), Ok(None));
    }

    #[test]
    fn many_fields_are_as_many_distinct_fields() {
        let fields = extra_fields(130);
        assert_eq!(fields.len(), 130);
        assert_eq!(fields.keys_len(), 130);
        assert_eq!(
            fields.get("x-field-129").and_then(|v| v.to_str().ok()),
            Some("129")
        );
        assert!(extra_fields(0).is_empty());
    }

    #[test]
    fn a_log_normal_draw_has_its_median() {
        let mut below = 0;
        for s in 0..10_000u64 {
            let d = log_normal(Duration::from_millis(200), 1.0, &mut draws(3, s, 1));
            if d < Duration::from_millis(200) {
                below += 1;
            }
        }
        assert!((4_700..5_300).contains(&below), "{below}");
    }
}
