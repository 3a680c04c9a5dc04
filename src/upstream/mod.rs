//! Talking to an upstream's endpoints: which endpoint an attempt goes to, the
//! connections to each (pooled per worker), and one exchange on a connection.
//!
//! Generic over the request body `B` it sends: this layer moves bodies, it does not
//! decide what they are. It knows nothing of retries, budgets or the app.
//!
//! From the bottom: [`dns`], [`connect`] and [`tls`] open a connection
//! ([`tls_failure`] says why one failed); [`request`] is what an attempt sends ahead of
//! its body; [`h1`] is HTTP/1.1 on tollgate's own codec (HTTP/2 is hyper's client);
//! [`response`] is what comes back ([`upgraded`]: a connection after `101`, to
//! tunnel); [`pool`] keeps one endpoint's connections and sends on one of them;
//! [`outlier`] is each endpoint's health; this file chooses the endpoint, and ejects
//! and re-admits endpoints as their results come in.

pub mod connect;
pub mod dns;
pub mod exchange;
pub mod h1;
pub mod outlier;
pub mod pool;
pub mod request;
pub mod response;
#[cfg(test)]
pub mod scripted;
pub mod tls;
pub mod tls_failure;
pub mod upgraded;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use bytes::Bytes;
use http::Version;
use http_body::Body;

use prometheus::IntCounter;

use crate::config::units::format_duration;
use crate::config::{OutlierConfig, Protocol, UpstreamConfig};
use crate::http::BoxError;
use outlier::{Room, Share, Standing, Verdict, clearly_worse};
use pool::{Endpoint, Want};

/// What this layer can send as a request body: any body of bytes, its errors boxed.
pub trait OutgoingBody:
    Body<Data = Bytes, Error = BoxError> + Unpin + Send + Sync + 'static
{
}

impl<T> OutgoingBody for T where
    T: Body<Data = Bytes, Error = BoxError> + Unpin + Send + Sync + 'static
{
}

/// The endpoints of one upstream, and the choice among them.
pub struct Endpoints<B> {
    list: Box<[Arc<Endpoint<B>>]>,
    next: AtomicUsize,
    /// Ejection, when the upstream has an `[outlier]` section.
    outlier: Option<Outlier>,
    /// How many endpoints are ejected (shared by every build on the same endpoints).
    room: Arc<Room>,
    /// The upstream's name, for the log.
    name: Arc<str>,
}

/// How long a probe is given when the upstream sets neither timeout.
const PROBE_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// The `[outlier]` rules as one build of the endpoints applies them.
struct Outlier {
    config: OutlierConfig,
    /// `config.max_out` of these endpoints.
    max_out: usize,
    /// How long a probe of an endpoint on probation may take before another request
    /// may be its probe: the attempt timeout, else the request timeout, else
    /// [`PROBE_TIME`].
    probe_ms: u64,
    /// `tollgate_ejections_total{upstream}`.
    ejections: IntCounter,
}

impl<B> std::fmt::Debug for Endpoints<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list.iter()).finish()
    }
}

impl<B: OutgoingBody> Endpoints<B> {
    /// The endpoints of `config`, with `workers` pools each; `open` counts their
    /// connections, `ejections` their ejections.
    pub fn new(
        config: &UpstreamConfig,
        open: &Arc<AtomicUsize>,
        workers: usize,
        ejections: IntCounter,
    ) -> Self {
        let name: Arc<str> = config.name.as_str().into();
        let list: Box<[_]> = config
            .endpoints
            .iter()
            .map(|a| {
                Arc::new(Endpoint::new(
                    name.clone(),
                    a.clone(),
                    open.clone(),
                    workers,
                    config.max_connection_age,
                ))
            })
            .collect();
        Endpoints {
            outlier: Outlier::of(config, list.len(), ejections),
            list,
            next: AtomicUsize::new(0),
            room: Arc::default(),
            name,
        }
    }
}

impl<B> Endpoints<B> {
    /// The same endpoints (and their pools and health), with a choice of their own and
    /// the outlier rules of `config`. Without rules, every ejected endpoint is back.
    pub fn share(&self, config: &UpstreamConfig, ejections: IntCounter) -> Self {
        let outlier = Outlier::of(config, self.list.len(), ejections);
        if outlier.is_none() {
            for e in self.list.iter() {
                if e.health.forget() {
                    self.room.release();
                }
            }
        }
        Endpoints {
            list: self.list.clone(),
            next: AtomicUsize::new(0),
            outlier,
            room: self.room.clone(),
            name: self.name.clone(),
        }
    }

