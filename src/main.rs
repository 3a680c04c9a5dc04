//! The `tollgate` command: parse the command line, set up logging, hand over to the
//! library, exit with its code.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A sidecar proxy that owns every retry between a service and its upstreams"
)]
struct Cli {
    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, value_enum, global = true, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve: listeners, admin endpoint, hot reload.
    Run {
        /// Config file [default: $TOLLGATE_CONFIG, then config/tollgate.toml].
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Validate a config (or a chain of them); print amplification and patience; lint.
    Check(tollgate::check::CheckArgs),
    /// The amplification calculator: worst case, expected, budget-capped, sensitivity.
    Calc(tollgate::calc::CalcArgs),
    /// The lab: real HTTP chains on loopback; naive vs owned retries, the inbound side,
    /// and whether a service is worse off through tollgate (`--scenario harm`).
    Lab(tollgate::lab::LabArgs),
    /// The tick simulation of a capacity dip under five retry policies.
    Sim(tollgate::lab::SimArgs),
    /// Transparent capture: install (or print, or remove) a pod's NAT rules.
    Iptables(tollgate::capture::IptablesArgs),
    /// Add the tollgate sidecar to Kubernetes manifests (or take it out: --uninject).
    Inject(tollgate::inject::InjectArgs),
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let filter: Targets = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Json => tracing_subscriber::registry()
            .with(fmt.json().with_filter(filter))
            .init(),
        LogFormat::Text => tracing_subscriber::registry()
            .with(fmt.with_filter(filter))
            .init(),
    }
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    if matches!(cli.log_format, LogFormat::Json) {
        tollgate::access_log::logs_are_json();
    }
    let code = match cli.command {
        Command::Run { config } => tollgate::run::run(tollgate::config::resolve_path(config)),
        Command::Check(args) => tollgate::check::main(args),
        Command::Calc(args) => tollgate::calc::main(args),
        Command::Lab(args) => tollgate::lab::lab_main(args),
        Command::Sim(args) => tollgate::lab::sim_main(args),
        Command::Iptables(args) => tollgate::capture::main(args),
        Command::Inject(args) => tollgate::inject::main(args),
    };
    std::process::exit(code);
}
