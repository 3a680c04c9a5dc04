//! The access log: off by default and silent; on, one line per request with what a
//! user needs to see what happened to it, in text or JSON.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::config::Config;
use common::*;

/// One upstream that answers 200, one that always fails with 503 (retried within a
/// budget that allows no retry at all but the first: strictly below a `min_per_sec` floor
/// of 0.15/s over 10 s, 1.5).
async fn upstreams() -> (Upstream, Upstream) {
    let ok = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let down = Upstream::start(|_req| async { respond(503, "down") }).await;
    (ok, down)
}

/// The two upstreams as `ok` and `down`, the access log as it defaults.
fn sections(ok: &Upstream, down: &Upstream) -> Config {
    Config::new()
        .upstream("ok", |u| u.authorities(["ok"]).endpoint(ok.addr))
        .upstream("down", |u| {
            u.authorities(["down"])
                .endpoint(down.addr)
                .retry(|r| r.max_attempts(3).backoff_base("1ms").backoff_max("2ms"))
                .budget(|b| b.ratio(0.0).min_per_sec(0.15).window("10s"))
        })
}

/// As [`sections`], with the access log on.
fn logged(ok: &Upstream, down: &Upstream) -> Config {
    sections(ok, down).access_log(|a| a.enabled(true))
}

/// The lines of the log that are access lines.
fn access_lines(log: &str, json: bool) -> Vec<String> {
    log.lines()
        .filter(|l| {
            if json {
                l.contains("\"kind\":\"access\"")
            } else {
                l.contains(" access direction=")
            }
        })
        .map(str::to_string)
        .collect()
}

