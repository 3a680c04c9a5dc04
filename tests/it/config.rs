//! The config file: the shipped example is valid, and mistakes are reported together,
//! each at FILE:LINE:COLUMN with its key and the fix.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use tollgate_core::config::{self, Protocol};

/// Asserts that `line` starts with `prefix`.
fn starts(line: &str, prefix: &str) {
    assert!(
        line.starts_with(prefix),
        "{line:?} does not start with {prefix:?}"
    );
}

/// Asserts that `text` mentions `words`.
fn mentions(text: &str, words: &str) {
    assert!(text.contains(words), "no {words:?} in:\n{text}");
}

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
    starts(&lines[0], "svc.toml:3:17: listener.drain_timeout: ");
    assert!(
        lines[0].contains("\"20ms\" or \"20s\""),
        "the fix is offered: {}",
        lines[0]
    );
    starts(
        &lines[1],
        "svc.toml:10:1: upstreams.payments.retry.max_atempts: unknown key",
    );
    mentions(&lines[1], "did you mean `max_attempts`?");
    starts(
        &lines[2],
        "svc.toml:14:9: upstreams.payments.budget.ratio: ",
    );
}

#[test]
fn a_syntax_error_is_reported_alone() {
    // `endpoints = ["x"]` is wrong too, but a file that is not TOML is not checked
    // further: what toml recovers from it is a guess.
    let text = "[listener]\naddr = \"127.0.0.1:1\n[upstreams.a]\nendpoints = [\"x\"]\n";
    let errors = config::parse("bad.toml", text, Path::new(".")).unwrap_err();
    assert!(!errors.0.is_empty());
    for d in &errors.0 {
        assert_eq!(d.key, "(syntax)", "{d}");
        assert!(d.to_string().starts_with("bad.toml:2:"), "{d}");
    }
}

/// An upstream `p` with its required keys, to append sections to.
const UPSTREAM_P: &str = "[upstreams.p]\nauthorities = [\"p\"]\nendpoints = [\"127.0.0.1:1\"]\n";

/// Every problem of `text`, one line each.
fn problems(text: &str) -> Vec<String> {
    match config::parse("t.toml", text, Path::new(".")) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.0.iter().map(|d| d.to_string()).collect(),
    }
}

#[test]
fn a_missing_bracket_is_one_error_where_it_is_missing() {
    let text = "[upstreams.p\nauthorities = [\"p\"]\nendpoints = [\"127.0.0.1:1\"]\n";
    let found = problems(text);
    assert_eq!(found.len(), 1, "{found:#?}");
    starts(
        &found[0],
        "t.toml:1:13: (syntax): unclosed table, expected `]`",
    );
}