    /// Round-robin over the endpoints, skipping `avoid` (the one that just failed),
    /// endpoints that refused a connection a moment ago and ejected ones, when there
    /// is another.
    ///
    /// Round-robin rather than least-loaded on purpose: an endpoint that fails fast has
    /// the fewest requests in flight, so a least-loaded balancer sends retries straight
    /// back to the broken one.
    pub fn pick(&self, avoid: Option<usize>) -> usize {
        // One endpoint: no clock to read, nothing to choose.
        if self.list.len() <= 1 {
            return 0;
        }
        self.pick_at(avoid, pool::clock_ms())
    }

    /// [`Endpoints::pick`] at `now_ms` on [`pool::clock_ms`].
    pub fn pick_at(&self, avoid: Option<usize>, now_ms: u64) -> usize {
        let n = self.list.len();
        if n <= 1 {
            return 0;
        }
        let start = self.next.fetch_add(1, Relaxed) % n;
        for k in 0..n {
            let i = (start + k) % n;
            if Some(i) != avoid && !self.list[i].skipped(now_ms) && self.is_in(i, now_ms) {
                return i;
            }
        }
        // Every other endpoint is failing too: keep trying them in turn.
        if Some(start) == avoid {
            (start + 1) % n
        } else {
            start
        }
    }

    /// Whether endpoint `i` takes this request: it is in the rotation, or it is on
    /// probation and this request becomes its probe. One whose ejection is over is
    /// re-admitted here.
    fn is_in(&self, i: usize, now_ms: u64) -> bool {
        let health = &self.list[i].health;
        match health.standing(now_ms) {
            Standing::In => true,
            Standing::Ejected | Standing::Probing => false,
            Standing::Due => {
                self.readmit(i, now_ms);
                self.claim_probe(i, now_ms)
            }
            Standing::ProbeFree => self.claim_probe(i, now_ms),
        }
    }

    fn claim_probe(&self, i: usize, now_ms: u64) -> bool {
        let probe_ms = self.outlier.as_ref().map_or(0, |o| o.probe_ms);
        self.list[i]
            .health
            .claim_probe(now_ms, now_ms.saturating_add(probe_ms))
    }

    /// Whether results are judged at all (the upstream has an `[outlier]` section).
    pub fn ejects(&self) -> bool {
        self.outlier.is_some()
    }

    /// What an attempt on endpoint `i` said about it: counted in its tally, and a
    /// success costs a load or two more.
    pub fn report(&self, i: usize, verdict: Verdict) {
        if verdict != Verdict::Neutral && self.outlier.is_some() {
            self.report_at(i, verdict, pool::clock_ms());
        }
    }

    /// [`Endpoints::report`] at `now_ms` on [`pool::clock_ms`].
    pub fn report_at(&self, i: usize, verdict: Verdict, now_ms: u64) {
        let (Some(o), Some(e)) = (&self.outlier, self.list.get(i)) else {
            return;
        };
        match verdict {
            Verdict::Neutral => {}
            Verdict::Success => {
                e.health.tally.record(false, now_ms);
                if e.health.succeeded() {
                    // Its probe answered: back in the rotation, its place freed.
                    self.room.release();
                }
            }
            Verdict::Failure => {
                e.health.tally.record(true, now_ms);
                if let Some(from) = e.health.failed(o.config.consecutive_failures) {
                    self.eject(o, i, from, now_ms);
                }
            }
        }
    }

    /// The failure share of endpoint `i` over the last 10 s, and that of the others in
    /// the rotation together (those out have no say in what the rest still serve).
    fn shares(&self, i: usize, now_ms: u64) -> (Share, Share) {
        let own = self.list[i].health.tally.share(now_ms);
        let others = self
            .list
            .iter()
            .enumerate()
            .filter(|(j, e)| *j != i && !e.health.is_out())
            .fold(Share::default(), |sum, (_, e)| {
                sum + e.health.tally.share(now_ms)
            });
        (own, others)
    }

