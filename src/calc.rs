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

use std::fmt::Write as _;

use serde_json::{Value, json};

/// Expected amplification above this is called dangerous. It is the checklist line of
/// the amplification calculator ("above about 3×, keep retries at one layer"), and it
/// is what a single layer with tollgate's default `max_attempts = 3` costs when every
/// attempt fails: beyond it, layers are multiplying each other's retries.
pub const DANGER_THRESHOLD: f64 = 3.0;

/// The failure rates of the sensitivity table: coarse where little changes, fine near
/// 1 where the expected load turns into the worst case.
pub const SENSITIVITY_RATES: [f64; 14] = [
    0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0,
];

/// Arguments of `tollgate calc`.
#[derive(clap::Args, Debug, Clone)]
pub struct CalcArgs {
    /// Retries per layer, top layer first (e.g. 2,3,3).
    #[arg(long, value_delimiter = ',', required = true)]
    pub retries: Vec<u32>,
    /// Failure rate per attempt at the bottom dependency, 0..=1.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    pub failure_rate: f64,
    /// Retry budget per layer (retries as a share of requests), e.g. 0.1 [default: none;
    /// the budget figures are left out, null in JSON].
    #[arg(long, allow_negative_numbers = true)]
    pub budget: Option<f64>,
    /// Requests per second offered by users at the top.
    #[arg(long, default_value_t = 1000.0, allow_negative_numbers = true)]
    pub rps: f64,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs `tollgate calc`; returns the exit code.
pub fn main(args: CalcArgs) -> i32 {
    let scenario = match Scenario::try_new(args.retries, args.failure_rate, args.budget, args.rps) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tollgate calc: {e}");
            return 2;
        }
    };
    let report = scenario.report();
    if args.json {
        println!("{:#}", report.to_json());
    } else {
        print!("{}", report.render());
    }
    0
}

/// Why the calculator's input cannot be used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvalidInput {
    #[error("--retries needs at least one layer, e.g. --retries 2,3,3")]
    NoLayers,
    #[error("--failure-rate must be from 0 to 1 (0.5 is 50%), got {0}")]
    FailureRate(f64),
    #[error("--budget must be a number of at least 0 (0.1 is 10%), got {0}")]
    Budget(f64),
    #[error("--rps must be a number of at least 0, got {0}")]
    Rps(f64),
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
        })
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

    pub fn report(&self) -> Report {
        let r = &self.retries;
        let sensitivity = sensitivity_rates(self.failure_rate)
            .into_iter()
            .map(|p| SensitivityRow {
                failure_rate: p,
                expected: expected(r, p),
                budget_expected: self.budget.map(|b| budget_expected(r, p, b)),
            })
            .collect();
        Report {
            layers: layers(r, self.failure_rate),
            worst_case: worst_case(r),
            expected: expected(r, self.failure_rate),
            budget_worst_case: self.budget.map(|b| budget_worst_case(r, b)),
            budget_expected: self
                .budget
                .map(|b| budget_expected(r, self.failure_rate, b)),
            danger_rate: danger_rate(r, DANGER_THRESHOLD),
            sensitivity,
            scenario: self.clone(),
        }
    }
}

/// One layer at a given failure rate at the bottom.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerLoad {
    pub retries: u32,
    /// The chance that a call this layer makes fails: `p` at the bottom, the give-up
    /// chance of the layer below everywhere else.
    pub failure_rate_in: f64,
    /// `E_i`: calls this layer makes, on average, per call it receives.
    pub expected: f64,
    /// `f_i`: the chance this layer gives up and returns a failure to its caller.
    pub gives_up: f64,
}

impl LayerLoad {
    pub fn attempts(&self) -> f64 {
        f64::from(self.retries) + 1.0
    }
}

/// `Π (1 + r_i)`: calls at the bottom per request at the top when every attempt fails.
pub fn worst_case(retries: &[u32]) -> f64 {
    retries.iter().map(|r| f64::from(*r) + 1.0).product()
}

