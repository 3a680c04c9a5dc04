//! Deadline headers come from the app and from other hops: parsing never panics, and a
//! value tollgate writes never promises more time than it has. `format_millis` and
//! `format_grpc_timeout` round down, so parsing what they wrote gives back at most the
//! duration they were given (and, within a century, exactly what fits their unit).

#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tollgate_core::deadline::{format_grpc_timeout, format_millis, parse_grpc_timeout, parse_millis};

/// The longest caller deadline tollgate takes at face value (it caps longer ones).
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn round_trips(d: Duration) {
    let grpc = format_grpc_timeout(d);
    assert!(grpc.len() <= 9, "{grpc:?}: more than 8 digits and a unit");
    let back = parse_grpc_timeout(grpc.as_bytes()).expect("tollgate's own grpc-timeout");
    assert!(back <= d, "{grpc:?} promises {back:?}, more than {d:?}");
    if d <= CENTURY {
        // Rounded down to the finest unit that fits 8 digits: within one unit.
        let unit = match grpc.as_bytes().last() {
            Some(b'n') => Duration::from_nanos(1),
            Some(b'u') => Duration::from_micros(1),
            Some(b'm') => Duration::from_millis(1),
            Some(b'S') => Duration::from_secs(1),
            Some(b'M') => Duration::from_secs(60),
            _ => Duration::from_secs(3600),
        };
        assert!(d - back < unit, "{grpc:?} lost {:?} of {d:?}", d - back);
    }

    let ms = format_millis(d);
    match parse_millis(ms.as_bytes()) {
        Some(back) => {
            assert!(back <= d, "{ms:?} promises {back:?}, more than {d:?}");
            if d <= CENTURY {
                assert!(d - back < Duration::from_millis(1), "{ms:?} for {d:?}");
            }
        }
        None => assert!(d > CENTURY, "{ms:?}: tollgate's own value unreadable"),
    }
}

fuzz_target!(|data: &[u8]| {
    // As header values from anyone: never a panic, never beyond the cap.
    if let Some(d) = parse_millis(data) {
        assert!(d <= CENTURY);
        round_trips(d);
    }
    if let Some(d) = parse_grpc_timeout(data) {
        round_trips(d);
    }
    // As a duration: the bytes as seconds and nanoseconds.
    if data.len() >= 12 {
        let secs = u64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8]));
        let nanos = u32::from_le_bytes(data[8..12].try_into().unwrap_or([0; 4])) % 1_000_000_000;
        // Small durations matter most: fold the seconds down sometimes.
        let secs = if data.len() > 12 && data[12] & 1 == 0 {
            secs % 100_000
        } else {
            secs
        };
        round_trips(Duration::new(secs, nanos));
    }
});