    /// Ejects endpoint `i`, from the state `from`, if it fails clearly more than the
    /// others: a new ejection if `max_ejected` leaves room (the endpoints skipped for
    /// refusing connections counted in), or the next one of an endpoint whose probe
    /// failed (it kept its place on probation). A probe that failed no worse than the
    /// others puts its endpoint back in the rotation.
    fn eject(&self, o: &Outlier, i: usize, from: u64, now_ms: u64) {
        let e = &self.list[i];
        let new = from == 0;
        let (own, others) = self.shares(i, now_ms);
        if !clearly_worse(own, others) {
            if !new && e.health.pardon(from) {
                self.room.release();
                tracing::info!(
                    upstream = %self.name,
                    endpoint = %e.addr,
                    failing = %percent(own),
                    others_failing = %percent(others),
                    "endpoint back in the rotation: its probe failed, but no worse than the \
                     others fail"
                );
            }
            return;
        }
        if new {
            let skipped = self
                .list
                .iter()
                .enumerate()
                .filter(|(j, other)| *j != i && !other.health.is_out() && other.skipped(now_ms))
                .count();
            if !self.room.reserve(o.max_out, skipped) {
                return;
            }
        }
        let length = o.config.ejection(e.health.ejections());
        let until = now_ms.saturating_add(u64::try_from(length.as_millis()).unwrap_or(u64::MAX));
        if !e.health.eject(from, until) {
            if new {
                self.room.release();
            }
            return;
        }
        o.ejections.inc();
        let why = if new {
            format!("{} failures in a row", o.config.consecutive_failures)
        } else {
            "it failed again on probation".to_string()
        };
        tracing::warn!(
            upstream = %self.name,
            endpoint = %e.addr,
            ejected_for = %format_duration(length),
            in_a_row = e.health.ejections(),
            out = self.room.out(),
            failing = %percent(own),
            others_failing = %percent(others),
            "endpoint ejected: {why}"
        );
    }

    fn readmit(&self, i: usize, now_ms: u64) {
        let e = &self.list[i];
        if e.health.readmit(now_ms) {
            tracing::info!(
                upstream = %self.name,
                endpoint = %e.addr,
                "endpoint re-admitted on probation: one request at a time until one \
                 answers, and ejected again if it fails"
            );
        }
    }

    /// Re-admits every endpoint whose ejection is over (for a quiet upstream, whose
    /// endpoints no request looks at), and says how many are out: ejected, or on
    /// probation until a probe answers.
    pub fn readmit_due(&self) -> usize {
        let now = pool::clock_ms();
        for i in 0..self.list.len() {
            if self.list[i].health.standing(now) == Standing::Due {
                self.readmit(i, now);
            }
        }
        self.room.out()
    }

