//! `tollgate calc`: the amplification calculator.
//!
//! When several layers of a call chain each retry, their attempts multiply: a layer
//! that makes up to `1 + r` attempts per call it receives turns every one of those
//! attempts into a full set of attempts at the layer below. The worst case, every
//! attempt failing, is the product `Π (1 + r_i)`: 2, 3 and 3 retries turn 1,000
//! requests per second at the top into 48,000 at the bottom.
//!
//! With failures that are independent, at a rate `p` per attempt at the bottom, the
//! picture is milder. A layer stops at its first success, so with a failure chance `q`
//! per call it makes `1 + q + … + q^r = (1 − q^(r+1)) / (1 − q)` calls on average
//! (`E`) and gives up with chance `q^(r+1)` (`f`). The bottom layer sees `q = p`; every
//! layer above sees the give-up chance of the one below, which shrinks fast, so the
//! upper retries rarely fire. Multiplying the layers' `E` is Wald's identity, and the
//! product telescopes: `Π E_i = (1 − p^W) / (1 − p)`, `W` the worst case. A chain costs
//! what one layer making `W` attempts would, which stays near `1 / (1 − p)` until `p`
//! nears 1 and then rushes up to `W`.
//!
//! Overload is not independent, though: a saturated dependency fails most calls, and
//! the expected figure climbs towards the worst case exactly when the dependency can
//! least take it. The sensitivity table shows where that happens. A retry budget `b`
//! caps each layer at `1 + b` calls per call whatever the failure rate:
//! `Π min(1 + r_i, 1 + b)` at worst, `≈ Π min(E_i, 1 + b)` expected (approximate,
//! because a budget also changes how often each layer gives up).
//!
//! An adaptive budget (`max_ratio`) moves its share between `b` and `max_ratio` as
//! the upstream shows how well retries go: `--max-ratio` shows the same two figures
//! with the share at its top, the most it can ever allow.
//!
//! The parts: [`math`] the formulas, [`report`] what they give for one scenario (and
//! its JSON), [`text`] the tables printed for people. This file takes the command line.

mod math;
mod report;
mod text;

pub use math::*;
pub use report::*;

