//! The real client programs some tests run, installed from their registries into the
//! tests' own directory once and reused: Node's undici from the npm registry, Python's
//! grpcio from the Python package index. A client that cannot be installed (no `npm`,
//! no network) skips the test that needs it, loudly; under `CI` it fails the test.
//! Included by the test files that need it (`#[path]`), not by every test binary; each
//! uses the clients it needs.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Skips loudly, or fails under `CI`, when `what` could not be installed.
fn missing(what: &str, why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} could not be installed in CI: {why}"
    );
    eprintln!("SKIPPED: {what} could not be installed ({why}); what needs it did not run");
}

/// The directory where `npm install undici@6` put it (its `node_modules` within), or
/// `None` when it could not.
pub fn undici() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("undici");
    if dir.join("node_modules/undici/package.json").exists() {
        return Some(dir);
    }
    std::fs::create_dir_all(&dir).ok()?;
    let installed = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent", "undici@6"])
        .current_dir(&dir)
        .status();
    match installed {
        Ok(s) if s.success() => Some(dir),
        other => {
            missing("undici (npm install undici@6)", &format!("{other:?}"));
            None
        }
    }
}

/// The `bin` directory of a venv with grpcio (`python3 -m venv`, then `pip install
/// grpcio`), or `None` when it could not be made.
pub fn grpcio() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpcio-venv");
    let bin = venv.join("bin");
    let python = bin.join("python3");
    let has_grpc = |python: &Path| {
        Command::new(python)
            .args(["-c", "import grpc"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if has_grpc(&python) {
        return Some(bin);
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status();
    if !made.as_ref().is_ok_and(|s| s.success()) {
        missing("a python3 venv (python3 -m venv)", &format!("{made:?}"));
        return None;
    }
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "grpcio"])
        .status();
    match installed {
        Ok(s) if s.success() && has_grpc(&python) => Some(bin),
        other => {
            missing("grpcio (pip install grpcio)", &format!("{other:?}"));
            None
        }
    }
}
