//! Deadlines that travel down the chain.
//!
//! The app says how long it will still wait (`x-timeout-ms: 800`, `grpc-timeout: 800m`,
//! `x-envoy-expected-rq-timeout-ms: 800`): a duration relative to now, never a clock
//! time, so hosts need not agree on the time. The smaller of that and the upstream's
//! `request_timeout` (whichever of the two there is) becomes this request's deadline,
//! an instant; with neither, the request has none and waits as long as it would without
//! tollgate. Every attempt tells the upstream the time left of that deadline, so the next
//! hop works to the same instant and nobody starts work no one will wait for. It is not
//! the attempt timeout: tollgate keeps waiting for a slow attempt past that (a retry
//! starts beside it), so an upstream told to give up then would give up on an answer
//! still wanted.
//!
//! gRPC is the exception: a gRPC server applies `grpc-timeout` to the whole call, its
//! streams included, not just to the response head. So a gRPC call carries the time
//! left of the caller's *own* deadline, uncapped by `request_timeout` or
//! `attempt_timeout` (which bound only tollgate's wait for the head), and no
//! `grpc-timeout` at all when the caller set none: [`Deadline::caller_left`].

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

/// The gRPC deadline header, whose value has its own wire format.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// The same name as a static, for the per-attempt fields that borrow their names.
pub static GRPC_TIMEOUT_NAME: HeaderName = GRPC_TIMEOUT;

/// Anything longer is treated as "no deadline of its own" (and capped by
/// `request_timeout` anyway); it keeps `Instant` arithmetic far from overflow.
const MAX_CALLER_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A header value of whole milliseconds: `"250"`. Signs, fractions, spaces inside,
/// empty values and overflow are rejected.
pub fn parse_millis(value: &[u8]) -> Option<Duration> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms = std::str::from_utf8(value).ok()?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ms).min(MAX_CALLER_TIMEOUT))
}

/// gRPC's `TimeoutValue TimeoutUnit`: 1 to 8 digits, then `H`, `M`, `S`, `m`, `u` or `n`.
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let value = value.trim_ascii();
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = std::str::from_utf8(digits).ok()?.parse::<u64>().ok()?;
    let d = match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    };
    Some(d)
}

/// The gRPC wire format for `d`, in the finest unit that fits in 8 digits.
pub fn format_grpc_timeout(d: Duration) -> HeaderValue {
    const LIMIT: u128 = 100_000_000;
    let nanos = d.as_nanos();
    let (n, unit) = if nanos < LIMIT {
        (nanos, 'n')
    } else if nanos / 1_000 < LIMIT {
        (nanos / 1_000, 'u')
    } else if nanos / 1_000_000 < LIMIT {
        (nanos / 1_000_000, 'm')
    } else if nanos / 1_000_000_000 < LIMIT {
        (nanos / 1_000_000_000, 'S')
    } else if nanos / 60_000_000_000 < LIMIT {
        (nanos / 60_000_000_000, 'M')
    } else {
        ((nanos / 3_600_000_000_000).min(LIMIT - 1), 'H')
    };
    let mut buf = Vec::with_capacity(10);
    crate::http::encode::write_decimal(&mut buf, n as u64);
    buf.push(unit as u8);
    HeaderValue::from_bytes(&buf).unwrap_or(HeaderValue::from_static("0n"))
}

/// Whole milliseconds, rounded down: the time left for the next hop is a promise, and
/// rounding up would promise time that does not exist.
pub fn format_millis(d: Duration) -> HeaderValue {
    thread_local! {
        // Consecutive requests mostly carry the same value (the attempt_timeout, or a
        // millisecond less): reusing it spares an allocation per attempt.
        static LAST: std::cell::RefCell<(u64, HeaderValue)> =
            const { std::cell::RefCell::new((0, HeaderValue::from_static("0"))) };
    }
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if last.0 != ms {
            *last = (ms, HeaderValue::from(ms));
        }
        last.1.clone()
    })
}

