//! The tables `tollgate calc` prints for people: the summary, the load layer by
//! layer, and the sensitivity to the failure rate with where it turns dangerous.

use std::fmt::Write as _;

use super::budget_worst_case;
use super::report::{DANGER_THRESHOLD, Report};

impl Report {
    /// The text output: summary, per-layer breakdown, sensitivity table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.intro(&mut out);
        self.summary(&mut out);
        self.per_layer(&mut out);
        self.sensitivity_table(&mut out);
        out
    }

    /// What was asked: the layers, the traffic, the failure rate, the budget.
    fn intro(&self, out: &mut String) {
        let s = &self.scenario;
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
        let budget = match (s.budget, s.max_ratio) {
            (Some(b), Some(m)) => format!(
                "retry budget {} per layer, adapting up to {} (max_ratio)",
                percent(b),
                percent(m)
            ),
            (Some(b), None) => format!("retry budget {} per layer", percent(b)),
            (None, _) => "no retry budget (add --budget 0.1 to see what one caps)".to_string(),
        };
        let _ = writeln!(
            out,
            "{} requests/s at the top, {} of attempts failing at the bottom, {budget}",
            rate(s.rps),
            percent(s.failure_rate),
        );
        let _ = writeln!(out);
    }

    /// The four headline figures, as amplification and as requests per second.
    fn summary(&self, out: &mut String) {
        let s = &self.scenario;
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
        if s.max_ratio.is_some() {
            summary.push(("worst case at max_ratio".into(), self.max_ratio_worst_case));
            summary.push(("expected at max_ratio".into(), self.max_ratio_expected));
        }
        for (label, value) in summary {
            if let Some(v) = value {
                let _ = writeln!(out, "  {label:<36}{:>14}{:>20}", times(v), rate(s.rps * v));
            }
        }
        let _ = writeln!(out);
    }

    /// Each layer at the failure rate given, worked bottom up.
    fn per_layer(&self, out: &mut String) {
        let s = &self.scenario;
        let n = s.retries.len();
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
    }

    /// The expected load at every failure rate, and where it turns dangerous.
    fn sensitivity_table(&self, out: &mut String) {
        let s = &self.scenario;
        let n = s.retries.len();
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
        let max_column = if s.max_ratio.is_some() {
            "at max_ratio"
        } else {
            ""
        };
        // The budget's columns only when there is a budget: without one the marks
        // follow the last column, not a blank one.
        let optional = |cell: &str, shown: bool| {
            if shown {
                format!("{cell:>14}")
            } else {
                String::new()
            }
        };
        let (with_budget, with_max) = (s.budget.is_some(), s.max_ratio.is_some());
        let header = format!(
            "  {:>12}{:>11}{:>20}{}{}",
            "failure rate",
            "expected",
            "RPS at the bottom",
            optional(budget_column, with_budget),
            optional(max_column, with_max)
        );
        let _ = writeln!(out, "{}", header.trim_end());
        for row in &self.sensitivity {
            let budget = row
                .budget_expected
                .map_or_else(String::new, |b| format!("{b:.2}×"));
            let top = row
                .max_ratio_expected
                .map_or_else(String::new, |b| format!("{b:.2}×"));
            let mut marks = Vec::new();
            if row.expected > DANGER_THRESHOLD {
                marks.push("dangerous");
            }
            if (row.failure_rate - s.failure_rate).abs() < 1e-12 {
                marks.push("<- --failure-rate");
            }
            let line = format!(
                "  {:>12}{:>11}{:>20}{}{}   {}",
                percent(row.failure_rate),
                format!("{:.2}×", row.expected),
                rate(s.rps * row.expected),
                optional(&budget, with_budget),
                optional(&top, with_max),
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
        if let Some(m) = s.max_ratio {
            let _ = writeln!(
                out,
                "  An adaptive share reaches its max_ratio of {} only while retries succeed and the upstream shows no overload:
                   even then no failure rate takes it past {}; while retries keep failing it falls below the budget.",
                percent(m),
                times(budget_worst_case(&s.retries, m))
            );
        }
        if n > 1 && s.retries.iter().filter(|r| **r > 0).count() > 1 {
            let _ = writeln!(
                out,
                "  Overload makes failures correlated, so real incidents sit near the worst case: retry at one layer only."
            );
        }
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
}
