//! `tollgate calc` as a user runs it: the worked example of the amplification
//! calculator is the acceptance test, in text and in JSON.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

fn calc(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("calc")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const EXAMPLE: [&str; 8] = [
    "--retries",
    "2,3,3",
    "--failure-rate",
    "0.5",
    "--budget",
    "0.1",
    "--rps",
    "1000",
];

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, stdout, stderr) = calc(&all);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

fn number(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {v}"))
}

#[test]
fn the_worked_example_reads_48x_48000_rps_2x_expected_and_1_33x_with_a_budget() {
    let (code, out, err) = calc(&EXAMPLE);
    assert_eq!(code, 0, "{err}");
    let line = |label: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` line in:\n{out}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let worst = line("worst case (every attempt fails)");
    assert!(worst.ends_with(&["48×", "48,000"]), "{worst:?}");
    let expected = line("expected at 50% failures");
    assert!(expected.ends_with(&["2.00×", "2,000"]), "{expected:?}");
    let budget = line("worst case with the budget");
    assert!(budget.ends_with(&["1.33×", "1,331"]), "{budget:?}");
    assert!(line("expected with the budget").contains(&"1.17×"));
}

#[test]
fn the_text_breaks_the_load_down_by_layer() {
    let (_, out, _) = calc(&EXAMPLE);
    let bottom = out
        .lines()
        .find(|l| l.trim_start().starts_with("3 (bottom)"))
        .unwrap();
    // The DB client: 3 retries, 4 attempts, sees 50%, 1.875 calls per call, gives up 6.25%.
    let cells: Vec<&str> = bottom.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "3", "(bottom)", "3", "4", "50%", "1.875", "6.25%", "48,000", "2,000"
        ]
    );
    let middle = out
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .unwrap();
    assert!(
        middle.contains("6.25%") && middle.contains("1.067"),
        "{middle}"
    );
}

#[test]
fn the_sensitivity_table_marks_where_it_turns_dangerous() {
    let (_, out, _) = calc(&EXAMPLE);
    let row = |rate: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(rate))
            .unwrap_or_else(|| panic!("no {rate} row in:\n{out}"))
            .to_string()
    };
    assert!(!row("60%").contains("dangerous"));
    assert!(row("70%").contains("dangerous"));
    assert!(row("100%").contains("48.00×"));
    assert!(row("50%").contains("<- --failure-rate"));
    assert!(
        out.contains("passes 3× at a failure rate of 66.67%"),
        "{out}"
    );
}

#[test]
fn without_a_budget_the_marks_follow_the_last_column() {
    let (_, out, _) = calc(&["--retries", "2,3,3"]);
    let row = |rate: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(rate))
            .unwrap_or_else(|| panic!("no {rate} row in:\n{out}"))
            .to_string()
    };
    assert!(row("50%").ends_with("2,000   <- --failure-rate"), "{out}");
    assert!(row("70%").ends_with("3,333   dangerous"), "{out}");
    let header = out
        .lines()
        .find(|l| l.contains("failure rate") && l.contains("RPS at the bottom"))
        .unwrap();
    assert!(header.ends_with("RPS at the bottom"), "{header}");
}

#[test]
fn the_worked_example_as_json() {
    let v = json(&EXAMPLE);
    assert_eq!(v["worst_case"].as_u64(), Some(48));
    assert_eq!(v["bottom_rps"].as_u64(), Some(48_000));
    assert!((number(&v, "expected") - 2.0).abs() < 0.01);
    assert!((number(&v, "budget_worst_case") - 1.331).abs() < 1e-9);
    let budget_expected = number(&v, "budget_expected");
    assert!((budget_expected - 1.1733).abs() < 1e-3, "{budget_expected}");
    assert_eq!(v["inputs"]["retries"], serde_json::json!([2, 3, 3]));

    let layers = v["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 3);
    assert!((number(&layers[2], "expected") - 1.875).abs() < 1e-12);
    assert!((number(&layers[2], "gives_up") - 0.0625).abs() < 1e-12);

    let rows = v["sensitivity"].as_array().unwrap();
    assert!(rows.len() >= 11);
    for row in rows {
        for key in ["failure_rate", "expected", "budget_expected"] {
            assert!(row[key].is_number(), "{key} in {row}");
        }
    }
    let first = &rows[0];
    let last = &rows[rows.len() - 1];
    assert_eq!(
        (number(first, "failure_rate"), number(first, "expected")),
        (0.0, 1.0)
    );
    assert_eq!(
        (number(last, "failure_rate"), number(last, "expected")),
        (1.0, 48.0)
    );
    assert!((number(last, "budget_expected") - 1.331).abs() < 1e-9);
    let rates: Vec<f64> = rows.iter().map(|r| number(r, "failure_rate")).collect();
    assert!(rates.windows(2).all(|w| w[0] < w[1]), "{rates:?}");
}

#[test]
fn without_a_budget_the_budget_figures_are_null() {
    let v = json(&["--retries", "2,3,3"]);
    assert_eq!(v["worst_case"].as_u64(), Some(48));
    assert!(v["budget_worst_case"].is_null());
    assert!(v["budget_expected"].is_null());
    assert!(v["sensitivity"][0]["budget_expected"].is_null());
    let (_, out, _) = calc(&["--retries", "2,3,3"]);
    assert!(!out.contains("with the budget"), "{out}");
}

#[test]
fn certain_failure_and_certain_success_are_exact() {
    let down = json(&["--retries", "2,3,3", "--failure-rate", "1"]);
    assert_eq!(number(&down, "expected"), 48.0);
    let up = json(&["--retries", "2,3,3", "--failure-rate", "0"]);
    assert_eq!(number(&up, "expected"), 1.0);
}

#[test]
fn attempts_as_the_config_counts_them_are_retries_plus_one() {
    let by_attempts = json(&["--attempts", "3,4,4"]);
    assert_eq!(by_attempts, json(&EXAMPLE[..2]));
    assert_eq!(by_attempts["worst_case"].as_u64(), Some(48));
    assert_eq!(
        by_attempts["inputs"]["retries"],
        serde_json::json!([2, 3, 3])
    );
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let cases: [&[&str]; 9] = [
        &["--retries", "2,3", "--failure-rate", "1.5"],
        &["--retries", "2,3", "--failure-rate", "-0.1"],
        &["--retries", "2,3", "--budget", "-1"],
        &["--retries", "2,3", "--rps", "-5"],
        &["--retries", "two"],
        &["--retries", ""],
        &[],
        &["--attempts", "0,2"],
        &["--attempts", "3", "--retries", "2"],
    ];
    for args in cases {
        let (code, out, err) = calc(args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(!err.trim().is_empty(), "{args:?}");
    }
    let (_, _, err) = calc(&["--retries", "2,3", "--failure-rate", "1.5"]);
    assert!(
        err.contains("--failure-rate") && err.contains("1.5"),
        "{err}"
    );
}
