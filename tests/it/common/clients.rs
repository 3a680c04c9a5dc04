//! The real client programs some tests run, installed from their registries into the
//! tests' own directory once and reused: Node's undici from the npm registry, Python's
//! grpcio and requests from the Python package index. A client that cannot be installed (no `npm`,
//! no network) skips the test that needs it, loudly; under `CI` it fails the test.
//! Each test uses the clients it needs.

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

/// A directory with grpcio in it (`pip install --target`, so no venv and no system
/// install), for `PYTHONPATH`; or `None` when it could not be installed.
pub fn grpcio() -> Option<PathBuf> {
    pip_target("grpcio", "grpc")
}

/// A directory with requests (and its urllib3) in it, as [`grpcio`]; or `None` when
/// it could not be installed.
pub fn requests() -> Option<PathBuf> {
    pip_target("requests", "requests")
}

/// `package`, installed with `pip install --target` into a directory of the tests'
/// own, once: the directory, where `import module` finds it (not a copy installed
/// elsewhere), or `None` when it could not be installed.
fn pip_target(package: &str, module: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(package);
    let found_there = || {
        let probe = format!(
            "import sys, {module}; sys.exit(0 if {module}.__file__.startswith(sys.argv[1]) else 1)"
        );
        Command::new("python3")
            .args(["-c", &probe])
            .arg(&dir)
            .env("PYTHONPATH", &dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if found_there() {
        return Some(dir);
    }
    let installed = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--upgrade", "--target"])
        .arg(&dir)
        .arg(package)
        // The tests run as root in CI: pip's warning about that is noise in their log.
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .status();
    match installed {
        Ok(s) if s.success() && found_there() => Some(dir),
        other => {
            missing(
                &format!("{package} (pip install {package})"),
                &format!("{other:?}"),
            );
            None
        }
    }
}
