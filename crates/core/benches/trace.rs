//! What tracing costs the request path: nothing but a check of an `Option` without
//! `[tracing]`; the decision alone for a request that is not traced; and, for one that
//! is, recording its SERVER span and an attempt's CLIENT span and handing them to the
//! export queue (the exporter's own work, on its thread, is not timed).

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Method};
use tokio::time::Instant;

use tollgate_core::config::{OtlpAddr, TracingConfig};
use tollgate_core::metrics::{Metrics, Outcome};
use tollgate_core::trace::{Arrival, AttemptEnd, AttemptStart, Side, TRACEPARENT, Tracer};

const SAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const UNSAMPLED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";

fn headers(tp: Option<&'static str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("host", HeaderValue::from_static("payments"));
    h.insert("accept", HeaderValue::from_static("*/*"));
    if let Some(tp) = tp {
        h.insert(TRACEPARENT, HeaderValue::from_static(tp));
    }
    h
}

fn arrival(headers: &HeaderMap) -> Arrival<'_> {
    Arrival {
        side: Side::Outbound,
        method: &Method::GET,
        authority: "payments",
        path: "/charge",
        https: false,
        upstream: "payments",
        headers,
    }
}

/// A tracer whose exporter sends to a port nothing listens on: its export fails at
/// once, counted, and the queue is taken as fast as it is filled.
fn tracer(metrics: &Metrics) -> Arc<Tracer> {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let addr: SocketAddr = dead.local_addr().expect("its address");
    drop(dead);
    let cfg = TracingConfig {
        otlp: OtlpAddr::parse(&format!("http://{addr}")).expect("an http URL"),
        sample: 0.0,
        batch: 512,
        queue: 1 << 20,
        timeout: Duration::from_secs(1),
    };
    Tracer::new(&cfg, metrics.trace_drops().clone()).expect("the exporter's thread")
}

fn off(c: &mut Criterion) {
    let none: Option<Arc<Tracer>> = None;
    let h = headers(Some(SAMPLED));
    c.bench_function("trace: off (no [tracing])", |b| {
        b.iter(|| {
            let trace = black_box(&none)
                .as_ref()
                .and_then(|t| t.request(&arrival(&h), Instant::now()));
            black_box(trace.is_some())
        })
    });
}

fn not_traced(c: &mut Criterion) {
    let metrics = Metrics::new();
    let t = tracer(&metrics);
    let unsampled = headers(Some(UNSAMPLED));
    c.bench_function("trace: unsampled traceparent (decision only)", |b| {
        b.iter(|| {
            black_box(
                t.request(&arrival(black_box(&unsampled)), Instant::now())
                    .is_some(),
            )
        })
    });
    let none = headers(None);
    c.bench_function("trace: no traceparent, sample = 0", |b| {
        b.iter(|| {
            black_box(
                t.request(&arrival(black_box(&none)), Instant::now())
                    .is_some(),
            )
        })
    });
}

/// Records `n` traced requests of one attempt each; returns the time it took.
fn record(t: &Tracer, h: &HeaderMap, n: u64) -> Duration {
    let now = Instant::now();
    let start = StdInstant::now();
    for _ in 0..n {
        let mut trace = t.request(&arrival(h), now).expect("sampled");
        let a = trace.attempt(
            AttemptStart {
                number: 1,
                hedge: false,
                endpoint: Some(SocketAddr::from(([10, 0, 0, 5], 8080))),
                reason: None,
                deadline_left: Some(Duration::from_millis(800)),
            },
            now,
        );
        black_box(trace.attempt_traceparent(a));
        let end = AttemptEnd {
            status: Some(200),
            fault: None,
            callee_outcome: None,
            ejected: false,
        };
        trace.attempt_ended(a, end, now);
        trace.finish(200, Outcome::Ok, now);
    }
    start.elapsed()
}

fn traced(c: &mut Criterion) {
    let metrics = Metrics::new();
    let t = tracer(&metrics);
    let sampled = headers(Some(SAMPLED));
    c.bench_function(
        "trace: sampled request, one attempt, recorded and queued",
        |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    // In rounds the queue holds, each taken before the next (not timed).
                    let n = left.min(100_000);
                    spent += record(&t, &sampled, n);
                    left -= n;
                    let drained = StdInstant::now() + Duration::from_secs(10);
                    while t.waiting() > 0 && StdInstant::now() < drained {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                spent
            })
        },
    );
}

criterion_group!(benches, off, not_traced, traced);
criterion_main!(benches);
