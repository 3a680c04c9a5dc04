//! Open-loop load: requests start on a fixed schedule whatever happens to the earlier
//! ones. A closed loop (each client waiting for its answer before the next request)
//! slows down as the system degrades and hides exactly the amplification the lab is
//! there to show.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::config::EndpointAddr;
use crate::http::NoBody;
use crate::upstream::pool::{Endpoint, Want};
use crate::upstream::request::{AttemptFields, RequestHead};

/// One user request as the user saw it.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// When it was sent, from the start of the run.
    pub sent: Duration,
    pub latency: Duration,
    pub ok: bool,
    /// The status the user got; 0 for none (no connection, or out of patience).
    pub status: u16,
}

#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub rps: f64,
    pub duration: Duration,
    /// The user's deadline, sent as `x-timeout-ms`.
    pub deadline: Duration,
    /// When the user's HTTP client gives up, whatever it asked for.
    pub patience: Duration,
    pub host: &'static str,
}

/// Live counts, for the progress line.
#[derive(Default)]
pub struct Live {
    pub sent: AtomicUsize,
    pub done: AtomicUsize,
    pub ok: AtomicUsize,
    pub ok_latency_us: AtomicU64,
}

/// Sends the load at `target` and returns every request's record.
pub async fn run(
    target: SocketAddr,
    spec: LoadSpec,
    start: Instant,
    live: Arc<Live>,
) -> Vec<Record> {
    let endpoint = Arc::new(Endpoint::<NoBody>::new(
        "load".into(),
        EndpointAddr {
            host: target.ip().to_string(),
            port: target.port(),
        },
        Arc::new(AtomicUsize::new(0)),
        1,
        None,
    ));
    let records: Arc<Mutex<Vec<Record>>> = Arc::default();
    let total = (spec.rps * spec.duration.as_secs_f64()).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / spec.rps);
    let deadline_value = HeaderValue::from(spec.deadline.as_millis() as u64);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let at = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(at).await;
        let (endpoint, records, live) = (endpoint.clone(), records.clone(), live.clone());
        let deadline_value = deadline_value.clone();
        let patience = spec.patience;
        let host = spec.host;
        live.sent.fetch_add(1, Relaxed);
        tasks.spawn(async move {
            let sent = Instant::now();
            let attempt = async {
                let (conn, _) = endpoint.checkout(Want::Http1, None, patience).await.ok()?;
                let mut headers = http::HeaderMap::with_capacity(2);
                headers.insert(http::header::HOST, HeaderValue::from_static(host));
                headers.insert("x-timeout-ms", deadline_value);
                // Each user request its own: the same target again within 2 s of a
                // failure would be an app's own retry of it.
                let uri = http::Uri::try_from(format!("/work?n={i}"))
                    .unwrap_or_else(|_| http::Uri::from_static("/work"));
                let head = RequestHead {
                    method: &http::Method::GET,
                    uri: &uri,
                    headers: &headers,
                    fields: AttemptFields::default(),
                    https: false,
                    continue_wait: std::time::Duration::ZERO,
                };
                let resp = conn.send(&head, NoBody).await.ok()?;
                let status = resp.status().as_u16();
                // Read to its end, the body gives its connection back to the pool.
                resp.into_body().collect().await.ok()?;
                Some(status)
            };
            let status = match tokio::time::timeout(patience, attempt).await {
                Ok(Some(status)) => status,
                _ => 0,
            };
            let ok = status == 200;
            let latency = sent.elapsed().min(patience);
            live.done.fetch_add(1, Relaxed);
            if ok {
                live.ok.fetch_add(1, Relaxed);
                live.ok_latency_us
                    .fetch_add(latency.as_micros() as u64, Relaxed);
            }
            records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Record {
                    sent: sent - start,
                    latency,
                    ok,
                    status,
                });
        });
        // Reap finished tasks as we go so the set stays small.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let mut out = std::mem::take(&mut *records.lock().unwrap_or_else(|p| p.into_inner()));
    out.sort_by_key(|r| r.sent);
    out
}
