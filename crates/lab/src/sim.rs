//! `tollgate sim`: the tick simulation of a capacity dip from "Retry Storms: How Client
//! Retries Turn a Short Dip into a Long Outage", run with tollgate's own [`Backoff`] and
//! [`RetryBudget`] on a virtual clock, so it checks the product's code rather than a
//! copy of it.
//!
//! The model: ticks of 100 ms; a service completes up to 100 requests per tick and
//! rejects the rest at once; users send 95 new requests per tick (95 % utilisation);
//! for ticks 100 to 119 capacity drops to 20. A rejected request is retried up to three
//! times according to the policy; one that runs out of retries is a failed user.
//! "Recovery" is the ticks after the dip until the offered load first fits capacity.
//!
//! Beside the published five, two policies of tollgate's own: the budget's share
//! adapting up to 30 % ([`tollgate_core::retry::learn::adaptive`]; the model's instant rejections are
//! a load shedder saying "overloaded", so they hold it at 10 % during the dip), and the
//! same with client-side throttling of first attempts ([`tollgate_core::retry::learn::throttle`], k =
//! 2 over 5 s), which rejects nothing in a dip as short as this one.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use tollgate_core::config::{BudgetConfig, ThrottleConfig};
use tollgate_core::retry::decide::backoff::{Backoff, Jitter};
use tollgate_core::retry::decide::budget::RetryBudget;
use tollgate_core::retry::learn::throttle::Throttle;

pub const TICK: Duration = Duration::from_millis(100);
const TICKS: usize = 400;
const CAPACITY: u64 = 100;
const ARRIVALS: u64 = 95;
const DIP_START: usize = 100;
/// The published dip: 20 ticks (2 s).
pub const DIP_TICKS: usize = 20;
/// The longest dip `--dip-ticks` takes: the run must see its end.
pub const MAX_DIP_TICKS: usize = 250;
const DIP_CAPACITY: u64 = 20;
const MAX_RETRY: usize = 3;
const CAP_TICKS: usize = 64;

/// A retry policy of the model.
pub struct Policy {
    pub name: &'static str,
    /// `None`: never retry.
    pub backoff: Option<Backoff>,
    pub budget: Option<BudgetConfig>,
    /// Client-side throttling of first attempts.
    pub throttle: Option<ThrottleConfig>,
}

/// The five policies of the published table.
pub fn policies() -> Vec<Policy> {
    let tick = TICK;
    // Retry number `a` (1-based) waits up to 2^a ticks, capped at 64: base 2 ticks.
    let expo = Backoff::try_new(tick * 2, tick * CAP_TICKS as u32).unwrap_or_default();
    let immediate = Backoff::try_new(tick, tick)
        .unwrap_or_default()
        .with_jitter(Jitter::None);
    vec![
        Policy {
            name: "no retries",
            backoff: None,
            budget: None,
            throttle: None,
        },
        Policy {
            name: "immediate retry",
            backoff: Some(immediate),
            budget: None,
            throttle: None,
        },
        Policy {
            name: "exponential, no jitter",
            backoff: Some(expo.with_jitter(Jitter::None)),
            budget: None,
            throttle: None,
        },
        Policy {
            name: "exponential, full jitter",
            backoff: Some(expo),
            budget: None,
            throttle: None,
        },
        Policy {
            name: "full jitter + 10% budget",
            backoff: Some(expo),
            budget: Some(TEN_PERCENT),
            throttle: None,
        },
        Policy {
            name: "+ adaptive budget, 10-30%",
            backoff: Some(expo),
            budget: Some(BudgetConfig {
                max_ratio: Some(0.3),
                ..TEN_PERCENT
            }),
            throttle: None,
        },
        Policy {
            name: "+ throttle (k = 2, 5 s)",
            backoff: Some(expo),
            budget: Some(BudgetConfig {
                max_ratio: Some(0.3),
                ..TEN_PERCENT
            }),
            throttle: Some(ThrottleConfig {
                k: 2.0,
                window: TICK * 50,
            }),
        },
    ]
}

