//! Do no harm: `tollgate lab --scenario harm --short`, the rows CI runs, each the same
//! calls at the same time straight to an upstream and through tollgate at its
//! defaults, at least a thousand a side, judged by a one-sided z-test at 99 %. The
//! promise is that no row is WORSE: an app that sends each call once gets through
//! tollgate at least what it gets calling the upstream directly.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;
use tollgate::lab::harm::rows::SHORT;

fn lab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("lab")
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

/// Each row in a line: its verdict and every column's success, and why a column is
/// WORSE.
fn summary(v: &Value) -> String {
    let mut out = String::new();
    for row in v["rows"].as_array().into_iter().flatten() {
        out.push_str(&format!("{} {}:", row["key"], row["verdict"]));
        for c in row["columns"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                " {} {:.1}%",
                c["key"].as_str().unwrap_or("?"),
                c["success_rate"].as_f64().unwrap_or(0.0) * 100.0
            ));
            if c["verdict"]["verdict"] == "WORSE" {
                out.push_str(&format!(" ({})", c["verdict"]["why"]));
            }
        }
        out.push('\n');
    }
    out
}

#[test]
fn tollgate_does_no_harm_in_the_short_harm_run() {
    let out = lab(&["--scenario", "harm", "--short", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    println!("{}", summary(&v));
    assert_eq!(v["scenario"], "harm");
    assert_eq!(v["short"], true);
    let rows = v["rows"].as_array().unwrap();
    let keys: Vec<&str> = rows.iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, SHORT);
    for row in rows {
        assert!(
            row["skipped"].is_null(),
            "{}: {}",
            row["key"],
            row["skipped"]
        );
        let columns = row["columns"].as_array().unwrap();
        assert_eq!(columns[0]["key"], "direct");
        for c in columns {
            assert!(
                c["requests"].as_u64().unwrap() >= 1_000,
                "{} {}: too few calls for the test",
                row["key"],
                c["key"]
            );
        }
        for c in &columns[1..] {
            assert!(!c["verdict"].is_null(), "{} {}", row["key"], c["key"]);
        }
    }
    let worse = v["worse"].as_array().unwrap();
    // The exit code says whether a row is WORSE.
    assert_eq!(
        out.status.code(),
        Some(if worse.is_empty() { 0 } else { 1 })
    );
    assert!(
        worse.is_empty(),
        "tollgate did harm in {worse:?}:\n{}",
        summary(&v)
    );
}

#[test]
fn the_lab_names_the_harm_scenario_and_refuses_what_it_does_not_take() {
    let help = lab(&["--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("harm"));
    for args in [
        &["--scenario", "harm", "--rows", "no-such-row"][..],
        &["--scenario", "harm", "--rps", "50"],
        &["--scenario", "storm", "--short"],
    ] {
        let out = lab(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?} says why");
    }
}