    pub fn get(&self, i: usize) -> &Endpoint<B> {
        &self.list[i]
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Endpoint<B>> {
        self.list.iter().map(|e| &**e)
    }
}

impl Outlier {
    fn of(config: &UpstreamConfig, endpoints: usize, ejections: IntCounter) -> Option<Self> {
        config.outlier.as_ref().map(|o| Outlier {
            max_out: o.max_out(endpoints),
            probe_ms: u64::try_from(
                config
                    .attempt_timeout
                    .or(config.request_timeout)
                    .unwrap_or(PROBE_TIME)
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
            config: o.clone(),
            ejections,
        })
    }
}

/// A failure share as the log writes it: `30%`.
fn percent(s: Share) -> String {
    format!("{:.0}%", s.ratio() * 100.0)
}

/// Which HTTP to speak to an upstream's endpoints for a request that arrived as
/// `version`.
pub fn want(config: &UpstreamConfig, version: Version) -> Want {
    match (config.protocol, config.tls.is_some()) {
        (Protocol::Http1, _) => Want::Http1,
        (Protocol::H2, _) => Want::Http2,
        (Protocol::Auto, true) => Want::Negotiate,
        (Protocol::Auto, false) if version == Version::HTTP_2 => Want::PreferHttp2,
        (Protocol::Auto, false) => Want::Http1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::NoBody;
    use proptest::prelude::*;

    fn endpoints(n: usize, outlier: &str) -> Endpoints<NoBody> {
        let list: Vec<String> = (1..=n).map(|p| format!("\"127.0.0.1:{p}\"")).collect();
        let text = format!(
            "[upstreams.u]\nauthorities = [\"u\"]\nendpoints = [{}]\nattempt_timeout = \"600ms\"\n{outlier}",
            list.join(", ")
        );
        let config = crate::config::parse("t.toml", &text, std::path::Path::new("."))
            .unwrap_or_else(|e| panic!("{e}"));
        let counter = IntCounter::new("ejections", "test").unwrap_or_else(|_| unreachable!());
        Endpoints::new(&config.upstreams[0], &Arc::default(), 1, counter)
    }

    /// Which endpoints `pick` chooses over `rounds` picks.
    fn chosen(e: &Endpoints<NoBody>, now: u64, rounds: usize) -> Vec<usize> {
        let mut seen: Vec<usize> = (0..rounds).map(|_| e.pick_at(None, now)).collect();
        seen.sort();
        seen.dedup();
        seen
    }

    const OUTLIER: &str =
        "[upstreams.u.outlier]\nconsecutive_failures = 3\nbase_ejection = \"10s\"\n";

    #[test]
    fn an_endpoint_failing_in_a_row_is_ejected_then_readmitted_on_probation() {
        let e = endpoints(3, OUTLIER);
        for _ in 0..2 {
            e.report_at(1, Verdict::Failure, 0);
        }
        assert_eq!(chosen(&e, 0, 9), [0, 1, 2]);
        e.report_at(1, Verdict::Failure, 0);
        assert_eq!(chosen(&e, 1, 9), [0, 2], "out after the third in a row");
        assert_eq!(e.room.out(), 1);
        assert_eq!(chosen(&e, 9_999, 9), [0, 2]);
        assert_eq!(
            chosen(&e, 10_000, 9),
            [0, 1, 2],
            "back after 10 s, for one probe"
        );
        assert_eq!(
            chosen(&e, 10_001, 9),
            [0, 2],
            "one request at a time on probation"
        );
        assert_eq!(e.room.out(), 1, "on probation, it keeps its place");
        e.report_at(1, Verdict::Failure, 10_000);
        assert_eq!(chosen(&e, 29_999, 9), [0, 2], "out again at once, for 20 s");
        assert_eq!(chosen(&e, 30_000, 9), [0, 1, 2]);
        assert_eq!(
            chosen(&e, 30_600, 9),
            [0, 1, 2],
            "a probe that never answered frees the place for another after the attempt's time"
        );
        e.report_at(1, Verdict::Success, 30_600);
        assert_eq!(e.room.out(), 0, "a success ends the probation");
        e.report_at(1, Verdict::Failure, 30_600);
        assert_eq!(chosen(&e, 30_600, 9), [0, 1, 2]);
        assert_eq!(chosen(&e, 30_600, 9), [0, 1, 2], "and it takes a run again");
    }

    #[test]
    fn neutral_results_and_other_endpoints_break_no_run() {
        let e = endpoints(3, OUTLIER);
        for _ in 0..10 {
            e.report_at(0, Verdict::Failure, 0);
            e.report_at(0, Verdict::Success, 0);
            e.report_at(2, Verdict::Neutral, 0);
        }
        assert_eq!(e.room.out(), 0);
        for _ in 0..2 {
            e.report_at(2, Verdict::Failure, 0);
            e.report_at(2, Verdict::Neutral, 0);
            e.report_at(1, Verdict::Success, 0);
        }
        e.report_at(2, Verdict::Failure, 0);
        assert_eq!(chosen(&e, 0, 9), [0, 1]);
    }

    #[test]
    fn failures_every_endpoint_shares_eject_none() {
        let e = endpoints(3, OUTLIER);
        // All three fail 3 in 10, in runs of three: the dependency's errors.
        for round in 0..10 {
            for i in 0..3 {
                let failed = round % 10 < 3;
                let v = if failed {
                    Verdict::Failure
                } else {
                    Verdict::Success
                };
                e.report_at(i, v, 100 * round as u64);
            }
        }
        assert_eq!(e.room.out(), 0);
        // One of them now fails alone: out once its share (7 in 14) is more than twice
        // the others' (6 in 28).
        for _ in 0..4 {
            e.report_at(2, Verdict::Failure, 1_000);
            e.report_at(0, Verdict::Success, 1_000);
            e.report_at(1, Verdict::Success, 1_000);
        }
        assert_eq!(e.room.out(), 1);
        assert_eq!(chosen(&e, 1_000, 9), [0, 1]);
    }

    #[test]
    fn a_probe_failing_with_everyone_else_puts_its_endpoint_back() {
        let e = endpoints(2, OUTLIER);
        for _ in 0..3 {
            e.report_at(1, Verdict::Failure, 0);
            e.report_at(0, Verdict::Success, 0);
        }
        assert_eq!(e.room.out(), 1);
        // Ten seconds on, the whole upstream fails: its probe fails, and so does the
        // other endpoint, as much.
        for _ in 0..20 {
            e.report_at(0, Verdict::Failure, 10_000);
        }
        assert_eq!(chosen(&e, 10_000, 4), [0, 1], "its probe");
        e.report_at(1, Verdict::Failure, 10_000);
        assert_eq!(e.room.out(), 0, "no worse than the other: back in");
        assert_eq!(chosen(&e, 10_001, 4), [0, 1]);
    }

    #[test]
    fn one_endpoint_is_never_ejected_and_without_rules_none_is() {
        let one = endpoints(1, OUTLIER);
        for _ in 0..10 {
            one.report_at(0, Verdict::Failure, 0);
        }
        assert_eq!(one.room.out(), 0);
        let none = endpoints(3, "");
        for _ in 0..10 {
            none.report_at(0, Verdict::Failure, 0);
        }
        assert_eq!(chosen(&none, 0, 9), [0, 1, 2]);
    }

    #[test]
    fn removing_the_rules_on_reload_brings_every_endpoint_back() {
        let e = endpoints(3, OUTLIER);
        for _ in 0..3 {
            e.report_at(2, Verdict::Failure, pool::clock_ms());
        }
        assert_eq!(e.readmit_due(), 1);
        let counter = IntCounter::new("ejections", "test").unwrap_or_else(|_| unreachable!());
        let config = crate::config::parse(
            "t.toml",
            "[upstreams.u]\nauthorities = [\"u\"]\nendpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]\n",
            std::path::Path::new("."),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let shared = e.share(&config.upstreams[0], counter);
        assert_eq!(shared.readmit_due(), 0);
        assert_eq!(chosen(&shared, pool::clock_ms(), 9), [0, 1, 2]);
    }

    #[test]
    fn endpoints_refusing_connections_count_against_max_ejected() {
        let e = endpoints(4, OUTLIER);
        // 50% of 4: two may be out. One refuses connections, so one more may go.
        e.list[0].skip_until(1_000);
        for _ in 0..20 {
            e.report_at(3, Verdict::Success, 0);
        }
        for _ in 0..3 {
            e.report_at(1, Verdict::Failure, 0);
            e.report_at(2, Verdict::Failure, 0);
        }
        assert_eq!(e.room.out(), 1);
        assert_eq!(chosen(&e, 0, 12).len(), 2, "two of four in the rotation");
        // The refusals stop: the second failing endpoint's next failure ejects it.
        e.report_at(2, Verdict::Failure, 1_000);
        assert_eq!(e.room.out(), 2);
    }

    #[derive(Clone, Debug)]
    enum Event {
        Result(usize, bool),
        Refused(usize),
        Wait(u64),
    }

    proptest! {
        /// Whatever the endpoints' results, refusals and the time, the ejected
        /// endpoints never exceed max_ejected (rounded down, never all), and an
        /// ejection only happens while ejected and refusing endpoints together leave
        /// room for it.
        #[test]
        fn max_ejected_is_never_exceeded(
            n in 1usize..8,
            percent in 0u32..=100,
            threshold in 1u32..4,
            events in prop::collection::vec(
                prop_oneof![
                    6 => (0usize..8, prop::bool::weighted(0.8)).prop_map(|(i, f)| Event::Result(i, f)),
                    1 => (0usize..8).prop_map(Event::Refused),
                    1 => (0u64..30_000).prop_map(Event::Wait),
                ],
                1..300,
            ),
        ) {
            let e = endpoints(n, &format!(
                "[upstreams.u.outlier]\nconsecutive_failures = {threshold}\nbase_ejection = \"1s\"\nmax_ejected = \"{percent}%\"\n"
            ));
            let max_out = (f64::from(percent) / 100.0 * n as f64 + 1e-9).floor() as usize;
            let max_out = max_out.min(n - 1);
            let mut now = 0u64;
            for event in events {
                match event {
                    Event::Result(i, failed) => {
                        let i = i % n;
                        let was_out = e.room.out();
                        let others_refusing = (0..n)
                            .filter(|j| *j != i && !e.list[*j].health.is_out() && e.list[*j].skipped(now))
                            .count();
                        let verdict = if failed { Verdict::Failure } else { Verdict::Success };
                        e.report_at(i, verdict, now);
                        if e.room.out() > was_out {
                            prop_assert!(was_out + others_refusing < max_out,
                                "ejected with {was_out} out and {others_refusing} refusing, max {max_out}");
                        }
                    }
                    Event::Refused(i) => e.list[i % n].skip_until(now + 250),
                    Event::Wait(ms) => {
                        now += ms;
                        let _ = e.pick_at(None, now);
                    }
                }
                let out = (0..n).filter(|j| e.list[*j].health.is_out()).count();
                prop_assert_eq!(out, e.room.out());
                prop_assert!(out <= max_out, "{out} ejected, max {max_out}");
            }
        }
    }
}
