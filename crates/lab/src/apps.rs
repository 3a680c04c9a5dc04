//! `tollgate lab --scenario apps`: ownership through the app.
//!
//! Between two tollgates there is always an app, and an app does not copy
//! `x-tollgate-outcome` onto its own failure. Here a caller's tollgate calls payments
//! through payments' tollgate (its inbound side); payments' app serves each request by
//! calling db through the same tollgate (its outbound side), passing the request's
//! `x-request-id` on, and answers a plain 503 of its own when that call fails. db is
//! down: every call gets 503. Both tollgates retry alike (`max_attempts = 3`, budgets
//! with room), so the two runs differ only in payments' `[inbound] owned_failures`:
//!
//! - `off`: payments' 503 looks like any failure, and the caller's tollgate retries it:
//!   every attempt of the outer layer costs db the attempts of the inner one (3 × 3);
//! - `mark`: payments' tollgate knows its own call for that request was given up on
//!   (owned), marks the app's 503 `downstream-owned`, and nobody retries it: db sees
//!   the attempts of one layer.
//!
//! The user requests go one at a time, each with an `x-request-id` of its own, and
//! every call is counted where it arrives (payments' app, db).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::LabError;
use super::backend::serve_http1;
use tollgate_core::run::Running;

/// What the scenario runs.
#[derive(Clone, Copy, Debug)]
pub struct AppsSpec {
    /// User requests, one at a time, in each run.
    pub requests: u64,
}

impl Default for AppsSpec {
    fn default() -> Self {
        AppsSpec { requests: 30 }
    }
}

/// One run, as counted where the calls arrived.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counted {
    pub requests: u64,
    /// Requests payments' app received (attempts of the outer layer that reached it).
    pub app_calls: u64,
    pub db_calls: u64,
    /// User requests answered `x-tollgate-outcome: downstream-owned`.
    pub owned: u64,
}

pub struct AppsResult {
    pub off: Counted,
    pub mark: Counted,
}

const MAX_ATTEMPTS: u32 = 3;

const LOOPBACK: &str =
    "[listener]\naddr = \"127.0.0.1:0\"\nmax_connections = 5000\n[admin]\naddr = \"127.0.0.1:0\"\n";

fn retries(name: &str) -> String {
    format!(
        "[upstreams.{name}.retry]\nmax_attempts = {MAX_ATTEMPTS}\nbackoff_base = \"1ms\"\n\
         backoff_max = \"5ms\"\n[upstreams.{name}.budget]\nratio = 10.0\nmin_per_sec = 1000\n"
    )
}

fn parse(text: &str) -> Result<tollgate_core::config::Config, LabError> {
    tollgate_core::config::parse("lab.toml", text, Path::new("."))
        .map_err(|e| LabError::Setup(e.to_string()))
}

fn setup(e: impl std::fmt::Display) -> LabError {
    LabError::Setup(e.to_string())
}

/// Serves HTTP/1.1 on `listener` with `answer` until aborted.
fn serve<F, Fut>(listener: TcpListener, answer: F) -> JoinHandle<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_http1(stream, answer.clone()));
        }
    })
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *resp.status_mut() = status;
    resp
}

/// One GET to `to` for `host`, with `x-request-id: id`: its status and outcome.
async fn get(to: SocketAddr, host: &str, id: &str) -> Option<(StatusCode, Option<String>)> {
    let stream = TcpStream::connect(to).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    let conn = tokio::spawn(conn);
    let req = Request::get("/")
        .header("host", host)
        .header("x-request-id", id)
        .body(Empty::<Bytes>::new())
        .ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .ok()?
        .ok()?;
    let outcome = resp
        .headers()
        .get("x-tollgate-outcome")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    conn.abort();
    Some((status, outcome))
}

