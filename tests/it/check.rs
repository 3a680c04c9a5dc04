//! `tollgate check` as a user runs it, on the fixture files in tests/fixtures/check/:
//! every lint fires on a config that breaks it and stays quiet on the shipped example,
//! every error of a file is listed with its line, a chain that retries at every layer
//! is flagged with its product, and the exit codes are 0, 1 and 3.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

const FIXTURES: &str = "tests/fixtures/check";

struct Run {
    code: i32,
    out: String,
}

impl Run {
    /// Asserts that the output says `text`.
    fn says(&self, text: &str) {
        assert!(self.out.contains(text), "no {text:?} in:\n{}", self.out);
    }
}

fn check(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.is_empty(), "unexpected stderr: {stderr}");
    Run {
        code: out.status.code().unwrap(),
        out: String::from_utf8(out.stdout).unwrap(),
    }
}

fn fixture(name: &str) -> String {
    format!("{FIXTURES}/{name}")
}

fn warnings(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.contains(": warning: ")).collect()
}

/// A copy of the shipped example with one line changed, in a scratch file. The fixture
/// files keep to 127.0.0.1; the addresses these lints are about only ever live here.
struct Scratch(PathBuf);

impl Scratch {
    fn example_with(name: &str, from: &str, to: &str) -> Scratch {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(root.join("config/tollgate.toml")).unwrap();
        assert!(text.contains(from));
        let path =
            std::env::temp_dir().join(format!("tollgate-check-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        Scratch(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn the_shipped_example_is_valid_without_warnings_even_when_strict() {
    for args in [
        &["--config", "config/tollgate.toml"][..],
        &["--config", "config/tollgate.toml", "--strict"],
        &["--strict"],
    ] {
        let run = check(args);
        assert_eq!(run.code, 0, "{args:?}:\n{}", run.out);
        assert!(warnings(&run.out).is_empty(), "{}", run.out);
        run.says("config/tollgate.toml: valid, 1 upstream");
        assert!(
            run.out.ends_with("valid: 1 file, no warnings\n"),
            "{}",
            run.out
        );
    }
}

#[test]
fn the_report_gives_each_upstreams_amplification_and_patience() {
    let run = check(&["--config", "config/tollgate.toml"]);
    let lines: Vec<&str> = run.out.lines().map(str::trim).collect();
    assert!(lines.contains(&"upstream payments"), "{}", run.out);
    assert!(
        lines.contains(
            &"max_attempts  3: worst case 3× the requests it receives, when every attempt fails"
        ),
        "{}",
        run.out
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("budget        1.10× in steady state")),
        "{}",
        run.out
    );
    run.says("min_per_sec = 10 retries/s allows more");
    assert!(
        lines.contains(
            &"patience      each attempt runs to the caller's deadline, or as long as it takes when it sends none (no request_timeout)"
        ),
        "{}",
        run.out
    );
}

/// Each fixture breaks one rule: the one warning it draws, as `FILE:LINE:COLUMN: key`.
const LINTS: [(&str, &str, &str); 9] = [
    ("patience.toml", "10:1", "upstreams.api.retry.max_attempts"),
    (
        "attempt-over-request.toml",
        "7:1",
        "upstreams.api.attempt_timeout",
    ),
    ("post.toml", "11:1", "upstreams.api.retry.methods"),
    ("loose-budget.toml", "14:1", "upstreams.api.budget.ratio"),
    (
        "budget-without-room.toml",
        "13:1",
        "upstreams.api.budget.ratio",
    ),
    (
        "budget-never-binds.toml",
        "13:1",
        "upstreams.api.budget.ratio",
    ),
    ("no-budget.toml", "3:12", "upstreams.api.budget"),
    (
        "no-jitter.toml",
        "11:1",
        "upstreams.api.retry.backoff_jitter",
    ),
    (
        "ownership-ignore.toml",
        "11:1",
        "upstreams.api.retry.ownership",
    ),
];

#[test]
fn each_lint_fires_on_a_config_that_breaks_it() {
    for (file, position, key) in LINTS {
        let path = fixture(file);
        let run = check(&["--config", &path]);
        let found = warnings(&run.out);
        assert_eq!(found.len(), 1, "{file}:\n{}", run.out);
        let expected = format!("{path}:{position}: warning: {key}: ");
        assert!(found[0].starts_with(&expected), "{file}: {}", found[0]);
        // Every warning says how to fix it.
        assert!(found[0].ends_with(')'), "{}", found[0]);
        assert_eq!(run.code, 0, "{file}");
        assert_eq!(check(&["--config", &path, "--strict"]).code, 3, "{file}");
    }
}

#[test]
fn the_lints_say_why_and_what_to_do() {
    let says = |file: &str, words: &[&str]| {
        let run = check(&["--config", &fixture(file)]);
        let warning = warnings(&run.out).concat();
        for w in words {
            assert!(warning.contains(w), "{file}: no {w:?} in {warning}");
        }
    };
    says(
        "patience.toml",
        &[
            "3075ms",
            "longer than request_timeout 2s",
            "lower attempt_timeout to 641ms",
            "raise request_timeout",
        ],
    );
    says(
        "post.toml",
        &["POST and PATCH are not idempotent", "idempotency-key"],
    );
    says("loose-budget.toml", &["ratio 0.8", "lower it to 0.1"]);
    says(
        "budget-without-room.toml",
        &[
            "ratio = 0 and min_per_sec = 0",
            "with max_attempts = 3 retries are configured but can never happen",
            "max_attempts = 1",
        ],
    );
    says(
        "budget-never-binds.toml",
        &[
            "ratio 5 can never bind",
            "at most 2 retries",
            "the effective cap is 3× (max_attempts)",
            "lower it to 0.1",
        ],
    );
    says(
        "no-budget.toml",
        &["no retry budget", "add [upstreams.api.budget]"],
    );
    says("no-jitter.toml", &["synchronised", "\"full\""]);
    says("ownership-ignore.toml", &["multiply", "\"honor\""]);
    says(
        "attempt-over-request.toml",
        &["attempt_timeout 3s is longer than request_timeout 2s"],
    );
}

#[test]
fn an_exposed_listener_is_flagged_and_an_exposed_admin_port_is_not() {
    // The admin port serves /config on loopback only, so a pod may bind it everywhere
    // for its probes and Prometheus.
    let admin = Scratch::example_with("admin", "127.0.0.1:15090", "0.0.0.0:15090");
    let run = check(&["--config", admin.path(), "--strict"]);
    assert_eq!(run.code, 0, "{}", run.out);
    assert!(warnings(&run.out).is_empty(), "{}", run.out);

    let listener = Scratch::example_with("listener", "127.0.0.1:15001", "0.0.0.0:15001");
    let run = check(&["--config", listener.path()]);
    assert_eq!(run.code, 0);
    let found = warnings(&run.out);
    assert_eq!(found.len(), 1, "{}", run.out);
    assert!(
        found[0].contains(": warning: listener.addr: 0.0.0.0:15001"),
        "{}",
        found[0]
    );
    assert!(
        found[0].contains("unknown_authorities = \"refuse\""),
        "other hosts could use it as a forward proxy: {}",
        found[0]
    );
}

#[test]
fn every_mistake_of_a_file_is_listed_with_its_line() {
    let path = fixture("three-mistakes.toml");
    for strict in [false, true] {
        let mut args = vec!["--config", path.as_str()];
        if strict {
            args.push("--strict");
        }
        let run = check(&args);
        assert_eq!(run.code, 1, "{}", run.out);
        let prefix = format!("{path}:");
        let errors: Vec<&str> = run
            .out
            .lines()
            .filter(|l| {
                l.strip_prefix(&prefix)
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            })
            .collect();
        assert_eq!(errors.len(), 3, "{}", run.out);
        assert!(errors[0].starts_with(&format!("{path}:5:14: upstreams.api.endpoints: ")));
        assert!(errors[1].starts_with(&format!("{path}:6:19: upstreams.api.request_timeout: ")));
        assert!(errors[2].starts_with(&format!("{path}:10:1: upstreams.api.retry.max_atempts: ")));
        assert!(errors[2].contains("did you mean `max_attempts`?"));
        run.says("invalid: 3 errors");
    }
}

#[test]
fn a_config_that_serves_nothing_is_invalid_even_empty() {
    for strict in [false, true] {
        let mut args = vec!["--config", "tests/fixtures/check/empty.toml"];
        if strict {
            args.push("--strict");
        }
        let run = check(&args);
        assert_eq!(run.code, 1, "{}", run.out);
        run.says("tests/fixtures/check/empty.toml:1:1: upstreams: no upstream is configured");
        run.says("invalid: 1 error");
    }
}

#[test]
fn a_missing_file_is_an_error() {
    let run = check(&["--config", "tests/fixtures/check/no-such-file.toml"]);
    assert_eq!(run.code, 1);
    run.says("no-such-file.toml:1:1: (file): cannot read");
}

fn chain(files: &[&str]) -> String {
    files
        .iter()
        .map(|f| fixture(f))
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn a_chain_that_retries_at_every_layer_is_flagged_with_its_product() {
    let layers = chain(&["chain-edge.toml", "chain-service.toml", "chain-db.toml"]);
    let run = check(&["--chain", &layers]);
    assert_eq!(run.code, 0, "{}", run.out);
    run.says("chain of 3 layers, top first");
    run.says("worst case at the bottom: 3 × 3 × 3 = 27×");
    let multiply: Vec<&str> = warnings(&run.out)
        .into_iter()
        .filter(|w| w.contains("layers of the chain retry"))
        .collect();
    assert_eq!(multiply.len(), 1, "{}", run.out);
    assert!(multiply[0].starts_with(&format!(
        "{}:10:1: warning: upstreams.service.retry.max_attempts: 3 layers of the chain retry",
        fixture("chain-edge.toml")
    )));
    assert!(multiply[0].contains("27×"));
    assert!(multiply[0].ends_with(
        "(retry at one layer only: set max_attempts = 1 at the others; the ownership header does the rest)"
    ));
    assert_eq!(check(&["--chain", &layers, "--strict"]).code, 3);
}

#[test]
fn a_chain_that_retries_once_with_shrinking_patience_is_clean() {
    let layers = chain(&[
        "layered-gateway.toml",
        "layered-service.toml",
        "layered-db.toml",
    ]);
    let run = check(&["--chain", &layers, "--strict"]);
    assert_eq!(run.code, 0, "{}", run.out);
    run.says("1 × 1 × 3 = 3×");
    assert!(warnings(&run.out).is_empty(), "{}", run.out);
}

#[test]
fn a_warning_is_shown_beside_an_error_not_after_it_is_fixed() {
    let path = fixture("error-and-warning.toml");
    let run = check(&["--config", &path]);
    assert_eq!(run.code, 1, "{}", run.out);
    run.says(&format!("{path}:7:19: upstreams.api.connect_timeout: "));
    run.says(&format!(
        "{path}:13:1: warning: upstreams.api.budget.ratio: ratio 10"
    ));
    run.says("invalid: 1 error, 1 warning in 1 file");
    // A lint about a key in error is not made up from its default.
    let run = check(&["--config", &fixture("three-mistakes.toml")]);
    run.says("invalid: 3 errors, 0 warnings");
}

/// Without `--config`, the file `$TOLLGATE_CONFIG` names is checked, and without that the
/// shipped `config/tollgate.toml`: what `tollgate run` would serve.
#[test]
fn without_a_path_it_checks_what_tollgate_config_names_else_the_default() {
    let named = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("TOLLGATE_CONFIG", fixture("three-mistakes.toml"))
        .output()
        .unwrap();
    let out = String::from_utf8(named.stdout).unwrap();
    assert_ne!(named.status.code(), Some(0), "{out}");
    assert!(out.contains("three-mistakes.toml"), "{out}");
    assert!(out.contains("invalid: 3 errors"), "{out}");
    let default = check(&[]);
    assert_eq!(default.code, 0, "{}", default.out);
    default.says("config/tollgate.toml");
}

#[test]
fn patience_that_grows_with_depth_is_flagged_naming_both_files() {
    let layers = chain(&["stagefront-api.toml", "stagefront-checkout.toml"]);
    let run = check(&["--chain", &layers, "--strict"]);
    assert_eq!(run.code, 3, "{}", run.out);
    let found = warnings(&run.out);
    assert_eq!(found.len(), 1, "{}", run.out);
    let w = found[0];
    assert!(w.starts_with(&format!(
        "{}:7:1: warning: upstreams.payments.attempt_timeout: patience does not shrink with depth",
        fixture("stagefront-checkout.toml")
    )));
    assert!(w.contains("4575ms (3 × 1500ms + 75ms backoff)"), "{w}");
    assert!(
        w.contains(&format!(
            "{} gives up after 2s",
            fixture("stagefront-api.toml")
        )),
        "{w}"
    );
    // Each file on its own is fine: only the chain shows the problem.
    for file in ["stagefront-api.toml", "stagefront-checkout.toml"] {
        assert_eq!(check(&["--config", &fixture(file), "--strict"]).code, 0);
    }
}

#[test]
fn a_chain_layer_can_name_the_upstream_that_calls_the_next_one() {
    let two = fixture("two-upstreams.toml");
    // By default the upstream with the most attempts: api, 3.
    let run = check(&["--chain", &format!("{two},{}", fixture("layered-db.toml"))]);
    run.says("3 × 3 = 9×");
    // cache makes one attempt.
    let run = check(&[
        "--chain",
        &format!("{two}#cache,{}", fixture("layered-db.toml")),
    ]);
    run.says("1 × 3 = 3×");
    let run = check(&["--chain", &format!("{two}#nope")]);
    assert_eq!(run.code, 1, "{}", run.out);
    run.says("upstreams.nope: --chain names upstream `nope`, which this file does not have (name one of: api, cache)");
}

#[test]
fn every_error_of_every_chain_file_is_reported() {
    let layers = chain(&[
        "chain-edge.toml",
        "three-mistakes.toml",
        "three-mistakes.toml",
    ]);
    let run = check(&["--chain", &layers]);
    assert_eq!(run.code, 1, "{}", run.out);
    // The file named twice is checked once.
    assert_eq!(
        run.out.matches(":5:14: upstreams.api.endpoints").count(),
        1,
        "{}",
        run.out
    );
    run.says("chain: not analysed until every file of it is valid");
    run.says("invalid: 3 errors, 0 warnings in 2 files");
}

#[test]
fn config_and_chain_combine() {
    let layers = chain(&[
        "layered-gateway.toml",
        "layered-service.toml",
        "layered-db.toml",
    ]);
    let run = check(&["--config", &fixture("no-budget.toml"), "--chain", &layers]);
    assert_eq!(run.code, 0, "{}", run.out);
    run.says(&format!("{}: valid", fixture("no-budget.toml")));
    run.says("1 × 1 × 3 = 3×");
    assert_eq!(warnings(&run.out).len(), 1, "{}", run.out);
    // Without --config, --chain checks only the chain's files.
    let run = check(&["--chain", &layers]);
    assert!(!run.out.contains("config/tollgate.toml"), "{}", run.out);
}

#[test]
fn an_inbound_side_without_a_fleet_budget_is_valid_and_linted() {
    let r = check(&["--config", &fixture("inbound-unbudgeted.toml")]);
    assert_eq!(
        r.code, 0,
        "valid: a warning exits 0 without --strict\n{}",
        r.out
    );
    r.says("valid, 0 upstreams and the inbound side");
    r.says("retries       no fleet budget: every caller's retries reach the app");
    r.says("max_inflight  200 at once");
    let strict = check(&["--strict", "--config", &fixture("inbound-unbudgeted.toml")]);
    assert_eq!(strict.code, 3);
    let w = warnings(&strict.out);
    assert_eq!(w.len(), 1, "{}", strict.out);
    assert!(
        w[0].starts_with(
            "tests/fixtures/check/inbound-unbudgeted.toml:8:2: warning: inbound: no fleet retry budget"
        ),
        "{}",
        w[0]
    );
    assert!(w[0].contains("[inbound.retries]"), "{}", w[0]);
}

#[test]
fn an_adaptive_budget_and_a_throttle_are_shown_with_what_they_allow() {
    let run = check(&["--config", &fixture("adaptive.toml")]);
    assert_eq!(run.code, 0, "{}", run.out);
    run.says("budget        1.10× to 1.30× in steady state: adapting between 1 + ratio 0.1 and 1 + max_ratio 0.3");
    run.says("while retries keep failing the share falls below ratio");
    run.says("throttle      first attempts rejected locally once fewer than 50% of requests are accepted over 5s (k = 2)");
    assert!(warnings(&run.out).is_empty(), "{}", run.out);
}

#[test]
fn a_max_ratio_below_ratio_is_an_error_at_its_line() {
    let text = std::fs::read_to_string(fixture("adaptive.toml"))
        .unwrap()
        .replace("max_ratio = 0.3", "max_ratio = 0.05");
    let path = std::env::temp_dir().join(format!(
        "tollgate-check-{}-max-ratio.toml",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap();
    let run = check(&["--config", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(run.code, 1, "{}", run.out);
    run.says(":14:13: upstreams.api.budget.max_ratio: max_ratio 0.05 is below ratio 0.1");
    run.says("(make max_ratio greater than ratio");
}

#[test]
fn minted_keys_and_dedupe_are_shown_with_what_they_do() {
    let run = check(&["--config", &fixture("exactly-once.toml")]);
    assert_eq!(run.code, 0, "{}", run.out);
    run.says("keys          idempotency-key minted for POST requests without one; after a failure that may have run, sent again only to an endpoint whose answers say x-tollgate-dedupe: on; header=idempotency-key (scope=replica: only back to that endpoint)");
    run.says("dedupe        keyed POST, PATCH run once, answers kept 24h in redis://127.0.0.1:6379/2; while the store fails: closed");
}
