//! Open-loop load: requests start on a fixed schedule whatever happens to the earlier
//! ones. A closed loop (each client waiting for its answer before the next request)
//! slows down as the system degrades and hides exactly the amplification the lab is
//! there to show.
//!
//! Real traffic repeats URLs: many users ask for the same popular one. So does the
//! load: one URL (the published storm's load), or a Zipf mix over a hundred ([`Urls`]),
//! drawn from a fixed seed so that chains run side by side send the same sequence. A
//! URL of its own per request would hide whatever a proxy does with repeated calls.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;
use http_body_util::BodyExt;
use tokio::time::Instant;

use tollgate_core::config::EndpointAddr;
use tollgate_core::http::NoBody;
use tollgate_core::upstream::pool::{Endpoint, Want};
use tollgate_core::upstream::request::{ContinueWait, RequestHead};

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

/// Which URLs a load asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urls {
    /// One popular URL.
    One,
    /// A Zipf mix (s = 1) over this many URLs: the first has about a fifth of the
    /// requests of a hundred.
    Zipf(usize),
    /// A URL of its own per request (a control: no real traffic does this).
    Distinct,
}

impl Urls {
    /// Draws the paths of `n` requests under `prefix` (`/work`), from `seed`.
    pub fn paths(self, prefix: &str, n: usize, seed: u64) -> Vec<String> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let cdf = match self {
            Urls::Zipf(k) => zipf_cdf(k),
            Urls::One | Urls::Distinct => Vec::new(),
        };
        (0..n)
            .map(|i| match self {
                Urls::One => prefix.to_string(),
                Urls::Zipf(_) => {
                    let u = rng.f64();
                    let rank = cdf
                        .partition_point(|c| *c < u)
                        .min(cdf.len().saturating_sub(1));
                    format!("{prefix}/{rank}")
                }
                Urls::Distinct => format!("{prefix}/{i}"),
            })
            .collect()
    }
}

/// The cumulative shares of a Zipf law (s = 1) over `n` ranks.
fn zipf_cdf(n: usize) -> Vec<f64> {
    let weights: Vec<f64> = (1..=n.max(1)).map(|k| 1.0 / k as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w / total;
            acc
        })
        .collect()
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
    pub urls: Urls,
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
    let paths: Vec<http::Uri> = spec
        .urls
        .paths("/work", total as usize, 1)
        .into_iter()
        .map(|p| http::Uri::try_from(p).unwrap_or_else(|_| http::Uri::from_static("/work")))
        .collect();
    let paths = Arc::new(paths);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let at = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(at).await;
        let (endpoint, records, live) = (endpoint.clone(), records.clone(), live.clone());
        let deadline_value = deadline_value.clone();
        let paths = paths.clone();
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
                let uri = &paths[i as usize];
                let head =
                    RequestHead::as_is(&http::Method::GET, uri, &headers, ContinueWait::ZERO);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_repeat_as_real_traffic_does() {
        assert!(Urls::One.paths("/work", 50, 1).iter().all(|p| p == "/work"));
        let zipf = Urls::Zipf(100).paths("/work", 1000, 1);
        let top = zipf.iter().filter(|p| *p == "/work/0").count();
        // Rank 1 of a Zipf law over 100 has 1 / H(100), about 19%, of the requests.
        assert!((140..260).contains(&top), "{top}");
        assert!(zipf.iter().all(|p| {
            p.strip_prefix("/work/")
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n < 100)
        }));
        // The same seed, the same sequence: chains side by side send the same.
        assert_eq!(zipf, Urls::Zipf(100).paths("/work", 1000, 1));
        assert_eq!(
            Urls::Distinct.paths("/work", 3, 1),
            ["/work/0", "/work/1", "/work/2"]
        );
    }
}