async fn wait_lines(p: &Process, n: usize, json: bool) -> Vec<String> {
    let enough = wait_until(Duration::from_secs(10), || {
        access_lines(&p.log(), json).len() >= n
    })
    .await;
    let lines = access_lines(&p.log(), json);
    assert!(
        enough,
        "{} access lines, not {n}:\n{}",
        lines.len(),
        p.log()
    );
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_a_line_saying_what_happened_to_it() {
    let (ok, down) = upstreams().await;
    let p = Process::start_logged_listening(
        "unknown_authorities = \"refuse\"",
        &logged(&ok, &down).to_toml_for_process(),
    )
    .await;

    assert_eq!(get(p.addr, "/charge?card=4111", "ok").await.status, 200);
    // The first failure is retried (the floor allows one retry), the next ones find
    // the budget spent.
    let first = send(
        p.addr,
        request("GET", "/fail", "down")
            .header("x-timeout-ms", "900")
            .header("idempotency-key", "k1")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(first.status, 503);
    let refused = get(p.addr, "/fail-too", "down").await;
    assert_eq!(refused.outcome(), Some("budget-exhausted"));
    // The first call again (its key), within 2 s of its owned failure: the app's own
    // retry, refused by the spent budget before any attempt.
    let again = send(
        p.addr,
        request("GET", "/fail", "down")
            .header("idempotency-key", "k1")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(again.outcome(), Some("budget-exhausted"));
    assert_eq!(get(p.addr, "/", "nowhere").await.status, 404);

    let lines = wait_lines(&p, 5, false).await;
    let line = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{lines:#?}"))
            .clone()
    };
    let served = line("upstream=ok");
    for part in [
        "method=GET",
        "authority=ok",
        "path=/charge ",
        "status=200",
        "attempts=1",
        "outcome=ok",
        "retries=-",
        "denied=-",
        "deadline_ms=-",
        "duration_ms=",
        "upstream_ms=",
        "app_retry=-",
        "idempotency_key=-",
    ] {
        assert!(served.contains(part), "{part:?} not in {served}");
    }
    assert!(!served.contains("card="), "the query is left out: {served}");
    assert!(
        served.contains(&format!("attempts=1 peer={} ", ok.addr)),
        "the endpoint's address is named: {served}"
    );

    let retried = line("retries=503");
    assert!(retried.contains("path=/fail "), "{retried}");
    assert!(retried.contains("deadline_ms=900"), "{retried}");
    assert!(retried.contains("denied=budget"), "{retried}");
    assert!(retried.contains("status=503"), "{retried}");
    assert!(retried.contains("attempts=2"), "{retried}");
    assert!(
        retried.contains(&format!("attempts=2 peer={0},{0} ", down.addr)),
        "each attempt's endpoint is named: {retried}"
    );
    assert!(retried.contains("idempotency_key=k1"), "{retried}");

    let budget = lines
        .iter()
        .find(|l| l.contains("outcome=budget-exhausted") && l.contains("attempts=1"))
        .unwrap_or_else(|| panic!("no budget-refused line:\n{lines:#?}"));
    assert!(budget.contains("retries=- denied=budget"), "{budget}");
    assert!(budget.contains("path=/fail-too "), "{budget}");
    let app_retry = lines
        .iter()
        .find(|l| l.contains("outcome=budget-exhausted") && l.contains("attempts=0"))
        .unwrap_or_else(|| panic!("no line for the app's own retry:\n{lines:#?}"));
    assert!(app_retry.contains("path=/fail "), "{app_retry}");
    assert!(app_retry.contains("denied=budget"), "{app_retry}");
    assert!(app_retry.contains("app_retry=key"), "{app_retry}");
    assert!(retried.contains("app_retry=-"), "{retried}");

    let unrouted = line("authority=nowhere");
    assert!(unrouted.contains("upstream=- "), "{unrouted}");
    assert!(unrouted.contains("status=404"), "{unrouted}");
    assert!(unrouted.contains("outcome=no-route"), "{unrouted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_carry_the_same_fields() {
    let (ok, down) = upstreams().await;
    let p = Process::start_logged(
        &sections(&ok, &down)
            .access_log(|a| a.enabled(true).format("json").query(true))
            .to_toml_for_process(),
    )
    .await;
    assert_eq!(get(p.addr, "/charge?card=1", "ok").await.status, 200);
    let lines = wait_lines(&p, 1, true).await;
    let v: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(v["upstream"], "ok");
    assert_eq!(v["method"], "GET");
    assert_eq!(v["path"], "/charge?card=1", "query = true keeps it");
    assert_eq!(v["status"], 200);
    assert_eq!(v["attempts"], 1);
    assert_eq!(v["outcome"], "ok");
    assert_eq!(v["retries"], serde_json::json!([]));
    assert_eq!(
        v["peer"],
        serde_json::json!([ok.addr.to_string()]),
        "the endpoint each attempt went to, named `peer` as in the text line"
    );
    assert!(v["denied"].is_null());
    assert!(v["app_retry"].is_null());
    assert!(v["duration_ms"].as_f64().unwrap() >= 0.0);
    assert!(v["timestamp"].as_str().unwrap().ends_with('Z'));
}

/// The inbound side's requests get lines too: who called, whether it was a retry or a
/// probe, and why it was refused when it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbound_side_logs_its_callers_requests() {
    let (ok, down) = upstreams().await;
    let inbound = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let p = Process::start_logged(
        &logged(&ok, &down)
            .inbound(ok.addr, |i| {
                i.addr(inbound).retries(|r| r.ratio(0.0).min_per_sec(0))
            })
            .to_toml_for_process(),
    )
    .await;
    let first = request("GET", "/orders?id=7", "checkout")
        .body(empty())
        .unwrap();
    assert_eq!(send(inbound, first).await.status, 200);
    let retry = request("GET", "/orders", "checkout")
        .header("x-tollgate-attempt", "2")
        .body(empty())
        .unwrap();
    assert_eq!(send(inbound, retry).await.status, 503);
    let probe = request("GET", "/healthz", "checkout")
        .header("user-agent", "kube-probe/1.31")
        .body(empty())
        .unwrap();
    assert_eq!(send(inbound, probe).await.status, 200);
    let lines = wait_lines(&p, 3, false).await;
    let inbound_lines: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("direction=inbound"))
        .collect();
    assert_eq!(inbound_lines.len(), 3, "{lines:?}");
    // A line is written once its answer has gone, which may be after the next request
    // came in: each line is found by its kind, not by its place.
    let line = |kind: &str| -> &str {
        let kind = format!(" request_kind={kind}");
        let found: Vec<&&String> = inbound_lines.iter().filter(|l| l.contains(&kind)).collect();
        assert_eq!(found.len(), 1, "{kind}: {lines:?}");
        found[0]
    };
    let first = line("first");
    assert!(
        first.contains(
            " method=GET authority=checkout path=/orders status=200 attempts=1 outcome=ok"
        ),
        "{first}"
    );
    assert!(
        first.contains(" caller=127.0.0.1 request_kind=first"),
        "{first}"
    );
    let retry = line("retry");
    assert!(
        retry.contains(" status=503 attempts=0 outcome=retry-rejected"),
        "{retry}"
    );
    assert!(retry.contains(" denied=retry-budget"), "{retry}");
    let probe = line("probe");
    assert!(probe.contains(" path=/healthz status=200"), "{probe}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_by_default_nothing_is_logged_per_request() {
    let (ok, down) = upstreams().await;
    let p = Process::start_logged(&sections(&ok, &down).to_toml_for_process()).await;
    for _ in 0..5 {
        assert_eq!(get(p.addr, "/", "ok").await.status, 200);
    }
    // Passed through, as an unknown authority.
    assert_eq!(get(p.addr, "/", &ok.addr.to_string()).await.status, 200);
    // The log's own lines (start, serving) are there; no request line is.
    assert!(p.log().contains("tollgate is serving"), "{}", p.log());
    assert!(access_lines(&p.log(), false).is_empty(), "{}", p.log());
    assert!(access_lines(&p.log(), true).is_empty(), "{}", p.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_no_route_answer_names_the_authority_it_got() {
    let (ok, down) = upstreams().await;
    let tg = Tollgate::start(
        &sections(&ok, &down)
            .listener(|l| l.unknown_authorities("refuse"))
            .to_toml(),
    )
    .await;
    let r = get(tg.addr, "/", "paymnets").await;
    assert_eq!(r.status, 404);
    assert!(
        String::from_utf8_lossy(&r.body).contains("\"paymnets\""),
        "{:?}",
        r.body
    );
    tg.stop().await;
}

/// Lines gather in the writer for a few milliseconds under load: the last requests'
/// lines are still written when tollgate is stopped right after answering them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_lines_are_written_before_a_stop() {
    let (ok, down) = upstreams().await;
    let mut p = Process::start_logged(&logged(&ok, &down).to_toml_for_process()).await;
    for i in 0..20 {
        let path = format!("/last/{i}");
        assert_eq!(get(p.addr, &path, "ok").await.status, 200);
    }
    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(10)).await, Some(0));
    let log = p.log();
    let lines = access_lines(&log, false);
    assert_eq!(lines.len(), 20, "{log}");
    assert!(lines[19].contains("path=/last/19 "), "{log}");
    let stopped = log.find("stopped").unwrap_or_else(|| panic!("{log}"));
    assert!(
        log.find("path=/last/19 ").is_some_and(|at| at < stopped),
        "the last line comes before the exit:\n{log}"
    );
}

/// A traced request's line ends with its trace id, on both sides; one that is not
/// traced has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_requests_line_carries_its_trace_id() {
    let (ok, down) = upstreams().await;
    let inbound = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let collector = dead_port().await;
    let p = Process::start_logged(
        &logged(&ok, &down)
            .inbound(ok.addr, |i| i.addr(inbound))
            .tracing(|t| t.otlp(format!("http://{collector}")))
            .to_toml_for_process(),
    )
    .await;
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traced = |path: &str| {
        request("GET", path, "ok")
            .header("traceparent", format!("00-{TRACE}-00f067aa0ba902b7-01"))
            .body(empty())
            .unwrap()
    };
    assert_eq!(send(p.addr, traced("/traced")).await.status, 200);
    assert_eq!(send(inbound, traced("/in")).await.status, 200);
    assert_eq!(get(p.addr, "/plain", "ok").await.status, 200);
    let lines = wait_lines(&p, 3, false).await;
    let line = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{lines:#?}"))
            .clone()
    };
    let outbound = line("path=/traced ");
    assert!(
        outbound.ends_with(&format!(" trace_id={TRACE}")),
        "{outbound}"
    );
    let inbound = line("path=/in ");
    assert!(
        inbound.ends_with(&format!(" trace_id={TRACE}")),
        "{inbound}"
    );
    let plain = line("path=/plain ");
    assert!(!plain.contains("trace_id"), "{plain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_to_a_name_names_the_address_it_reached() {
    // An endpoint given by name: its first request goes out before the name has been
    // followed into one endpoint per address, and its line still names the address
    // the connection reached, not `-`.
    let up = Upstream::start(|_req| async { respond(200, "ok") }).await;
    let p = Process::start_logged(
        &Config::new()
            .upstream("named", |u| {
                u.authorities(["named"])
                    .endpoint(format!("localhost:{}", up.addr.port()))
            })
            .access_log(|a| a.enabled(true))
            .to_toml_for_process(),
    )
    .await;
    assert_eq!(get(p.addr, "/", "named").await.status, 200);
    let lines = wait_lines(&p, 1, false).await;
    assert!(
        lines[0].contains(&format!("attempts=1 peer=127.0.0.1:{} ", up.addr.port())),
        "{}",
        lines[0]
    );
}
