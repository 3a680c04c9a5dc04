//! `[upstreams.NAME.outlier]` and `[upstreams.NAME.hedge]`: when a failing endpoint
//! is taken out, and when a slow attempt gets a hedge beside it. The two values that
//! are neither a number nor a duration are read here: a share written as a percentage
//! (`"50%"`) and a hedge delay that is a percentile (`"p95"`) or a duration.

use std::time::Duration;

use toml::de::DeValue;

use super::schema::Section;
use super::walker::{Table, Walker, kind};
use crate::config::keys::{hedge as hedge_key, outlier as outlier_key};
use crate::config::model::*;
use crate::config::units::parse_duration;

/// `[upstreams.NAME.outlier]`; a key not written takes its default.
pub(super) fn outlier(w: &mut Walker<'_>, upstream: &str, t: &Table) -> OutlierConfig {
    w.check_keys(Section::Outlier, upstream, t);
    let d = OutlierConfig::default();
    let ejection = Duration::from_millis(1)..=MAX_EJECTION;
    OutlierConfig {
        consecutive_failures: w.ranged(
            t,
            outlier_key::consecutive_failures,
            u64::from(d.consecutive_failures),
            1..=1000u64,
        ) as u32,
        base_ejection: w.ranged(t, outlier_key::base_ejection, d.base_ejection, ejection),
        max_ejected: percent(w, t, outlier_key::max_ejected).unwrap_or(d.max_ejected),
    }
}

/// `[upstreams.NAME.hedge]`; a key not written takes its default.
pub(super) fn hedge(w: &mut Walker<'_>, upstream: &str, t: &Table) -> HedgeConfig {
    w.check_keys(Section::Hedge, upstream, t);
    let d = HedgeConfig::default();
    HedgeConfig {
        after: after(w, t).unwrap_or(d.after),
        max_extra: w.ranged(t, hedge_key::max_extra, d.max_extra, 0.0..=1.0),
    }
}

/// A share written as a percentage from 0% to 100%, as a fraction.
fn percent(w: &mut Walker<'_>, t: &Table, key: &str) -> Option<f64> {
    let v = t.get(key)?;
    let (span, full) = (v.span(), t.key(key));
    const FIX: &str = "write a percentage in quotes, e.g. \"50%\"";
    let text = match v.get_ref() {
        DeValue::String(s) => s.trim().to_string(),
        DeValue::Integer(_) | DeValue::Float(_) => {
            w.reject(span, &full, "a bare number is ambiguous here", FIX);
            return None;
        }
        other => {
            let message = format!("expected a percentage, found {}", kind(other));
            w.reject(span, &full, message, FIX);
            return None;
        }
    };
    let number = text.strip_suffix('%').map(str::trim);
    match number.and_then(|n| n.parse::<f64>().ok()) {
        Some(p) if (0.0..=100.0).contains(&p) => Some(p / 100.0),
        Some(_) => {
            let fix = "use a percentage from \"0%\" to \"100%\"";
            w.reject(span, &full, format!("{text} is out of range"), fix);
            None
        }
        None => {
            w.reject(span, &full, format!("`{text}` is not a percentage"), FIX);
            None
        }
    }
}

/// The lowest and highest percentile a hedge may wait for. Below the median a hedge
/// doubles most requests; above p99.9 the estimate follows the upstream too slowly
/// (its downward step is a thousandth of its upward one).
const PERCENTILES: std::ops::RangeInclusive<f64> = 50.0..=99.9;

/// `after`: `"p95"` (a percentile of the recent attempt latency) or a duration.
fn after(w: &mut Walker<'_>, t: &Table) -> Option<HedgeAfter> {
    let (text, span) = w.string(t, hedge_key::after)?;
    let full = t.key(hedge_key::after);
    const FIX: &str = "write a percentile such as \"p95\" or a duration such as \"50ms\"";
    if let Some(p) = text.trim().strip_prefix('p') {
        return match p.parse::<f64>() {
            Ok(p) if PERCENTILES.contains(&p) => Some(HedgeAfter::Percentile(p / 100.0)),
            Ok(_) => {
                let fix = "use a percentile from \"p50\" to \"p99.9\"";
                w.reject(span, &full, format!("`{text}` is out of range"), fix);
                None
            }
            Err(_) => {
                w.reject(span, &full, format!("`{text}` is not a percentile"), FIX);
                None
            }
        };
    }
    match parse_duration(&text) {
        Ok(d) if !d.is_zero() => Some(HedgeAfter::Fixed(d)),
        Ok(_) => {
            let fix = "hedge after a time longer than 0, or remove the hedge section";
            w.reject(span, &full, "a hedge at once doubles every request", fix);
            None
        }
        Err(e) => {
            w.reject(span, &full, format!("invalid hedge delay: {e}"), FIX);
            None
        }
    }
}