/// One run with payments' `owned_failures` set to `mode`.
async fn run_one(mode: &str, spec: AppsSpec) -> Result<Counted, LabError> {
    let db_calls = Arc::new(AtomicU64::new(0));
    let app_calls = Arc::new(AtomicU64::new(0));
    let db_listener = TcpListener::bind("127.0.0.1:0").await.map_err(setup)?;
    let db_addr = db_listener.local_addr().map_err(setup)?;
    let counter = db_calls.clone();
    let db = serve(db_listener, move |_req| {
        counter.fetch_add(1, Relaxed);
        async { plain(StatusCode::SERVICE_UNAVAILABLE, "db is down\n") }
    });
    let app_listener = TcpListener::bind("127.0.0.1:0").await.map_err(setup)?;
    let app_addr = app_listener.local_addr().map_err(setup)?;
    let payments = Running::start(
        parse(&format!(
            "{LOOPBACK}[inbound]\naddr = \"127.0.0.1:0\"\napp = \"{app_addr}\"\n\
             owned_failures = \"{mode}\"\n\
             [upstreams.db]\nauthorities = [\"db\"]\nendpoints = [\"{db_addr}\"]\n{}",
            retries("db")
        ))?,
        None,
    )
    .await
    .map_err(setup)?;
    let outbound = payments.server.local_addr();
    let inbound = payments
        .server
        .inbound_addr()
        .ok_or_else(|| setup("the inbound side did not start"))?;
    let counter = app_calls.clone();
    let app = serve(app_listener, move |req: Request<Incoming>| {
        counter.fetch_add(1, Relaxed);
        let id = req
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        async move {
            // The app's own call for this request, through its tollgate; whatever it
            // got, the app answers a failure of its own, without tollgate's words.
            let _ = get(outbound, "db", &id).await;
            plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "payments could not charge\n",
            )
        }
    });
    let caller = Running::start(
        parse(&format!(
            "{LOOPBACK}[upstreams.payments]\nauthorities = [\"payments\"]\n\
             endpoints = [\"{inbound}\"]\n{}",
            retries("payments")
        ))?,
        None,
    )
    .await
    .map_err(setup)?;
    let mut owned = 0;
    for i in 0..spec.requests {
        let answer = get(caller.server.local_addr(), "payments", &format!("lab-{i}")).await;
        if answer.and_then(|(_, o)| o).as_deref() == Some("downstream-owned") {
            owned += 1;
        }
    }
    caller.shutdown(Duration::ZERO).await;
    payments.shutdown(Duration::ZERO).await;
    app.abort();
    db.abort();
    Ok(Counted {
        requests: spec.requests,
        app_calls: app_calls.load(Relaxed),
        db_calls: db_calls.load(Relaxed),
        owned,
    })
}

pub async fn run(spec: AppsSpec, progress: bool) -> Result<AppsResult, LabError> {
    if progress {
        tollgate_core::print::stderr_line("  owned_failures = \"off\" ...");
    }
    let off = run_one("off", spec).await?;
    if progress {
        tollgate_core::print::stderr_line("  owned_failures = \"mark\" ...");
    }
    let mark = run_one("mark", spec).await?;
    Ok(AppsResult { off, mark })
}

pub fn table(r: &AppsResult) -> String {
    let mut out = format!(
        "apps: ownership through the app\n\
         caller's tollgate -> payments' tollgate (inbound) -> payments' app -> the same \
         tollgate (outbound) -> db, down.\n\
         Both tollgates retry up to {MAX_ATTEMPTS} attempts; {} user requests, one at a time.\n\n\
         {:<16} {:>10} {:>10} {:>16} {:>18}\n",
        r.off.requests,
        "owned_failures",
        "app calls",
        "db calls",
        "db per request",
        "downstream-owned"
    );
    for (mode, c) in [("off", r.off), ("mark", r.mark)] {
        out.push_str(&format!(
            "{mode:<16} {:>10} {:>10} {:>16.1} {:>18}\n",
            c.app_calls,
            c.db_calls,
            c.db_calls as f64 / c.requests.max(1) as f64,
            c.owned
        ));
    }
    out.push_str(
        "\nWith \"off\" the caller retries the app's 503 and the layers multiply; with \
         \"mark\" the app's 503 goes back downstream-owned and db sees one layer's attempts.\n",
    );
    out
}

pub fn to_json(r: &AppsResult) -> Value {
    let one = |c: Counted| {
        json!({
            "requests": c.requests,
            "app_calls": c.app_calls,
            "db_calls": c.db_calls,
            "db_calls_per_request": c.db_calls as f64 / c.requests.max(1) as f64,
            "downstream_owned": c.owned,
        })
    };
    json!({
        "scenario": "apps",
        "max_attempts": MAX_ATTEMPTS,
        "off": one(r.off),
        "mark": one(r.mark),
    })
}