/// The published budget. Its window is one tick, the model's resolution: like the
/// published token bucket, whose cap of 10 tokens is one tick's deposits, it allows no
/// burst larger than a tenth of a tick's traffic.
const TEN_PERCENT: BudgetConfig = BudgetConfig {
    ratio: 0.1,
    min_per_sec: 0.0,
    window: TICK,
    max_ratio: None,
};

#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    pub policy: &'static str,
    pub peak: u64,
    pub sent: u64,
    pub failed: u64,
    /// `None`: the load never fit capacity again within the run.
    pub recovery: Option<usize>,
}

/// Runs one policy with a seeded RNG and a dip of `dip` ticks.
pub fn simulate(p: &Policy, seed: u64, dip: usize) -> SimResult {
    let dip_end = DIP_START + dip.min(MAX_DIP_TICKS);
    let mut rng = fastrand::Rng::with_seed(seed);
    let origin = Instant::now();
    let budget = p.budget.as_ref().map(|b| RetryBudget::new(Some(b), origin));
    let adaptive = budget.as_ref().and_then(|b| b.adaptive());
    let throttle = p.throttle.as_ref().map(|c| Throttle::new(c, origin));
    let mut pending = vec![[0u64; MAX_RETRY + 1]; TICKS + CAP_TICKS + 2];
    let (mut peak, mut sent, mut failed, mut recovery) = (0, 0, 0, None);
    for t in 0..TICKS {
        let now = origin + TICK * t as u32;
        let mut offered = pending[t];
        // A request the throttle rejects is a failed user, never sent.
        let throttled = throttle.as_ref().map_or(0, |th| {
            (0..ARRIVALS).filter(|_| !th.admit(now, &mut rng)).count() as u64
        });
        failed += throttled;
        offered[0] += ARRIVALS - throttled;
        if let Some(b) = &budget {
            for _ in 0..ARRIVALS {
                b.record_request(now);
            }
        }
        let total: u64 = offered.iter().sum();
        sent += total;
        peak = peak.max(total);
        let capacity = if (DIP_START..dip_end).contains(&t) {
            DIP_CAPACITY
        } else {
            CAPACITY
        };
        let rejected = total.saturating_sub(capacity);
        for (a, count) in offered.iter().enumerate() {
            // Which attempts are served is random: each is rejected with the same odds.
            let rej = (0..*count)
                .filter(|_| rejected > 0 && rng.u64(0..total) < rejected)
                .count();
            // What the learning parts hear: attempts served, and rejections (a load
            // shedder's "overloaded").
            for _ in rej as u64..*count {
                if let Some(th) = &throttle {
                    th.accepted(now);
                    th.answered(now);
                }
                adaptive
                    .filter(|_| a > 0)
                    .inspect(|s| s.retry_succeeded(now));
            }
            for _ in 0..rej {
                throttle.iter().for_each(Throttle::rejected);
                if let Some(s) = adaptive {
                    s.overloaded(now);
                    if a > 0 {
                        s.retry_failed();
                    }
                }
                // Given up on: its answer is the failure.
                let done = |failed: &mut u64| {
                    *failed += 1;
                    throttle.iter().for_each(|th| th.answered(now));
                };
                let Some(backoff) = &p.backoff else {
                    done(&mut failed);
                    continue;
                };
                if a == MAX_RETRY {
                    done(&mut failed);
                    continue;
                }
                if let Some(b) = &budget
                    && !b.try_retry(now)
                {
                    done(&mut failed);
                    continue;
                }
                let sleep = backoff.draw(a as u32, &mut rng);
                let ticks = (sleep.as_nanos().div_ceil(TICK.as_nanos()) as usize).max(1);
                pending[t + ticks][a + 1] += 1;
            }
        }
        if t >= dip_end && recovery.is_none() && total <= CAPACITY {
            recovery = Some(t - dip_end);
        }
    }
    SimResult {
        policy: p.name,
        peak,
        sent,
        failed,
        recovery,
    }
}

/// Every policy, with the published dip.
pub fn run_all(seed: u64) -> Vec<SimResult> {
    run_with_dip(seed, DIP_TICKS)
}

