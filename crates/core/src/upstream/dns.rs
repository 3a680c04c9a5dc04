//! Resolving an endpoint's name: re-resolved every few seconds, so Kubernetes Service
//! DNS changes are followed, and rotated through the addresses it returns (a headless
//! Service returns one per pod).
//!
//! The system resolver (`getaddrinfo`) blocks a thread per lookup, and a resolver that
//! stops answering holds each one for its own timeouts. So a burst of requests must not
//! become a burst of lookups: one lookup per name is in flight at a time and every
//! request that needs the name waits for its answer (as long as its connect timeout
//! allows); a failed lookup is remembered for [`NEGATIVE_TTL`]; at most
//! [`MAX_LOOKUPS`] lookups are in flight in the whole process; and a known answer that
//! has aged past [`DNS_TTL`] keeps being used while it is looked up again, so a
//! resolver that stops answering does not stop the traffic to addresses already known.
//! The lookup runs on a task of its own, which holds its place among the
//! [`MAX_LOOKUPS`] until the lookup really returns, whoever still waits for it.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use crate::config::EndpointAddr;

/// A name that could not be resolved.
#[derive(Debug, thiserror::Error)]
#[error("cannot resolve {host}: {source}")]
pub struct ResolveError {
    pub host: String,
    pub source: io::Error,
}

/// How long a resolved name is trusted before it is looked up again.
pub const DNS_TTL: Duration = Duration::from_secs(5);
/// How long a failed lookup is remembered before the name is looked up again.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(1);
/// Lookups in flight at once in the whole process (each a blocking thread).
pub const MAX_LOOKUPS: usize = 4;

/// A name lookup in progress.
pub type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>>;

/// How names are looked up (the system resolver, or another one for tests), and the
/// places for lookups in flight, shared by every resolver that uses them.
#[derive(Clone)]
pub struct Lookups {
    lookup: Arc<dyn Fn(String, u16) -> LookupFuture + Send + Sync>,
    places: Arc<Semaphore>,
}

impl std::fmt::Debug for Lookups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookups")
            .field("free", &self.places.available_permits())
            .finish()
    }
}

impl Lookups {
    /// The system resolver (`getaddrinfo`, on the runtime's blocking threads), with
    /// [`MAX_LOOKUPS`] places for the whole process.
    pub fn system() -> Self {
        static SYSTEM: OnceLock<Lookups> = OnceLock::new();
        SYSTEM
            .get_or_init(|| Lookups::system_apart(MAX_LOOKUPS))
            .clone()
    }

    /// The system resolver with `in_flight` places of its own, apart from
    /// [`Lookups::system`]'s: names no upstream lists (requests passed through) cannot
    /// take the places the upstreams' names need.
    pub fn system_apart(in_flight: usize) -> Self {
        Lookups::limited(
            |host, port| {
                Box::pin(async move {
                    tokio::net::lookup_host((host.as_str(), port))
                        .await
                        .map(Iterator::collect)
                })
            },
            in_flight,
        )
    }

    /// `lookup`, with at most `in_flight` lookups at once.
    pub fn limited(
        lookup: impl Fn(String, u16) -> LookupFuture + Send + Sync + 'static,
        in_flight: usize,
    ) -> Self {
        Lookups {
            lookup: Arc::new(lookup),
            places: Arc::new(Semaphore::new(in_flight.max(1))),
        }
    }
}

/// What a finished lookup found; shared with everyone who waited for it.
type Found = Result<Arc<[SocketAddr]>, Arc<io::Error>>;

/// What is known of the name.
#[derive(Default)]
struct Known {
    /// The last answer, and when it came.
    addrs: Option<(Arc<[SocketAddr]>, Instant)>,
    /// The last failure, and when it came.
    failed: Option<(Arc<io::Error>, Instant)>,
    /// The lookup in flight: its answer arrives here.
    pending: Option<watch::Receiver<Option<Found>>>,
}

