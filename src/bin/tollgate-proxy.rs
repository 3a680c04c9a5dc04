//! `tollgate-proxy`: `tollgate run` alone, the sidecar's server without the tools, so a
//! sidecar maps only the pages of what it runs. `tollgate run` hands over to it when it
//! is installed beside `tollgate` (see [`tollgate_core::run`]); its command line is `run`'s.

use clap::{Parser, Subcommand};
use tollgate_core::run::{LogArgs, RunArgs};

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "tollgate's server alone: `tollgate run` runs it when it is installed beside tollgate"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve: listeners, admin endpoint, hot reload.
    Run(RunArgs),
}

/// mimalloc: a request's few allocations and frees, on one thread, at about half what
/// glibc's cost (Cargo.toml says why, docs/benchmarks.md "The allocator" what it measured).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse();
    // Before any thread or log: back to a `tollgate` of another build, which serves.
    let not_handed_back = tollgate_core::run::taken_over();
    cli.log.init();
    if let Some(error) = not_handed_back {
        tracing::warn!("could not hand back to the tollgate of another build: {error}");
    }
    let Command::Run(args) = cli.command;
    std::process::exit(tollgate_core::run::run(
        tollgate_core::config::resolve_path(args.config),
    ));
}
