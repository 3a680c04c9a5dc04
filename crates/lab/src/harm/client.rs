//! The app of the harm scenario: one HTTP/1.1 client, the same for every column, that
//! sends each call once (its own retries off, as tollgate asks) on an open-loop
//! schedule, and records what it got.
//!
//! Real traffic repeats URLs: a row asks for one URL, a Zipf mix over a hundred, or (as
//! the control) a distinct URL per request. The schedule and the URLs are drawn once
//! per row, and every column sends request `n` at the same instant, to its own path
//! (straight to the upstream, or through tollgate).
//!
//! The client keeps its connections alive, as apps do. Given several addresses (the
//! replicas of a service, without a mesh) it takes them in turn, and when a connection
//! is refused it dials the next one, as a client given a name with several addresses
//! does; it never sends a request twice (a request canceled on a pooled connection
//! before any byte left is sent on a new one, as hyper's pool does).
//!
//! A row may ask for another caller instead: one that writes its request and then
//! half-closes its connection, as `nc -N` and some scripts do, or a real client
//! program ([`super::program`]) run once per column on the same schedule.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::app::{COLUMN, SEQ};
pub use crate::load::Urls;

/// What a row sends.
#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    /// One after another: requests a second, for how long.
    pub steps: Vec<(f64, Duration)>,
    pub urls: Urls,
    /// POSTs with a body of their own each; else GETs.
    pub post: bool,
    /// Each POST carries an idempotency key named after its URL (`"item-7"`: popular
    /// keys, as many customers have an order 7) and the `Authorization` of a user of its
    /// own: the same key from different users, which a deduplicating callee must keep
    /// apart.
    pub keyed: bool,
    /// Sent as `x-timeout-ms`: how long the app will wait.
    pub deadline: Option<Duration>,
    /// When the app gives up on a call, whatever it said.
    pub patience: Duration,
}

impl Traffic {
    pub fn duration(&self) -> Duration {
        self.steps.iter().map(|(_, d)| *d).sum()
    }

    pub fn requests(&self) -> u64 {
        self.steps
            .iter()
            .map(|(rps, d)| (rps * d.as_secs_f64()).round() as u64)
            .sum()
    }

    /// When each request goes out, and its path.
    pub fn plan(&self, seed: u64) -> Vec<(Duration, String)> {
        let mut at = Vec::with_capacity(self.requests() as usize);
        let mut from = Duration::ZERO;
        for &(rps, length) in &self.steps {
            let n = (rps * length.as_secs_f64()).round() as u64;
            at.extend((0..n).map(|i| from + Duration::from_secs_f64(i as f64 / rps)));
            from += length;
        }
        let paths = self.urls.paths("/item", at.len(), seed);
        at.into_iter().zip(paths).collect()
    }
}

/// The app's client in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The lab's own HTTP/1.1 client, keeping its connections alive.
    Lab,
    /// A connection a call: the request written, then the write side shut down (a FIN
    /// while the answer is awaited), the answer read to its end.
    HalfClose,
    /// A real client program, one process a column ([`super::program`] runs it).
    Program(Program),
}

/// A real client program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// Node with undici: `EnvHttpProxyAgent` through tollgate, an `Agent` direct.
    Undici,
    /// Python with grpcio: unary calls on an insecure channel.
    Grpc,
    /// Python with requests: small POSTs, through `http_proxy` when it is set.
    Requests,
}

/// Where one column sends.
#[derive(Clone, Debug)]
pub struct Target {
    /// One address (a proxy), or the replicas, taken in turn.
    pub addrs: Vec<SocketAddr>,
    /// The authority the app calls (`Host`).
    pub host: String,
    /// As through `http_proxy`: the request line carries `http://host/path`.
    pub absolute: bool,
}

/// One call as the app saw it.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    pub seq: u32,
    /// From the start of the row.
    pub sent: Duration,
    /// Until the body's end (or the failure).
    pub latency: Duration,
    /// 0: no answer (refused, reset, or out of patience).
    pub status: u16,
    /// A 200 whose body came whole.
    pub ok: bool,
    pub outcome: Option<&'static str>,
    /// `x-tollgate-attempts`; 0 when absent.
    pub attempts: u8,
}

