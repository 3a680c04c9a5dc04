//! An upstream's endpoints: where they come from, which one an attempt goes to, and
//! which are out for failing.
//!
//! **One address is one endpoint.** In Kubernetes an upstream is a Service, and a
//! Service's name stands for many pods: a headless Service resolves to one address per
//! ready pod. Every per-endpoint rule (round robin, a retry going elsewhere, the skip
//! after a refused connect, ejection, pools) is about one pod, so every address a name
//! resolves to, or a watched Service lists, is an endpoint of its own, with its own
//! pool and health. The names are followed ([`Endpoints`]): re-resolved every 5 s while
//! the upstream is in use, an address that appears takes requests from the next one on,
//! and one that goes takes no new request while those in flight finish. A name whose
//! addresses are not known yet is one endpoint for the moment, resolved as it connects.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::OutgoingBody;
use super::dns::{self, Resolver};
use super::outlier::{EndpointReport, Room, Share, Standing, clearly_worse};
use super::pool::{self, Endpoint};
use crate::config::units::format_duration;
use crate::config::{
    Discovery, EndpointAddr, KubernetesConfig, OutlierConfig, ServicePort, UpstreamConfig,
};
use crate::discovery::{self, DiscoveryMetrics, ServiceWatch};
use crate::metrics::Ejections;

/// How often the names of an upstream in use are looked up again.
pub const FOLLOW_EVERY: Duration = dns::DNS_TTL;
/// An upstream whose endpoints no request asked for in this many rounds of
/// [`FOLLOW_EVERY`] (a minute) stops having its names looked up, until its next
/// request: 2,000 idle upstreams cost no lookups.
const IDLE_ROUNDS: u32 = 12;
/// How many endpoints that left the set are remembered by number, for the access log.
const GONE: usize = 64;
/// How long one round of lookups may wait for a name.
const LOOKUP_PATIENCE: Duration = Duration::from_secs(10);

/// The endpoints of one upstream, and the choice among them.
pub struct Endpoints<B> {
    shared: Arc<Shared<B>>,
    next: AtomicUsize,
    /// Ejection, when the upstream has an `[outlier]` section.
    outlier: Option<Outlier>,
}

/// What every build of an upstream's endpoints on the same transport shares: the
/// endpoints now, where they come from, and how many are out.
struct Shared<B> {
    /// The endpoints now; replaced whole when a name's addresses change.
    set: ArcSwap<Vec<Arc<Endpoint<B>>>>,
    /// The same, when nothing can change them (IP literals only): read without the
    /// swap's bookkeeping.
    fixed: std::sync::OnceLock<Arc<Vec<Arc<Endpoint<B>>>>>,
    /// Where the endpoints come from, in the config's order.
    sources: Box<[Source]>,
    /// Whether any source can change (a name, not only IP literals).
    moving: bool,
    /// A request asked for an endpoint since the last round of lookups.
    used: AtomicBool,
    /// A task follows the names.
    following: AtomicBool,
    /// How many endpoints are ejected.
    room: Room,
    /// The next endpoint's number (an endpoint keeps its number for its life).
    next_id: AtomicUsize,
    /// Said once: the upstream retries but its name leads to one address.
    warned_one: AtomicBool,
    /// The endpoints that went last (at most [`GONE`], retired: no connection is kept
    /// for them): an access log line written after its pod left the set still names it,
    /// as does one of a name's first request, which may connect after the name was
    /// followed into addresses.
    gone: std::sync::Mutex<std::collections::VecDeque<Arc<Endpoint<B>>>>,
    /// Whether requests to it may be retried (for that warning).
    retries: bool,
    make: Make,
    /// The upstream's name, for the log.
    name: Arc<str>,
}

/// What a new endpoint is made with.
struct Make {
    open: Arc<AtomicUsize>,
    workers: usize,
    max_age: Option<Duration>,
}

/// Where some of an upstream's endpoints come from.
enum Source {
    /// An IP literal: one endpoint, for good.
    Fixed(EndpointAddr),
    /// A name: an endpoint per address it resolves to.
    Name(Arc<Resolver>),
    /// A Service's ready pods, watched in the Kubernetes API; until the first list,
    /// the Service's DNS name, as a direct call would use.
    Service(Arc<ServiceWatch>),
}

/// What an endpoint is, as the set knows it again across rebuilds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// One address.
    Addr(SocketAddr),
    /// A name whose addresses are not known yet, resolved as it connects.
    Name(EndpointAddr),
}

/// How long a probe is given when the upstream sets neither timeout.
const PROBE_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// The `[outlier]` rules as one build of the endpoints applies them.
struct Outlier {
    config: OutlierConfig,
    /// How long a probe of an endpoint on probation may take before another request
    /// may be its probe: the attempt timeout, else the request timeout, else
    /// [`PROBE_TIME`].
    probe_ms: u64,
    /// `tollgate_ejections_total{upstream}`.
    ejections: Ejections,
}