/// Arguments of `tollgate calc`.
#[derive(clap::Args, Debug, Clone)]
pub struct CalcArgs {
    /// Retries per layer, top layer first (e.g. 2,3,3): a layer with max_attempts = 3
    /// retries 2 times. Or give --attempts.
    #[arg(long, value_delimiter = ',', required_unless_present = "attempts")]
    pub retries: Vec<u32>,
    /// Attempts per layer, the first try included, as the config's max_attempts counts
    /// them (e.g. 3,4,4 is --retries 2,3,3).
    #[arg(long, value_delimiter = ',', conflicts_with = "retries")]
    pub attempts: Vec<u32>,
    /// Failure rate per attempt at the bottom dependency, 0..=1.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    pub failure_rate: f64,
    /// Retry budget per layer (retries as a share of requests), e.g. 0.1 [default: none;
    /// the budget figures are left out, null in JSON].
    #[arg(long, allow_negative_numbers = true)]
    pub budget: Option<f64>,
    /// The top of an adaptive budget (the config's max_ratio): what the share allows at
    /// most, beside what --budget allows [default: none].
    #[arg(long, allow_negative_numbers = true, requires = "budget")]
    pub max_ratio: Option<f64>,
    /// Requests per second offered by users at the top.
    #[arg(long, default_value_t = 1000.0, allow_negative_numbers = true)]
    pub rps: f64,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tollgate calc`; returns the exit code.
pub fn main(args: CalcArgs) -> i32 {
    let retries = if args.attempts.is_empty() {
        Ok(args.retries)
    } else {
        args.attempts
            .iter()
            .map(|a| a.checked_sub(1).ok_or(InvalidInput::NoAttempt))
            .collect()
    };
    let scenario = retries
        .and_then(|r| Scenario::try_new(r, args.failure_rate, args.budget, args.rps))
        .and_then(|s| s.with_max_ratio(args.max_ratio));
    let scenario = match scenario {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tollgate calc: {e}");
            return 2;
        }
    };
    let report = scenario.report();
    if args.json {
        tollgate_core::print::stdout(&format!("{:#}\n", report.to_json()));
    } else {
        tollgate_core::print::stdout(&report.render());
    }
    0
}

/// Why the calculator's input cannot be used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvalidInput {
    #[error("--retries needs at least one layer, e.g. --retries 2,3,3")]
    NoLayers,
    #[error(
        "--attempts counts the first try too: every layer makes at least 1, e.g. --attempts 3,4,4"
    )]
    NoAttempt,
    #[error("--failure-rate must be from 0 to 1 (0.5 is 50%), got {0}")]
    FailureRate(f64),
    #[error("--budget must be a number of at least 0 (0.1 is 10%), got {0}")]
    Budget(f64),
    #[error("--rps must be a number of at least 0, got {0}")]
    Rps(f64),
    #[error(
        "--max-ratio must be a number at least --budget ({budget}), got {max}: the share adapts upwards from the budget"
    )]
    MaxRatio { max: f64, budget: f64 },
    #[error(
        "the worst case of these {0} layers is too large to compute: use fewer layers or retries"
    )]
    Overflow(usize),
}

/// A validated calculator input: at least one layer, a failure rate in `0..=1`, a
/// budget and a request rate that are finite and not negative.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    retries: Vec<u32>,
    failure_rate: f64,
    budget: Option<f64>,
    rps: f64,
    /// The top of an adaptive budget.
    max_ratio: Option<f64>,
}

impl Scenario {
    pub fn try_new(
        retries: Vec<u32>,
        failure_rate: f64,
        budget: Option<f64>,
        rps: f64,
    ) -> Result<Self, InvalidInput> {
        if retries.is_empty() {
            return Err(InvalidInput::NoLayers);
        }
        if !(0.0..=1.0).contains(&failure_rate) {
            return Err(InvalidInput::FailureRate(failure_rate));
        }
        if let Some(b) = budget.filter(|b| !(b.is_finite() && *b >= 0.0)) {
            return Err(InvalidInput::Budget(b));
        }
        if !(rps.is_finite() && rps >= 0.0) {
            return Err(InvalidInput::Rps(rps));
        }
        if !(worst_case(&retries) * rps).is_finite() {
            return Err(InvalidInput::Overflow(retries.len()));
        }
        Ok(Scenario {
            retries,
            failure_rate,
            budget,
            rps,
            max_ratio: None,
        })
    }

    /// The same scenario with an adaptive budget whose share tops out at `max_ratio`
    /// (none: a fixed budget). It needs a budget and must not be below it.
    pub fn with_max_ratio(self, max_ratio: Option<f64>) -> Result<Self, InvalidInput> {
        let Some(max) = max_ratio else {
            return Ok(self);
        };
        let budget = self.budget.unwrap_or(f64::NAN);
        if !(max.is_finite() && max >= budget) {
            return Err(InvalidInput::MaxRatio { max, budget });
        }
        Ok(Scenario {
            max_ratio: Some(max),
            ..self
        })
    }

    /// The top of an adaptive budget, if one was given.
    pub fn max_ratio(&self) -> Option<f64> {
        self.max_ratio
    }

    /// Retries per layer, top first.
    pub fn retries(&self) -> &[u32] {
        &self.retries
    }

    pub fn failure_rate(&self) -> f64 {
        self.failure_rate
    }

    pub fn budget(&self) -> Option<f64> {
        self.budget
    }

    pub fn rps(&self) -> f64 {
        self.rps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_refused() {
        let ok = |r: Vec<u32>, p, b, rps| Scenario::try_new(r, p, b, rps);
        assert_eq!(ok(vec![], 0.5, None, 1.0), Err(InvalidInput::NoLayers));
        assert!(matches!(
            ok(vec![1], 1.5, None, 1.0),
            Err(InvalidInput::FailureRate(_))
        ));
        assert!(matches!(
            ok(vec![1], -0.1, None, 1.0),
            Err(InvalidInput::FailureRate(_))
        ));
        assert!(matches!(
            ok(vec![1], f64::NAN, None, 1.0),
            Err(InvalidInput::FailureRate(_))
        ));
        assert!(matches!(
            ok(vec![1], 0.5, Some(-0.1), 1.0),
            Err(InvalidInput::Budget(_))
        ));
        assert!(matches!(
            ok(vec![1], 0.5, Some(f64::INFINITY), 1.0),
            Err(InvalidInput::Budget(_))
        ));
        assert!(matches!(
            ok(vec![1], 0.5, None, -1.0),
            Err(InvalidInput::Rps(_))
        ));
        assert!(matches!(
            ok(vec![1], 0.5, None, f64::NAN),
            Err(InvalidInput::Rps(_))
        ));
        assert!(matches!(
            ok(vec![u32::MAX; 40], 0.5, None, 1.0),
            Err(InvalidInput::Overflow(40))
        ));
        assert!(ok(vec![0], 0.0, Some(0.0), 0.0).is_ok());
        let adaptive = |b, m| ok(vec![2], 0.5, b, 1.0).unwrap().with_max_ratio(Some(m));
        assert!(adaptive(Some(0.1), 0.3).is_ok());
        assert!(matches!(
            adaptive(Some(0.1), 0.05),
            Err(InvalidInput::MaxRatio { .. })
        ));
        assert!(matches!(
            adaptive(None, 0.3),
            Err(InvalidInput::MaxRatio { .. })
        ));
        assert!(ok(vec![3], 1.0, None, 0.0).is_ok());
    }
}
