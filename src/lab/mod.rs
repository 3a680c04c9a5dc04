//! `tollgate lab` and `tollgate sim`: the retry-storm lab and the tick simulator.

/// Arguments of `tollgate lab`.
#[derive(clap::Args, Debug, Clone)]
pub struct LabArgs {
    /// Scenario: storm (default), brownout, dip, down.
    #[arg(long, default_value = "storm")]
    pub scenario: String,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG time series to this file.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

/// Arguments of `tollgate sim`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tollgate lab`; returns the exit code.
pub fn lab_main(args: LabArgs) -> i32 {
    let _ = args;
    eprintln!("lab: not built yet");
    1
}

/// Runs `tollgate sim`; returns the exit code.
pub fn sim_main(args: SimArgs) -> i32 {
    let _ = args;
    eprintln!("sim: not built yet");
    1
}