/// Every policy, with a dip of `dip` ticks.
pub fn run_with_dip(seed: u64, dip: usize) -> Vec<SimResult> {
    policies().iter().map(|p| simulate(p, seed, dip)).collect()
}

pub fn table(results: &[SimResult], dip: usize) -> String {
    let mut out = format!(
        "tollgate sim: {TICKS} ticks of 100 ms, capacity {CAPACITY}/tick, {ARRIVALS} arrivals/tick, \
         capacity {DIP_CAPACITY} for ticks {DIP_START}-{}, up to {MAX_RETRY} retries\n\n",
        DIP_START + dip - 1
    );
    out.push_str(&format!(
        "  {:<28} {:>10} {:>12} {:>10} {:>10}\n",
        "policy", "peak load", "total sent", "failed", "recovery"
    ));
    for r in results {
        out.push_str(&format!(
            "  {:<28} {:>10} {:>12} {:>10} {:>10}\n",
            r.policy,
            r.peak,
            r.sent,
            r.failed,
            r.recovery.map_or("never".to_string(), |t| t.to_string())
        ));
    }
    out.push_str(
        "\n  peak load and total sent are attempts per tick and in all; recovery is ticks\n  \
         after the dip until the offered load fits capacity again.\n",
    );
    out
}

pub fn to_json(results: &[SimResult], dip: usize) -> Value {
    json!({
        "ticks": TICKS,
        "tick_ms": TICK.as_millis() as u64,
        "capacity": CAPACITY,
        "arrivals": ARRIVALS,
        "dip": { "from": DIP_START, "to": DIP_START + dip, "capacity": DIP_CAPACITY },
        "max_retries": MAX_RETRY,
        "policies": results.iter().map(|r| json!({
            "policy": r.policy,
            "peak_load": r.peak,
            "total_sent": r.sent,
            "failed": r.failed,
            "recovery_ticks": r.recovery,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_shape_holds() {
        let r = run_all(1);
        let by = |name: &str| r.iter().find(|x| x.policy == name).unwrap().clone();
        let none = by("no retries");
        let budget = by("full jitter + 10% budget");
        assert_eq!(none.peak, ARRIVALS);
        assert_eq!(none.recovery, Some(0));
        // The budgeted policy stays near capacity and recovers within a tick or two.
        assert!(
            budget.peak <= CAPACITY + CAPACITY / 5,
            "budget peak {}",
            budget.peak
        );
        assert!(
            budget.recovery.unwrap() <= 2,
            "budget recovery {:?}",
            budget.recovery
        );
        // Unbudgeted retries peak at more than three times capacity and take tens of
        // ticks to recover.
        for name in [
            "immediate retry",
            "exponential, no jitter",
            "exponential, full jitter",
        ] {
            let p = by(name);
            assert!(p.peak > 3 * CAPACITY, "{name} peak {}", p.peak);
            assert!(
                p.recovery.is_none_or(|t| t >= 10),
                "{name} recovery {:?}",
                p.recovery
            );
            assert!(
                p.sent > budget.sent,
                "{name} sent less than the budgeted policy"
            );
        }
    }

    #[test]
    fn the_throttle_rejects_nothing_in_a_short_dip_and_sheds_a_long_one() {
        let short = run_all(1);
        let long = run_with_dip(1, 100);
        let by = |r: &[SimResult], name: &str| r.iter().find(|x| x.policy == name).unwrap().clone();
        let (budget, throttle) = ("full jitter + 10% budget", "+ throttle (k = 2, 5 s)");
        assert_eq!(by(&short, throttle).sent, by(&short, budget).sent);
        assert_eq!(by(&short, throttle).failed, by(&short, budget).failed);
        // Ten seconds of a service that rejects four requests in five: the throttle
        // stops sending most of what would be rejected anyway.
        let (b, t) = (by(&long, budget), by(&long, throttle));
        assert!(
            t.sent + 2_000 < b.sent,
            "throttled {} sent, budgeted {}",
            t.sent,
            b.sent
        );
        assert!(t.recovery.is_some_and(|r| r <= 2), "{:?}", t.recovery);
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        assert_eq!(run_all(7), run_all(7));
    }
}
