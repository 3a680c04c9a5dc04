//! `Retry-After` and `grpc-retry-pushback-ms` come from upstreams: parsing never panics,
//! an unreadable value is no wait, a date is read exactly, and the three HTTP-date
//! forms agree with each other and with a day count done the slow way.

#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use tollgate_core::retry::decide::retry_after::{
    DAYS, LONG_DAYS, MONTHS, Pushback, parse_http_date, parse_pushback_ms, parse_retry_after,
};

fn leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn month_days(y: i64, m: u32) -> u32 {
    [
        31,
        if leap(y) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ][m as usize - 1]
}

/// Seconds since the epoch, counted day by day.
fn slow_epoch(y: i64, m: u32, d: u32, h: u64, mi: u64, s: u64) -> u64 {
    let mut days: u64 = (1970..y).map(|yy| if leap(yy) { 366 } else { 365 }).sum();
    days += (1..m).map(|mm| u64::from(month_days(y, mm))).sum::<u64>();
    days += u64::from(d - 1);
    days * 86_400 + h * 3600 + mi * 60 + s
}

fuzz_target!(|data: &[u8]| {
    // Any bytes, at any "now".
    let now = UNIX_EPOCH
        + Duration::from_secs(data.get(..4).map_or(0, |b| {
            u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }));
    if let Some(wait) = parse_retry_after(data, now) {
        let text = std::str::from_utf8(data)
            .expect("only text is a wait")
            .trim();
        if !text.bytes().all(|b| b.is_ascii_digit()) {
            let at = parse_http_date(text).expect("a wait from a date that does not parse");
            assert_eq!(wait, at.duration_since(now).unwrap_or(Duration::ZERO));
        }
    }
    match parse_pushback_ms(data) {
        Pushback::After(d) => {
            let text = std::str::from_utf8(data)
                .expect("only text is a wait")
                .trim();
            assert!(!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()));
            assert_eq!(text.parse::<u64>().ok(), u64::try_from(d.as_millis()).ok());
        }
        Pushback::Never => {}
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(t) = parse_http_date(text) {
            assert!(t >= UNIX_EPOCH);
        }
    }

    // A date built from the bytes, written in all three forms.
    if data.len() >= 8 {
        let y = 1960 + i64::from(u16::from_le_bytes([data[0], data[1]]) % 8100);
        let m = u32::from(data[2] % 12) + 1;
        let d = u32::from(data[3] % 32);
        let (h, mi, s) = (
            u64::from(data[4] % 25),
            u64::from(data[5] % 61),
            u64::from(data[6] % 62),
        );
        let wd = usize::from(data[7] % 7);
        let valid = (1970..=9999).contains(&y)
            && d >= 1
            && d <= month_days(y, m)
            && h <= 23
            && mi <= 59
            && s <= 60;
        let month = MONTHS[m as usize - 1];
        let imf = format!(
            "{}, {d:02} {month} {y:04} {h:02}:{mi:02}:{s:02} GMT",
            DAYS[wd]
        );
        let got = parse_http_date(&imf);
        if valid {
            let want = UNIX_EPOCH + Duration::from_secs(slow_epoch(y, m, d, h, mi, s));
            assert_eq!(got, Some(want), "{imf}");
            let asctime = format!("{} {month} {d:>2} {h:02}:{mi:02}:{s:02} {y:04}", DAYS[wd]);
            assert_eq!(parse_http_date(&asctime), Some(want), "{asctime}");
            if (1970..2070).contains(&y) {
                let rfc850 = format!(
                    "{}, {d:02}-{month}-{:02} {h:02}:{mi:02}:{s:02} GMT",
                    LONG_DAYS[wd],
                    y % 100
                );
                assert_eq!(parse_http_date(&rfc850), Some(want), "{rfc850}");
            }
            let secs = want.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let before = UNIX_EPOCH + Duration::from_secs(secs.saturating_sub(7));
            assert_eq!(
                parse_retry_after(imf.as_bytes(), before),
                Some(Duration::from_secs(secs.min(7))),
                "{imf}"
            );
            let _: SystemTime = want;
        } else {
            assert_eq!(got, None, "{imf} is no date");
        }
    }
});
