//! Retry-After and grpc-retry-pushback-ms: waited for when the wait fits max_retry_after
//! and the deadline, otherwise the answer goes back at once with the header untouched.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::config::Config;
use common::*;
use tokio::time::Instant;

fn config_for(addr: std::net::SocketAddr) -> String {
    Config::new()
        .upstream("busy", |u| {
            u.authorities(["busy"])
                .endpoint(addr)
                .request_timeout("4s")
                .attempt_timeout("1s")
                .retry(|r| {
                    r.max_attempts(3)
                        .backoff_base("1ms")
                        .backoff_max("5ms")
                        .max_retry_after("5s")
                })
                .budget(|b| b)
        })
        .to_toml()
}

/// An upstream that answers 503 with `retry_after` once, then 200, recording when each
/// attempt arrived.
async fn once_busy(retry_after: impl Into<String>) -> (Upstream, Arc<Mutex<Vec<Instant>>>) {
    let retry_after: String = retry_after.into();
    let times: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let t = times.clone();
    let up = Upstream::start(move |_req| {
        let t = t.clone();
        let retry_after = retry_after.clone();
        async move {
            let n = {
                let mut t = t.lock().unwrap();
                t.push(Instant::now());
                t.len()
            };
            if n == 1 {
                http::Response::builder()
                    .status(503)
                    .header("retry-after", retry_after.as_str())
                    .body(full("busy"))
                    .unwrap()
            } else {
                respond(200, "ok")
            }
        }
    })
    .await;
    (up, times)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_1_is_waited_for() {
    let (up, times) = once_busy("1").await;
    let tg = Tollgate::start(&config_for(up.addr)).await;
    let r = get(tg.addr, "/", "busy").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.attempts(), 2);
    let t = times.lock().unwrap().clone();
    assert!(
        t[1] - t[0] >= Duration::from_secs(1),
        "retried after {:?}",
        t[1] - t[0]
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_as_an_http_date_is_waited_for() {
    let at = std::time::SystemTime::now() + Duration::from_secs(3);
    let (up, times) = once_busy(httpdate(at)).await;
    let tg = Tollgate::start(&config_for(up.addr)).await;
    let r = get(tg.addr, "/", "busy").await;
    assert_eq!(r.status, 200);
    let t = times.lock().unwrap().clone();
    // The date has one-second resolution: at least two of the three seconds are waited.
    assert!(
        t[1] - t[0] >= Duration::from_millis(1000),
        "retried after {:?}",
        t[1] - t[0]
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_30_is_not_waited_for() {
    let (up, _times) = once_busy("30").await;
    let tg = Tollgate::start(&config_for(up.addr)).await;
    let started = Instant::now();
    let r = get(tg.addr, "/", "busy").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.outcome(), Some("retry-after-too-long"));
    assert_eq!(
        r.header("retry-after"),
        Some("30"),
        "Retry-After passes back untouched"
    );
    assert_eq!(r.attempts(), 1);
    assert_eq!(up.hits(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the long wait was not returned at once"
    );
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_denied_total{reason=\"retry-after\",upstream=\"busy\"}"
        ),
        Some(1.0)
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_longer_than_the_deadline_is_not_waited_for() {
    let (up, _times) = once_busy("3").await;
    let tg = Tollgate::start(&config_for(up.addr)).await;
    let req = request("GET", "/", "busy")
        .header("x-timeout-ms", "1500")
        .body(empty())
        .unwrap();
    let r = send(tg.addr, req).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.outcome(), Some("retry-after-too-long"));
    tg.stop().await;
}

/// IMF-fixdate for a time.
fn httpdate(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil from days (H. Hinnant).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    let wd = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    let mon = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][(mo - 1) as usize];
    format!("{wd}, {d:02} {mon} {y} {h:02}:{m:02}:{s:02} GMT")
}