impl<B> std::fmt::Debug for Endpoints<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.shared.set.load().iter())
            .finish()
    }
}

impl<B: OutgoingBody> Endpoints<B> {
    /// The endpoints of `config`, with `workers` pools each; `open` counts their
    /// connections, `ejections` their ejections. Names whose addresses are known
    /// already have an endpoint per address; the others are resolved as they connect,
    /// and followed from the first request on.
    pub fn new(
        config: &UpstreamConfig,
        open: &Arc<AtomicUsize>,
        workers: usize,
        ejections: Ejections,
    ) -> Self {
        let sources: Box<[Source]> = config
            .endpoints
            .iter()
            .map(|a| match a.ip() {
                Some(_) => Source::Fixed(a.clone()),
                None => Source::Name(Arc::new(Resolver::new(a.clone()))),
            })
            .collect();
        Self::of_sources(config, sources, open, workers, ejections)
    }

    /// The endpoints of `config` with `discovery = "kubernetes"`: its Service's ready
    /// pods, watched with `kube`'s credentials (counted in `metrics`); the Service's
    /// name, as a direct call would use, until the first list, or for good when there
    /// is nothing to watch with. Without discovery, [`Endpoints::new`].
    pub fn discovered(
        config: &UpstreamConfig,
        kube: &KubernetesConfig,
        metrics: impl FnOnce() -> DiscoveryMetrics,
        open: &Arc<AtomicUsize>,
        workers: usize,
        ejections: Ejections,
    ) -> Self {
        let Discovery::Kubernetes(service) = &config.discovery else {
            return Self::new(config, open, workers, ejections);
        };
        let sources: Box<[Source]> = match discovery::watch(service, kube, metrics()) {
            Ok(w) => Box::new([Source::Service(w)]),
            Err(e) => {
                let name = match &service.namespace {
                    Some(ns) => format!("{}.{ns}", service.name),
                    None => service.name.clone(),
                };
                // A named port has no number without the API.
                let port = match &service.port {
                    ServicePort::Number(n) => *n,
                    ServicePort::Name(_) => 0,
                };
                tracing::error!(
                    upstream = %config.name,
                    error = %e,
                    "the Service cannot be watched: its name is called instead, as a direct \
                     call would (a named port, without the API, leaves no number to call)"
                );
                match port {
                    0 => Box::new([]),
                    port => Box::new([Source::Name(Arc::new(Resolver::new(EndpointAddr {
                        host: name,
                        port,
                    })))]),
                }
            }
        };
        let e = Self::of_sources(config, sources, open, workers, ejections);
        e.follow_services();
        e
    }

    /// Follows the watched Services of these endpoints: every change the watch publishes
    /// is applied at once; stops when the endpoints are gone.
    fn follow_services(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for source in self.shared.sources.iter() {
            if let Source::Service(w) = source {
                let mut changes = w.subscribe();
                let shared = Arc::downgrade(&self.shared);
                rt.spawn(async move {
                    while changes.changed().await.is_ok() {
                        let Some(s) = shared.upgrade() else { return };
                        s.rebuild();
                    }
                });
            }
        }
    }

    /// [`Endpoints::new`] with names looked up by `lookups` (tests).
    #[cfg(test)]
    pub fn with_lookups(config: &UpstreamConfig, lookups: dns::Lookups) -> Self {
        let sources: Box<[Source]> = config
            .endpoints
            .iter()
            .map(|a| match a.ip() {
                Some(_) => Source::Fixed(a.clone()),
                None => Source::Name(Arc::new(Resolver::with_lookups(a.clone(), lookups.clone()))),
            })
            .collect();
        let counter = Ejections::detached();
        Self::of_sources(config, sources, &Arc::default(), 1, counter)
    }

    fn of_sources(
        config: &UpstreamConfig,
        sources: Box<[Source]>,
        open: &Arc<AtomicUsize>,
        workers: usize,
        ejections: Ejections,
    ) -> Self {
        let shared = Arc::new(Shared {
            set: ArcSwap::from_pointee(Vec::new()),
            fixed: std::sync::OnceLock::new(),
            moving: sources.iter().any(|s| matches!(s, Source::Name(_))),
            sources,
            used: AtomicBool::new(false),
            following: AtomicBool::new(false),
            room: Room::default(),
            next_id: AtomicUsize::new(0),
            warned_one: AtomicBool::new(false),
            gone: std::sync::Mutex::default(),
            retries: config.retry.max_attempts > 1,
            make: Make {
                open: open.clone(),
                workers,
                max_age: config.max_connection_age,
            },
            name: config.name.as_str().into(),
        });
        shared.rebuild();
        if shared.sources.iter().all(|s| matches!(s, Source::Fixed(_))) {
            let _ = shared.fixed.set(shared.set.load_full());
        }
        Endpoints {
            outlier: Outlier::of(config, ejections),
            shared,
            next: AtomicUsize::new(0),
        }
    }
}

