//! What an upstream's `[outlier]` and `[hedge]` sections say: when an endpoint is taken
//! out of the rotation for failing, and when a slow attempt gets a second one beside
//! it. Plain data: the endpoint layer builds its ejection state from the first, the
//! retry layer its hedging from the second.

use std::fmt;
use std::time::Duration;

use crate::config::units::format_duration;

/// An ejection never lasts longer than this, however many came in a row.
pub const MAX_EJECTION: Duration = Duration::from_secs(300);

/// `[upstreams.NAME.outlier]`: passive ejection of endpoints that keep failing.
#[derive(Clone, Debug, PartialEq)]
pub struct OutlierConfig {
    /// Failures of one endpoint in a row that eject it.
    pub consecutive_failures: u32,
    /// The first ejection's length; doubled for each ejection in a row, capped at
    /// [`MAX_EJECTION`].
    pub base_ejection: Duration,
    /// The most of the endpoints that may be out at once, as a share (0.5 for `"50%"`).
    pub max_ejected: f64,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(10),
            max_ejected: 0.5,
        }
    }
}

impl OutlierConfig {
    /// How long the ejection that is number `in_a_row` (0 for the first) lasts.
    pub fn ejection(&self, in_a_row: u32) -> Duration {
        let factor = 1u32.checked_shl(in_a_row.min(31)).unwrap_or(u32::MAX);
        self.base_ejection.saturating_mul(factor).min(MAX_EJECTION)
    }

    /// How many of `endpoints` may be out at once: the share, rounded down, and never
    /// all of them (one endpoint is never ejected).
    pub fn max_out(&self, endpoints: usize) -> usize {
        let share = (self.max_ejected * endpoints as f64 + 1e-9).floor() as usize;
        share.min(endpoints.saturating_sub(1))
    }
}

/// When a hedge is sent: after a percentile of the recent attempt latency, or after a
/// fixed time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HedgeAfter {
    /// The quantile, 0.95 for `"p95"`.
    Percentile(f64),
    Fixed(Duration),
}

impl fmt::Display for HedgeAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HedgeAfter::Percentile(q) => {
                let p = (q * 1000.0).round() / 10.0;
                write!(f, "p{p}")
            }
            HedgeAfter::Fixed(d) => f.write_str(&format_duration(*d)),
        }
    }
}

/// `[upstreams.NAME.hedge]`: a second attempt beside a slow one, within a budget.
#[derive(Clone, Debug, PartialEq)]
pub struct HedgeConfig {
    pub after: HedgeAfter,
    /// Hedges may add at most this share to the requests of the window.
    pub max_extra: f64,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            after: HedgeAfter::Percentile(0.95),
            max_extra: 0.05,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejections_double_up_to_five_minutes() {
        let o = OutlierConfig::default();
        assert_eq!(o.ejection(0), Duration::from_secs(10));
        assert_eq!(o.ejection(1), Duration::from_secs(20));
        assert_eq!(o.ejection(4), Duration::from_secs(160));
        assert_eq!(o.ejection(5), MAX_EJECTION);
        assert_eq!(o.ejection(1000), MAX_EJECTION);
    }

    #[test]
    fn the_share_is_rounded_down_and_never_all() {
        let mut o = OutlierConfig::default();
        assert_eq!(o.max_out(1), 0);
        assert_eq!(o.max_out(2), 1);
        assert_eq!(o.max_out(3), 1);
        assert_eq!(o.max_out(10), 5);
        o.max_ejected = 1.0;
        assert_eq!(o.max_out(1), 0);
        assert_eq!(o.max_out(4), 3);
        o.max_ejected = 0.3;
        assert_eq!(o.max_out(10), 3, "0.3 * 10 is 3, not 2.9999");
    }

    #[test]
    fn after_prints_as_written() {
        assert_eq!(HedgeAfter::Percentile(0.95).to_string(), "p95");
        assert_eq!(HedgeAfter::Percentile(0.999).to_string(), "p99.9");
        assert_eq!(
            HedgeAfter::Fixed(Duration::from_millis(50)).to_string(),
            "50ms"
        );
    }
}
