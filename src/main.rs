//! The `tollgate` command: parse the command line, set up logging, hand over to the
//! library, exit with its code. `run` is served by `tollgate-proxy` when it is installed
//! beside this binary (see [`tollgate_core::run`]), else here.

use clap::{Parser, Subcommand};
use tollgate_core::run::{LogArgs, RunArgs};

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A sidecar proxy that owns every retry between a service and its upstreams"
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
    /// Validate a config (or a chain of them); print amplification and patience; lint.
    Check(tollgate_check::CheckArgs),
    /// The amplification calculator: worst case, expected, budget-capped, sensitivity.
    Calc(tollgate_calc::CalcArgs),
    /// The lab: real HTTP chains on loopback; naive vs owned retries, the inbound side,
    /// and whether a service is worse off through tollgate (`--scenario harm`).
    Lab(tollgate_lab::LabArgs),
    /// The tick simulation of a capacity dip under five retry policies.
    Sim(tollgate_lab::SimArgs),
    /// Transparent capture: install (or print, or remove) a pod's NAT rules.
    Iptables(tollgate_capture::IptablesArgs),
    /// Add the tollgate sidecar to Kubernetes manifests (or take it out: --uninject).
    Inject(tollgate_inject::InjectArgs),
}

/// mimalloc: a request's few allocations and frees, on one thread, at about half what
/// glibc's cost (Cargo.toml says why, docs/benchmarks.md "The allocator" what it measured).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse();
    // Before any thread or log: the process becomes `tollgate-proxy`, or stays this.
    let not_handed_over = match cli.command {
        Command::Run(_) => tollgate_core::run::hand_over(),
        _ => None,
    };
    cli.log.init();
    if let Some(kept) = not_handed_over {
        tracing::warn!("{kept}");
    }
    let code = match cli.command {
        Command::Run(args) => {
            tollgate_core::run::run(tollgate_core::config::resolve_path(args.config))
        }
        Command::Check(args) => tollgate_check::main(args),
        Command::Calc(args) => tollgate_calc::main(args),
        Command::Lab(args) => tollgate_lab::lab_main(args),
        Command::Sim(args) => tollgate_lab::sim_main(args),
        Command::Iptables(args) => tollgate_capture::main(args),
        Command::Inject(args) => tollgate_inject::main(args),
    };
    std::process::exit(code);
}
