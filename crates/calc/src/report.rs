//! What the calculator works out for one scenario, and that as the JSON object of
//! `calc --json`.

use serde_json::{Value, json};

use super::Scenario;
use super::math::*;

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

impl Scenario {
    pub fn report(&self) -> Report {
        let r = &self.retries;
        let sensitivity = sensitivity_rates(self.failure_rate)
            .into_iter()
            .map(|p| SensitivityRow {
                failure_rate: p,
                expected: expected(r, p),
                budget_expected: self.budget.map(|b| budget_expected(r, p, b)),
                max_ratio_expected: self.max_ratio.map(|m| budget_expected(r, p, m)),
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
            max_ratio_worst_case: self.max_ratio.map(|m| budget_worst_case(r, m)),
            max_ratio_expected: self
                .max_ratio
                .map(|m| budget_expected(r, self.failure_rate, m)),
            danger_rate: danger_rate(r, DANGER_THRESHOLD),
            sensitivity,
            scenario: self.clone(),
        }
    }
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
    /// With the share at `max_ratio`; `None` when none was given.
    pub max_ratio_expected: Option<f64>,
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
    /// The budget's figures with an adaptive share at its top (`max_ratio`): the most
    /// it ever allows. `None` without `--max-ratio`.
    pub max_ratio_worst_case: Option<f64>,
    pub max_ratio_expected: Option<f64>,
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
                    "max_ratio_expected": row.max_ratio_expected,
                    "dangerous": row.expected > DANGER_THRESHOLD,
                })
            })
            .collect();
        json!({
            "inputs": {
                "retries": s.retries,
                "failure_rate": s.failure_rate,
                "budget": s.budget,
                "max_ratio": s.max_ratio,
                "rps": s.rps,
            },
            "worst_case": whole_or_float(self.worst_case),
            "bottom_rps": whole_or_float(self.bottom_rps()),
            "expected": self.expected,
            "expected_bottom_rps": rps * self.expected,
            "budget_worst_case": self.budget_worst_case,
            "budget_bottom_rps": self.budget_worst_case.map(|w| rps * w),
            "budget_expected": self.budget_expected,
            "max_ratio_worst_case": self.max_ratio_worst_case,
            "max_ratio_bottom_rps": self.max_ratio_worst_case.map(|w| rps * w),
            "max_ratio_expected": self.max_ratio_expected,
            "danger_threshold": DANGER_THRESHOLD,
            "danger_failure_rate": self.danger_rate,
            "layers": layers,
            "sensitivity": sensitivity,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: [u32; 3] = [2, 3, 3];

    #[test]
    fn the_worked_example_worst_case_is_48_and_48000_rps() {
        assert_eq!(worst_case(&EXAMPLE), 48.0);
        let report = Scenario::try_new(EXAMPLE.to_vec(), 0.5, Some(0.1), 1000.0)
            .unwrap()
            .report();
        assert_eq!(report.bottom_rps(), 48_000.0);
    }

    #[test]
    fn the_sensitivity_table_includes_the_callers_rate_once() {
        assert_eq!(sensitivity_rates(0.5).len(), SENSITIVITY_RATES.len());
        let rates = sensitivity_rates(0.42);
        assert_eq!(rates.len(), SENSITIVITY_RATES.len() + 1);
        assert!(rates.windows(2).all(|w| w[0] < w[1]));
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
        assert!(v["max_ratio_worst_case"].is_null());
        assert_eq!(v["worst_case"], 3);
    }

    #[test]
    fn max_ratio_shows_what_an_adaptive_budget_allows_at_most() {
        let v = Scenario::try_new(EXAMPLE.to_vec(), 0.5, Some(0.1), 1000.0)
            .unwrap()
            .with_max_ratio(Some(0.3))
            .unwrap()
            .report()
            .to_json();
        assert!((v["budget_worst_case"].as_f64().unwrap() - 1.331).abs() < 1e-9);
        // 1.3 × 1.3 × 1.3: the fixed rule with max_ratio in place of the budget.
        let top = v["max_ratio_worst_case"].as_f64().unwrap();
        assert!((top - 2.197).abs() < 1e-9, "{top}");
        assert!((v["max_ratio_bottom_rps"].as_f64().unwrap() - 2197.0).abs() < 1e-6);
        assert_eq!(v["inputs"]["max_ratio"], 0.3);
    }
}