/// Parses one accepted deadline header by its name: `grpc-timeout` has its own format,
/// every other header is whole milliseconds.
pub fn parse_header(name: &HeaderName, value: &HeaderValue) -> Option<Duration> {
    if *name == GRPC_TIMEOUT {
        parse_grpc_timeout(value.as_bytes())
    } else {
        parse_millis(value.as_bytes())
    }
}

/// The caller's remaining patience: the smallest valid value among the accepted
/// headers. Unparseable values are ignored (the upstream's `request_timeout` applies).
pub fn caller_timeout(headers: &HeaderMap, accept: &[HeaderName]) -> Option<Duration> {
    let mut best: Option<Duration> = None;
    for name in accept {
        for value in headers.get_all(name) {
            if let Some(d) = parse_header(name, value) {
                best = Some(best.map_or(d, |b| b.min(d)));
            }
        }
    }
    best
}

/// The instant by which a request must have its response head, if it has one, and the
/// caller's own deadline, which may lie beyond it.
///
/// A request has a deadline only when its caller sent one or its upstream sets a
/// `request_timeout`; without either it waits as long as it would without tollgate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// `None`: no deadline.
    at: Option<Instant>,
    /// When the caller stops waiting, as it said itself (not capped by
    /// `request_timeout`); `None` when it said nothing.
    caller: Option<Instant>,
}

impl Deadline {
    /// `min(caller, request_timeout)` from `now`, or whichever of the two there is.
    pub fn new(now: Instant, caller: Option<Duration>, request_timeout: Option<Duration>) -> Self {
        let caller = caller.map(|c| c.min(MAX_CALLER_TIMEOUT));
        let d = match (caller, request_timeout) {
            (Some(c), Some(r)) => Some(c.min(r)),
            (c, r) => c.or(r),
        };
        Deadline {
            at: d.map(|d| now + d),
            caller: caller.map(|c| now + c),
        }
    }

    /// When tollgate stops waiting for a response head; `None`: it does not.
    pub fn at(&self) -> Option<Instant> {
        self.at
    }

    /// When the caller's own deadline ends; `None` when it set none.
    pub fn caller_at(&self) -> Option<Instant> {
        self.caller
    }

    /// The time left of the caller's own deadline (the `grpc-timeout` a gRPC call
    /// carries upstream); `None` when the caller set no deadline.
    pub fn caller_left(&self, now: Instant) -> Option<Duration> {
        self.caller.map(|c| c.saturating_duration_since(now))
    }

    /// The time left; `None` without a deadline.
    pub fn remaining(&self, now: Instant) -> Option<Duration> {
        self.at.map(|at| at.saturating_duration_since(now))
    }

    /// Whether there is time left for something that takes `d`.
    pub fn allows(&self, now: Instant, d: Duration) -> bool {
        self.remaining(now).is_none_or(|left| left > d)
    }

    pub fn expired(&self, now: Instant) -> bool {
        self.at.is_some_and(|at| now >= at)
    }
}