/// Every layer at failure rate `p` at the bottom, listed top first and computed bottom
/// up: `E = (1 − q^(r+1)) / (1 − q)` and `f = q^(r+1)`, `q` the failure chance it sees.
pub fn layers(retries: &[u32], p: f64) -> Vec<LayerLoad> {
    let mut q = p;
    let mut out: Vec<LayerLoad> = retries
        .iter()
        .rev()
        .map(|&r| {
            let attempts = f64::from(r) + 1.0;
            let layer = LayerLoad {
                retries: r,
                failure_rate_in: q,
                expected: calls_per_call(q, attempts),
                gives_up: q.powf(attempts),
            };
            q = layer.gives_up;
            layer
        })
        .collect();
    out.reverse();
    out
}

/// The geometric series `1 + q + … + q^(n−1)`, with its limits where the closed form
/// divides by zero: `n` calls when every call fails, one when none does.
fn calls_per_call(q: f64, attempts: f64) -> f64 {
    if q >= 1.0 {
        attempts
    } else if q <= 0.0 {
        1.0
    } else {
        (1.0 - q.powf(attempts)) / (1.0 - q)
    }
}

/// `Π E_i`: calls at the bottom per request at the top, on average, at failure rate `p`.
pub fn expected(retries: &[u32], p: f64) -> f64 {
    layers(retries, p).iter().map(|l| l.expected).product()
}

/// `Π min(1 + r_i, 1 + b)`: the worst case when every layer has a retry budget `b`.
pub fn budget_worst_case(retries: &[u32], b: f64) -> f64 {
    retries
        .iter()
        .map(|r| (f64::from(*r) + 1.0).min(1.0 + b))
        .product()
}

/// `≈ Π min(E_i, 1 + b)`: the expected load when every layer has a retry budget `b`.
pub fn budget_expected(retries: &[u32], p: f64, b: f64) -> f64 {
    layers(retries, p)
        .iter()
        .map(|l| l.expected.min(1.0 + b))
        .product()
}

/// The failure rate at which the expected amplification reaches `threshold`, or `None`
/// when even the worst case stays at or below it. The expected load rises steadily
/// with `p` (every `E_i` and every `f_i` does), so bisection finds the crossing.
pub fn danger_rate(retries: &[u32], threshold: f64) -> Option<f64> {
    if worst_case(retries) <= threshold {
        return None;
    }
    let (mut low, mut high) = (0.0f64, 1.0f64);
    for _ in 0..60 {
        let mid = (low + high) / 2.0;
        if expected(retries, mid) > threshold {
            high = mid;
        } else {
            low = mid;
        }
    }
    Some(high)
}

/// The table's rates, with the caller's own rate slotted in when it is not one of them.
fn sensitivity_rates(own: f64) -> Vec<f64> {
    let mut rates = SENSITIVITY_RATES.to_vec();
    if !rates.iter().any(|r| (r - own).abs() < 1e-12) {
        rates.push(own);
        rates.sort_by(f64::total_cmp);
    }
    rates
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SensitivityRow {
    pub failure_rate: f64,
    pub expected: f64,
    /// `None` when no budget was given.
    pub budget_expected: Option<f64>,
}

/// Everything the calculator works out for one scenario. Budget figures are `None`
/// (JSON `null`) when no budget was given: an uncapped figure would only repeat the
/// unbudgeted one under a name that suggests a cap.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub scenario: Scenario,
    /// Top first.
    pub layers: Vec<LayerLoad>,
    pub worst_case: f64,
    pub expected: f64,
    pub budget_worst_case: Option<f64>,
    pub budget_expected: Option<f64>,
    /// Where the expected amplification passes [`DANGER_THRESHOLD`].
    pub danger_rate: Option<f64>,
    pub sensitivity: Vec<SensitivityRow>,
}

