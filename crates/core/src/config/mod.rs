//! The config file: raw TOML with spans -> a validated `Config`, or every problem
//! found, each at `FILE:LINE:COLUMN` with its key and the fix.
//!
//! Loading is two steps: [`parse`] turns the text into a `Config` and opens no file;
//! [`read_files`] then reads the certificate files the text names. [`load`] and
//! [`load_text`] do both, and are what `run`, `check` and a reload use. A valid config
//! may still deserve a warning: [`lint`] says which (`check` prints them; `run` and
//! every reload log them), with the figures of [`figures`].
//!
//! This is the lowest layer: it imports nothing from the rest of tollgate.

pub mod cluster;
mod diagnostic;
pub mod diff;
pub mod figures;
mod files;
mod json;
pub mod keys;
pub mod lint;
mod model;
mod parse;
// Compiled always (two items) so that the crates above, `check`'s tests, can use it.
#[doc(hidden)]
pub mod testing;
pub mod units;

pub use diagnostic::{ConfigErrors, Diagnostic, Severity, Source};
pub use files::{MAX_FILE, files_unchanged, read_files};
pub use lint::lint;
pub use model::*;
pub use parse::{
    NOT_A_PROBE_FIELD, normalize_authority, parse, parse_endpoint, parse_lenient, source_hash,
};

use std::path::{Path, PathBuf};

/// Reads and validates a config file and the files it names.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![Diagnostic {
            severity: Severity::Error,
            file: name.clone(),
            line: 1,
            column: 1,
            key: "(file)".into(),
            message: format!("cannot read the config file: {e}"),
            fix: "pass --config PATH or set TOLLGATE_CONFIG to a readable TOML file".into(),
        }])
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    load_text(&name, &text, base)
}

/// Validates config text and reads the files it names; `file` is the name diagnostics
/// give it, `base` the directory relative file paths are found in.
pub fn load_text(file: &str, text: &str, base: &Path) -> Result<Config, ConfigErrors> {
    read_files(parse(file, text, base)?)
}

/// `--config`, else `$TOLLGATE_CONFIG`, else `config/tollgate.toml`.
pub fn resolve_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("TOLLGATE_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
}
