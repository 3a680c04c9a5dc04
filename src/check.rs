//! `tollgate check`: validate, report amplification and patience, lint.

use std::path::PathBuf;

/// Arguments of `tollgate check`.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// Config file [default: $TOLLGATE_CONFIG, then config/tollgate.toml].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Config files of a call chain, top layer first (the way a request travels).
    #[arg(long, value_delimiter = ',')]
    pub chain: Option<Vec<PathBuf>>,
    /// Exit 3 when the config is valid but has warnings.
    #[arg(long)]
    pub strict: bool,
}

/// Runs `tollgate check`; returns the exit code.
pub fn main(args: CheckArgs) -> i32 {
    let _ = args;
    eprintln!("check: not built yet");
    1
}
