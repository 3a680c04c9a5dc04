//! Passive outlier ejection: an endpoint that fails `consecutive_failures` times in a
//! row is taken out of the rotation for a while, so one bad pod (a silent one that
//! accepts and never answers, one whose disk is full) stops eating a share of every
//! request's first attempt and of the retry budget with it.
//!
//! The state is a few atomics per endpoint and one count per upstream: the request
//! path reads one word per endpoint it considers, and writes only when a result
//! changes something (a failure, or the first success after failures). An ejection
//! lasts `base_ejection`, doubled for each ejection in a row and capped at
//! [`MAX_EJECTION`]. When it is over the endpoint is re-admitted on probation, as a
//! circuit breaker half-opens: one request at a time goes to it (a probe, given the
//! attempt's time to answer) until one answers. A failure ejects it again at once, for
//! twice as long; a success puts it back in the rotation and forgets its past. Without
//! the one-at-a-time rule, an endpoint that fails slowly (one that never answers)
//! would take its whole share of the traffic for an attempt's time after every
//! ejection.
//!
//! Ejections are limited by `max_ejected`: never more of the upstream out at once than
//! that share, and the endpoints skipped for refusing connections count against it.
//! When a whole upstream fails, its endpoints are not the problem, and ejecting them
//! one after another would pile its traffic onto the last ones standing.
//!
//! This file holds the two pieces of state; [`super::Endpoints`] puts them together
//! with the endpoints' other state, and logs.
//!
//! [`MAX_EJECTION`]: crate::config::MAX_EJECTION

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// What an attempt's result says about the endpoint it went to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The endpoint answered as a healthy one does.
    Success,
    /// The endpoint failed: no connection, a reset, no answer in time, a 5xx of its own.
    Failure,
    /// Nothing to hold for or against it (the app left, another tollgate's verdict,
    /// this process out of descriptors).
    Neutral,
}

/// Where an endpoint stands, read in one load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    In,
    Ejected,
    /// Ejected, and its time is up: to be re-admitted on probation.
    Due,
    /// On probation, with its one request in flight.
    Probing,
    /// On probation, and free to take the next request as its probe.
    ProbeFree,
}

/// Set in [`Health::until`] while on probation; the rest of the word is then when the
/// probe in flight is given up on (0: none in flight).
const PROBE: u64 = 1 << 63;

/// One endpoint's health.
#[derive(Debug, Default)]
pub struct Health {
    /// Failures in a row since the last success (or re-admission).
    failures: AtomicU32,
    /// Ejections in a row: the next one lasts `base_ejection * 2^ejections`.
    ejections: AtomicU32,
    /// 0 while in the rotation; `PROBE | deadline` on probation; else ejected until
    /// then (ms on `pool::clock_ms`).
    until: AtomicU64,
}

impl Health {
    pub fn standing(&self, now_ms: u64) -> Standing {
        match self.until.load(Relaxed) {
            0 => Standing::In,
            probe if probe & PROBE != 0 => {
                if probe & !PROBE > now_ms {
                    Standing::Probing
                } else {
                    Standing::ProbeFree
                }
            }
            until if until > now_ms => Standing::Ejected,
            _ => Standing::Due,
        }
    }

    /// Ejected or on probation: not wholly in the rotation.
    pub fn is_out(&self) -> bool {
        self.until.load(Relaxed) != 0
    }

    /// A healthy answer: the failures before it were not a run, a past of ejections is
    /// forgiven, and a probation ends. `true` when it ended a probation (the endpoint
    /// is back in). Writes nothing when there is nothing to forget.
    pub fn succeeded(&self) -> bool {
        let v = self.until.load(Acquire);
        let back = if v == 0 {
            false
        } else if v & PROBE != 0 {
            if self.until.compare_exchange(v, 0, AcqRel, Relaxed).is_err() {
                return false;
            }
            true
        } else {
            // Ejected: an attempt that was in flight when it went out.
            return false;
        };
        if self.failures.load(Relaxed) != 0 {
            self.failures.store(0, Relaxed);
        }
        if self.ejections.load(Relaxed) != 0 {
            self.ejections.store(0, Relaxed);
        }
        back
    }

    /// A failure: `Some(from)` when the endpoint is to be ejected now, from the state
    /// word `from` (0 after `threshold` failures in a row, the probation word when its
    /// probe failed). Results of attempts that were in flight when it was ejected
    /// count for nothing.
    pub fn failed(&self, threshold: u32) -> Option<u64> {
        match self.until.load(Acquire) {
            0 => {
                let n = self.failures.fetch_add(1, Relaxed).saturating_add(1);
                (n >= threshold).then_some(0)
            }
            probe if probe & PROBE != 0 => Some(probe),
            _ => None,
        }
    }

    /// Ejections in a row so far (0 before the first).
    pub fn ejections(&self) -> u32 {
        self.ejections.load(Relaxed)
    }

