//! Per-upstream series cost what is used: an upstream's series appear with its first
//! request (every fixed-word label value of its counters at zero, its final status codes
//! as seen, its histograms with their buckets), disappear when a reload removes it, and
//! an upstream never called has none; the process's own series, and the state of its
//! config and listeners, are there without any traffic.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::config::{self, Config};
use common::tempdir::TempDir;
use common::*;

/// The series lines (without their values) whose labels name `upstream`.
fn series_of(text: &str, upstream: &str) -> Vec<String> {
    let label = format!("upstream=\"{upstream}\"");
    text.lines()
        .filter(|l| !l.starts_with('#') && l.contains(&label))
        .map(|l| l.rsplit_once(' ').map_or(l, |(s, _)| s).to_string())
        .collect()
}

/// Every series an upstream retrying on `on` with a budget has after one `200`, with
/// the value it must have (`None`: present, any value).
fn after_one_ok(upstream: &str, on: &[&str]) -> Vec<(String, Option<f64>)> {
    let mut want = Vec::new();
    let mut at = |series: String, value: Option<f64>| want.push((series, value));
    let u = format!("upstream=\"{upstream}\"");
    at(
        format!("tollgate_requests_total{{code=\"200\",outcome=\"ok\",{u}}}"),
        Some(1.0),
    );
    for (result, n) in [
        ("1xx", 0.0),
        ("2xx", 1.0),
        ("3xx", 0.0),
        ("4xx", 0.0),
        ("5xx", 0.0),
        ("connect-failure", 0.0),
        ("tls", 0.0),
        ("reset", 0.0),
        ("timeout", 0.0),
        ("cancelled", 0.0),
    ] {
        at(
            format!("tollgate_attempts_total{{result=\"{result}\",{u}}}"),
            Some(n),
        );
    }
    for reason in on {
        at(
            format!("tollgate_retries_total{{reason=\"{reason}\",{u}}}"),
            Some(0.0),
        );
    }
    for reason in [
        "budget",
        "deadline",
        "attempts",
        "retry-after",
        "method",
        "body-too-large",
        "ownership",
        "upstream-rejected",
    ] {
        at(
            format!("tollgate_retries_denied_total{{reason=\"{reason}\",{u}}}"),
            Some(0.0),
        );
    }
    for result in ["won", "lost", "denied"] {
        at(
            format!("tollgate_hedges_total{{result=\"{result}\",{u}}}"),
            Some(0.0),
        );
    }
    for evidence in ["marker", "key", "trace"] {
        at(
            format!("tollgate_app_retries_total{{evidence=\"{evidence}\",{u}}}"),
            Some(0.0),
        );
    }
    at(format!("tollgate_ejections_total{{{u}}}"), Some(0.0));
    at(format!("tollgate_endpoints_ejected{{{u}}}"), Some(0.0));
    at(format!("tollgate_inflight_requests{{{u}}}"), Some(0.0));
    at(format!("tollgate_amplification{{{u}}}"), Some(1.0));
    at(format!("tollgate_upstream_connections{{{u}}}"), None);
    at(format!("tollgate_retry_budget_available{{{u}}}"), None);
    at(format!("tollgate_retry_budget_ratio{{{u}}}"), Some(0.1));
    at(format!("tollgate_throttle_probability{{{u}}}"), Some(0.0));
    at(
        format!("tollgate_attempts_per_request_count{{{u}}}"),
        Some(1.0),
    );
    at(
        format!("tollgate_attempts_per_request_bucket{{{u},le=\"10\"}}"),
        Some(1.0),
    );
    for h in [
        "tollgate_request_duration_seconds",
        "tollgate_attempt_duration_seconds",
    ] {
        at(format!("{h}_count{{{u}}}"), Some(1.0));
        at(format!("{h}_bucket{{{u},le=\"0.0005\"}}"), None);
        at(format!("{h}_bucket{{{u},le=\"30\"}}"), Some(1.0));
        at(format!("{h}_bucket{{{u},le=\"+Inf\"}}"), Some(1.0));
    }
    want
}

