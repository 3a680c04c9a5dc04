//! The per-request pieces, one by one: budget bookkeeping (fixed and adaptive), a
//! backoff draw, the throttle's decision, the look for the app's own retries, deadline
//! header parsing and formatting, route lookup, the endpoint choice with its ejection
//! check, and the hedge timer and decision. Each runs on every request (or every
//! failure), so each must cost nanoseconds, not microseconds.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

use tollgate_core::config::{BudgetConfig, HedgeAfter, HedgeConfig, ThrottleConfig};
use tollgate_core::deadline;
use tollgate_core::http::NoBody;
use tollgate_core::proxy::route::Routes;
use tollgate_core::retry::decide::backoff::Backoff;
use tollgate_core::retry::decide::budget::RetryBudget;
use tollgate_core::retry::decide::hedge::Hedging;
use tollgate_core::retry::evidence::recent::{RecentFailures, Remembered};
use tollgate_core::retry::learn::throttle::Throttle;
use tollgate_core::upstream::Endpoints;
use tollgate_core::upstream::outlier::EndpointReport;

fn budget(c: &mut Criterion) {
    let cfg = BudgetConfig {
        ratio: 0.1,
        min_per_sec: 10.0,
        window: Duration::from_secs(10),
        max_ratio: None,
    };
    let b = RetryBudget::new(Some(&cfg), Instant::now());
    c.bench_function("budget: record a request", |bench| {
        bench.iter(|| b.record_request(black_box(Instant::now())))
    });
    c.bench_function("budget: record an attempt", |bench| {
        bench.iter(|| b.record_attempt(black_box(Instant::now())))
    });
    c.bench_function("budget: ask for a retry", |bench| {
        bench.iter(|| black_box(b.try_retry(Instant::now())))
    });
}

fn adaptive_budget(c: &mut Criterion) {
    let cfg = BudgetConfig {
        ratio: 0.2,
        min_per_sec: 10.0,
        window: Duration::from_secs(10),
        max_ratio: Some(0.6),
    };
    let b = RetryBudget::new(Some(&cfg), Instant::now());
    c.bench_function("adaptive budget: ask for a retry", |bench| {
        bench.iter(|| black_box(b.try_retry(Instant::now())))
    });
    let share = b.adaptive().expect("max_ratio above ratio");
    c.bench_function("adaptive budget: a retry succeeded", |bench| {
        bench.iter(|| share.retry_succeeded(black_box(Instant::now())))
    });
    c.bench_function("adaptive budget: a retry failed", |bench| {
        bench.iter(|| share.retry_failed())
    });
}

fn throttle(c: &mut Criterion) {
    let t = Throttle::new(&ThrottleConfig::default(), Instant::now());
    let mut rng = fastrand::Rng::with_seed(1);
    c.bench_function(
        "throttle: decide a first attempt, upstream healthy",
        |bench| {
            bench.iter(|| {
                let now = Instant::now();
                let go = t.admit(now, &mut rng);
                t.accepted(now);
                t.answered(now);
                black_box(go)
            })
        },
    );
    let failing = Throttle::new(&ThrottleConfig::default(), Instant::now());
    c.bench_function(
        "throttle: decide a first attempt, upstream failing",
        |bench| {
            bench.iter(|| {
                let now = Instant::now();
                let go = failing.admit(now, &mut rng);
                if go {
                    failing.rejected();
                    failing.answered(now);
                }
                black_box(go)
            })
        },
    );
}

fn app_retries(c: &mut Criterion) {
    let recent = RecentFailures::new(Instant::now());
    let what = ("GET", "payments", Some("/charge?id=42"), None::<&[u8]>);
    c.bench_function("app retries: fingerprint a request", |bench| {
        bench.iter(|| black_box(recent.fingerprint(black_box(what))))
    });
    let fp = recent.fingerprint(what);
    c.bench_function("app retries: look, nothing failed recently", |bench| {
        bench.iter(|| black_box(recent.lookup(black_box(fp), Instant::now())))
    });
    let failed = Remembered {
        status: 503,
        grpc: None,
    };
    recent.record(recent.fingerprint("another"), failed, Instant::now());
    c.bench_function("app retries: look, a failure in the table", |bench| {
        bench.iter(|| black_box(recent.lookup(black_box(fp), Instant::now())))
    });
}

fn backoff(c: &mut Criterion) {
    let b = Backoff::default();
    let mut rng = fastrand::Rng::with_seed(1);
    c.bench_function("backoff: full-jitter draw", |bench| {
        bench.iter(|| black_box(b.draw(black_box(2), &mut rng)))
    });
}

