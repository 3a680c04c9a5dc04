//! `tollgate calc`: the amplification calculator.

/// Arguments of `tollgate calc`.
#[derive(clap::Args, Debug, Clone)]
pub struct CalcArgs {
    /// Retries per layer, top layer first (e.g. 2,3,3).
    #[arg(long, value_delimiter = ',', required = true)]
    pub retries: Vec<u32>,
    /// Failure rate per attempt at the bottom dependency, 0..=1.
    #[arg(long, default_value_t = 0.5)]
    pub failure_rate: f64,
    /// Retry budget per layer (retries as a share of requests), e.g. 0.1.
    #[arg(long)]
    pub budget: Option<f64>,
    /// Requests per second offered by users at the top.
    #[arg(long, default_value_t = 1000.0)]
    pub rps: f64,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tollgate calc`; returns the exit code.
pub fn main(args: CalcArgs) -> i32 {
    let _ = args;
    eprintln!("calc: not built yet");
    1
}