/// The scrape once the request's duration is observed (at the end of its response
/// body, which can come a moment after the client read it); at most 10 s.
async fn settled(tg: &Tollgate, upstream: &str) -> String {
    let series = format!("tollgate_request_duration_seconds_count{{upstream=\"{upstream}\"}}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = tg.metrics().await;
        if metric(&m, &series) == Some(1.0) {
            return m;
        }
        assert!(tokio::time::Instant::now() < deadline, "{series}:\n{m}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_series(text: &str, want: &[(String, Option<f64>)]) {
    for (series, value) in want {
        let got = metric(text, series);
        match value {
            Some(v) => assert_eq!(got, Some(*v), "{series}:\n{text}"),
            None => assert!(got.is_some(), "{series} missing:\n{text}"),
        }
    }
}

const ON: [&str; 3] = ["connect-failure", "reset", "503"];

fn two_upstreams(up: std::net::SocketAddr) -> Config {
    let with = |u: config::Upstream, name: &str| {
        u.authorities([name])
            .endpoint(up)
            .retry(|r| r.max_attempts(2).on(ON))
            .budget(|b| b.ratio(0.1))
    };
    Config::new()
        .listener(|l| l.unknown_authorities("refuse"))
        .upstream("used", |u| with(u, "used"))
        .upstream("idle", |u| with(u, "idle"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_upstream_has_no_series_and_one_request_makes_all_of_them() {
    let up = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let tg = Tollgate::start(&two_upstreams(up.addr).to_toml()).await;

    let m = tg.metrics().await;
    for name in ["used", "idle", "passthrough"] {
        assert_eq!(series_of(&m, name), Vec::<String>::new(), "{name}:\n{m}");
    }
    assert!(
        !m.contains("# TYPE tollgate_attempts_total "),
        "a family without a series is not written:\n{m}"
    );

    assert_eq!(get(tg.addr, "/", "used").await.status, 200);
    let m = settled(&tg, "used").await;
    let want = after_one_ok("used", &ON);
    assert_series(&m, &want);
    let mut got = series_of(&m, "used");
    got.retain(|s| !s.contains("_bucket{"));
    let mut expected: Vec<&str> = want
        .iter()
        .map(|(s, _)| s.as_str())
        .filter(|s| !s.contains("_bucket{"))
        .collect();
    // The sums of the histograms are series too.
    let sums: Vec<String> = [
        "tollgate_attempts_per_request",
        "tollgate_request_duration_seconds",
        "tollgate_attempt_duration_seconds",
    ]
    .iter()
    .map(|h| format!("{h}_sum{{upstream=\"used\"}}"))
    .collect();
    expected.extend(sums.iter().map(String::as_str));
    got.sort();
    expected.sort();
    assert_eq!(got, expected, "exactly these, no other code:\n{m}");
    assert_eq!(series_of(&m, "idle"), Vec::<String>::new(), "{m}");

    // A code is written once it is seen.
    let teapot = Upstream::start(|_req| async { respond(418, "no") }).await;
    let tg2 = Tollgate::start(
        &Config::new()
            .upstream("t", |u| u.authorities(["t"]).endpoint(teapot.addr))
            .to_toml(),
    )
    .await;
    assert_eq!(get(tg2.addr, "/", "t").await.status, 418);
    let m = tg2.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"418\",outcome=\"ok\",upstream=\"t\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert!(!m.contains("code=\"200\",outcome=\"ok\""), "{m}");
    assert_eq!(
        metric(&m, "tollgate_attempts_total{result=\"4xx\",upstream=\"t\"}"),
        Some(1.0)
    );
    tg2.stop().await;
    drop(teapot);
    tg.stop().await;
    drop(up);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_and_state_series_are_there_without_traffic() {
    let up = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let port = free_port();
    let tg = Tollgate::start(
        &two_upstreams(up.addr)
            .upstream("own", |u| {
                u.authorities(["own"])
                    .endpoint(up.addr)
                    .listen(format!("127.0.0.1:{port}"))
            })
            .to_toml(),
    )
    .await;
    let m = tg.metrics().await;
    for (series, value) in [
        (
            format!(
                "tollgate_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            ),
            Some(1.0),
        ),
        ("tollgate_config_last_reload_successful".into(), Some(1.0)),
        (
            "tollgate_config_last_reload_success_timestamp_seconds".into(),
            None,
        ),
        (
            "tollgate_config_reloads_total{result=\"ok\"}".into(),
            Some(0.0),
        ),
        (
            "tollgate_config_reloads_total{result=\"error\"}".into(),
            Some(0.0),
        ),
        (
            "tollgate_config_reloads_total{result=\"partial\"}".into(),
            Some(0.0),
        ),
        ("tollgate_listener_up{upstream=\"own\"}".into(), Some(1.0)),
        (
            "tollgate_descriptors_exhausted_total{at=\"accept\"}".into(),
            Some(0.0),
        ),
        (
            "tollgate_descriptors_exhausted_total{at=\"connect\"}".into(),
            Some(0.0),
        ),
        (
            "tollgate_trace_spans_dropped_total{reason=\"queue-full\"}".into(),
            Some(0.0),
        ),
        (
            "tollgate_passthrough_connections_total{direction=\"outbound\"}".into(),
            Some(0.0),
        ),
        (
            "tollgate_requests_total{code=\"404\",outcome=\"no-route\",upstream=\"\"}".into(),
            Some(0.0),
        ),
        ("process_start_time_seconds".into(), None),
    ] {
        match value {
            Some(v) => assert_eq!(metric(&m, &series), Some(v), "{series}:\n{m}"),
            None => assert!(metric(&m, &series).is_some(), "{series}:\n{m}"),
        }
    }
    assert_eq!(
        series_of(&m, "own"),
        ["tollgate_listener_up{upstream=\"own\"}"],
        "only its listener's state:\n{m}"
    );
    tg.stop().await;
    drop(up);
}

/// A config file with upstreams `a` and (`with_b`) `b`, each retrying on `on`.
fn file(up: std::net::SocketAddr, with_b: bool, on: &[&str]) -> String {
    let on = on
        .iter()
        .map(|w| format!("\"{w}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let upstream = |name: &str| {
        format!(
            "[upstreams.{name}]\nauthorities = [\"{name}\"]\nendpoints = [\"{up}\"]\n\
             [upstreams.{name}.retry]\nmax_attempts = 2\non = [{on}]\n"
        )
    };
    let mut text = format!(
        "[listener]\naddr = \"127.0.0.1:0\"\nunknown_authorities = \"refuse\"\n\
         [admin]\naddr = \"127.0.0.1:0\"\n{}",
        upstream("a")
    );
    if with_b {
        text.push_str(&upstream("b"));
    }
    text
}

/// Writes `content` and waits (at most 10 s) for the reload that reads it.
async fn reload(tg: &Tollgate, path: &std::path::Path, content: &str, nth: f64) {
    std::fs::write(path, content).unwrap();
    tg.wait_reloads("ok", nth).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_an_upstream_removes_its_series() {
    let up = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let dir = TempDir::new("series-reload");
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, file(up.addr, true, &["503"])).unwrap();
    let tg = Tollgate::start_file(&path).await;
    for name in ["a", "b"] {
        assert_eq!(get(tg.addr, "/", name).await.status, 200, "{name}");
    }
    let m = tg.metrics().await;
    assert!(!series_of(&m, "b").is_empty(), "{m}");

    // b goes; a stays, with another retry condition: its counts carry on.
    reload(&tg, &path, &file(up.addr, false, &["503", "reset"]), 1.0).await;
    let m = tg.metrics().await;
    assert_eq!(series_of(&m, "b"), Vec::<String>::new(), "{m}");
    let a_ok = "tollgate_requests_total{code=\"200\",outcome=\"ok\",upstream=\"a\"}";
    assert_eq!(metric(&m, a_ok), Some(1.0), "{m}");
    assert_eq!(
        metric(
            &m,
            "tollgate_retries_total{reason=\"reset\",upstream=\"a\"}"
        ),
        Some(0.0),
        "the new condition is written at once for a used upstream:\n{m}"
    );
    assert_eq!(get(tg.addr, "/", "a").await.status, 200);
    assert_eq!(metric(&tg.metrics().await, a_ok), Some(2.0));

    // b comes back: it starts afresh, with no series until its first request.
    reload(&tg, &path, &file(up.addr, true, &["503"]), 2.0).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(tg.addr, "/", "b").await.status != 200 {
        assert!(tokio::time::Instant::now() < deadline, "b not routed again");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"200\",outcome=\"ok\",upstream=\"b\"}"
        ),
        Some(1.0),
        "counted from zero again:\n{m}"
    );
    tg.stop().await;
    drop(up);
}
