//! The tools stop quietly when the reader of their output has gone away, as Unix tools
//! do: `tollgate calc --json | head -c 10` ends without a panic about a broken pipe.
//!
//! The reading end of a real pipe is closed before the tool starts, so its first write
//! meets the broken pipe for certain (a reader that closes after some bytes may lose the
//! race against a tool that has already written everything).

#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};

/// Runs `tollgate ARGS` with stdout into a pipe nobody reads; its exit code and stderr.
fn into_closed_pipe(args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("TOLLGATE_CONFIG")
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

fn assert_quiet(args: &[&str], code: i32) {
    let (status, stderr) = into_closed_pipe(args);
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    assert!(stderr.is_empty(), "{args:?} wrote to stderr:\n{stderr}");
    assert_eq!(status, Some(code), "{args:?}: {stderr}");
}

#[test]
fn calc_stops_quietly_when_the_reader_is_gone() {
    assert_quiet(&["calc", "--retries", "2,3,3", "--json"], 0);
    assert_quiet(&["calc", "--retries", "2,3,3", "--budget", "0.1"], 0);
}

#[test]
fn check_stops_quietly_and_still_exits_with_its_verdict() {
    assert_quiet(&["check", "--config", "config/tollgate.toml"], 0);
    assert_quiet(
        &[
            "check",
            "--config",
            "tests/fixtures/check/three-mistakes.toml",
        ],
        1,
    );
}

#[test]
fn sim_and_lab_stop_quietly_when_the_reader_is_gone() {
    assert_quiet(&["sim"], 0);
    assert_quiet(&["sim", "--json"], 0);
    assert_quiet(
        &["lab", "--scenario", "down", "--duration", "1", "--json"],
        0,
    );
}