impl<B: OutgoingBody> Shared<B> {
    /// Makes the set anew from what the sources know now: an endpoint that is still
    /// there keeps its pools and health, a new one starts fresh, and one that went is
    /// retired (no new request; its requests in flight finish).
    fn rebuild(&self) {
        let old = self.set.load_full();
        let mut kept: HashMap<Key, &Arc<Endpoint<B>>> =
            old.iter().map(|e| (key_of(e), e)).collect();
        let mut list = Vec::with_capacity(old.len().max(self.sources.len()));
        let mut seen = std::collections::HashSet::new();
        let mut add = |key: Key, list: &mut Vec<Arc<Endpoint<B>>>| {
            if !seen.insert(key.clone()) {
                return;
            }
            let e = match kept.remove(&key) {
                Some(e) => e.clone(),
                None => Arc::new(self.endpoint(&key)),
            };
            list.push(e);
        };
        for source in self.sources.iter() {
            match source {
                Source::Fixed(a) => {
                    if let Some(ip) = a.ip() {
                        add(Key::Addr(ip), &mut list);
                    }
                }
                Source::Name(r) => match r.known() {
                    Some(addrs) => {
                        for a in addrs.iter() {
                            add(Key::Addr(*a), &mut list);
                        }
                    }
                    None => add(Key::Name(r.addr().clone()), &mut list),
                },
                Source::Service(w) => {
                    let found = w.subscribe().borrow().clone();
                    match found.ready {
                        // An empty list is a Service without a ready pod: no endpoint.
                        Some(addrs) => {
                            for a in addrs.iter() {
                                add(Key::Addr(*a), &mut list);
                            }
                        }
                        None => {
                            if let Some((host, port)) = w.dns_name() {
                                add(Key::Name(EndpointAddr { host, port }), &mut list);
                            }
                        }
                    }
                }
            }
        }
        let changed =
            list.len() != old.len() || list.iter().zip(old.iter()).any(|(a, b)| !Arc::ptr_eq(a, b));
        if !changed {
            return;
        }
        for gone in kept.values() {
            if gone.retire() {
                self.room.release();
            }
            let mut g = self.gone.lock().unwrap_or_else(|p| p.into_inner());
            if g.len() == GONE {
                g.pop_front();
            }
            g.push_back(Arc::clone(gone));
            tracing::info!(upstream = %self.name, endpoint = %gone.addr, "endpoint gone: no new request goes to it");
        }
        if !old.is_empty() {
            for e in list
                .iter()
                .filter(|e| !old.iter().any(|o| Arc::ptr_eq(o, e)))
            {
                tracing::info!(upstream = %self.name, endpoint = %e.addr, "endpoint added");
            }
        }
        self.warn_if_one(&list);
        self.set.store(Arc::new(list));
    }

    fn endpoint(&self, key: &Key) -> Endpoint<B> {
        let addr = match key {
            Key::Addr(a) => EndpointAddr {
                host: a.ip().to_string(),
                port: a.port(),
            },
            Key::Name(n) => n.clone(),
        };
        let id = self.next_id.fetch_add(1, Relaxed);
        Endpoint::new(
            self.name.clone(),
            addr,
            self.make.open.clone(),
            self.make.workers,
            self.make.max_age,
        )
        .numbered(id)
    }

    /// Once: an upstream that retries, whose names lead to one address, is most
    /// likely a Service's virtual IP: a retry lands on a random pod and nothing can be
    /// ejected.
    fn warn_if_one(&self, list: &[Arc<Endpoint<B>>]) {
        let [only] = list else { return };
        let one_address = only.addr.ip().is_some_and(|a| !a.ip().is_loopback());
        if self.retries && self.moving && one_address && !self.warned_one.swap(true, Relaxed) {
            tracing::warn!(
                upstream = %self.name,
                endpoint = %only.addr,
                "one address: a Service VIP? retries land on a random pod and nothing can be \
                 ejected; use a headless Service or discovery = \"kubernetes\""
            );
        }
    }
}

/// The key an endpoint of the set was made for.
fn key_of<B>(e: &Endpoint<B>) -> Key {
    match e.addr.ip() {
        Some(a) => Key::Addr(a),
        None => Key::Name(e.addr.clone()),
    }
}

