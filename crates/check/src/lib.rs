//! `tollgate check`: validate config files, show what each upstream can cost the
//! dependency behind it, and warn about settings that are valid but will hurt someone
//! during an outage.
//!
//! Errors come from [`config::load`]: every problem of every file, each at
//! `FILE:LINE:COLUMN` with its fix. The lints here are warnings in the same shape. A
//! file that draws one works as written; the warning says what it costs when the
//! upstream fails, and what to write instead.
//!
//! A single file cannot show the worst mistake of all, which is a chain of services
//! that each retry. With `--chain` every file is one layer of a call chain, listed top
//! first, and its upstream is the call to the next layer. The attempts of the layers
//! multiply, and a layer's patience has to shrink with depth: an inner layer that
//! keeps working after the outer layer stopped waiting for its attempt holds
//! connections for an answer nobody reads, while the outer layer retries on top.
//!
//! The parts: [`lint`] the warnings of one file, [`chain`] the analysis of a call
//! chain, [`figures`](tollgate_core::config::figures) what an upstream's settings cost (amplification, patience),
//! [`render`] the text `check` prints. This file reads the files and decides the exit
//! code.

mod chain;
mod render;

use std::path::{Path, PathBuf};

pub use chain::{ChainLayer, ChainReport, check_chain};
pub use tollgate_core::config::figures::budget_cap;
pub use tollgate_core::config::lint::{LOOSE_BUDGET_RATIO, lint};
use tollgate_core::config::{self, Config, Diagnostic};

/// Exit codes of `tollgate check`.
pub const EXIT_VALID: i32 = 0;
pub const EXIT_INVALID: i32 = 1;
pub const EXIT_WARNINGS: i32 = 3;

/// Arguments of `tollgate check`.
#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    /// Config file [default: $TOLLGATE_CONFIG, then config/tollgate.toml; with --chain:
    /// none, only the chain's files are checked].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Config files of a call chain, top layer first (the way a request travels). Each
    /// file is a layer; FILE#UPSTREAM picks the upstream that calls the next layer
    /// (default: the one with the most attempts).
    #[arg(long, value_delimiter = ',', value_name = "FILE[#UPSTREAM],...")]
    pub chain: Option<Vec<PathBuf>>,
    /// Exit 3 when the config is valid but has warnings.
    #[arg(long)]
    pub strict: bool,
}

/// Runs `tollgate check`; returns the exit code.
pub fn main(args: CheckArgs) -> i32 {
    let config = match (&args.config, &args.chain) {
        (None, Some(_)) => None,
        (flag, _) => Some(config::resolve_path(flag.clone())),
    };
    let report = Report::run(config.as_deref(), args.chain.as_deref().unwrap_or(&[]));
    tollgate_core::print::stdout(&report.render(args.strict));
    report.exit_code(args.strict)
}

/// One config file as checked.
#[derive(Debug)]
pub struct CheckedFile {
    /// As named in diagnostics.
    pub name: String,
    /// The config, or every error in the file.
    pub config: Result<Config, Vec<Diagnostic>>,
    /// The lints of the file alone; for an invalid file, those about keys without an
    /// error (a mistake elsewhere must not hide `ratio = 10`).
    pub warnings: Vec<Diagnostic>,
}

impl CheckedFile {
    pub fn load(path: &Path) -> Self {
        let name = path.display().to_string();
        match config::load(path) {
            Ok(config) => CheckedFile {
                name,
                warnings: lint(&config),
                config: Ok(config),
            },
            Err(errors) => CheckedFile {
                warnings: lints_beside(path, &name, &errors.0),
                name,
                config: Err(errors.0),
            },
        }
    }
}

/// The lints of an invalid file that concern no key in error: read leniently (a value in
/// error stands at its default, so a lint about it, or about a section holding it,
/// would be about a value the user did not write).
fn lints_beside(path: &Path, name: &str, errors: &[Diagnostic]) -> Vec<Diagnostic> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let Some(config) = config::parse_lenient(name, &text, base) else {
        return Vec::new();
    };
    let related = |a: &str, b: &str| {
        a == b || a.starts_with(&format!("{b}.")) || b.starts_with(&format!("{a}."))
    };
    lint(&config)
        .into_iter()
        .filter(|w| !errors.iter().any(|e| related(&w.key, &e.key)))
        .collect()
}

