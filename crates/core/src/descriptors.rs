//! File descriptors: how many client connections the process can afford, how to tell
//! running out of them from a peer's failure, and how to say so without flooding the
//! log.
//!
//! Every client connection usually needs an upstream connection too, so client
//! connections get at most half of what the soft `RLIMIT_NOFILE` allows (less a few the
//! process needs for itself), and never more than `listener.max_connections`: the
//! connections past that are accepted and closed at once, instead of taking the
//! descriptor an upstream connection needs and failing later as a `502` blamed on the
//! upstream. The limit is read from `/proc/self/limits`, which needs no system call
//! binding (and no `unsafe`).
//!
//! A descriptor shortage that still happens (`EMFILE`, `ENFILE`) is local: an accept
//! that fails with it backs off, a connect that fails with it is answered `503
//! overloaded` and never counted against the upstream. Either warns at most once per
//! [`WARN_EVERY`], with how many times it happened since the last line.

use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

/// Descriptors kept for the process itself: standard streams, each worker's runtime,
/// the listeners and their spares, the admin port, the config watch.
pub const RESERVED: u64 = 32;

/// Connections the admin port keeps open at most (the kubelet's probes, Prometheus):
/// reserved apart from the client connections, so a crowd on the admin port cannot
/// take the descriptors the listener's connections need, nor the other way round.
pub const ADMIN_CONNECTIONS: usize = 64;

/// `ENFILE` and `EMFILE` (the same numbers on every Linux architecture).
const ENFILE: i32 = 23;
const EMFILE: i32 = 24;

/// Whether an error says this process (`EMFILE`) or the system (`ENFILE`) is out of
/// file descriptors: a local shortage, never a peer's failure.
pub fn is_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(EMFILE | ENFILE))
}

/// The soft limit on open files of this process; `None` when unlimited or unknown.
pub fn soft_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    crate::metrics::process::parse_max_open_files(&limits)
}

/// The most client connections to keep open: `max_connections`, and no more than half
/// of what `soft_limit` leaves past [`RESERVED`] and [`ADMIN_CONNECTIONS`], so each can have its upstream
/// connection. At least 1.
pub fn client_cap(max_connections: usize, soft_limit: Option<u64>) -> usize {
    let by_limit = soft_limit.map_or(usize::MAX, |n| {
        let kept = RESERVED + ADMIN_CONNECTIONS as u64;
        usize::try_from(n.saturating_sub(kept) / 2).unwrap_or(usize::MAX)
    });
    max_connections.min(by_limit).max(1)
}

/// How often a repeated warning may be logged.
pub const WARN_EVERY: Duration = Duration::from_secs(5);

/// A warning that is logged at most once per [`WARN_EVERY`], with the number of times
/// it happened since it was last logged.
pub struct Throttled {
    /// Milliseconds since [`epoch`] (+1) of the last line; 0 before the first.
    last: AtomicU64,
    count: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Throttled {
    pub const fn new() -> Self {
        Throttled {
            last: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Counts one occurrence. `Some(n)` when a line is due now: `n` occurrences since
    /// the last one, this one included.
    pub fn due(&self) -> Option<u64> {
        self.count.fetch_add(1, Relaxed);
        let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let last = self.last.load(Relaxed);
        let every = WARN_EVERY.as_millis() as u64;
        if last != 0 && now < last.saturating_add(every) {
            return None;
        }
        // One caller wins the line; the others' occurrences go into the next one.
        self.last
            .compare_exchange(last, now, Relaxed, Relaxed)
            .ok()?;
        Some(self.count.swap(0, Relaxed).max(1))
    }
}

impl Default for Throttled {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_connections_get_half_of_what_the_limit_leaves() {
        assert_eq!(client_cap(10_000, Some(256)), 80);
        assert_eq!(client_cap(10_000, Some(1024)), 464);
        assert_eq!(
            client_cap(100, Some(1024)),
            100,
            "never above max_connections"
        );
        assert_eq!(client_cap(10_000, None), 10_000, "unlimited");
        assert_eq!(client_cap(10_000, Some(10)), 1, "at least one");
    }

    #[test]
    fn only_descriptor_shortages_are_local() {
        assert!(is_exhaustion(&io::Error::from_raw_os_error(EMFILE)));
        assert!(is_exhaustion(&io::Error::from_raw_os_error(ENFILE)));
        assert!(!is_exhaustion(&io::Error::from(
            io::ErrorKind::ConnectionRefused
        )));
        assert!(!is_exhaustion(&io::Error::from_raw_os_error(111)));
    }

    #[test]
    fn this_process_has_a_limit_or_none() {
        // Under any test runner the soft limit is a number; `ulimit -n unlimited` is
        // refused by Linux for open files.
        assert!(soft_limit().is_some_and(|n| n >= 16));
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_warning_is_one_line_per_period_with_its_count() {
        let t = Throttled::new();
        assert_eq!(t.due(), Some(1), "the first one at once");
        for _ in 0..99 {
            assert_eq!(t.due(), None);
        }
        tokio::time::advance(WARN_EVERY).await;
        assert_eq!(t.due(), Some(100), "then the count of what was held back");
        assert_eq!(t.due(), None);
        tokio::time::advance(WARN_EVERY * 3).await;
        assert_eq!(t.due(), Some(2));
    }
}
