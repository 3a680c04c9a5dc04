//! What the upstream says about when to come back: `Retry-After` (delta-seconds or an
//! HTTP-date) and gRPC's `grpc-retry-pushback-ms`.
//!
//! A recovering server is the only party that knows when it is ready; honouring its
//! schedule lets it control its own inbound rate instead of meeting everybody's
//! identical constant at once.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The upstream's answer to "when may I retry?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushback {
    /// Not before this long from now.
    After(Duration),
    /// Not at all (a negative or unparseable `grpc-retry-pushback-ms`).
    Never,
}

/// `Retry-After`: delta-seconds or HTTP-date (IMF-fixdate, RFC 850 or asctime).
/// `None` when the value is neither: an unreadable hint is ignored, not obeyed.
/// A date in the past means "now".
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Delta-seconds beyond any sane wait saturate rather than fail.
        let secs = text.parse::<u64>().unwrap_or(u64::MAX).min(u64::MAX / 2);
        return Some(Duration::from_secs(secs));
    }
    let at = parse_http_date(text)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `grpc-retry-pushback-ms`: a non-negative integer of milliseconds; anything else
/// means the server does not want the call retried.
pub fn parse_pushback_ms(value: &[u8]) -> Pushback {
    let text = match std::str::from_utf8(value) {
        Ok(t) => t.trim(),
        Err(_) => return Pushback::Never,
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Pushback::Never;
    }
    match text.parse::<u64>() {
        Ok(ms) => Pushback::After(Duration::from_millis(ms)),
        Err(_) => Pushback::Never,
    }
}

/// The month names of an HTTP-date, January first.
pub const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
/// The weekday names of IMF-fixdate and asctime, Monday first.
pub const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
/// The weekday names of RFC 850 dates, Monday first.
pub const LONG_DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// An HTTP-date (RFC 9110 section 5.6.7) as a `SystemTime`.
pub fn parse_http_date(text: &str) -> Option<SystemTime> {
    let parts: Vec<&str> = text.split_ascii_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        [wd, d, m, y, t, "GMT"] if wd.strip_suffix(',').is_some_and(|w| DAYS.contains(&w)) => {
            if d.len() != 2 || y.len() != 4 {
                return None;
            }
            (d.parse::<u32>().ok()?, *m, y.parse::<i64>().ok()?, *t)
        }
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
        [wd, dmy, t, "GMT"] if wd.strip_suffix(',').is_some_and(|w| LONG_DAYS.contains(&w)) => {
            let mut it = dmy.split('-');
            let (d, m, y) = (it.next()?, it.next()?, it.next()?);
            if it.next().is_some() || d.len() != 2 || y.len() != 2 {
                return None;
            }
            // Two-digit years: RFC 9110 says a year that looks more than 50 years in
            // the future is in the past century.
            let yy = y.parse::<i64>().ok()?;
            let year = if yy < 70 { 2000 + yy } else { 1900 + yy };
            (d.parse::<u32>().ok()?, m, year, *t)
        }
        // asctime: Sun Nov  6 08:49:37 1994
        [wd, m, d, t, y] if DAYS.contains(wd) => {
            if y.len() != 4 || d.is_empty() || d.len() > 2 {
                return None;
            }
            (d.parse::<u32>().ok()?, *m, y.parse::<i64>().ok()?, *t)
        }
        _ => return None,
    };
    let month = MONTHS.iter().position(|m| *m == month)? as u32 + 1;
    let mut hms = time.split(':');
    let (h, mi, s) = (hms.next()?, hms.next()?, hms.next()?);
    if hms.next().is_some() || h.len() != 2 || mi.len() != 2 || s.len() != 2 {
        return None;
    }
    let (h, mi, s): (u64, u64, u64) = (h.parse().ok()?, mi.parse().ok()?, s.parse().ok()?);
    if !(1..=31).contains(&day) || h > 23 || mi > 59 || s > 60 || !(1970..=9999).contains(&year) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    if days < 0 || day > days_in_month(year, month) {
        return None;
    }
    let secs = days as u64 * 86_400 + h * 3600 + mi * 60 + s;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn delta_seconds() {
        assert_eq!(parse_retry_after(b"1", at(0)), Some(Duration::from_secs(1)));
        assert_eq!(
            parse_retry_after(b" 120 ", at(0)),
            Some(Duration::from_secs(120))
        );
        assert!(parse_retry_after(b"99999999999999999999999", at(0)).is_some());
    }

    #[test]
    fn the_three_http_date_forms_agree() {
        // 1994-11-06 08:49:37 UTC
        let t = 784_111_777;
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(parse_http_date(form), Some(at(t)), "{form}");
        }
        assert_eq!(
            parse_retry_after(b"Sun, 06 Nov 1994 08:49:47 GMT", at(t)),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after(b"Sun, 06 Nov 1994 08:49:27 GMT", at(t)),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
    }

    #[test]
    fn garbage_is_not_a_wait() {
        for bad in [
            &b""[..],
            b"-1",
            b"1.5",
            b"soon",
            b"Sun, 06 Nov 1994 08:49:37 PST",
            b"Sun, 31 Feb 1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994 25:49:37 GMT",
            b"Xyz, 06 Nov 1994 08:49:37 GMT",
            b"\xff\xfe",
        ] {
            assert_eq!(
                parse_retry_after(bad, at(0)),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn leap_days_and_the_epoch() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert!(parse_http_date("Tue, 29 Feb 2000 00:00:00 GMT").is_some());
        assert!(parse_http_date("Thu, 29 Feb 2001 00:00:00 GMT").is_none());
    }

    #[test]
    fn pushback_negative_or_garbage_means_never() {
        assert_eq!(
            parse_pushback_ms(b"250"),
            Pushback::After(Duration::from_millis(250))
        );
        assert_eq!(parse_pushback_ms(b"0"), Pushback::After(Duration::ZERO));
        for bad in [&b"-1"[..], b"", b"soon", b"1.5", b"99999999999999999999999"] {
            assert_eq!(parse_pushback_ms(bad), Pushback::Never);
        }
    }
}