/// Resolves an endpoint's name, caching the answer briefly and rotating through the
/// addresses it returns (a headless Service returns one per pod).
#[derive(Debug)]
pub struct Resolver {
    addr: EndpointAddr,
    literal: Option<SocketAddr>,
    lookups: Lookups,
    known: Arc<Mutex<Known>>,
    next: AtomicUsize,
}

impl std::fmt::Debug for Known {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Known")
            .field("addrs", &self.addrs.as_ref().map(|(a, _)| a.len()))
            .field("failed", &self.failed.is_some())
            .field("pending", &self.pending.is_some())
            .finish()
    }
}

fn lock(known: &Mutex<Known>) -> MutexGuard<'_, Known> {
    known.lock().unwrap_or_else(|p| p.into_inner())
}

/// A failure handed to one more waiter (an `io::Error` is not `Clone`).
fn copy(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

impl Resolver {
    pub fn new(addr: EndpointAddr) -> Self {
        Self::with_lookups(addr, Lookups::system())
    }

    pub fn with_lookups(addr: EndpointAddr, lookups: Lookups) -> Self {
        Resolver {
            literal: addr.ip(),
            addr,
            lookups,
            known: Arc::default(),
            next: AtomicUsize::new(0),
        }
    }

    /// The name and port this resolves.
    pub fn addr(&self) -> &EndpointAddr {
        &self.addr
    }

    /// One of the name's addresses: a known one, or the answer of the lookup in flight
    /// (started if there is none). The wait is bounded by the caller.
    pub async fn resolve(&self) -> Result<SocketAddr, ResolveError> {
        if let Some(a) = self.literal {
            return Ok(a);
        }
        self.addresses().await.map(|addrs| self.pick(&addrs))
    }

    /// Every address of the name, as [`Resolver::resolve`] would find them: the known
    /// ones, or the answer of the lookup in flight (started if there is none). The wait
    /// is bounded by the caller.
    pub async fn addresses(&self) -> Result<Arc<[SocketAddr]>, ResolveError> {
        if let Some(a) = self.literal {
            return Ok(Arc::new([a]));
        }
        let mut answer = {
            let mut known = lock(&self.known);
            let failed_lately = self.refresh(&mut known);
            if let Some((addrs, _)) = &known.addrs {
                return Ok(addrs.clone());
            }
            match (&known.pending, &known.failed) {
                (Some(answer), _) => answer.clone(),
                (None, Some((e, _))) if failed_lately => return Err(self.error(copy(e))),
                (None, _) => {
                    let answer = self.look_up();
                    known.pending = Some(answer.clone());
                    answer
                }
            }
        };
        let found = match answer.wait_for(Option::is_some).await {
            Ok(found) => found.clone(),
            Err(_) => None,
        };
        match found {
            Some(Ok(addrs)) => Ok(addrs),
            Some(Err(e)) => Err(self.error(copy(&e))),
            None => Err(self.error(io::Error::other("the lookup was abandoned"))),
        }
    }

    /// Every address of the name as a lookup no older than [`DNS_TTL`] found them: the
    /// known answer while it is that young, else the answer of a new lookup (or of the
    /// one in flight). A name that failed a moment ago gives its last answer, if any.
    /// The wait is bounded by the caller.
    pub async fn fresh(&self) -> Result<Arc<[SocketAddr]>, ResolveError> {
        if let Some(a) = self.literal {
            return Ok(Arc::new([a]));
        }
        let mut answer = {
            let mut known = lock(&self.known);
            self.refresh(&mut known);
            match (&known.pending, &known.addrs, &known.failed) {
                (Some(answer), _, _) => answer.clone(),
                (None, Some((addrs, _)), _) => return Ok(addrs.clone()),
                (None, None, Some((e, _))) => return Err(self.error(copy(e))),
                (None, None, None) => {
                    return Err(self.error(io::Error::other("no lookup was made")));
                }
            }
        };
        let found = match answer.wait_for(Option::is_some).await {
            Ok(found) => found.clone(),
            Err(_) => None,
        };
        match found {
            Some(Ok(addrs)) => Ok(addrs),
            Some(Err(e)) => Err(self.error(copy(&e))),
            None => Err(self.error(io::Error::other("the lookup was abandoned"))),
        }
    }

    /// The addresses known now, without waiting: a literal, or the last answer (looked
    /// up again when it has aged). When none is known, a lookup is started (unless one
    /// is in flight or failed a moment ago) for [`Resolver::addresses`] to join.
    pub fn known(&self) -> Option<Arc<[SocketAddr]>> {
        if let Some(a) = self.literal {
            return Some(Arc::new([a]));
        }
        let mut known = lock(&self.known);
        self.refresh(&mut known);
        known.addrs.as_ref().map(|(a, _)| a.clone())
    }

    /// Under the lock: forgets a lookup whose task died with its runtime (a closed
    /// channel), and starts one when no answer is known or the known one has aged,
    /// unless one is in flight or failed a moment ago. Whether one failed a moment ago.
    fn refresh(&self, known: &mut Known) -> bool {
        let failed_lately = known
            .failed
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() < NEGATIVE_TTL);
        if known
            .pending
            .as_ref()
            .is_some_and(|p| p.has_changed().is_err())
        {
            known.pending = None;
        }
        let due = known
            .addrs
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() >= DNS_TTL);
        if due && known.pending.is_none() && !failed_lately {
            known.pending = Some(self.look_up());
        }
        failed_lately
    }

    /// Starts a lookup on a task of its own: it waits for a place, looks the name up,
    /// records the answer and hands it to whoever waits.
    fn look_up(&self) -> watch::Receiver<Option<Found>> {
        let (tx, rx) = watch::channel(None);
        let lookups = self.lookups.clone();
        let known = self.known.clone();
        let (host, port) = (self.addr.host.clone(), self.addr.port);
        tokio::spawn(async move {
            let found = match lookups.places.acquire().await {
                Ok(_place) => (lookups.lookup)(host, port).await,
                Err(_) => Err(io::Error::other("no lookups are taken any more")),
            };
            let found: Found = match found {
                Ok(addrs) if !addrs.is_empty() => Ok(addrs.into()),
                Ok(_) => Err(Arc::new(io::Error::new(
                    io::ErrorKind::NotFound,
                    "no addresses",
                ))),
                Err(e) => Err(Arc::new(e)),
            };
            {
                let mut known = lock(&known);
                let now = Instant::now();
                match &found {
                    Ok(addrs) => {
                        known.addrs = Some((addrs.clone(), now));
                        known.failed = None;
                    }
                    // Out of descriptors is this process's shortage, not the name's.
                    Err(e) if crate::descriptors::is_exhaustion(e) => {}
                    Err(e) => known.failed = Some((e.clone(), now)),
                }
                known.pending = None;
            }
            let _ = tx.send(Some(found));
        });
        rx
    }

    fn pick(&self, addrs: &[SocketAddr]) -> SocketAddr {
        addrs[self.next.fetch_add(1, Relaxed) % addrs.len()]
    }

    fn error(&self, source: io::Error) -> ResolveError {
        ResolveError {
            host: self.addr.host.clone(),
            source,
        }
    }

    /// Forget the known answer (after a connect failure: the pod may be gone). A
    /// lookup in flight goes on.
    pub fn invalidate(&self) {
        if self.literal.is_none() {
            lock(&self.known).addrs = None;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    fn name(host: &str) -> EndpointAddr {
        EndpointAddr {
            host: host.to_string(),
            port: 80,
        }
    }

    const ADDR: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 80);

    /// A lookup that counts its calls and answers with `answer` once `gate` lets it
    /// (each lookup takes one permit for good).
    fn counted(
        calls: &Arc<AtomicUsize>,
        gate: &Arc<tokio::sync::Semaphore>,
        answer: fn() -> io::Result<Vec<SocketAddr>>,
    ) -> Lookups {
        let (calls, gate) = (calls.clone(), gate.clone());
        Lookups::limited(
            move |_, _| {
                calls.fetch_add(1, Relaxed);
                let gate = gate.clone();
                Box::pin(async move {
                    if let Ok(permit) = gate.acquire().await {
                        permit.forget();
                    }
                    answer()
                })
            },
            MAX_LOOKUPS,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_resolutions_of_a_name_share_one_lookup() {
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let r = Arc::new(Resolver::with_lookups(
            name("payments"),
            counted(&calls, &gate, || Ok(vec![ADDR])),
        ));
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..100 {
            let r = r.clone();
            waiting.spawn(async move { r.resolve().await.map_err(|e| e.to_string()) });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(calls.load(Relaxed), 1, "one lookup in flight for the name");
        gate.add_permits(1000);
        while let Some(r) = waiting.join_next().await {
            assert_eq!(r.unwrap(), Ok(ADDR));
        }
        assert_eq!(r.resolve().await.unwrap(), ADDR, "and the answer is cached");
        assert_eq!(calls.load(Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_lookup_is_remembered_for_a_second() {
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(1000));
        let r = Resolver::with_lookups(
            name("gone"),
            counted(&calls, &gate, || Err(io::ErrorKind::NotFound.into())),
        );
        for _ in 0..50 {
            assert!(r.resolve().await.is_err());
        }
        assert_eq!(calls.load(Relaxed), 1);
        tokio::time::advance(NEGATIVE_TTL).await;
        assert!(r.resolve().await.is_err());
        assert_eq!(calls.load(Relaxed), 2, "looked up again after a second");
    }

    /// A resolver that never answers: however many requests wait for names, only a
    /// few lookups (each a blocking thread with the system resolver) are in flight,
    /// one per name at most, and every wait ends with the caller's own timeout.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_resolver_gets_a_bounded_number_of_lookups() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let lookups = Lookups::limited(
            move |_, _| {
                counter.fetch_add(1, Relaxed);
                Box::pin(std::future::pending())
            },
            4,
        );
        let resolvers: Vec<Arc<Resolver>> = (0..50)
            .map(|i| {
                Arc::new(Resolver::with_lookups(
                    name(&format!("n{i}")),
                    lookups.clone(),
                ))
            })
            .collect();
        let mut waiting = tokio::task::JoinSet::new();
        for round in 0..3 {
            for r in &resolvers {
                for _ in 0..20 {
                    let r = r.clone();
                    waiting.spawn(async move {
                        tokio::time::timeout(Duration::from_millis(200), r.resolve()).await
                    });
                }
            }
            while let Some(r) = waiting.join_next().await {
                assert!(
                    r.unwrap().is_err(),
                    "round {round}: timed out, not answered"
                );
            }
        }
        assert_eq!(calls.load(Relaxed), 4, "3000 resolutions of 50 names");
    }

    #[tokio::test(start_paused = true)]
    async fn a_known_answer_is_used_while_it_is_looked_up_again() {
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(1));
        let r = Resolver::with_lookups(name("payments"), counted(&calls, &gate, || Ok(vec![ADDR])));
        assert_eq!(r.resolve().await.unwrap(), ADDR);
        tokio::time::advance(DNS_TTL).await;
        // The refresh hangs (the gate is closed now); the known answer still serves.
        for _ in 0..10 {
            assert_eq!(r.resolve().await.unwrap(), ADDR);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(calls.load(Relaxed), 2, "one refresh");
        // After a connect failure the answer is forgotten, and the wait is the caller's.
        r.invalidate();
        let waited = tokio::time::timeout(Duration::from_millis(100), r.resolve()).await;
        assert!(waited.is_err());
        assert_eq!(calls.load(Relaxed), 2, "the refresh in flight is joined");
    }
}