/// The outcomes tollgate may name, kept as static words.
pub const OUTCOMES: [&str; 23] = [
    "attempts-exhausted",
    "budget-exhausted",
    "deadline-exceeded",
    "retry-after-too-long",
    "not-retryable",
    "body-too-large",
    "overloaded",
    "no-route",
    "upstream-unreachable",
    "throttled",
    "retry-rejected",
    "app-retry",
    "app-unreachable",
    "app-timeout",
    "downstream-owned",
    "in-progress",
    "key-mismatch",
    "not-replayable",
    "dedupe-unavailable",
    "loop",
    "malformed",
    "header-too-large",
    "other",
];

fn outcome(v: &HeaderValue) -> &'static str {
    outcome_word(v.to_str().unwrap_or("other"))
}

/// An outcome tollgate named, as one of its static words (`other` when unknown).
pub fn outcome_word(text: &str) -> &'static str {
    OUTCOMES
        .iter()
        .find(|o| **o == text.trim())
        .copied()
        .unwrap_or("other")
}

type Sender = SendRequest<Full<Bytes>>;

/// Kept-alive connections to one address.
#[derive(Default)]
struct Pool {
    idle: Mutex<Vec<Sender>>,
}

impl Pool {
    async fn take(&self) -> Option<Sender> {
        loop {
            let mut s = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
            if s.is_closed() {
                continue;
            }
            // Just handed back after its body: ready as soon as its task has seen it.
            if let Ok(Ok(())) = tokio::time::timeout(Duration::from_millis(100), s.ready()).await {
                return Some(s);
            }
        }
    }

    fn put(&self, s: Sender) {
        if !s.is_closed() {
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(s);
        }
    }
}

/// The most header fields the client takes in an answer: room for any the rows send
/// (hyper's own default, 100, would fail the many-fields row on both sides alike).
const MAX_FIELDS: usize = 512;

async fn connect(addr: SocketAddr) -> std::io::Result<Sender> {
    let stream = TcpStream::connect(addr).await?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_headers(MAX_FIELDS)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One column's client: its target and its connections.
pub struct Client {
    target: Target,
    column: usize,
    pools: Vec<Pool>,
    half_close: bool,
    /// Each call on a connection of its own (`Connection: close`), as a client
    /// without a pool.
    per_call: bool,
}

/// One request of the plan.
pub struct Call<'a> {
    pub seq: u32,
    pub path: &'a str,
    pub sent: Duration,
}

impl Client {
    pub fn new(target: Target, column: usize, caller: Caller) -> Self {
        let pools = target.addrs.iter().map(|_| Pool::default()).collect();
        Client {
            target,
            column,
            pools,
            half_close: caller == Caller::HalfClose,
            per_call: false,
        }
    }

    /// The same client without a pool: each call on a connection of its own.
    pub fn connection_per_call(self) -> Self {
        Client {
            per_call: true,
            ..self
        }
    }

