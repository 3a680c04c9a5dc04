//! The formulas of the calculator: a chain of retrying layers, the worst case, the
//! expected load at a failure rate, and what a retry budget caps. See the module doc
//! of [`crate`] for where they come from.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DANGER_THRESHOLD;

    const EXAMPLE: [u32; 3] = [2, 3, 3];

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
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
        let capped = budget_expected(&EXAMPLE, 0.5, 10.0);
        assert_eq!(capped, expected(&EXAMPLE, 0.5));
    }

    #[test]
    fn danger_rate_is_where_expected_crosses_the_threshold() {
        let p = danger_rate(&EXAMPLE, DANGER_THRESHOLD).unwrap();
        assert!(close(expected(&EXAMPLE, p), DANGER_THRESHOLD, 1e-9));
        assert!((0.6..0.7).contains(&p), "{p}");
        assert_eq!(danger_rate(&[2], DANGER_THRESHOLD), None);
        assert_eq!(danger_rate(&[1, 0], DANGER_THRESHOLD), None);
    }
}