/// Runs `fut` until `at`, or to its end when there is no deadline; `None` when the
/// deadline came first.
pub async fn within<F: Future>(at: Option<Instant>, fut: F) -> Option<F::Output> {
    match at {
        Some(at) => tokio::time::timeout_at(at, fut).await.ok(),
        None => Some(fut.await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn milliseconds_parse_strictly() {
        assert_eq!(parse_millis(b"250"), Some(ms(250)));
        assert_eq!(parse_millis(b" 0 "), Some(ms(0)));
        for bad in [
            &b""[..],
            b"-5",
            b"+5",
            b"1.5",
            b"1e3",
            b"12 3",
            b"abc",
            b"99999999999999999999999",
        ] {
            assert_eq!(
                parse_millis(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(
            parse_millis(b"9999999999999999999").is_some(),
            "huge but valid: capped"
        );
    }

    #[test]
    fn grpc_timeouts_parse_every_unit() {
        assert_eq!(parse_grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout(b"400m"), Some(ms(400)));
        assert_eq!(
            parse_grpc_timeout(b"500u"),
            Some(Duration::from_micros(500))
        );
        assert_eq!(parse_grpc_timeout(b"600n"), Some(Duration::from_nanos(600)));
        assert_eq!(
            parse_grpc_timeout(b"99999999S"),
            Some(Duration::from_secs(99_999_999))
        );
        for bad in [
            &b""[..],
            b"m",
            b"100",
            b"100x",
            b"123456789m",
            b"-1S",
            b"1.5S",
            b"10 m",
        ] {
            assert_eq!(
                parse_grpc_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn grpc_timeouts_format_within_eight_digits_and_round_trip() {
        for d in [
            Duration::from_nanos(5),
            ms(250),
            Duration::from_secs(3),
            Duration::from_secs(100_000_000),
            Duration::from_secs(u64::MAX / 4),
        ] {
            let v = format_grpc_timeout(d);
            let text = v.to_str().unwrap();
            assert!(text.len() <= 9, "{text} is longer than 8 digits and a unit");
            let back = parse_grpc_timeout(v.as_bytes()).unwrap();
            assert!(back <= d, "{text} promises more than {d:?}");
        }
        assert_eq!(format_grpc_timeout(ms(250)), "250000u");
        assert_eq!(format_grpc_timeout(Duration::from_secs(3)), "3000000u");
    }

    #[test]
    fn the_smallest_accepted_header_wins_and_garbage_is_ignored() {
        let accept = [
            HeaderName::from_static("x-timeout-ms"),
            GRPC_TIMEOUT,
            HeaderName::from_static("x-envoy-expected-rq-timeout-ms"),
        ];
        let mut h = HeaderMap::new();
        assert_eq!(caller_timeout(&h, &accept), None);
        h.insert("x-timeout-ms", HeaderValue::from_static("900"));
        h.insert("grpc-timeout", HeaderValue::from_static("300m"));
        h.insert(
            "x-envoy-expected-rq-timeout-ms",
            HeaderValue::from_static("nonsense"),
        );
        assert_eq!(caller_timeout(&h, &accept), Some(ms(300)));
        h.insert("x-other", HeaderValue::from_static("1"));
        assert_eq!(
            caller_timeout(&h, &accept),
            Some(ms(300)),
            "only accepted headers count"
        );
        assert_eq!(
            caller_timeout(&h, &[]),
            None,
            "an empty accept list ignores the caller"
        );
    }

    #[test]
    fn deadline_is_the_smaller_of_caller_and_request_timeout() {
        let now = Instant::now();
        let two = Some(ms(2000));
        assert_eq!(
            Deadline::new(now, Some(ms(400)), two).at(),
            Some(now + ms(400))
        );
        assert_eq!(
            Deadline::new(now, Some(ms(9000)), two).at(),
            Some(now + ms(2000))
        );
        assert_eq!(Deadline::new(now, None, two).at(), Some(now + ms(2000)));
        assert!(Deadline::new(now, Some(ms(0)), two).expired(now));
    }

    #[test]
    fn without_a_request_timeout_the_callers_deadline_is_the_deadline() {
        let now = Instant::now();
        let d = Deadline::new(now, Some(ms(10_000)), None);
        assert_eq!(d.at(), Some(now + ms(10_000)), "never capped by a default");
        assert_eq!(d.remaining(now + ms(2500)), Some(ms(7500)));
        let none = Deadline::new(now, None, None);
        assert_eq!(none.at(), None, "no deadline at all");
        assert_eq!(none.remaining(now), None);
        assert!(!none.expired(now + Duration::from_secs(3600)));
        assert!(none.allows(now, Duration::from_secs(3600)));
    }

    #[test]
    fn the_callers_own_deadline_is_kept_uncapped() {
        let now = Instant::now();
        let d = Deadline::new(now, Some(ms(9000)), Some(ms(2000)));
        assert_eq!(d.caller_left(now), Some(ms(9000)), "not capped");
        assert_eq!(d.caller_left(now + ms(1000)), Some(ms(8000)));
        assert_eq!(d.caller_left(now + ms(10_000)), Some(ms(0)));
        assert_eq!(
            Deadline::new(now, None, Some(ms(2000))).caller_left(now),
            None
        );
    }

    #[test]
    fn milliseconds_round_down() {
        assert_eq!(format_millis(Duration::from_micros(1999)), "1");
    }
}