/// Everything `check` found: each file once, then the chain.
#[derive(Debug)]
pub struct Report {
    pub files: Vec<CheckedFile>,
    /// `None` without `--chain`.
    pub chain: Option<ChainCheck>,
}

/// The chain as checked: not analysed while any of its files is invalid.
#[derive(Debug)]
pub enum ChainCheck {
    Analysed(ChainReport),
    Skipped,
}

impl Report {
    /// Checks `config` (if any) and every file of `chain`, each file once however often
    /// it is named, then the chain itself.
    pub fn run(config: Option<&Path>, chain: &[PathBuf]) -> Report {
        let mut files: Vec<CheckedFile> = Vec::new();
        let mut paths: Vec<PathBuf> = Vec::new();
        let mut index_of = |path: &Path, files: &mut Vec<CheckedFile>| -> usize {
            if let Some(i) = paths.iter().position(|p| p == path) {
                return i;
            }
            paths.push(path.to_path_buf());
            files.push(CheckedFile::load(path));
            files.len() - 1
        };
        if let Some(path) = config {
            index_of(path, &mut files);
        }
        let layers: Vec<(usize, Option<String>)> = chain
            .iter()
            .map(|spec| {
                let (path, upstream) = split_layer(spec);
                (index_of(&path, &mut files), upstream)
            })
            .collect();
        let chain = (!layers.is_empty()).then(|| {
            let configs: Option<Vec<(&Config, Option<&str>)>> = layers
                .iter()
                .map(|(i, up)| files[*i].config.as_ref().ok().map(|c| (c, up.as_deref())))
                .collect();
            match configs {
                Some(configs) => ChainCheck::Analysed(check_chain(&configs)),
                None => ChainCheck::Skipped,
            }
        });
        Report { files, chain }
    }

    fn diagnostics(&self) -> impl Iterator<Item = &Diagnostic> {
        let chain = match &self.chain {
            Some(ChainCheck::Analysed(c)) => c.diagnostics.as_slice(),
            _ => &[],
        };
        self.files
            .iter()
            .flat_map(|f| {
                let errors = f.config.as_ref().err().map_or(&[][..], |e| e.as_slice());
                errors.iter().chain(&f.warnings)
            })
            .chain(chain)
    }

    pub fn errors(&self) -> usize {
        self.diagnostics().filter(|d| d.is_error()).count()
    }

    pub fn warnings(&self) -> usize {
        self.diagnostics().filter(|d| !d.is_error()).count()
    }

    /// 1 with any error; 3 with warnings under `--strict`; 0 otherwise.
    pub fn exit_code(&self, strict: bool) -> i32 {
        if self.errors() > 0 {
            EXIT_INVALID
        } else if strict && self.warnings() > 0 {
            EXIT_WARNINGS
        } else {
            EXIT_VALID
        }
    }
}

/// `FILE` or `FILE#UPSTREAM`; a file whose name itself contains `#` is taken whole.
fn split_layer(spec: &Path) -> (PathBuf, Option<String>) {
    if spec.exists() {
        return (spec.to_path_buf(), None);
    }
    let text = spec.to_string_lossy();
    match text.rsplit_once('#') {
        Some((file, name)) if !name.is_empty() && !name.contains(['/', '\\']) => {
            (PathBuf::from(file), Some(name.to_string()))
        }
        _ => (spec.to_path_buf(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_specs_split_at_the_last_hash() {
        assert_eq!(
            split_layer(Path::new("no/such/a.toml#db")),
            (PathBuf::from("no/such/a.toml"), Some("db".to_string()))
        );
        assert_eq!(
            split_layer(Path::new("no/such/a.toml")),
            (PathBuf::from("no/such/a.toml"), None)
        );
    }
}
