//! The app's latencies over one sampling window, kept lock-free: a log-scaled
//! histogram of atomic counters (eight buckets per doubling, so a percentile read from
//! it is within about 5% of the true one). Recording a sample is one atomic add; the
//! window's percentile is read, and the counters emptied, once per window by whoever
//! closes it.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

/// Buckets per doubling of the latency.
const SUB: u32 = 8;
/// Doublings covered, from 1 µs: up to 2^31 µs (about 36 minutes).
const OCTAVES: u32 = 31;
const BUCKETS: usize = (OCTAVES * SUB) as usize;

pub struct Samples {
    buckets: Box<[AtomicU32]>,
    count: AtomicU32,
}

impl Default for Samples {
    fn default() -> Self {
        Samples {
            buckets: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            count: AtomicU32::new(0),
        }
    }
}

/// The bucket of a latency in microseconds (at least 1).
fn bucket(micros: u64) -> usize {
    let v = micros.max(1);
    let octave = 63 - v.leading_zeros();
    // The three bits after the leading one say where in the doubling it falls.
    let sub = if octave >= 3 {
        (v >> (octave - 3)) & 7
    } else {
        (v << (3 - octave)) & 7
    };
    ((octave * SUB) as usize + sub as usize).min(BUCKETS - 1)
}

/// The middle of a bucket, in microseconds.
fn middle(index: usize) -> f64 {
    let (octave, sub) = (index as u32 / SUB, index as u32 % SUB);
    let low = f64::from(1u32 << octave.min(31)) * (1.0 + f64::from(sub) / f64::from(SUB));
    low * (1.0 + 0.5 / (f64::from(SUB) + f64::from(sub)))
}

impl Samples {
    pub fn record(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket(micros)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    pub fn count(&self) -> u32 {
        self.count.load(Relaxed)
    }

    /// The `q` quantile (0..=1) of the samples, and empties the window. `None` without
    /// samples.
    pub fn take_quantile(&self, q: f64) -> Option<Duration> {
        let counts: Vec<u32> = self.buckets.iter().map(|b| b.swap(0, Relaxed)).collect();
        self.count.store(0, Relaxed);
        let total: u64 = counts.iter().map(|c| u64::from(*c)).sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += u64::from(*c);
            if seen >= rank {
                return Some(Duration::from_nanos((middle(i) * 1000.0) as u64));
            }
        }
        None
    }

    /// Empties the window.
    pub fn clear(&self) {
        for b in self.buckets.iter() {
            b.store(0, Relaxed);
        }
        self.count.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percentile_is_read_within_a_bucket_of_the_truth() {
        let s = Samples::default();
        for ms in 1..=100u64 {
            s.record(Duration::from_millis(ms));
        }
        assert_eq!(s.count(), 100);
        let p50 = s.take_quantile(0.5).unwrap().as_secs_f64() * 1000.0;
        assert!((47.0..=53.0).contains(&p50), "{p50}");
        assert_eq!(s.count(), 0, "taken: the window is empty");
        assert_eq!(s.take_quantile(0.5), None);
    }

    #[test]
    fn buckets_grow_with_the_latency_and_cover_the_range() {
        let mut last = 0;
        for micros in [1, 2, 3, 7, 8, 9, 100, 1_000, 25_000, 1_000_000, u64::MAX] {
            let b = bucket(micros);
            assert!(b >= last, "{micros}");
            last = b;
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for i in [0, 8, 100, 200] {
            let m = middle(i) as u64;
            assert_eq!(bucket(m), i, "the middle of bucket {i} ({m} µs) is in it");
        }
    }
}