impl Report {
    /// Attempts per second reaching the bottom dependency in the worst case.
    pub fn bottom_rps(&self) -> f64 {
        self.scenario.rps * self.worst_case
    }

    pub fn to_json(&self) -> Value {
        let s = &self.scenario;
        let rps = s.rps;
        let mut worst_out = rps;
        let mut expected_out = rps;
        let layers: Vec<Value> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                worst_out *= l.attempts();
                expected_out *= l.expected;
                json!({
                    "layer": i + 1,
                    "retries": l.retries,
                    "attempts": u64::from(l.retries) + 1,
                    "failure_rate_in": l.failure_rate_in,
                    "expected": l.expected,
                    "gives_up": l.gives_up,
                    "budget_expected": s.budget.map(|b| l.expected.min(1.0 + b)),
                    "worst_case_rps_out": whole_or_float(worst_out),
                    "expected_rps_out": expected_out,
                })
            })
            .collect();
        let sensitivity: Vec<Value> = self
            .sensitivity
            .iter()
            .map(|row| {
                json!({
                    "failure_rate": row.failure_rate,
                    "expected": row.expected,
                    "budget_expected": row.budget_expected,
                    "dangerous": row.expected > DANGER_THRESHOLD,
                })
            })
            .collect();
        json!({
            "inputs": {
                "retries": s.retries,
                "failure_rate": s.failure_rate,
                "budget": s.budget,
                "rps": s.rps,
            },
            "worst_case": whole_or_float(self.worst_case),
            "bottom_rps": whole_or_float(self.bottom_rps()),
            "expected": self.expected,
            "expected_bottom_rps": rps * self.expected,
            "budget_worst_case": self.budget_worst_case,
            "budget_bottom_rps": self.budget_worst_case.map(|w| rps * w),
            "budget_expected": self.budget_expected,
            "danger_threshold": DANGER_THRESHOLD,
            "danger_failure_rate": self.danger_rate,
            "layers": layers,
            "sensitivity": sensitivity,
        })
    }

    /// The text output: summary, per-layer breakdown, sensitivity table.
    pub fn render(&self) -> String {
        let s = &self.scenario;
        let mut out = String::new();
        let n = s.retries.len();
        let retries: Vec<String> = s.retries.iter().map(u32::to_string).collect();
        let attempts: Vec<String> = s
            .retries
            .iter()
            .map(|r| (u64::from(*r) + 1).to_string())
            .collect();
        let _ = writeln!(
            out,
            "Retry amplification of {n} {} with {} {}: {} attempts per call",
            if n == 1 {
                "layer"
            } else {
                "layers (top first)"
            },
            retries.join(", "),
            if retries.len() == 1 && retries[0] == "1" {
                "retry"
            } else {
                "retries"
            },
            attempts.join(" × "),
        );
        let budget = match s.budget {
            Some(b) => format!("retry budget {} per layer", percent(b)),
            None => "no retry budget (add --budget 0.1 to see what one caps)".to_string(),
        };
        let _ = writeln!(
            out,
            "{} requests/s at the top, {} of attempts failing at the bottom, {budget}",
            rate(s.rps),
            percent(s.failure_rate),
        );
        let _ = writeln!(out);

        let _ = writeln!(
            out,
            "  {:<36}{:>14}{:>20}",
            "", "amplification", "RPS at the bottom"
        );
        let mut summary = vec![
            (
                "worst case (every attempt fails)".to_string(),
                Some(self.worst_case),
            ),
            (
                format!("expected at {} failures", percent(s.failure_rate)),
                Some(self.expected),
            ),
        ];
        if s.budget.is_some() {
            summary.push(("worst case with the budget".into(), self.budget_worst_case));
            summary.push(("expected with the budget".into(), self.budget_expected));
        }
        for (label, value) in summary {
            if let Some(v) = value {
                let _ = writeln!(out, "  {label:<36}{:>14}{:>20}", times(v), rate(s.rps * v));
            }
        }
        let _ = writeln!(out);

        let _ = writeln!(
            out,
            "Per layer at {} failures (worked bottom up: a layer fails as often as the one below gives up)",
            percent(s.failure_rate)
        );
        let _ = writeln!(
            out,
            "  {:<10}{:>8}{:>9}{:>12}{:>11}{:>12}{:>15}{:>15}",
            "layer",
            "retries",
            "attempts",
            "sees fail",
            "E_i",
            "f_i",
            "sends worst",
            "sends expected"
        );
        let (mut worst_out, mut expected_out) = (s.rps, s.rps);
        for (i, l) in self.layers.iter().enumerate() {
            worst_out *= l.attempts();
            expected_out *= l.expected;
            let name = match i {
                0 if n == 1 => "1 (only)".to_string(),
                0 => "1 (top)".to_string(),
                i if i + 1 == n => format!("{} (bottom)", i + 1),
                i => (i + 1).to_string(),
            };
            let _ = writeln!(
                out,
                "  {name:<10}{:>8}{:>9}{:>12}{:>11.3}{:>12}{:>15}{:>15}",
                l.retries,
                u64::from(l.retries) + 1,
                percent(l.failure_rate_in),
                l.expected,
                percent(l.gives_up),
                rate(worst_out),
                rate(expected_out),
            );
        }
        let _ = writeln!(
            out,
            "  sees fail: chance a call it makes fails; E_i: calls it makes per call it receives, on average;\n  \
             f_i: chance it gives up and fails its caller; sends: requests/s it sends down"
        );
        let _ = writeln!(out);

        let _ = writeln!(out, "Sensitivity to the failure rate at the bottom");
        let _ = writeln!(
            out,
            "(dangerous: expected above {}×, more than one layer of {} attempts costs even in a total outage,",
            DANGER_THRESHOLD, DANGER_THRESHOLD
        );
        let _ = writeln!(out, "so the layers are multiplying each other's retries)");
        let budget_column = if s.budget.is_some() {
            "with budget"
        } else {
            ""
        };
        let header = format!(
            "  {:>12}{:>11}{:>20}{:>14}",
            "failure rate", "expected", "RPS at the bottom", budget_column
        );
        let _ = writeln!(out, "{}", header.trim_end());
        for row in &self.sensitivity {
            let budget = row
                .budget_expected
                .map_or_else(String::new, |b| format!("{b:.2}×"));
            let mut marks = Vec::new();
            if row.expected > DANGER_THRESHOLD {
                marks.push("dangerous");
            }
            if (row.failure_rate - s.failure_rate).abs() < 1e-12 {
                marks.push("<- --failure-rate");
            }
            let line = format!(
                "  {:>12}{:>11}{:>20}{:>14}   {}",
                percent(row.failure_rate),
                format!("{:.2}×", row.expected),
                rate(s.rps * row.expected),
                budget,
                marks.join(", "),
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        match self.danger_rate {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "  The expected amplification passes {}× at a failure rate of {}; the worst case is {}.",
                    DANGER_THRESHOLD,
                    percent(p),
                    times(self.worst_case)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  Never dangerous: even the worst case is {}.",
                    times(self.worst_case)
                );
            }
        }
        if let Some(b) = s.budget {
            let _ = writeln!(
                out,
                "  With a {} budget per layer no failure rate takes it past {}.",
                percent(b),
                times(budget_worst_case(&s.retries, b))
            );
        }
        if n > 1 && s.retries.iter().filter(|r| **r > 0).count() > 1 {
            let _ = writeln!(
                out,
                "  Overload makes failures correlated, so real incidents sit near the worst case: retry at one layer only."
            );
        }
        out
    }
}