fn deadlines(c: &mut Criterion) {
    let accept = [
        HeaderName::from_static("x-timeout-ms"),
        deadline::GRPC_TIMEOUT,
        HeaderName::from_static("x-envoy-expected-rq-timeout-ms"),
    ];
    let mut h = HeaderMap::new();
    h.insert("x-timeout-ms", HeaderValue::from_static("850"));
    h.insert("content-type", HeaderValue::from_static("application/json"));
    c.bench_function("deadline: read the caller's headers", |bench| {
        bench.iter(|| black_box(deadline::caller_timeout(black_box(&h), &accept)))
    });
    c.bench_function("deadline: parse grpc-timeout", |bench| {
        bench.iter(|| black_box(deadline::parse_grpc_timeout(black_box(b"250m"))))
    });
    c.bench_function("deadline: format x-timeout-ms", |bench| {
        bench.iter(|| {
            black_box(deadline::format_millis(black_box(Duration::from_millis(
                599,
            ))))
        })
    });
    c.bench_function("deadline: format grpc-timeout", |bench| {
        bench.iter(|| {
            black_box(deadline::format_grpc_timeout(black_box(
                Duration::from_millis(599),
            )))
        })
    });
}

fn routing(c: &mut Criterion) {
    let names: Vec<Vec<String>> = (0..50)
        .map(|i| {
            vec![
                format!("service-{i}"),
                format!("service-{i}.default.svc.cluster.local"),
            ]
        })
        .collect();
    let routes = Routes::new(
        names.iter().enumerate().map(|(i, a)| (i, a.as_slice())),
        None,
    );
    c.bench_function("route: host with port, 50 upstreams", |bench| {
        bench.iter(|| black_box(routes.lookup(black_box("service-42:8080"))))
    });
    c.bench_function("route: unknown host", |bench| {
        bench.iter(|| black_box(routes.lookup(black_box("evil.example.com"))))
    });
}

/// Three endpoints, with `outlier` as their outlier section.
fn endpoints(outlier: &str) -> Endpoints<NoBody> {
    let text = format!(
        "[upstreams.u]\nauthorities = [\"u\"]\n\
         endpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]\n{outlier}"
    );
    let config = tollgate_core::config::parse("bench.toml", &text, std::path::Path::new("."))
        .unwrap_or_else(|e| panic!("{e}"));
    let counter = tollgate_core::metrics::Ejections::detached();
    Endpoints::new(&config.upstreams[0], &Default::default(), 1, counter)
}

fn endpoint_choice(c: &mut Criterion) {
    let plain = endpoints("");
    c.bench_function("endpoints: pick, no outlier section", |bench| {
        bench.iter(|| black_box(plain.pick(black_box(None))))
    });
    let ejecting = endpoints("[upstreams.u.outlier]\nconsecutive_failures = 1\n");
    let now = ejecting.now();
    ejecting.report(&now[1], EndpointReport::Failure);
    c.bench_function("endpoints: pick, one of three ejected", |bench| {
        bench.iter(|| black_box(ejecting.pick(black_box(Some(0)))))
    });
    c.bench_function("endpoints: report a success", |bench| {
        bench.iter(|| ejecting.report(black_box(&now[2]), EndpointReport::Success))
    });
}

fn hedging(c: &mut Criterion) {
    let now = Instant::now();
    let p95 = HedgeConfig {
        after: HedgeAfter::Percentile(0.95),
        max_extra: 0.05,
    };
    let h = Hedging::new(&p95, None, now);
    let mut rng = fastrand::Rng::with_seed(1);
    for _ in 0..1000 {
        h.observe(Duration::from_micros(rng.u64(10_000..30_000)));
    }
    c.bench_function("hedge: when is it due (p95 estimate)", |bench| {
        bench.iter(|| black_box(h.delay()))
    });
    c.bench_function("hedge: observe an attempt's latency", |bench| {
        bench.iter(|| h.observe(black_box(Duration::from_micros(21_000))))
    });
    c.bench_function("hedge: record a request", |bench| {
        bench.iter(|| h.record_request(black_box(Instant::now())))
    });
    c.bench_function("hedge: ask the max_extra budget", |bench| {
        bench.iter(|| black_box(h.try_hedge(Instant::now())))
    });
}

criterion_group!(
    benches,
    budget,
    adaptive_budget,
    throttle,
    app_retries,
    backoff,
    deadlines,
    routing,
    endpoint_choice,
    hedging
);
criterion_main!(benches);
