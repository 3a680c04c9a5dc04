//! The exporter: a thread of its own that takes spans off the queue, encodes them and
//! POSTs them to the collector (OTLP over HTTP, protobuf), one batch at a time.
//!
//! It has its own single-threaded runtime so that nothing it does (a collector that
//! takes its `timeout` to answer, a name to resolve, the encoding) ever runs on a
//! worker that serves requests. A batch goes out when `batch` spans are waiting, or
//! every [`INTERVAL`] with what there is. A batch that fails (no connection, a status
//! other than 2xx, no answer within `timeout`) is dropped and counted
//! (`export-failed`), never retried: the queue behind it is what must not wait. One
//! connection is kept open and reused; one that failed is closed.

use std::io;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::encode::{self, Clock, Resource};
use super::queue::{Taken, Taker};
use super::span::Spans;
use crate::metrics::trace::{SpanDrop, TraceDrops};

/// The longest a span waits for a batch to fill before it is sent anyway.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Where and how the exporter sends.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    /// `host:port`, connected to and sent as `Host`.
    pub authority: String,
    /// `/v1/traces`, behind the path of the configured address.
    pub path: String,
    pub batch: usize,
    pub timeout: Duration,
}

/// Starts the exporter's thread. It ends once every handle of the queue is gone and
/// what they left has been sent.
pub(super) fn spawn(
    taker: Taker<Spans>,
    settings: Settings,
    resource: Resource,
    drops: TraceDrops,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tollgate-otlp".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match runtime {
                Ok(rt) => rt.block_on(run(taker, settings, resource, drops)),
                // The taker goes with this thread: every push is then counted as failed.
                Err(e) => {
                    tracing::warn!(error = %e, "trace export: no runtime; spans will be dropped")
                }
            }
        })
}

async fn run(mut taker: Taker<Spans>, settings: Settings, resource: Resource, drops: TraceDrops) {
    let mut exporter = Exporter {
        client: Client::new(&settings),
        resource,
        drops,
        timeout: settings.timeout,
        failing: false,
    };
    let mut batch: Vec<Box<Spans>> = Vec::new();
    let mut in_batch = 0;
    loop {
        taker.ready(tokio::time::sleep(INTERVAL)).await;
        // What is waiting now, not what keeps arriving: every wake ends.
        let mut budget = taker.waiting();
        let closed = loop {
            match taker.take() {
                Taken::Spans(spans) => {
                    let n = spans.count();
                    if in_batch + n > settings.batch && !batch.is_empty() {
                        exporter.export(&mut batch).await;
                        in_batch = 0;
                    }
                    in_batch += n;
                    batch.push(spans);
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        break false;
                    }
                }
                Taken::Empty => break false,
                Taken::Closed => break true,
            }
        };
        if !batch.is_empty() {
            exporter.export(&mut batch).await;
            in_batch = 0;
        }
        if closed {
            return;
        }
    }
}

struct Exporter {
    client: Client,
    resource: Resource,
    drops: TraceDrops,
    timeout: Duration,
    /// The last export failed: logged once when it starts and once when it ends.
    failing: bool,
}

impl Exporter {
    // The spans stay in the boxes the requests filled: handed over and batched without
    // a copy of a few hundred bytes each.
    #[allow(clippy::vec_box)]
    async fn export(&mut self, batch: &mut Vec<Box<Spans>>) {
        let spans: usize = batch.iter().map(|s| s.count()).sum();
        let body = encode::export_request(batch, &self.resource, Clock::now());
        batch.clear();
        let result = tokio::time::timeout(self.timeout, self.client.post(body)).await;
        let error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(ExportError::Timeout(self.timeout)),
        };
        match error {
            None if self.failing => {
                self.failing = false;
                tracing::info!(collector = %self.client.authority, "trace export: the collector takes spans again");
            }
            None => {}
            Some(e) => {
                // Whatever state the connection is in, it is not one to reuse.
                self.client.sender = None;
                self.drops.dropped(SpanDrop::ExportFailed, spans);
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(collector = %self.client.authority, error = %e, "trace export failed; spans are dropped (tollgate_trace_spans_dropped_total) until it recovers");
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("the collector answered {0}")]
    Status(StatusCode),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("invalid request: {0}")]
    Request(#[from] http::Error),
}

/// One HTTP/1.1 connection to the collector, on hyper's client.
struct Client {
    authority: String,
    path: String,
    sender: Option<http1::SendRequest<Full<Bytes>>>,
}

impl Client {
    fn new(s: &Settings) -> Self {
        Client {
            authority: s.authority.clone(),
            path: s.path.clone(),
            sender: None,
        }
    }

    async fn connect(&self) -> Result<http1::SendRequest<Full<Bytes>>, ExportError> {
        let stream = TcpStream::connect(self.authority.as_str())
            .await
            .map_err(ExportError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn post(&mut self, body: Vec<u8>) -> Result<(), ExportError> {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.connect().await?,
        };
        sender.ready().await?;
        let req = Request::post(self.path.as_str())
            .header(HOST, self.authority.as_str())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(Bytes::from(body)))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        // Read to its end (a partial success says little we could act on) so the
        // connection can carry the next batch; a collector's answer is small.
        let whole = Limited::new(resp.into_body(), 64 * 1024)
            .collect()
            .await
            .is_ok();
        if !status.is_success() {
            return Err(ExportError::Status(status));
        }
        if whole {
            self.sender = Some(sender);
        }
        Ok(())
    }
}