/// Integers as JSON integers (48, not 48.0) where that is exact.
fn whole_or_float(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

/// `48×` for whole numbers, `2.00×` otherwise.
fn times(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}×")
    } else if x.abs() >= 1e15 {
        format!("{x:.3e}×")
    } else {
        format!("{x:.2}×")
    }
}

/// `50%`, `6.25%`, `<0.01%` for a chance that is there but would print as zero.
fn percent(x: f64) -> String {
    let pct = x * 100.0;
    if pct == 0.0 {
        "0%".into()
    } else if pct < 0.01 {
        "<0.01%".into()
    } else if (pct - pct.round()).abs() < 1e-9 {
        format!("{pct:.0}%")
    } else {
        let text = format!("{pct:.2}");
        format!("{}%", text.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// A request rate with thousands separators: `48,000`; small fractions keep a decimal.
fn rate(x: f64) -> String {
    if x.abs() >= 1e15 {
        return format!("{x:.3e}");
    }
    if x < 100.0 && x.fract() != 0.0 {
        return format!("{x:.1}");
    }
    let digits = format!("{:.0}", x.round());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: [u32; 3] = [2, 3, 3];

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
    }

    #[test]
    fn the_worked_example_worst_case_is_48_and_48000_rps() {
        assert_eq!(worst_case(&EXAMPLE), 48.0);
        let report = Scenario::try_new(EXAMPLE.to_vec(), 0.5, Some(0.1), 1000.0)
            .unwrap()
            .report();
        assert_eq!(report.bottom_rps(), 48_000.0);
    }

    #[test]
    fn the_worked_example_layers_match_the_article() {
        let l = layers(&EXAMPLE, 0.5);
        // DB client: (1 − 0.5⁴) / 0.5 = 1.875 calls, gives up 0.5⁴ = 6.25% of the time.
        assert!(close(l[2].expected, 1.875, 1e-12));
        assert!(close(l[2].gives_up, 0.0625, 1e-12));
        // The service sees 6.25% failures: (1 − 0.0625⁴) / 0.9375 ≈ 1.067.
        assert!(close(l[1].failure_rate_in, 0.0625, 1e-12));
        assert!(close(
            l[1].expected,
            (1.0 - 0.0625f64.powi(4)) / 0.9375,
            1e-12
        ));
        assert!(close(l[1].expected, 1.067, 1e-3));
        // The gateway sees almost no failures.
        assert!(close(l[0].expected, 1.0, 1e-4));
        assert!(close(expected(&EXAMPLE, 0.5), 2.0, 1e-3));
    }

    #[test]
    fn the_worked_example_budget_caps_at_1_331() {
        assert!(close(budget_worst_case(&EXAMPLE, 0.1), 1.331, 1e-12));
        let e = layers(&EXAMPLE, 0.5);
        let by_hand = e[0].expected.min(1.1) * e[1].expected.min(1.1) * 1.1;
        assert!(close(budget_expected(&EXAMPLE, 0.5, 0.1), by_hand, 1e-12));
    }

    #[test]
    fn no_failures_means_no_amplification() {
        let l = layers(&EXAMPLE, 0.0);
        assert!(l.iter().all(|l| l.expected == 1.0 && l.gives_up == 0.0));
        assert_eq!(expected(&EXAMPLE, 0.0), 1.0);
    }

    #[test]
    fn total_failure_is_the_worst_case_without_nan() {
        let l = layers(&EXAMPLE, 1.0);
        assert_eq!(
            l.iter().map(|l| l.expected).collect::<Vec<_>>(),
            vec![3.0, 4.0, 4.0]
        );
        assert!(l.iter().all(|l| l.gives_up == 1.0));
        assert_eq!(expected(&EXAMPLE, 1.0), 48.0);
        assert_eq!(
            budget_expected(&EXAMPLE, 1.0, 0.1),
            budget_worst_case(&EXAMPLE, 0.1)
        );
    }

    #[test]
    fn near_the_limits_the_closed_form_stays_finite_and_ordered() {
        for p in [1e-300, 1e-9, 0.5, 1.0 - 1e-9, 1.0 - f64::EPSILON] {
            let e = expected(&EXAMPLE, p);
            assert!(e.is_finite() && (1.0..=48.0).contains(&e), "p = {p}: {e}");
        }
    }

    #[test]
    fn expected_rises_with_the_failure_rate() {
        let mut last = 0.0;
        for i in 0..=1000 {
            let e = expected(&EXAMPLE, f64::from(i) / 1000.0);
            assert!(e >= last, "falls at p = {}", f64::from(i) / 1000.0);
            last = e;
        }
    }

    #[test]
    fn the_layers_telescope_into_one_layer_of_worst_case_attempts() {
        // E_i = (1 − f_i) / (1 − f_(i+1)), so Π E_i = (1 − p^W) / (1 − p), W the worst case.
        for p in [0.1, 0.5, 0.9, 0.99] {
            let w = worst_case(&EXAMPLE);
            let single = (1.0 - f64::powf(p, w)) / (1.0 - p);
            assert!(close(expected(&EXAMPLE, p), single, 1e-9), "p = {p}");
        }
    }

    #[test]
    fn a_single_layer_is_one_plus_p_plus_p_squared() {
        let p = 0.3;
        assert!(close(expected(&[2], p), 1.0 + p + p * p, 1e-12));
        assert_eq!(expected(&[0], p), 1.0);
    }

    #[test]
    fn a_budget_of_zero_means_no_retries() {
        assert_eq!(budget_worst_case(&EXAMPLE, 0.0), 1.0);
        assert_eq!(budget_expected(&EXAMPLE, 0.7, 0.0), 1.0);
    }

    #[test]
    fn a_generous_budget_caps_nothing() {
        assert_eq!(budget_worst_case(&EXAMPLE, 10.0), 48.0);
        assert_eq!(
            budget_expected(&EXAMPLE, 0.5, 10.0),
            expected(&EXAMPLE, 0.5)
        );
    }

    #[test]
    fn danger_rate_is_where_expected_crosses_the_threshold() {
        let p = danger_rate(&EXAMPLE, DANGER_THRESHOLD).unwrap();
        assert!(close(expected(&EXAMPLE, p), DANGER_THRESHOLD, 1e-9));
        assert!((0.6..0.7).contains(&p), "{p}");
        assert_eq!(danger_rate(&[2], DANGER_THRESHOLD), None);
        assert_eq!(danger_rate(&[1, 0], DANGER_THRESHOLD), None);
    }

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
        assert!(ok(vec![3], 1.0, None, 0.0).is_ok());
    }

    #[test]
    fn the_sensitivity_table_includes_the_callers_rate_once() {
        assert_eq!(sensitivity_rates(0.5).len(), SENSITIVITY_RATES.len());
        let rates = sensitivity_rates(0.42);
        assert_eq!(rates.len(), SENSITIVITY_RATES.len() + 1);
        assert!(rates.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn numbers_print_the_way_people_read_them() {
        assert_eq!(times(48.0), "48×");
        assert_eq!(times(1.331), "1.33×");
        assert_eq!(times(1.99997), "2.00×");
        assert_eq!(rate(48_000.0), "48,000");
        assert_eq!(rate(1_000_000.0), "1,000,000");
        assert_eq!(rate(999.6), "1,000");
        assert_eq!(rate(0.5), "0.5");
        assert_eq!(percent(0.5), "50%");
        assert_eq!(percent(0.0625), "6.25%");
        assert_eq!(percent(0.95), "95%");
        assert_eq!(percent(0.999), "99.9%");
        assert_eq!(percent(1e-9), "<0.01%");
    }

    #[test]
    fn json_without_a_budget_has_null_budget_figures() {
        let v = Scenario::try_new(vec![2], 0.5, None, 10.0)
            .unwrap()
            .report()
            .to_json();
        assert!(v["budget_worst_case"].is_null());
        assert!(v["budget_expected"].is_null());
        assert!(v["sensitivity"][0]["budget_expected"].is_null());
        assert_eq!(v["worst_case"], 3);
    }
}