/// Follows an upstream's names while it is in use: looks them up every
/// [`FOLLOW_EVERY`] and rebuilds the set when their addresses change; stops after a
/// minute without a request, or when the upstream is gone.
async fn follow<B: OutgoingBody>(shared: Weak<Shared<B>>) {
    let mut idle = 0;
    loop {
        let Some(s) = shared.upgrade() else { return };
        let names: Vec<Arc<Resolver>> = s
            .sources
            .iter()
            .filter_map(|src| match src {
                Source::Name(r) => Some(r.clone()),
                _ => None,
            })
            .collect();
        drop(s);
        for r in names {
            let _ = tokio::time::timeout(LOOKUP_PATIENCE, r.fresh()).await;
        }
        let Some(s) = shared.upgrade() else { return };
        s.rebuild();
        drop(s);
        tokio::time::sleep(FOLLOW_EVERY).await;
        let Some(s) = shared.upgrade() else { return };
        if s.used.swap(false, Relaxed) {
            idle = 0;
        } else {
            idle += 1;
            if idle >= IDLE_ROUNDS {
                s.following.store(false, Relaxed);
                // A request that came in between sees nobody following: it starts again.
                if !s.used.load(Relaxed) || s.following.swap(true, Relaxed) {
                    return;
                }
                idle = 0;
            }
        }
    }
}

impl<B: OutgoingBody> Endpoints<B> {
    /// The endpoint for the next attempt: round-robin over the endpoints, skipping
    /// `avoid` (the number of the one that just failed), endpoints that refused a
    /// connection a moment ago and ejected ones, when there is another.
    ///
    /// Round-robin rather than least-loaded on purpose: an endpoint that fails fast has
    /// the fewest requests in flight, so a least-loaded balancer sends retries straight
    /// back to the broken one.
    /// `None`: there is no endpoint (a Service without a ready pod).
    #[inline]
    pub fn pick(&self, avoid: Option<usize>) -> Option<Arc<Endpoint<B>>> {
        if let Some(list) = self.shared.fixed.get() {
            if let [only] = list.as_slice() {
                return Some(only.clone());
            }
            return self.pick_in(list, avoid, pool::clock_ms());
        }
        if self.shared.moving && !self.shared.used.load(Relaxed) {
            self.wake();
        }
        let set = self.shared.set.load();
        // One endpoint: no clock to read, nothing to choose.
        if let [only] = set.as_slice() {
            return Some(only.clone());
        }
        self.pick_in(&set, avoid, pool::clock_ms())
    }

    /// A request asked for an endpoint: the names are followed again if they were not.
    #[cold]
    fn wake(&self) {
        self.shared.used.store(true, Relaxed);
        if !self.shared.following.swap(true, Relaxed) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(follow(Arc::downgrade(&self.shared)));
            } else {
                self.shared.following.store(false, Relaxed);
            }
        }
    }
}

impl<B> Endpoints<B> {
    /// The same endpoints (and their pools and health), with a choice of their own and
    /// the outlier rules of `config`. Without rules, every ejected endpoint is back.
    pub fn share(&self, config: &UpstreamConfig, ejections: Ejections) -> Self {
        let outlier = Outlier::of(config, ejections);
        if outlier.is_none() {
            for e in self.shared.set.load().iter() {
                if e.health.forget() {
                    self.shared.room.release();
                }
            }
        }
        Endpoints {
            shared: self.shared.clone(),
            next: AtomicUsize::new(0),
            outlier,
        }
    }

    /// [`Endpoints::pick`] at `now_ms` on [`pool::clock_ms`].
    pub fn pick_at(&self, avoid: Option<usize>, now_ms: u64) -> Option<Arc<Endpoint<B>>> {
        let set = self.shared.set.load();
        self.pick_in(&set, avoid, now_ms)
    }

    fn pick_in(
        &self,
        set: &[Arc<Endpoint<B>>],
        avoid: Option<usize>,
        now_ms: u64,
    ) -> Option<Arc<Endpoint<B>>> {
        let n = set.len();
        if n <= 1 {
            return set.first().cloned();
        }
        let start = self.next.fetch_add(1, Relaxed) % n;
        for k in 0..n {
            let e = &set[(start + k) % n];
            if Some(e.id) != avoid && !e.skipped(now_ms) && self.is_in(set, e, now_ms) {
                return Some(e.clone());
            }
        }
        // Every other endpoint is failing too: keep trying them in turn.
        if Some(set[start].id) == avoid {
            Some(set[(start + 1) % n].clone())
        } else {
            Some(set[start].clone())
        }
    }

    /// Whether endpoint `e` takes this request: it is in the rotation, or it is on
    /// probation and this request becomes its probe. One whose ejection is over is
    /// re-admitted here.
    fn is_in(&self, _set: &[Arc<Endpoint<B>>], e: &Endpoint<B>, now_ms: u64) -> bool {
        match e.health.standing(now_ms) {
            Standing::In => true,
            Standing::Ejected | Standing::Probing => false,
            Standing::Due => {
                self.readmit(e, now_ms);
                self.claim_probe(e, now_ms)
            }
            Standing::ProbeFree => self.claim_probe(e, now_ms),
        }
    }

    fn claim_probe(&self, e: &Endpoint<B>, now_ms: u64) -> bool {
        let probe_ms = self.outlier.as_ref().map_or(0, |o| o.probe_ms);
        e.health
            .claim_probe(now_ms, now_ms.saturating_add(probe_ms))
    }

