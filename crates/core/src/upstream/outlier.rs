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
//! A run of failures ejects only an endpoint that fails clearly more than its peers:
//! their failure share over the last 10 s ([`Tally`]) under half of its own, and by
//! more than chance when they fail too (a one-sided two-proportion test at 99%: with
//! few results, a run alone makes any endpoint's share look high). Errors
//! every endpoint shares are the dependency's (a database behind them all, a bad
//! deploy): ejecting for them moves the load onto fewer replicas and helps nobody. So
//! each endpoint also counts its results in two time buckets, a couple of atomic adds
//! per result, and the shares are only computed when a run would eject ([`clearly_worse`]).
//!
//! Ejections are limited by `max_ejected`: never more of the upstream out at once than
//! that share, and the endpoints skipped for refusing connections count against it.
//! When a whole upstream fails, its endpoints are not the problem, and ejecting them
//! one after another would pile its traffic onto the last ones standing.
//!
//! This file holds the pieces of state; [`super::Endpoints`] puts them together with
//! the endpoints' other state, and logs.
//!
//! [`MAX_EJECTION`]: crate::config::MAX_EJECTION

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// What an attempt's result says about the endpoint it went to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointReport {
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

/// How long one bucket of a [`Tally`] counts; the window is about as long.
pub const BUCKET_MS: u64 = 10_000;

/// Bits of a bucket's word: its bucket number (low bits) | failures | results.
const COUNT_BITS: u32 = 24;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - 2 * COUNT_BITS)) - 1;

/// An endpoint's results over the last [`BUCKET_MS`], in two buckets of that length:
/// the current one and the one before, weighed by how much of it is still within the
/// window (the sliding-window estimate). Each bucket is one word: its number, its
/// failures and its results; a result is one atomic add, or a store when the bucket
/// starts over. 2^24 results a bucket is far beyond what one endpoint answers.
#[derive(Debug, Default)]
pub struct Tally {
    buckets: [AtomicU64; 2],
}

/// Failures and results, as a share to compare.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Share {
    pub failures: f64,
    pub results: f64,
}

impl std::ops::Add for Share {
    type Output = Share;

    fn add(self, o: Share) -> Share {
        Share {
            failures: self.failures + o.failures,
            results: self.results + o.results,
        }
    }
}

impl Share {
    /// Failures per result; none without results.
    pub fn ratio(self) -> f64 {
        if self.results > 0.0 {
            self.failures / self.results
        } else {
            0.0
        }
    }
}

/// A one-sided two-proportion z-test at 99%: a difference of shares this large comes by
/// chance about once in a hundred between endpoints that fail alike.
const Z_99: f64 = 2.33;

/// Whether an endpoint that failed `own` fails clearly more than its peers, who
/// together failed `others`: their share under half of its own, and, when they fail
/// too, by more than chance. With few results a run of failures alone makes any
/// endpoint's share look high (6 of 8 against a peer's 2 of 9, where both fail 30% of
/// the time), and the errors every endpoint shares would eject one of them. Peers that
/// did not fail share nothing: the run is the endpoint's own.
pub fn clearly_worse(own: Share, others: Share) -> bool {
    // It has just failed a run: with no results counted (the window turned), its own
    // share is all failures.
    let own = if own.results > 0.0 {
        own
    } else {
        Share {
            failures: 1.0,
            results: 1.0,
        }
    };
    let (mine, theirs) = (own.ratio(), others.ratio());
    if theirs >= mine / 2.0 {
        return false;
    }
    // No peer answered lately, or none failed: nothing is shared, the run is its own.
    if others.results <= 0.0 || others.failures <= 0.0 {
        return true;
    }
    let pooled = (own.failures + others.failures) / (own.results + others.results);
    let se = (pooled * (1.0 - pooled) * (1.0 / own.results + 1.0 / others.results)).sqrt();
    se <= 0.0 || (mine - theirs) / se > Z_99
}

impl Tally {
    fn word(epoch: u64, failures: u64, results: u64) -> u64 {
        (failures << (64 - COUNT_BITS)) | (results << (64 - 2 * COUNT_BITS)) | (epoch & EPOCH_MASK)
    }

    /// Counts one result at `now_ms`.
    pub fn record(&self, failed: bool, now_ms: u64) {
        let epoch = now_ms / BUCKET_MS;
        let bucket = &self.buckets[(epoch % 2) as usize];
        let add = Self::word(0, u64::from(failed), 1);
        let v = bucket.load(Relaxed);
        if v & EPOCH_MASK == epoch & EPOCH_MASK {
            bucket.fetch_add(add, Relaxed);
            return;
        }
        // The bucket held an older window: it starts over. A result counted by another
        // request in between may be lost; a share does not need it.
        if bucket
            .compare_exchange(v, Self::word(epoch, 0, 0) + add, Relaxed, Relaxed)
            .is_err()
        {
            bucket.fetch_add(add, Relaxed);
        }
    }