    fn request(&self, call: &Call<'_>, traffic: &Traffic) -> Option<Request<Full<Bytes>>> {
        let t = &self.target;
        let uri = if t.absolute {
            format!("http://{}{}", t.host, call.path)
        } else {
            call.path.to_string()
        };
        let (method, body) = if traffic.post {
            let body = format!("{{\"order\":{},\"column\":{}}}", call.seq, self.column);
            (Method::POST, Bytes::from(body))
        } else {
            (Method::GET, Bytes::new())
        };
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::HOST, &t.host)
            .header(COLUMN, self.column)
            .header(SEQ, call.seq);
        if traffic.post {
            b = b.header(http::header::CONTENT_TYPE, "application/json");
        }
        if self.per_call {
            b = b.header(http::header::CONNECTION, "close");
        }
        if traffic.keyed {
            let key = call.path.trim_start_matches('/').replace('/', "-");
            b = b.header("idempotency-key", format!("\"{key}\"")).header(
                http::header::AUTHORIZATION,
                format!("Bearer user-{}", call.seq),
            );
        }
        if let Some(d) = traffic.deadline {
            b = b.header("x-timeout-ms", d.as_millis() as u64);
        }
        b.body(Full::new(body)).ok()
    }

    /// Sends one call and waits for its whole answer, within the app's patience.
    pub async fn send(&self, call: Call<'_>, traffic: &Traffic) -> Record {
        let began = Instant::now();
        let mut record = Record {
            seq: call.seq,
            sent: call.sent,
            latency: Duration::ZERO,
            status: 0,
            ok: false,
            outcome: None,
            attempts: 0,
        };
        if self.half_close {
            let exchange = self.half_closing(&call, traffic, &mut record);
            let _ = tokio::time::timeout(traffic.patience, exchange).await;
        } else {
            let exchange = self.exchange(&call, traffic, &mut record);
            let _ = tokio::time::timeout(traffic.patience, exchange).await;
        }
        record.latency = began.elapsed().min(traffic.patience);
        record
    }

    async fn exchange(&self, call: &Call<'_>, traffic: &Traffic, record: &mut Record) {
        let n = self.pools.len();
        if n == 0 {
            return;
        }
        let first = call.seq as usize % n;
        // In turn, and on a refused connection the next address.
        for k in 0..n {
            let i = (first + k) % n;
            let pool = &self.pools[i];
            let Some(req) = self.request(call, traffic) else {
                return;
            };
            let pooled = if self.per_call {
                None
            } else {
                pool.take().await
            };
            let mut sender = match pooled {
                Some(s) => s,
                None => match connect(self.target.addrs[i]).await {
                    Ok(s) => s,
                    Err(_) => continue,
                },
            };
            let resp = match sender.send_request(req).await {
                Ok(r) => r,
                Err(e) if e.is_canceled() => {
                    // Never written: the pooled connection had closed. Once more on a
                    // new one, as an HTTP client's pool does.
                    let Some(req) = self.request(call, traffic) else {
                        return;
                    };
                    let Ok(mut fresh) = connect(self.target.addrs[i]).await else {
                        continue;
                    };
                    match fresh.send_request(req).await {
                        Ok(r) => {
                            sender = fresh;
                            r
                        }
                        Err(_) => return,
                    }
                }
                Err(_) => return,
            };
            record.status = resp.status().as_u16();
            record.outcome = resp.headers().get("x-tollgate-outcome").map(outcome);
            record.attempts = resp
                .headers()
                .get("x-tollgate-attempts")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
            let whole = resp.into_body().collect().await.is_ok();
            record.ok = whole && record.status == 200;
            if whole && !self.per_call {
                pool.put(sender);
            }
            return;
        }
    }
}