    /// Whether results are judged at all (the upstream has an `[outlier]` section).
    pub fn ejects(&self) -> bool {
        self.outlier.is_some()
    }

    /// What an attempt on endpoint `e` said about it: counted in its tally, and a
    /// success costs a load or two more.
    pub fn report(&self, e: &Endpoint<B>, report: EndpointReport) {
        if report != EndpointReport::Neutral && self.outlier.is_some() {
            self.report_at(e, report, pool::clock_ms());
        }
    }

    /// [`Endpoints::report`] at `now_ms` on [`pool::clock_ms`].
    pub fn report_at(&self, e: &Endpoint<B>, report: EndpointReport, now_ms: u64) {
        let Some(o) = &self.outlier else {
            return;
        };
        match report {
            EndpointReport::Neutral => {}
            EndpointReport::Success => {
                e.health.tally.record(false, now_ms);
                if e.health.succeeded() {
                    // Its probe answered: back in the rotation, its place freed.
                    self.shared.room.release();
                }
            }
            EndpointReport::Failure => {
                e.health.tally.record(true, now_ms);
                if let Some(from) = e.health.failed(o.config.consecutive_failures) {
                    self.eject(o, e, from, now_ms);
                }
            }
        }
    }

    /// The failure share of endpoint `e` over the last 10 s, and that of the others in
    /// the rotation together (those out have no say in what the rest still serve).
    fn shares(set: &[Arc<Endpoint<B>>], e: &Endpoint<B>, now_ms: u64) -> (Share, Share) {
        let own = e.health.tally.share(now_ms);
        let others = set
            .iter()
            .filter(|o| o.id != e.id && !o.health.is_out())
            .fold(Share::default(), |sum, o| {
                sum + o.health.tally.share(now_ms)
            });
        (own, others)
    }