    /// The failures and results of about the last [`BUCKET_MS`] at `now_ms`.
    pub fn share(&self, now_ms: u64) -> Share {
        let epoch = now_ms / BUCKET_MS;
        let read = |e: u64, weight: f64| {
            let v = self.buckets[(e % 2) as usize].load(Relaxed);
            if v & EPOCH_MASK != e & EPOCH_MASK {
                return Share::default();
            }
            Share {
                failures: ((v >> (64 - COUNT_BITS)) & COUNT_MASK) as f64 * weight,
                results: ((v >> (64 - 2 * COUNT_BITS)) & COUNT_MASK) as f64 * weight,
            }
        };
        let into = (now_ms % BUCKET_MS) as f64 / BUCKET_MS as f64;
        let before = match epoch.checked_sub(1) {
            Some(e) => read(e, 1.0 - into),
            None => Share::default(),
        };
        read(epoch, 1.0) + before
    }
}

/// One endpoint's health.
#[derive(Debug, Default)]
pub struct Health {
    /// Its results of the last [`BUCKET_MS`], to compare with its peers'.
    pub tally: Tally,
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

    /// A failed probe of an endpoint that fails no more than its peers: back in the
    /// rotation, as a success would put it (its past of ejections kept). `false` when
    /// another request changed the state `from` first.
    pub fn pardon(&self, from: u64) -> bool {
        if self
            .until
            .compare_exchange(from, 0, AcqRel, Relaxed)
            .is_err()
        {
            return false;
        }
        self.failures.store(0, Relaxed);
        true
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

    fn share(failures: f64, results: f64) -> Share {
        Share { failures, results }
    }

    #[test]
    fn only_an_endpoint_failing_clearly_more_than_its_peers_is_worse() {
        // The same 30% everywhere: the dependency's, not the endpoint's.
        assert!(!clearly_worse(share(30.0, 100.0), share(29.0, 100.0)));
        assert!(!clearly_worse(share(100.0, 100.0), share(100.0, 200.0)));
        // Twice the others' share is not enough: more than twice.
        assert!(!clearly_worse(share(40.0, 100.0), share(20.0, 100.0)));
        assert!(clearly_worse(share(41.0, 100.0), share(20.0, 100.0)));
        assert!(clearly_worse(share(100.0, 100.0), share(1.0, 100.0)));
        // Peers that answered nothing lately have failed nothing.
        assert!(clearly_worse(share(5.0, 5.0), Share::default()));
        assert!(clearly_worse(Share::default(), Share::default()));
        // Peers that fail everything: none is worse.
        assert!(!clearly_worse(share(5.0, 5.0), share(50.0, 50.0)));
        // Few results: a run early in the window is chance, not a worse endpoint (both
        // fail 30% of the time here)...
        assert!(!clearly_worse(share(9.0, 20.0), share(4.0, 20.0)));
        assert!(!clearly_worse(share(6.0, 8.0), share(2.0, 9.0)));
        // ... while a dead one stands out at once, and one failing beside peers that
        // fail too, once its share is more than chance.
        assert!(clearly_worse(share(5.0, 5.0), share(0.0, 3.0)));
        assert!(clearly_worse(share(2.0, 2.0), share(0.0, 2.0)));
        assert!(clearly_worse(share(5.0, 5.0), share(9.0, 30.0)));
        assert!(!clearly_worse(share(5.0, 5.0), share(1.0, 3.0)));
    }

    #[test]
    fn a_tally_counts_about_the_last_ten_seconds() {
        let t = Tally::default();
        for i in 0..10 {
            t.record(i < 3, 1_000);
        }
        assert_eq!(t.share(1_000), share(3.0, 10.0));
        // The next bucket: the first is weighed by what is left of it in the window.
        t.record(true, 12_500);
        let s = t.share(12_500);
        assert_eq!(s, share(1.0 + 3.0 * 0.75, 1.0 + 10.0 * 0.75));
        // Twenty seconds on, both buckets are of older windows.
        assert_eq!(t.share(30_000), Share::default());
        t.record(false, 30_000);
        assert_eq!(t.share(30_000), share(0.0, 1.0), "a bucket starts over");
    }

    #[test]
    fn a_tally_word_keeps_its_counts_apart() {
        let t = Tally::default();
        for _ in 0..100_000 {
            t.record(true, 5);
        }
        for _ in 0..50_000 {
            t.record(false, 5);
        }
        assert_eq!(t.share(5), share(100_000.0, 150_000.0));
    }

    #[test]
    fn a_pardoned_probe_is_back_in() {
        let h = Health::default();
        assert!(h.eject(0, 1000));
        assert!(h.readmit(1000));
        assert!(h.claim_probe(1000, 1600));
        let probe = h.failed(5).expect("a probe's failure names its state");
        assert!(h.pardon(probe));
        assert_eq!(h.standing(1000), Standing::In);
        assert_eq!(h.ejections(), 1, "its past is kept");
        assert!(!h.pardon(probe), "once");
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
