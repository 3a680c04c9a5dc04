//! Each caller's share of the fleet's retry budget: while several callers (by source
//! address) send requests, none gets more than an equal share of the retries the window
//! allows, unless the others leave theirs unused (max-min fairness). Without it one noisy
//! caller, or one that marks every request a retry, spends the whole budget, and a real
//! caller's one retry a moment later is rejected.
//!
//! # The rule
//!
//! Over the budget's window, let `C` be the retries it allows (those granted plus those
//! left), `n` the callers seen in the window (any request), and `g_i` the retries granted
//! to caller `i`. Caller `c` may have another retry (if the budget grants it) when
//! `g_c < C / n`, or when the room left, `C - Σ g_i`, is more than what the others may
//! still take of their equal shares, `Σ_{i≠c} max(0, C / n - g_i)`. So a lone caller may
//! take the whole budget, and a caller that asks more than its share takes only what the
//! others leave: a caller that sends only first attempts keeps its share for the retry it
//! may need.
//!
//! # The bounds
//!
//! Callers are seen in a table of [`SEEN`] slots by a hash of their address: two callers
//! in one slot count as one (so `n`, and the protection, are never overstated). At most
//! [`CALLERS`] callers that asked for retries are known with their grants at once; a new
//! one takes the place of the one that asked longest ago, which starts over with nothing
//! granted when it asks again. Grants and sightings are counted in halves of the window
//! (the current half and the one before).
//!
//! # Cost
//!
//! Seeing a request is one atomic load (a store when its slot changes hands or a new half
//! begins). Only a retry asks for a share, and it takes one lock: retries are few by
//! design, and the tables are read whole.

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

use crate::retry::decide::budget::RetryBudget;

/// The most callers that asked for retries known at once.
pub const CALLERS: usize = 256;
/// Slots of the table of callers seen.
pub const SEEN: usize = 1024;

/// One caller as the table knows it.
#[derive(Clone, Copy, Debug)]
struct Caller {
    addr: IpAddr,
    /// The half-window its `current` count is of.
    half: u64,
    /// Grants in that half, and in the half before it.
    current: u32,
    previous: u32,
    /// The half-window it last asked in.
    asked: u64,
}

impl Caller {
    /// Brings the counts to half-window `now`.
    fn roll(&mut self, now: u64) {
        match now.saturating_sub(self.half) {
            0 => {}
            1 => {
                self.previous = self.current;
                self.current = 0;
            }
            _ => {
                self.previous = 0;
                self.current = 0;
            }
        }
        self.half = now;
    }

    fn granted(&self) -> u32 {
        self.current + self.previous
    }

    /// Asked within the window (this half or the one before).
    fn asking(&self, now: u64) -> bool {
        now.saturating_sub(self.asked) <= 1
    }
}

/// The callers of one inbound side and their retries.
pub struct FairShare {
    origin: Instant,
    half: Duration,
    table: Mutex<Vec<Caller>>,
    /// Per slot: a tag of the caller's address (high bits) and the half-window it was
    /// last seen in (low [`HALF_BITS`] bits, plus one: 0 is never).
    seen: Box<[AtomicU64]>,
}

const HALF_BITS: u32 = 24;

impl std::fmt::Debug for FairShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairShare")
            .field("half", &self.half)
            .finish_non_exhaustive()
    }
}

/// Why a retry was not granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The fleet budget has no room.
    Budget,
    /// The budget has room, but it is the other callers' share.
    Share,
}