impl Client {
    /// One call on a connection of its own: the request written whole, the write side
    /// shut down, the answer read. In turn over the addresses, and on a refused
    /// connection the next one, as [`Client::exchange`].
    async fn half_closing(&self, call: &Call<'_>, traffic: &Traffic, record: &mut Record) {
        let Some(req) = self.request(call, traffic) else {
            return;
        };
        let (parts, body) = req.into_parts();
        let Ok(body) = body.collect().await.map(|b| b.to_bytes());
        let mut wire = format!("{} {} HTTP/1.1\r\n", parts.method, parts.uri).into_bytes();
        for (name, value) in &parts.headers {
            wire.extend_from_slice(name.as_str().as_bytes());
            wire.extend_from_slice(b": ");
            wire.extend_from_slice(value.as_bytes());
            wire.extend_from_slice(b"\r\n");
        }
        if !body.is_empty() {
            wire.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        wire.extend_from_slice(&body);
        let n = self.target.addrs.len();
        let first = call.seq as usize % n.max(1);
        for k in 0..n {
            let addr = self.target.addrs[(first + k) % n];
            let Ok(mut stream) = TcpStream::connect(addr).await else {
                continue;
            };
            if stream.write_all(&wire).await.is_err() || stream.shutdown().await.is_err() {
                return;
            }
            if let Some(answer) = read_answer(&mut stream).await {
                record.status = answer.status;
                record.outcome = answer.outcome;
                record.attempts = answer.attempts;
                record.ok = answer.whole && answer.status == 200;
            }
            return;
        }
    }
}

/// An answer read off a connection the client has half-closed.
struct RawAnswer {
    status: u16,
    outcome: Option<&'static str>,
    attempts: u8,
    /// Its body came to the end its head announced.
    whole: bool,
}

/// The most an answer may take of memory here: the lab's are a few bytes.
const RAW_MAX: usize = 1 << 20;

/// Reads one HTTP/1.1 answer: its head, then its body by `Content-Length`, by chunks
/// (to the last one) or to the end of the connection. `None`: no head came.
async fn read_answer(stream: &mut TcpStream) -> Option<RawAnswer> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let mut eof = false;
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut head = httparse::Response::new(&mut fields);
        if let Ok(httparse::Status::Complete(len)) = head.parse(&buf) {
            let status = head.code.unwrap_or(0);
            let field = |name: &str| {
                head.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
            };
            let outcome = field("x-tollgate-outcome").map(outcome_word);
            let attempts = field("x-tollgate-attempts")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let length: Option<usize> = field("content-length").and_then(|v| v.trim().parse().ok());
            let chunked = field("transfer-encoding")
                .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
            let mut body = buf.split_off(len);
            let whole = loop {
                let done = match (length, chunked) {
                    (Some(n), _) => body.len() >= n,
                    (None, true) => body.ends_with(b"0\r\n\r\n"),
                    // Delimited by the close.
                    (None, false) => eof,
                };
                if done {
                    break true;
                }
                if eof || body.len() > RAW_MAX {
                    break false;
                }
                match stream.read(&mut chunk).await {
                    Ok(0) => eof = true,
                    Ok(n) => body.extend_from_slice(&chunk[..n]),
                    Err(_) => break false,
                }
            };
            return Some(RawAnswer {
                status,
                outcome,
                attempts,
                whole,
            });
        }
        if eof || buf.len() > RAW_MAX {
            return None;
        }
        match stream.read(&mut chunk).await {
            Ok(0) => eof = true,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return None,
        }
    }
}

/// Sends `plan` to every client at once, request `n` to all of them at the same
/// instant from `start`; each client's records, in order of `seq`.
pub async fn drive(
    clients: Vec<Arc<Client>>,
    plan: Arc<Vec<(Duration, String)>>,
    traffic: Arc<Traffic>,
    start: Instant,
) -> Vec<Vec<Record>> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut records: Vec<Vec<Record>> = clients.iter().map(|_| Vec::new()).collect();
    for seq in 0..plan.len() {
        let at = plan[seq].0;
        tokio::time::sleep_until(start + at).await;
        for (c, client) in clients.iter().enumerate() {
            let (client, plan, traffic) = (client.clone(), plan.clone(), traffic.clone());
            tasks.spawn(async move {
                let call = Call {
                    seq: seq as u32,
                    path: &plan[seq].1,
                    sent: at,
                };
                (c, client.send(call, &traffic).await)
            });
        }
        while let Some(Ok((c, r))) = tasks.try_join_next() {
            records[c].push(r);
        }
    }
    while let Some(done) = tasks.join_next().await {
        if let Ok((c, r)) = done {
            records[c].push(r);
        }
    }
    for r in &mut records {
        r.sort_by_key(|r| r.seq);
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(urls: Urls) -> Traffic {
        Traffic {
            steps: vec![
                (5.0, Duration::from_secs(2)),
                (100.0, Duration::from_secs(10)),
            ],
            urls,
            post: false,
            keyed: false,
            deadline: None,
            patience: Duration::from_secs(1),
        }
    }

    #[test]
    fn the_plan_follows_the_steps() {
        let t = traffic(Urls::Distinct);
        let plan = t.plan(1);
        assert_eq!(plan.len() as u64, t.requests());
        assert_eq!(plan.len(), 1010);
        assert_eq!(plan[10].0, Duration::from_secs(2));
        assert_eq!(plan[11].0, Duration::from_millis(2010));
        assert_eq!(plan[3].1, "/item/3");
        assert_eq!(t.duration(), Duration::from_secs(12));
    }

    #[test]
    fn every_column_gets_the_same_plan() {
        let t = traffic(Urls::Zipf(100));
        assert_eq!(t.plan(1), t.plan(1));
        assert!(t.plan(1).iter().all(|(_, p)| p.starts_with("/item/")));
    }
}