    /// Ejects endpoint `e`, from the state `from`, if it fails clearly more than the
    /// others: a new ejection if `max_ejected` leaves room (the endpoints skipped for
    /// refusing connections counted in), or the next one of an endpoint whose probe
    /// failed (it kept its place on probation). A probe that failed no worse than the
    /// others puts its endpoint back in the rotation. An endpoint no longer in the set
    /// is not ejected.
    fn eject(&self, o: &Outlier, e: &Endpoint<B>, from: u64, now_ms: u64) {
        let set = self.shared.set.load();
        if !set.iter().any(|x| x.id == e.id) {
            return;
        }
        let room = &self.shared.room;
        let new = from == 0;
        let (own, others) = Self::shares(&set, e, now_ms);
        if !clearly_worse(own, others) {
            if !new && e.health.pardon(from) {
                room.release();
                tracing::info!(
                    upstream = %self.shared.name,
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
            let skipped = set
                .iter()
                .filter(|x| x.id != e.id && !x.health.is_out() && x.skipped(now_ms))
                .count();
            if !room.reserve(o.config.max_out(set.len()), skipped) {
                return;
            }
        }
        let length = o.config.ejection(e.health.ejections());
        let until = now_ms.saturating_add(u64::try_from(length.as_millis()).unwrap_or(u64::MAX));
        if !e.health.eject(from, until) {
            if new {
                room.release();
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
            upstream = %self.shared.name,
            endpoint = %e.addr,
            ejected_for = %format_duration(length),
            in_a_row = e.health.ejections(),
            out = room.out(),
            failing = %percent(own),
            others_failing = %percent(others),
            "endpoint ejected: {why}"
        );
    }

    fn readmit(&self, e: &Endpoint<B>, now_ms: u64) {
        if e.health.readmit(now_ms) {
            tracing::info!(
                upstream = %self.shared.name,
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
        for e in self.shared.set.load().iter() {
            if e.health.standing(now) == Standing::Due {
                self.readmit(e, now);
            }
        }
        self.shared.room.out()
    }

    /// The endpoint at `i` in the set now.
    #[cfg(test)]
    fn nth(&self, i: usize) -> Arc<Endpoint<B>> {
        self.shared.set.load()[i].clone()
    }

    /// [`Endpoints::report_at`] of the endpoint at `i` in the set now.
    #[cfg(test)]
    fn report_nth(&self, i: usize, report: EndpointReport, now_ms: u64) {
        let e = self.nth(i);
        self.report_at(&e, report, now_ms);
    }

    /// The endpoint numbered `id`, while it is one of the endpoints.
    pub fn by_id(&self, id: usize) -> Option<Arc<Endpoint<B>>> {
        self.shared.set.load().iter().find(|e| e.id == id).cloned()
    }

    /// The address of the endpoint numbered `id`: one in the set, or one that left it
    /// a moment ago.
    pub fn address_of(&self, id: usize) -> Option<SocketAddr> {
        if let Some(e) = self.shared.set.load().iter().find(|e| e.id == id) {
            return e.address();
        }
        let gone = self.shared.gone.lock().unwrap_or_else(|p| p.into_inner());
        gone.iter()
            .rev()
            .find(|g| g.id == id)
            .and_then(|g| g.address())
    }

    /// The endpoints now.
    pub fn now(&self) -> Arc<Vec<Arc<Endpoint<B>>>> {
        self.shared.set.load_full()
    }

    pub fn len(&self) -> usize {
        self.shared.set.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.shared.set.load().is_empty()
    }

    /// The names the endpoints come from (each with what it resolves to).
    pub fn names(&self) -> impl Iterator<Item = &Resolver> {
        self.shared.sources.iter().filter_map(|s| match s {
            Source::Name(r) => Some(&**r),
            _ => None,
        })
    }

    /// The cluster IPs (`clusterIP:port`) of the watched Services: what a captured
    /// connection to one of them dials.
    pub fn service_ips(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.shared.sources.iter().filter_map(|s| match s {
            Source::Service(w) => w.cluster_ip(),
            _ => None,
        })
    }
}

impl Outlier {
    fn of(config: &UpstreamConfig, ejections: Ejections) -> Option<Self> {
        config.outlier.as_ref().map(|o| Outlier {
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
        let counter = Ejections::detached();
        Endpoints::new(&config.upstreams[0], &Arc::default(), 1, counter)
    }

    /// Which endpoints `pick` chooses over `rounds` picks.
    fn chosen(e: &Endpoints<NoBody>, now: u64, rounds: usize) -> Vec<usize> {
        let mut seen: Vec<usize> = (0..rounds)
            .map(|_| e.pick_at(None, now).map_or(usize::MAX, |x| x.id))
            .collect();
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
            e.report_nth(1, EndpointReport::Failure, 0);
        }
        assert_eq!(chosen(&e, 0, 9), [0, 1, 2]);
        e.report_nth(1, EndpointReport::Failure, 0);
        assert_eq!(chosen(&e, 1, 9), [0, 2], "out after the third in a row");
        assert_eq!(e.shared.room.out(), 1);
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
        assert_eq!(e.shared.room.out(), 1, "on probation, it keeps its place");
        e.report_nth(1, EndpointReport::Failure, 10_000);
        assert_eq!(chosen(&e, 29_999, 9), [0, 2], "out again at once, for 20 s");
        assert_eq!(chosen(&e, 30_000, 9), [0, 1, 2]);
        assert_eq!(
            chosen(&e, 30_600, 9),
            [0, 1, 2],
            "a probe that never answered frees the place for another after the attempt's time"
        );
        e.report_nth(1, EndpointReport::Success, 30_600);
        assert_eq!(e.shared.room.out(), 0, "a success ends the probation");
        e.report_nth(1, EndpointReport::Failure, 30_600);
        assert_eq!(chosen(&e, 30_600, 9), [0, 1, 2]);
        assert_eq!(chosen(&e, 30_600, 9), [0, 1, 2], "and it takes a run again");
    }

    #[test]
    fn neutral_results_and_other_endpoints_break_no_run() {
        let e = endpoints(3, OUTLIER);
        for _ in 0..10 {
            e.report_nth(0, EndpointReport::Failure, 0);
            e.report_nth(0, EndpointReport::Success, 0);
            e.report_nth(2, EndpointReport::Neutral, 0);
        }
        assert_eq!(e.shared.room.out(), 0);
        // Endpoint 1's successes between its failures break no run either (and make
        // its share clearly worse than the others', 3 in 3 against 10 in 40).
        for _ in 0..2 {
            e.report_nth(2, EndpointReport::Failure, 0);
            e.report_nth(2, EndpointReport::Neutral, 0);
            for _ in 0..10 {
                e.report_nth(1, EndpointReport::Success, 0);
            }
        }
        e.report_nth(2, EndpointReport::Failure, 0);
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
                    EndpointReport::Failure
                } else {
                    EndpointReport::Success
                };
                e.report_nth(i, v, 100 * round as u64);
            }
        }
        assert_eq!(e.shared.room.out(), 0);
        // One of them now fails alone: out once its share is more than twice the
        // others' and more than chance: not at 7 in 14 against 6 in 28 (chance, one
        // time in 30), at 9 in 16 against 6 in 32.
        let fail_alone = |rounds| {
            for _ in 0..rounds {
                e.report_nth(2, EndpointReport::Failure, 1_000);
                e.report_nth(0, EndpointReport::Success, 1_000);
                e.report_nth(1, EndpointReport::Success, 1_000);
            }
        };
        fail_alone(4);
        assert_eq!(e.shared.room.out(), 0);
        fail_alone(2);
        assert_eq!(e.shared.room.out(), 1);
        assert_eq!(chosen(&e, 1_000, 9), [0, 1]);
    }

    #[test]
    fn a_probe_failing_with_everyone_else_puts_its_endpoint_back() {
        let e = endpoints(2, OUTLIER);
        for _ in 0..3 {
            e.report_nth(1, EndpointReport::Failure, 0);
            e.report_nth(0, EndpointReport::Success, 0);
        }
        assert_eq!(e.shared.room.out(), 1);
        // Ten seconds on, the whole upstream fails: its probe fails, and so does the
        // other endpoint, as much.
        for _ in 0..20 {
            e.report_nth(0, EndpointReport::Failure, 10_000);
        }
        assert_eq!(chosen(&e, 10_000, 4), [0, 1], "its probe");
        e.report_nth(1, EndpointReport::Failure, 10_000);
        assert_eq!(e.shared.room.out(), 0, "no worse than the other: back in");
        assert_eq!(chosen(&e, 10_001, 4), [0, 1]);
    }

    #[test]
    fn one_endpoint_is_never_ejected_and_without_rules_none_is() {
        let one = endpoints(1, OUTLIER);
        for _ in 0..10 {
            one.report_nth(0, EndpointReport::Failure, 0);
        }
        assert_eq!(one.shared.room.out(), 0);
        let none = endpoints(3, "");
        for _ in 0..10 {
            none.report_nth(0, EndpointReport::Failure, 0);
        }
        assert_eq!(chosen(&none, 0, 9), [0, 1, 2]);
    }

    #[test]
    fn removing_the_rules_on_reload_brings_every_endpoint_back() {
        let e = endpoints(3, OUTLIER);
        for _ in 0..3 {
            e.report_nth(2, EndpointReport::Failure, pool::clock_ms());
        }
        assert_eq!(e.readmit_due(), 1);
        let counter = Ejections::detached();
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
        e.nth(0).skip_until(1_000);
        for _ in 0..20 {
            e.report_nth(3, EndpointReport::Success, 0);
        }
        for _ in 0..3 {
            e.report_nth(1, EndpointReport::Failure, 0);
            e.report_nth(2, EndpointReport::Failure, 0);
        }
        assert_eq!(e.shared.room.out(), 1);
        assert_eq!(chosen(&e, 0, 12).len(), 2, "two of four in the rotation");
        // The refusals stop: the second failing endpoint's next failure ejects it.
        e.report_nth(2, EndpointReport::Failure, 1_000);
        assert_eq!(e.shared.room.out(), 2);
    }

    /// The log lines written while `f` runs on this thread.
    async fn logged<F: std::future::Future<Output = ()>>(f: F) -> String {
        use std::sync::Mutex;
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        f.await;
        drop(guard);
        let bytes = sink.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A name that leads to one address off loopback, on an upstream that retries: most
    /// likely a Service's virtual IP, warned about once, however often it is followed;
    /// not for several addresses, nor without retries.
    #[tokio::test(start_paused = true)]
    async fn one_address_behind_a_name_is_warned_about_once_where_retries_are_on() {
        use std::net::{IpAddr, Ipv4Addr};
        let vip = |last: u8| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, last)), 80);
        let follow = |answer: Vec<SocketAddr>, attempts: u32| async move {
            let lookups = dns::Lookups::limited(
                move |_, _| {
                    let now = answer.clone();
                    Box::pin(async move { Ok(now) })
                },
                4,
            );
            let config = crate::config::parse(
                "t.toml",
                &format!(
                    "[upstreams.u]\nauthorities = [\"u\"]\nendpoints = [\"payments:80\"]\n\
                     [upstreams.u.retry]\nmax_attempts = {attempts}\n"
                ),
                std::path::Path::new("."),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let e: Endpoints<NoBody> = Endpoints::with_lookups(&config.upstreams[0], lookups);
            // Followed while in use: three rounds of lookups.
            for _ in 0..3 {
                let _ = e.pick(None);
                tokio::time::sleep(FOLLOW_EVERY + Duration::from_millis(100)).await;
            }
            assert!(e.now().iter().all(|x| x.peer.is_some()), "looked up");
        };
        let warning = "one address: a Service VIP?";
        let one = logged(follow(vec![vip(10)], 3)).await;
        assert_eq!(one.matches(warning).count(), 1, "{one}");
        assert!(
            one.contains("upstream=u") && one.contains("10.96.0.10:80"),
            "{one}"
        );
        let pods = logged(follow(vec![vip(1), vip(2), vip(3)], 3)).await;
        assert!(!pods.contains(warning), "{pods}");
        let no_retries = logged(follow(vec![vip(10)], 1)).await;
        assert!(!no_retries.contains(warning), "{no_retries}");
    }

    /// A name whose addresses the test sets: every address is an endpoint of its own,
    /// an address that appears takes requests at once, one that goes takes no new
    /// request and keeps none of its connections, and one that stays keeps its health.
    #[tokio::test(start_paused = true)]
    async fn every_address_of_a_name_is_an_endpoint_followed_while_in_use() {
        use std::net::{IpAddr, Ipv4Addr};
        use std::sync::Mutex;
        let answer: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
        let addr = |last: u8| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)), 80);
        *answer.lock().unwrap_or_else(|p| p.into_inner()) = vec![addr(1), addr(2), addr(3)];
        let served = answer.clone();
        let lookups = dns::Lookups::limited(
            move |_, _| {
                let now = served.lock().unwrap_or_else(|p| p.into_inner()).clone();
                Box::pin(async move { Ok(now) })
            },
            4,
        );
        let config = crate::config::parse(
            "t.toml",
            "[upstreams.u]\nauthorities = [\"u\"]\nendpoints = [\"payments:80\"]\n\
             [upstreams.u.outlier]\nconsecutive_failures = 3\n",
            std::path::Path::new("."),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let e: Endpoints<NoBody> = Endpoints::with_lookups(&config.upstreams[0], lookups);
        // Not looked up yet: the name is one endpoint, resolved as it connects.
        assert_eq!(e.len(), 1);
        assert_eq!(e.pick(None).map(|x| x.peer), Some(None));
        // The first request starts following the name.
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        while e.len() != 3 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let peers = |e: &Endpoints<NoBody>| {
            let mut p: Vec<_> = e.now().iter().filter_map(|x| x.peer).collect();
            p.sort();
            p
        };
        assert_eq!(peers(&e), [addr(1), addr(2), addr(3)]);
        // Round robin over the three addresses, and a retry goes to another one.
        let first = e.pick(None).map_or(usize::MAX, |x| x.id);
        assert_ne!(e.pick(Some(first)).map(|x| x.id), Some(first));
        let mut seen: Vec<_> = (0..6).map(|_| e.pick(None).and_then(|x| x.peer)).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 3, "each address takes its turn");
        // 10.0.0.1 fails in a row: ejected, as one pod.
        let one = e
            .now()
            .iter()
            .find(|x| x.peer == Some(addr(1)))
            .cloned()
            .unwrap_or_else(|| unreachable!());
        let now = pool::clock_ms();
        for _ in 0..3 {
            e.report_at(&one, EndpointReport::Failure, now);
            for other in e.now().iter().filter(|x| x.id != one.id) {
                e.report_at(other, EndpointReport::Success, now);
            }
        }
        assert_eq!(e.readmit_due(), 1, "the failing pod is out");
        // A pod goes and another comes: within one round of following.
        *answer.lock().unwrap_or_else(|p| p.into_inner()) = vec![addr(2), addr(3), addr(4)];
        let _ = e.pick(None);
        tokio::time::sleep(FOLLOW_EVERY + Duration::from_millis(100)).await;
        assert_eq!(peers(&e), [addr(2), addr(3), addr(4)]);
        assert!(one.retired(), "the gone pod takes no connection back");
        assert_eq!(
            e.address_of(one.id),
            Some(addr(1)),
            "an access log line written after the pod left still names it"
        );
        assert_eq!(
            e.readmit_due(),
            0,
            "its place among the ejected is given back"
        );
        let two = e
            .now()
            .iter()
            .find(|x| x.peer == Some(addr(2)))
            .cloned()
            .unwrap_or_else(|| unreachable!());
        assert!(!two.retired(), "a pod that stays keeps its endpoint");
        // Unused for a minute: no more lookups; the next request follows again.
        tokio::time::sleep(FOLLOW_EVERY * (IDLE_ROUNDS + 2)).await;
        assert!(
            !e.shared.following.load(Relaxed),
            "an idle upstream looks nothing up"
        );
        *answer.lock().unwrap_or_else(|p| p.into_inner()) = vec![addr(5)];
        let _ = e.pick(None);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(peers(&e), [addr(5)], "looked up again at its next request");
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
                        let was_out = e.shared.room.out();
                        let others_refusing = (0..n)
                            .filter(|j| *j != i && !e.nth(*j).health.is_out() && e.nth(*j).skipped(now))
                            .count();
                        let report = if failed { EndpointReport::Failure } else { EndpointReport::Success };
                        e.report_nth(i, report, now);
                        if e.shared.room.out() > was_out {
                            prop_assert!(was_out + others_refusing < max_out,
                                "ejected with {was_out} out and {others_refusing} refusing, max {max_out}");
                        }
                    }
                    Event::Refused(i) => e.nth(i % n).skip_until(now + 250),
                    Event::Wait(ms) => {
                        now += ms;
                        let _ = e.pick_at(None, now);
                    }
                }
                let out = (0..n).filter(|j| e.nth(*j).health.is_out()).count();
                prop_assert_eq!(out, e.shared.room.out());
                prop_assert!(out <= max_out, "{out} ejected, max {max_out}");
            }
        }
    }
}