impl FairShare {
    pub fn new(window: Duration, now: Instant) -> Self {
        FairShare {
            origin: now,
            half: (window / 2).max(Duration::from_millis(1)),
            table: Mutex::new(Vec::with_capacity(16)),
            seen: (0..SEEN).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A request from `addr` arrived: the caller is seen in this half of the window.
    pub fn see(&self, addr: IpAddr, now: Instant) {
        let (slot, value) = self.sighting(addr, self.half_at(now));
        if self.seen[slot].load(Relaxed) != value {
            self.seen[slot].store(value, Relaxed);
        }
    }

    /// Where `addr` is seen, and what its slot then holds.
    fn sighting(&self, addr: IpAddr, half: u64) -> (usize, u64) {
        let h = mix(addr);
        let stamp = (half & ((1 << HALF_BITS) - 1)) + 1;
        ((h as usize) % SEEN, (h & !((1 << HALF_BITS) - 1)) | stamp)
    }

    /// Callers seen in this half of the window or the one before.
    fn seen_now(&self, half: u64) -> usize {
        let mask = (1 << HALF_BITS) - 1;
        let this = (half & mask) + 1;
        let before = (half.wrapping_sub(1) & mask) + 1;
        self.seen
            .iter()
            .map(|s| s.load(Relaxed) & mask)
            .filter(|s| *s == this || (half > 0 && *s == before))
            .count()
    }

    fn half_at(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin);
        u64::try_from(since.as_nanos() / self.half.as_nanos().max(1)).unwrap_or(u64::MAX)
    }

    /// A retry from `addr`: granted from `budget` if it is within the caller's share.
    pub fn try_retry(
        &self,
        addr: IpAddr,
        budget: &RetryBudget,
        now: Instant,
    ) -> Result<(), Refused> {
        let half = self.half_at(now);
        self.see(addr, now);
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let me = match table.iter().position(|c| c.addr == addr) {
            Some(i) => i,
            None => admit(&mut table, addr, half),
        };
        for c in table.iter_mut() {
            c.roll(half);
        }
        table[me].asked = half;
        let asking: Vec<(usize, u32)> = table
            .iter()
            .enumerate()
            .filter(|(_, c)| c.asking(half))
            .map(|(i, c)| (i, c.granted()))
            .collect();
        // Callers seen but not asking hold their whole share in reserve.
        let callers = self.seen_now(half).max(asking.len());
        let left = budget.window_left(now);
        if callers > 1 && left.is_finite() {
            let allowed = budget.stats(now).retries as f64 + left;
            let share = allowed / callers as f64;
            let mine = f64::from(table[me].granted());
            let idle = (callers - asking.len()) as f64 * share;
            let reserved: f64 = asking
                .iter()
                .filter(|(i, _)| *i != me)
                .map(|(_, g)| (share - f64::from(*g)).max(0.0))
                .sum::<f64>()
                + idle;
            if mine + 1.0 > share && left - reserved < 1.0 {
                return Err(Refused::Share);
            }
        }
        if !budget.try_retry(now) {
            return Err(Refused::Budget);
        }
        table[me].current += 1;
        Ok(())
    }

    /// Callers known now (for tests and the bound).
    pub fn known(&self) -> usize {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A hash of an address, cheap and well spread (for the table of callers seen, where a
/// collision only counts two callers as one).
fn mix(addr: IpAddr) -> u64 {
    let bits: u128 = match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    let folded = (bits as u64) ^ ((bits >> 64) as u64);
    // A 64-bit finaliser (splitmix64's).
    let mut z = folded.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Makes room for `addr` and returns its place: a new entry while the table has room,
/// else the place of the caller that asked longest ago.
fn admit(table: &mut Vec<Caller>, addr: IpAddr, half: u64) -> usize {
    let fresh = Caller {
        addr,
        half,
        current: 0,
        previous: 0,
        asked: half,
    };
    if table.len() < CALLERS {
        table.push(fresh);
        return table.len() - 1;
    }
    let oldest = table
        .iter()
        .enumerate()
        .min_by_key(|(_, c)| c.asked)
        .map_or(0, |(i, _)| i);
    table[oldest] = fresh;
    oldest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BudgetConfig;

    fn budget(now: Instant) -> RetryBudget {
        // No requests, a floor of 1 a second over 10 s: 10 retries in the window, at
        // most twice the even share of a slot at once.
        RetryBudget::new(
            Some(&BudgetConfig {
                ratio: 0.0,
                min_per_sec: 1.0,
                window: Duration::from_secs(10),
                max_ratio: None,
            }),
            now,
        )
    }

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_caller_may_take_the_whole_budget() {
        let now = Instant::now();
        let (b, f) = (budget(now), FairShare::new(Duration::from_secs(10), now));
        let mut granted = 0;
        for s in 0..100 {
            let at = now + Duration::from_millis(100 * s);
            if f.try_retry(ip(1), &b, at).is_ok() {
                granted += 1;
            }
        }
        assert_eq!(
            granted, 9,
            "the whole window's allowance, strictly below 1/s * 10 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_noisy_caller_cannot_starve_a_quiet_one() {
        let now = Instant::now();
        let (b, f) = (budget(now), FairShare::new(Duration::from_secs(10), now));
        // The quiet caller has only been seen, and never asked.
        f.see(ip(2), now);
        let mut noisy = 0;
        for s in 0..50 {
            let at = now + Duration::from_millis(100 * s);
            if f.try_retry(ip(1), &b, at).is_ok() {
                noisy += 1;
            }
        }
        assert_eq!(
            noisy, 4,
            "half of the 9 (4.5) for the noisy one, in whole retries"
        );
        f.see(ip(2), now + Duration::from_millis(5_000));
        let later = now + Duration::from_millis(5_000);
        assert_eq!(
            f.try_retry(ip(2), &b, later),
            Ok(()),
            "the quiet caller still gets a retry"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded() {
        let now = Instant::now();
        let (b, f) = (budget(now), FairShare::new(Duration::from_secs(10), now));
        for n in 0..(CALLERS + 50) {
            let addr = IpAddr::from([10, 1, (n / 256) as u8, (n % 256) as u8]);
            let _ = f.try_retry(addr, &b, now);
        }
        assert_eq!(f.known(), CALLERS);
    }
}