#[test]
fn an_unusable_value_is_one_error_not_two() {
    let up = "[upstreams.p]\nendpoints = [\"127.0.0.1:1\"]\n";
    // A string where a list is wanted: authorities was given, only wrongly.
    let found = problems(&format!("{up}authorities = \"p\"\n"));
    assert_eq!(found.len(), 1, "{found:#?}");
    starts(
        &found[0],
        "t.toml:3:15: upstreams.p.authorities: expected a list of strings",
    );
    // An unreadable backoff_base is not compared with backoff_max as its default.
    let retry = format!("{up}authorities = [\"p\"]\n[upstreams.p.retry]\n");
    let found = problems(&format!(
        "{retry}backoff_base = \"2 s\"\nbackoff_max = \"10ms\"\n"
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    mentions(
        &found[0],
        "upstreams.p.retry.backoff_base: invalid duration",
    );
    let found = problems(&format!(
        "{retry}backoff_base = \"2s\"\nbackoff_max = \"one second\"\n"
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    // A readable pair that is wrong is still reported, at the key that was written.
    let found = problems(&format!("{retry}backoff_max = \"10ms\"\n"));
    assert_eq!(
        found,
        [
            "t.toml:5:15: upstreams.p.retry.backoff_max: backoff_base 25ms is longer than \
          backoff_max 10ms (make backoff_base at most backoff_max)"
        ]
    );
    // A server_name of the wrong type is not also missing.
    let found = problems(&format!(
        "{up}authorities = [\"p\"]\n[upstreams.p.tls]\nserver_name = 5\n"
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    mentions(&found[0], "expected a string");
}

#[test]
fn a_key_in_the_wrong_section_says_where_it_belongs() {
    let text = r#"max_attempts = 2
[listener]
window = "1s"
[upstreams.p]
authorities = ["p"]
endpoints = ["127.0.0.1:1"]
max_attempts = 3
addr = "127.0.0.1:1"
[upstreams.p.retry]
ratio = 0.1
endpoints = ["127.0.0.1:2"]
[upstreams.p.budget]
retry = 1
"#;
    let found = problems(text);
    let expected = [
        "t.toml:1:1: max_attempts: `max_attempts` does not belong at the top level (it belongs in [upstreams.NAME.retry])",
        "t.toml:3:1: listener.window: `window` does not belong in [listener] (it belongs in [upstreams.NAME.budget] or in [upstreams.NAME.throttle] or in [inbound.retries])",
        "t.toml:7:1: upstreams.p.max_attempts: `max_attempts` does not belong in [upstreams.p] (it belongs in [upstreams.p.retry])",
        "t.toml:8:1: upstreams.p.addr: `addr` does not belong in [upstreams.p] (it belongs in [listener] or in [admin] or in [inbound])",
        "t.toml:10:1: upstreams.p.retry.ratio: `ratio` does not belong in [upstreams.p.retry] (it belongs in [upstreams.p.budget] or in [inbound.retries])",
        "t.toml:11:1: upstreams.p.retry.endpoints: `endpoints` does not belong in [upstreams.p.retry] (it belongs in [upstreams.p])",
        "t.toml:13:1: upstreams.p.budget.retry: `retry` does not belong in [upstreams.p.budget] (it belongs in its own section, [upstreams.p.retry])",
    ];
    assert_eq!(found, expected);
}

#[test]
fn a_duplicate_key_is_named() {
    let found = problems(&format!("{UPSTREAM_P}authorities = [\"q\"]\n"));
    assert_eq!(
        found,
        [
            "t.toml:4:1: upstreams.p.authorities: duplicate key `authorities`: it is already set \
          in this section (keep one `authorities = ...` and remove the other)"
        ]
    );
}

#[test]
fn key_less_lines_are_reported_where_the_key_is_missing_and_nothing_else() {
    // Each line whose key was deleted is one error at its place; the two are not also
    // reported as a nameless key set twice, nor is an empty header.
    let text = format!("{UPSTREAM_P}[upstreams.p.retry]\n= 3\n= \"25ms\"\n[ ]\n");
    let found = problems(&text);
    for place in ["t.toml:5:1: (syntax): ", "t.toml:6:1: (syntax): "] {
        assert!(
            found.iter().any(|d| d.starts_with(place)),
            "nothing at {place}: {found:#?}"
        );
    }
    for d in &found {
        starts(d, "t.toml:");
        mentions(d, ": (syntax): ");
        assert!(!d.contains("duplicate"), "{found:#?}");
    }
}

#[test]
fn a_section_over_a_key_of_the_same_name_says_which_to_keep() {
    let found = problems(&format!(
        "{UPSTREAM_P}retry = 3\n[upstreams.p.retry]\nmax_attempts = 3\n"
    ));
    assert_eq!(
        found,
        [
            "t.toml:5:14: upstreams.p.retry: duplicate key `retry`: it is already set as a key, \
             so [upstreams.p.retry] cannot be a section (keep either the key `retry` or the \
             [upstreams.p.retry] section, not both)"
        ]
    );
}

#[test]
fn envoy_retry_words_are_refused_with_the_tollgate_spelling() {
    let on = r#"on = ["5xx", "gateway-error", "retriable-4xx", "refused-stream", "connect-failure", "reset"]"#;
    let text = format!("{UPSTREAM_P}[upstreams.p.retry]\n{on}\n");
    let found = problems(&text);
    let envoy = |word: &str, col: usize, fix: &str| {
        format!(
            "t.toml:5:{col}: upstreams.p.retry.on: `{word}` is Envoy's retry_on word, not a \
             tollgate retry condition ({fix})"
        )
    };
    assert_eq!(
        found,
        [
            envoy(
                "5xx",
                7,
                "list the statuses from 500 to 599 you mean, e.g. \"500\", \"502\", \"503\", \"504\""
            ),
            envoy("gateway-error", 14, "write \"502\", \"503\", \"504\""),
            envoy("retriable-4xx", 31, "write \"409\""),
            envoy("refused-stream", 48, "write \"reset\""),
        ]
    );
    // connect-failure and reset are tollgate's words too.
    let ok = text.replace(
        "\"5xx\", \"gateway-error\", \"retriable-4xx\", \"refused-stream\", ",
        "",
    );
    let cfg = config::parse("t.toml", &ok, Path::new(".")).unwrap();
    assert_eq!(
        cfg.upstreams[0].retry.on.names(),
        ["connect-failure", "reset"]
    );
}

#[test]
fn a_config_without_upstreams_is_refused() {
    for text in [
        "",
        "[listener]\naddr = \"127.0.0.1:15001\"\n",
        "[upstreams]\n",
    ] {
        let found = problems(text);
        assert_eq!(found.len(), 1, "{text:?}: {found:#?}");
        mentions(&found[0], ": upstreams: no upstream is configured");
        mentions(&found[0], "add an [upstreams.NAME] section");
    }
    // An upstream that was written but is invalid has its own errors, and no more.
    let found = problems("[upstreams.p]\nauthorities = [\"p\"]\n");
    assert_eq!(found.len(), 1, "{found:#?}");
    mentions(&found[0], "endpoints: missing");
}

#[test]
fn tls_files_that_cannot_be_read_are_config_errors() {
    // Every one is reported at once, each with the path it resolved to.
    let text = format!(
        "{UPSTREAM_P}[upstreams.p.tls]\nserver_name = \"api.example\"\nca_file = \"ca.pem\"\n\
         client_cert = \"certs/tls.crt\"\nclient_key = \"/nonexistent/tls.key\"\n"
    );
    // Parsing alone reads no file.
    let base = Path::new("/nonexistent/etc");
    assert!(config::parse("t.toml", &text, base).is_ok());
    let errors = config::load_text("t.toml", &text, base).unwrap_err();
    let found: Vec<String> = errors.0.iter().map(|d| d.to_string()).collect();
    assert_eq!(found.len(), 3, "{found:#?}");
    starts(
        &found[0],
        "t.toml:6:11: upstreams.p.tls.ca_file: cannot read /nonexistent/etc/ca.pem",
    );
    starts(
        &found[1],
        "t.toml:7:15: upstreams.p.tls.client_cert: cannot read /nonexistent/etc/certs/tls.crt",
    );
    starts(
        &found[2],
        "t.toml:8:14: upstreams.p.tls.client_key: cannot read /nonexistent/tls.key",
    );
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
    mentions(
        &errors,
        "c.toml:6:10: upstreams.a.listen: 127.0.0.1:15001 is already used by listener.addr",
    );
    // The second claim is reported where it stands, naming where the first one does.
    mentions(
        &errors,
        "c.toml:8:16: upstreams.b.authorities: `shared` is already claimed by upstream `a` at 4:16",
    );
    mentions(&errors, "is already used by listener.addr at 2:1");
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
mint_idempotency_key = ["POST", "PATCH"]
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
fn endpoint_health_and_hedging_are_read_with_their_defaults() {
    let text = format!(
        "{UPSTREAM_P}max_connection_age = \"5m\"\n[upstreams.p.outlier]\n[upstreams.p.hedge]\n"
    );
    let cfg = config::parse("t.toml", &text, Path::new(".")).unwrap();
    let up = cfg.upstream("p").unwrap();
    assert_eq!(
        up.max_connection_age,
        Some(std::time::Duration::from_secs(300))
    );
    let o = up.outlier.as_ref().unwrap();
    assert_eq!(o.consecutive_failures, 5);
    assert_eq!(o.base_ejection, std::time::Duration::from_secs(10));
    assert_eq!(o.max_ejected, 0.5);
    let h = up.hedge.as_ref().unwrap();
    assert_eq!(h.after, config::HedgeAfter::Percentile(0.95));
    assert_eq!(h.max_extra, 0.05);
    let text = format!(
        "{UPSTREAM_P}[upstreams.p.outlier]\nconsecutive_failures = 3\nbase_ejection = \"30s\"\n\
         max_ejected = \"25%\"\n[upstreams.p.hedge]\nafter = \"40ms\"\nmax_extra = 0.1\n"
    );
    let cfg = config::parse("t.toml", &text, Path::new(".")).unwrap();
    let up = cfg.upstream("p").unwrap();
    assert_eq!(up.outlier.as_ref().unwrap().max_ejected, 0.25);
    assert_eq!(
        up.hedge.as_ref().unwrap().after,
        config::HedgeAfter::Fixed(std::time::Duration::from_millis(40))
    );
    assert_eq!(
        cfg.to_json()["upstreams"]["p"]["hedge"]["after"],
        serde_json::json!("40ms")
    );
    assert_eq!(
        cfg.to_json()["upstreams"]["p"]["outlier"]["max_ejected"],
        serde_json::json!("25%")
    );
}

#[test]
fn mistakes_in_endpoint_health_and_hedging_name_their_place_and_fix() {
    let text = format!(
        "{UPSTREAM_P}max_conection_age = \"5m\"\n\
         [upstreams.p.outlier]\nconsecutive_failure = 3\nmax_ejected = 50\nbase_ejection = \"10m\"\n\
         [upstreams.p.hedge]\nafter = \"p101\"\nmax_extra = 2\nmax_ejected = \"10%\"\n"
    );
    let found = problems(&text);
    let expected = [
        "t.toml:4:1: upstreams.p.max_conection_age: unknown key `max_conection_age` (did you mean `max_connection_age`?)",
        "t.toml:6:1: upstreams.p.outlier.consecutive_failure: unknown key `consecutive_failure` (did you mean `consecutive_failures`?)",
        "t.toml:7:15: upstreams.p.outlier.max_ejected: a bare number is ambiguous here (write a percentage in quotes, e.g. \"50%\")",
        "t.toml:8:17: upstreams.p.outlier.base_ejection: 10m is out of range (use a value from 1ms to 5m)",
        "t.toml:10:9: upstreams.p.hedge.after: `p101` is out of range (use a percentile from \"p50\" to \"p99.9\")",
        "t.toml:11:13: upstreams.p.hedge.max_extra: 2 is out of range (use a value from 0 to 1)",
        "t.toml:12:1: upstreams.p.hedge.max_ejected: `max_ejected` does not belong in [upstreams.p.hedge] (it belongs in [upstreams.p.outlier])",
    ];
    assert_eq!(found, expected);
    let found = problems(&format!(
        "{UPSTREAM_P}[upstreams.p.hedge]\nafter = \"soon\"\n[upstreams.p.outlier]\nmax_ejected = \"half\"\n"
    ));
    assert_eq!(found.len(), 2, "{found:#?}");
    mentions(&found[0], "upstreams.p.hedge.after: invalid hedge delay");
    mentions(&found[0], "\"p95\"");
    mentions(&found[1], "`half` is not a percentage");
}

#[test]
fn passthrough_is_a_reserved_upstream_name_and_unknown_authorities_takes_two_words() {
    let found = problems(
        "[listener]\nunknown_authorities = \"drop\"\n\
         [upstreams.passthrough]\nauthorities = [\"p\"]\nendpoints = [\"127.0.0.1:1\"]\n",
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    starts(
        &found[0],
        "t.toml:2:23: listener.unknown_authorities: `drop` is not",
    );
    mentions(&found[0], "\"pass\"");
    mentions(&found[0], "\"refuse\"");
    starts(
        &found[1],
        "t.toml:3:12: upstreams.passthrough: `passthrough` is reserved",
    );
    mentions(&found[1], "give the upstream another name");
}
