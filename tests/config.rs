//! The config file: the shipped example is valid, and mistakes are reported together,
//! each at FILE:LINE:COLUMN with its key and the fix.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use tollgate::config::{self, Protocol};

#[test]
fn the_shipped_example_loads() {
    let cfg = config::load(Path::new("config/tollgate.toml")).unwrap();
    let up = cfg.upstream("payments").unwrap();
    assert_eq!(up.retry.max_attempts, 3);
    assert_eq!(up.protocol, Protocol::Auto);
    assert_eq!(up.budget.as_ref().unwrap().ratio, 0.1);
    assert_eq!(cfg.listener.max_header_bytes, 32 * 1024);
}

#[test]
fn three_mistakes_are_all_reported_with_their_lines() {
    let text = r#"[listener]
addr = "127.0.0.1:15001"
drain_timeout = 20

[upstreams.payments]
authorities = ["payments"]
endpoints = ["payments:8080"]

[upstreams.payments.retry]
max_atempts = 3
backoff_base = "25ms"

[upstreams.payments.budget]
ratio = -0.5
"#;
    let errors = config::parse("svc.toml", text, Path::new(".")).unwrap_err();
    let lines: Vec<String> = errors.0.iter().map(|d| d.to_string()).collect();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(
        lines[0].starts_with("svc.toml:3:17: listener.drain_timeout: "),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("\"20ms\" or \"20s\""),
        "the fix is offered: {}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("svc.toml:10:1: upstreams.payments.retry.max_atempts: unknown key"),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains("did you mean `max_attempts`?"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with("svc.toml:14:9: upstreams.payments.budget.ratio: "),
        "{}",
        lines[2]
    );
}

#[test]
fn syntax_errors_and_semantic_errors_come_together() {
    let text = "[listener]\naddr = \"127.0.0.1:1\n[upstreams.a]\nendpoints = [\"x\"]\n";
    let errors = config::parse("bad.toml", text, Path::new(".")).unwrap_err();
    let all = errors.to_string();
    assert!(all.contains("bad.toml:2:"), "{all}");
}

#[test]
fn clashing_authorities_and_ports_are_errors() {
    let text = r#"[listener]
addr = "127.0.0.1:15001"
[upstreams.a]
authorities = ["shared"]
endpoints = ["127.0.0.1:1"]
listen = "127.0.0.1:15001"
[upstreams.b]
authorities = ["shared"]
endpoints = ["127.0.0.1:2"]
"#;
    let errors = config::parse("c.toml", text, Path::new("."))
        .unwrap_err()
        .to_string();
    assert!(
        errors.contains(
            "c.toml:6:10: upstreams.a.listen: 127.0.0.1:15001 is already used by listener.addr"
        ),
        "{errors}"
    );
    assert!(
        errors.contains(
            "c.toml:8:16: upstreams.b.authorities: `shared` is already claimed by upstream `a`"
        ),
        "{errors}"
    );
}

#[test]
fn every_key_of_the_spec_is_accepted() {
    let text = r#"[runtime]
worker_threads = 2
[listener]
addr = "127.0.0.1:15001"
drain_timeout = "20s"
header_read_timeout = "5s"
max_header_bytes = "32KiB"
[admin]
addr = "127.0.0.1:15090"
[deadline]
header = "x-timeout-ms"
accept = ["x-timeout-ms", "grpc-timeout", "x-envoy-expected-rq-timeout-ms"]
[upstreams.payments]
authorities = ["payments", "payments.default.svc.cluster.local"]
listen = "127.0.0.1:7001"
endpoints = ["10.0.0.5:8080", "payments-1:8080"]
host = "api.payments.example"
protocol = "http1"
connect_timeout = "200ms"
request_timeout = "2s"
attempt_timeout = "600ms"
max_inflight = 1000
[upstreams.payments.retry]
max_attempts = 3
on = ["connect-failure", "reset", "timeout", "502", "503", "504", "unavailable"]
methods = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]
idempotency_header = "idempotency-key"
backoff_base = "25ms"
backoff_max = "1s"
retry_after = "honor"
max_retry_after = "5s"
max_body = "64KiB"
[upstreams.payments.budget]
ratio = 0.1
min_per_sec = 10
window = "10s"
"#;
    let cfg = config::parse("spec.toml", text, Path::new(".")).unwrap();
    let up = cfg.upstream("payments").unwrap();
    assert_eq!(up.endpoints.len(), 2);
    assert_eq!(up.retry.on.names().len(), 7);
    assert_eq!(cfg.runtime.worker_threads, Some(2));
}

#[test]
fn tls_files_that_cannot_be_read_are_config_errors() {
    let text = r#"[upstreams.p]
authorities = ["p"]
endpoints = ["127.0.0.1:443"]
[upstreams.p.tls]
server_name = "api.example"
ca_file = "/nonexistent/ca.pem"
"#;
    let errors = config::parse("t.toml", text, Path::new("."))
        .unwrap_err()
        .to_string();
    assert!(
        errors.contains("t.toml:6:11: upstreams.p.tls.ca_file: cannot read /nonexistent/ca.pem"),
        "{errors}"
    );
}
