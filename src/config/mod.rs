//! The config file: raw TOML with spans -> a validated `Config`, or every problem
//! found, each at `FILE:LINE:COLUMN` with its key and the fix.

mod diagnostic;
mod json;
mod model;
mod parse;
pub mod units;

pub use diagnostic::{ConfigErrors, Diagnostic, Severity, Source};
pub use model::*;
pub use parse::{load, normalize_authority, parse, parse_endpoint, source_hash};

use std::path::PathBuf;

/// `--config`, else `$TOLLGATE_CONFIG`, else `config/tollgate.toml`.
pub fn resolve_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| std::env::var_os("TOLLGATE_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
}
