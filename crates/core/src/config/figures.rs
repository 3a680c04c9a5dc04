//! What an upstream's settings cost: the amplification its budget allows, and the
//! patience of its attempts (how long a caller can wait on it) set against deadlines.

use std::time::Duration;

use super::UpstreamConfig;

/// The steady-state amplification a budget allows: `min(max_attempts, 1 + ratio)`, with
/// `max_ratio` in place of `ratio` when the share adapts (the most it allows).
/// `None` without a budget. The `min_per_sec` floor allows more at low traffic.
pub fn budget_cap(up: &UpstreamConfig) -> Option<f64> {
    up.budget
        .as_ref()
        .map(|b| f64::from(up.retry.max_attempts).min(1.0 + b.top_ratio()))
}

/// The model's total patience for `attempts` attempts instead of `max_attempts`;
/// `None` without an attempt timeout.
pub fn patience_with(up: &UpstreamConfig, attempts: u32) -> Option<Duration> {
    let mut fewer = up.clone();
    fewer.retry.max_attempts = attempts;
    fewer.total_patience()
}

/// How many attempts, with their backoffs, start within `limit` (every attempt but
/// the last waiting its whole attempt timeout first).
pub fn attempts_that_fit(up: &UpstreamConfig, limit: Duration) -> u32 {
    (1..=up.retry.max_attempts)
        .take_while(|n| patience_with(up, *n).is_some_and(|p| p <= limit))
        .last()
        .unwrap_or(0)
}

/// What the attempts cost a caller's deadline: total patience, but never longer than
/// `request_timeout`, since the deadline cancels whatever is still running then.
/// `None`: no bound of this upstream's own (no attempt timeout and no request
/// timeout): the caller's deadline, if any, is the only one.
pub fn effective_patience(up: &UpstreamConfig) -> Option<Duration> {
    match (up.total_patience(), up.request_timeout) {
        (Some(p), Some(r)) => Some(p.min(r)),
        (p, r) => p.or(r),
    }
}

/// The backoff share of [`UpstreamConfig::total_patience`]: every backoff at its cap.
pub fn total_backoff(up: &UpstreamConfig) -> Duration {
    (0..up.retry.max_attempts.saturating_sub(1))
        .map(|n| up.retry.backoff.cap(n))
        .sum()
}

/// A whole number without a fraction, or scientific notation when it is huge.
pub fn plain(x: f64) -> String {
    if x < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.3e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{BASE, parse};

    #[test]
    fn budget_cap_is_the_lower_of_attempts_and_one_plus_ratio() {
        let config = parse(BASE);
        assert_eq!(budget_cap(&config.upstreams[0]), Some(1.1));
        let loose = parse(&BASE.replacen("ratio = 0.1", "ratio = 5", 1));
        assert_eq!(budget_cap(&loose.upstreams[0]), Some(3.0));
        let adaptive = parse(&BASE.replacen("ratio = 0.1", "ratio = 0.1\nmax_ratio = 0.4", 1));
        assert_eq!(
            budget_cap(&adaptive.upstreams[0]),
            Some(1.4),
            "the most it allows"
        );
        let none = parse(&BASE.replacen("[upstreams.api.budget]\nratio = 0.1", "", 1));
        assert_eq!(budget_cap(&none.upstreams[0]), None);
    }

    #[test]
    fn the_deadline_caps_an_inner_layers_patience() {
        let inner = parse(&BASE.replacen(
            r#"attempt_timeout = "600ms""#,
            r#"attempt_timeout = "1s""#,
            1,
        ));
        assert_eq!(
            effective_patience(&inner.upstreams[0]),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn without_timeouts_an_upstream_has_no_patience_of_its_own() {
        let none = parse(
            &BASE.replacen("request_timeout = \"2s\"\n", "", 1).replacen(
                "attempt_timeout = \"600ms\"\n",
                "",
                1,
            ),
        );
        let up = &none.upstreams[0];
        assert_eq!((up.request_timeout, up.attempt_timeout), (None, None));
        assert_eq!(effective_patience(up), None);
        assert_eq!(attempts_that_fit(up, Duration::from_secs(60)), 0);
    }
}
