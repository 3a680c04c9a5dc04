//! Durations (`"250ms"`, `"2s"`, `"1m"`) and sizes (`"32KiB"`, `"1MiB"`) as written in the
//! config file, parsed strictly and printed back in the same shape.
//!
//! A bare number is never a duration: `timeout = 2` could mean seconds or milliseconds,
//! and guessing wrong silently changes a safety limit by a factor of a thousand.

use std::time::Duration;

/// Parses `"<number><unit>"` with unit `us`, `ms`, `s`, `m` or `h`; the number may have a
/// fraction (`"1.5s"`). Compound forms (`"1m30s"`) are accepted too.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("`{text}` does not start with a number"));
        }
        let number: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("`{}` is not a number", &rest[..num_len]))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale = match unit {
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("`{text}` has no unit")),
            other => return Err(format!("unknown unit `{other}` in `{text}`")),
        };
        total += number * scale;
    }
    if !total.is_finite() || total > 365.0 * 24.0 * 3600.0 {
        return Err(format!("`{text}` is too long"));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Prints a duration in the largest unit that keeps it exact: `250ms`, `2s`, `1m`, `1500us`.
pub fn format_duration(d: Duration) -> String {
    let micros = d.as_micros();
    if micros == 0 {
        return "0s".into();
    }
    if micros.is_multiple_of(3_600_000_000) {
        format!("{}h", micros / 3_600_000_000)
    } else if micros.is_multiple_of(60_000_000) {
        format!("{}m", micros / 60_000_000)
    } else if micros.is_multiple_of(1_000_000) {
        format!("{}s", micros / 1_000_000)
    } else if micros.is_multiple_of(1_000) {
        format!("{}ms", micros / 1_000)
    } else {
        format!("{micros}us")
    }
}

/// Parses `"<integer><unit>"` with unit `B`, `KiB`, `MiB` or `GiB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let num_len = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if num_len == 0 {
        return Err(format!("`{text}` does not start with a whole number"));
    }
    let number: u64 = text[..num_len]
        .parse()
        .map_err(|_| format!("`{text}` is too large"))?;
    let scale: u64 = match text[num_len..].trim_start() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "K" | "KB" | "k" | "kB" | "M" | "MB" | "G" | "GB" => {
            return Err(format!(
                "`{text}`: write binary units (KiB, MiB, GiB) so the size is unambiguous"
            ));
        }
        other => return Err(format!("unknown unit `{other}` in `{text}`")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// Prints a size in the largest binary unit that keeps it exact.
pub fn format_size(bytes: u64) -> String {
    if bytes == 0 {
        return "0B".into();
    }
    for (unit, scale) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
    }

    #[test]
    fn durations_without_units_or_with_garbage_are_rejected() {
        for bad in ["", "2", "ms", "2 parsecs", "2x", "-1s", "1e9h", "s2"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn durations_print_back_the_way_they_are_written() {
        for text in ["250ms", "2s", "1m", "1h", "1500us", "0s"] {
            let parsed = parse_duration(text).unwrap();
            assert_eq!(format_duration(parsed), text);
        }
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("32KiB"), Ok(32 * 1024));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("512B"), Ok(512));
        assert!(parse_size("32KB").unwrap_err().contains("KiB"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999GiB").is_err());
        assert_eq!(format_size(64 * 1024), "64KiB");
        assert_eq!(format_size(1000), "1000B");
    }
}