    /// Takes the endpoint out until `until_ms`, from the state `from` that
    /// [`Health::failed`] named; `false` when another request changed it first.
    pub fn eject(&self, from: u64, until_ms: u64) -> bool {
        let until = until_ms.clamp(1, PROBE - 1);
        if self
            .until
            .compare_exchange(from, until, AcqRel, Relaxed)
            .is_err()
        {
            return false;
        }
        self.ejections.fetch_add(1, Relaxed);
        self.failures.store(0, Relaxed);
        true
    }

    /// Puts an endpoint whose time is up on probation; `false` when it is not due (or
    /// another request re-admitted it first).
    pub fn readmit(&self, now_ms: u64) -> bool {
        let until = self.until.load(Acquire);
        if until == 0 || until & PROBE != 0 || until > now_ms {
            return false;
        }
        if self
            .until
            .compare_exchange(until, PROBE, AcqRel, Relaxed)
            .is_err()
        {
            return false;
        }
        self.failures.store(0, Relaxed);
        true
    }

    /// Makes this request the probe of an endpoint on probation, given until
    /// `deadline_ms` to answer; `false` when a probe is in flight already.
    pub fn claim_probe(&self, now_ms: u64, deadline_ms: u64) -> bool {
        let v = self.until.load(Acquire);
        if v & PROBE == 0 || v & !PROBE > now_ms {
            return false;
        }
        let next = PROBE | deadline_ms.min(PROBE - 1);
        self.until
            .compare_exchange(v, next, AcqRel, Relaxed)
            .is_ok()
    }

    /// Back in the rotation with no past at all (the outlier section was removed).
    /// `true` when it was out.
    pub fn forget(&self) -> bool {
        let was_out = self.until.swap(0, AcqRel) != 0;
        self.failures.store(0, Relaxed);
        self.ejections.store(0, Relaxed);
        was_out
    }
}

/// How many of an upstream's endpoints are ejected, against how many may be.
#[derive(Debug, Default)]
pub struct Room {
    out: AtomicUsize,
}

impl Room {
    /// Takes a place for one more ejection, if `skipped` endpoints (refusing
    /// connections, not ejected) and the ejected ones leave room under `max_out`.
    pub fn reserve(&self, max_out: usize, skipped: usize) -> bool {
        self.out
            .fetch_update(AcqRel, Acquire, |out| {
                (out + skipped < max_out).then_some(out + 1)
            })
            .is_ok()
    }

    /// An ejection ended (or never happened).
    pub fn release(&self) {
        let _ = self
            .out
            .fetch_update(AcqRel, Acquire, |out| out.checked_sub(1));
    }

    /// Endpoints ejected now.
    pub fn out(&self) -> usize {
        self.out.load(Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_failures_ejects_and_a_success_breaks_it() {
        let h = Health::default();
        assert_eq!(h.failed(3), None);
        assert_eq!(h.failed(3), None);
        assert!(!h.succeeded());
        assert_eq!(h.failed(3), None);
        assert_eq!(h.failed(3), None);
        assert_eq!(h.failed(3), Some(0), "the third in a row");
    }

    #[test]
    fn an_ejected_endpoint_comes_back_on_probation_one_request_at_a_time() {
        let h = Health::default();
        assert!(h.eject(0, 1000));
        assert!(!h.eject(0, 2000), "ejected once");
        assert_eq!(h.standing(999), Standing::Ejected);
        assert_eq!(
            h.failed(1),
            None,
            "results of attempts in flight count for nothing"
        );
        assert!(!h.succeeded());
        assert!(!h.readmit(999));
        assert_eq!(h.standing(1000), Standing::Due);
        assert!(h.readmit(1000));
        assert!(!h.readmit(1000), "once");
        assert_eq!(h.standing(1000), Standing::ProbeFree);
        assert!(h.claim_probe(1000, 1600));
        assert!(!h.claim_probe(1001, 1700), "one probe at a time");
        assert_eq!(h.standing(1599), Standing::Probing);
        assert_eq!(
            h.standing(1600),
            Standing::ProbeFree,
            "a probe never answered"
        );
        assert!(h.claim_probe(1600, 2200));
        let probe = h.failed(5).expect("the probe's failure ejects again");
        assert!(h.eject(probe, 5000));
        assert_eq!(h.ejections(), 2);
        assert!(h.readmit(5000));
        assert!(h.claim_probe(5000, 5600));
        assert!(h.succeeded(), "the probe answered: back in");
        assert_eq!(h.standing(5000), Standing::In);
        assert_eq!(h.ejections(), 0, "a success forgives the past");
        assert_eq!(h.failed(2), None, "and it takes a run again");
    }

    #[test]
    fn the_room_counts_the_skipped_endpoints_too() {
        let r = Room::default();
        assert!(r.reserve(2, 0));
        assert!(
            !r.reserve(2, 1),
            "one ejected and one skipped fill two places"
        );
        assert!(r.reserve(2, 0));
        assert!(!r.reserve(2, 0));
        r.release();
        r.release();
        r.release();
        assert_eq!(r.out(), 0, "never below zero");
    }
}
