//! The proxy as it runs: the app-facing listeners and their connections, the config
//! snapshot every request reads, and the orderly ways it changes (reload) and ends
//! (drain).
//!
//! - [`crate::server`]: client connections and their codecs, handed a
//!   [`crate::server::Service`];
//! - [`handler`]: the outbound service: route, admit, deadline, retry, answer (the
//!   inbound side's listener, when the config has one, is handed
//!   [`crate::inbound::InboundService`] instead);
//! - [`route`], [`snapshot`], [`grpc`]: what the handler works with;
//! - [`redirect`], [`destinations`], [`passthrough`]: transparent capture, a redirected
//!   connection served by the service its original destination calls for, or passed
//!   through to it untouched.
//!
//! The snapshot is an `ArcSwap`: a request loads it once, clones the `Arc` of the one
//! upstream it needs and keeps it to the end, so a reload never changes a request
//! midway and never makes one wait.
//!
//! Client connections past `listener.max_connections`, or past what the open-file limit
//! leaves for them ([`crate::descriptors::client_cap`]), are accepted and closed at
//! once. An accept that fails for want of a descriptor sheds the waiting connection
//! with a spare descriptor kept for that, and backs off; it warns once per few seconds.

mod app_retries;
mod apply;
pub mod destinations;
pub mod handler;
mod local;
pub mod origins;
pub mod passthrough;
pub mod redirect;
pub mod route;
pub mod snapshot;
pub mod unrouted;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::{TcpListener, TcpSocket};
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::descriptors::{self, Throttled};
use crate::inbound::Inbound;
use crate::metrics::passthrough::Direction;
use crate::metrics::{Metrics, Shortage};
use crate::server::AppBody;
use crate::worker::Workers;
use handler::Outbound;
use redirect::Captures;
pub use snapshot::Snapshot;

/// An upstream as the proxy runs it: the retry engine's, sending the app's bodies.
pub type Upstream = crate::retry::Upstream<AppBody>;

/// State every connection and request of the process shares.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub metrics: Arc<Metrics>,
    /// Requests no upstream claimed (plain HTTP, and gRPC calls).
    pub unrouted: [prometheus::IntCounter; 2],
    /// Requests for unknown authorities passed through, and where to.
    pub passing: Arc<unrouted::Passing>,
    /// The inbound side, when the config has one (fixed at start: it is a listener).
    pub inbound: Option<Arc<Inbound>>,
    /// Listeners bound and config loaded (and not draining): `/readyz` says 200.
    pub ready: AtomicBool,
    /// Where the outbound and inbound listeners are bound: a redirected connection is
    /// never passed through to them.
    own: Box<[SocketAddr]>,
    /// Where the admin endpoint is bound, once it is (its configured port may be 0).
    pub admin_bound: std::sync::OnceLock<SocketAddr>,
    connections: AtomicUsize,
    /// The most client connections open at once: `max_connections`, lowered to what
    /// the open-file limit leaves for them.
    client_cap: usize,
    all_closed: Notify,
    shutdown: watch::Sender<bool>,
}

impl Shared {
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Acquire)
    }

    /// Whether `dst` is one of tollgate's own listeners: the outbound and inbound ones,
    /// the admin endpoint, an upstream's own `listen` port.
    pub(crate) fn is_own(&self, dst: SocketAddr) -> bool {
        let snap = self.snapshot.load();
        let config = &snap.config;
        let mut own = self
            .own
            .iter()
            .copied()
            .chain([config.admin.addr])
            .chain(self.admin_bound.get().copied())
            .chain(config.upstreams.iter().filter_map(|u| u.listen));
        let ip = dst.ip().to_canonical();
        own.any(|l| {
            l.port() == dst.port()
                // A connection to 0.0.0.0 reaches this host, at whichever address listens.
                && (ip.is_unspecified()
                    || l.ip().to_canonical() == ip
                    || (l.ip().is_unspecified() && is_local(ip)))
        })
    }
}

/// Whether a local socket may be bound to `ip`: whether it is one of this host's (this
/// network namespace's) addresses.
fn is_local(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what}): {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub what: String,
    pub source: std::io::Error,
}

/// The accept loops of one address, one per worker.
struct Accepting {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Listening sockets for one address, one per worker.
struct Bound {
    addr: SocketAddr,
    listeners: Vec<(Option<Handle>, TcpListener)>,
}

/// A running proxy: its listeners and the handles to reload and stop it.
pub struct Server {
    shared: Arc<Shared>,
    workers: Workers,
    main_addr: SocketAddr,
    /// Dedicated `listen` ports, by upstream name.
    dedicated: std::sync::Mutex<HashMap<String, Accepting>>,
    main: std::sync::Mutex<Option<Accepting>>,
    /// The inbound side's listener, and where it is bound.
    inbound: std::sync::Mutex<Option<Accepting>>,
    inbound_addr: Option<SocketAddr>,
    sweeper: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.sweeper.abort();
    }
}

/// How often idle upstream connections are looked at for ones the endpoint closed.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Closes, every [`SWEEP_EVERY`], the idle upstream connections their endpoint has
/// closed, so a quiet upstream does not leave sockets half-closed until its next
/// request; and re-admits the ejected endpoints whose time is up, so the log says so
/// when it happens, not at the next request.
fn sweeper(shared: &Arc<Shared>) -> JoinHandle<()> {
    let shared = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            for up in shared.snapshot.load().upstreams.iter() {
                for ep in up.endpoints().iter() {
                    ep.sweep();
                }
                up.endpoints().readmit_due();
            }
            if let Some(inbound) = &shared.inbound {
                inbound.sweep();
            }
            shared.passing.origins.sweep();
        }
    })
}

async fn bind(addr: SocketAddr, what: &str, workers: &Workers) -> Result<Bound, BindError> {
    let fail = |source| BindError {
        addr,
        what: what.to_string(),
        source,
    };
    if workers.handles().is_empty() {
        let l = TcpListener::bind(addr).await.map_err(fail)?;
        return Ok(Bound {
            addr: l.local_addr().map_err(fail)?,
            listeners: vec![(None, l)],
        });
    }
    if addr.port() != 0 {
        // The workers share the port through SO_REUSEPORT, and so would any other
        // process that asks: a second tollgate started by mistake would silently take a
        // share of the connections. A plain bind (no SO_REUSEPORT) fails while anyone
        // listens there, reuse-port or not.
        exclusive(addr).map_err(fail)?;
    }
    let mut actual = addr;
    let mut listeners = Vec::new();
    for h in workers.handles() {
        // Registered with the worker's own reactor.
        let _in_worker = h.enter();
        let socket = if actual.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(fail)?;
        socket.set_reuseaddr(true).map_err(fail)?;
        socket.set_reuseport(true).map_err(fail)?;
        socket.bind(actual).map_err(fail)?;
        let l = socket.listen(1024).map_err(fail)?;
        // Port 0: the others join the port the first one got.
        actual = l.local_addr().map_err(fail)?;
        listeners.push((Some(h.clone()), l));
    }
    Ok(Bound {
        addr: actual,
        listeners,
    })
}

/// Whether `addr` is free for tollgate alone: bound for a moment without SO_REUSEPORT
/// (SO_REUSEADDR only lets it past connections of an earlier run in TIME_WAIT).
fn exclusive(addr: SocketAddr) -> std::io::Result<()> {
    let probe = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    probe.set_reuse_address(true)?;
    match probe.bind(&addr.into()) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(std::io::Error::new(
            e.kind(),
            "another process already listens there (another tollgate?); tollgate does not \
             share its ports",
        )),
        other => other,
    }
}

impl Server {
    /// Binds every listener of `config` and starts serving on `workers`.
    pub async fn start(
        config: Config,
        metrics: Arc<Metrics>,
        workers: Workers,
    ) -> Result<Self, BindError> {
        let main_listener = bind(config.listener.addr, "listener.addr", &workers).await?;
        let main_addr = main_listener.addr;
        let mut dedicated_listeners = Vec::new();
        for u in &config.upstreams {
            if let Some(addr) = u.listen {
                let l = bind(addr, &format!("upstreams.{}.listen", u.name), &workers).await?;
                dedicated_listeners.push((u.name.clone(), l));
            }
        }
        let inbound_listener = match &config.inbound {
            Some(i) => Some(bind(i.addr, "inbound.addr", &workers).await?),
            None => None,
        };
        let (shutdown, _) = watch::channel(false);
        let settings = config.listener;
        let soft_limit = descriptors::soft_limit();
        let client_cap = descriptors::client_cap(settings.max_connections, soft_limit);
        if client_cap < settings.max_connections {
            tracing::info!(
                client_connections = client_cap,
                max_connections = settings.max_connections,
                open_file_limit = soft_limit,
                "client connections capped by the open-file limit (half of it is kept for upstream connections)"
            );
        }
        let snapshot = Snapshot::build(config, &metrics, None, workers.count());
        let config = &snapshot.config;
        let inbound = config.inbound.as_ref().map(|i| {
            let settings = (&config.deadline, config.access_log, snapshot.tracer.clone());
            Inbound::new(i, settings, metrics.clone(), workers.count())
        });
        metrics.mark_loaded();
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snapshot),
            unrouted: [metrics.unrouted(false), metrics.unrouted(true)],
            passing: unrouted::Passing::new(&metrics, workers.count()),
            inbound,
            metrics,
            ready: AtomicBool::new(false),
            own: [Some(main_addr), inbound_listener.as_ref().map(|l| l.addr)]
                .into_iter()
                .flatten()
                .collect(),
            admin_bound: std::sync::OnceLock::new(),
            connections: AtomicUsize::new(0),
            client_cap,
            all_closed: Notify::new(),
            shutdown,
        });
        let main = accept(
            main_listener,
            &shared,
            outbound(&shared, None),
            Some(Direction::Outbound),
            settings,
        );
        let inbound_addr = inbound_listener.as_ref().map(|l| l.addr);
        let inbound = match (inbound_listener, &shared.inbound) {
            (Some(l), Some(i)) => Some(accept(
                l,
                &shared,
                i.service(),
                Some(Direction::Inbound),
                settings,
            )),
            _ => None,
        };
        let mut dedicated = HashMap::new();
        for (name, l) in dedicated_listeners {
            let service = outbound(&shared, Some(name.clone().into()));
            let a = accept(l, &shared, service, None, settings);
            shared.metrics.listener_up(&name, true);
            dedicated.insert(name, a);
        }
        shared.ready.store(true, Release);
        Ok(Server {
            sweeper: sweeper(&shared),
            shared,
            workers,
            main_addr,
            dedicated: std::sync::Mutex::new(dedicated),
            main: std::sync::Mutex::new(Some(main)),
            inbound: std::sync::Mutex::new(inbound),
            inbound_addr,
        })
    }

    /// Where the inbound side listens, when the config has one.
    pub fn inbound_addr(&self) -> Option<SocketAddr> {
        self.inbound_addr
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The address the main listener is bound to (useful when configured with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.main_addr
    }

    /// Where an upstream's dedicated listener is bound.
    pub fn listen_addr(&self, upstream: &str) -> Option<SocketAddr> {
        self.dedicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(upstream)
            .map(|a| a.addr)
    }

    fn take_dedicated(&self, name: &str) -> Option<Accepting> {
        self.dedicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
    }

    /// Stops accepting, asks every connection to finish, and waits for them up to
    /// `drain_timeout`. Returns the connections still open when it gave up.
    pub async fn shutdown(&self, drain_timeout: Duration) -> usize {
        self.shared.ready.store(false, Release);
        let mut listeners: Vec<Accepting> = self
            .dedicated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, a)| a)
            .collect();
        listeners.extend(self.main.lock().unwrap_or_else(|p| p.into_inner()).take());
        listeners.extend(
            self.inbound
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        for a in listeners {
            a.stop_accepting().await;
        }
        let _ = self.shared.shutdown.send(true);
        let drained = tokio::time::timeout(drain_timeout, async {
            loop {
                let notified = self.shared.all_closed.notified();
                if self.shared.connections() == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
        if drained.is_err() {
            self.shared.connections()
        } else {
            0
        }
    }
}

impl Accepting {
    async fn stop_accepting(self) {
        let _ = self.stop.send(true);
        // The listeners are dropped with the tasks: the port refuses new connections.
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// One open client connection in its listener's count, given back when dropped; it
/// carries the listener's shared state too.
struct ConnCount(Arc<Shared>);

impl Drop for ConnCount {
    fn drop(&mut self) {
        if self.0.connections.fetch_sub(1, AcqRel) == 1 {
            self.0.all_closed.notify_waiters();
        }
    }
}

/// The outbound service: routed by authority, or on a dedicated port to its upstream.
fn outbound(shared: &Arc<Shared>, dedicated: Option<Arc<str>>) -> Outbound {
    Outbound {
        shared: shared.clone(),
        dedicated,
        captured: None,
    }
}

/// Serves the connections of `bound` with `service`; with `capture`, connections
/// redirected to it are told apart ([`redirect`]).
fn accept<S: Captures>(
    bound: Bound,
    shared: &Arc<Shared>,
    service: S,
    capture: Option<Direction>,
    settings: crate::config::ListenerConfig,
) -> Accepting {
    let (stop, _) = watch::channel(false);
    let mut tasks = Vec::new();
    for (handle, listener) in bound.listeners {
        let work = accept_loop(
            listener,
            Listening {
                bound: bound.addr,
                capture,
                service: service.clone(),
            },
            shared.clone(),
            settings,
            stop.subscribe(),
        );
        tasks.push(match handle {
            Some(h) => h.spawn(work),
            None => tokio::spawn(work),
        });
    }
    Accepting {
        addr: bound.addr,
        stop,
        tasks,
    }
}

/// Accepts that failed for want of a descriptor, and accepts that failed otherwise.
static ACCEPT_EXHAUSTED: Throttled = Throttled::new();
static ACCEPT_FAILED: Throttled = Throttled::new();

/// A descriptor kept free for one thing: when accepting fails for want of one, it is
/// let go, the waiting connection accepted with it and closed at once (the client
/// learns now, instead of waiting in the listen queue for as long as the shortage
/// lasts), and taken again.
struct Spare(Option<std::fs::File>);

impl Spare {
    fn new() -> Self {
        Spare(std::fs::File::open("/dev/null").ok())
    }

    /// Sheds one waiting connection; whether it did.
    fn shed(&mut self, listener: &TcpListener) -> bool {
        let Some(spare) = self.0.take() else {
            *self = Spare::new();
            return false;
        };
        drop(spare);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let shed = matches!(listener.poll_accept(&mut cx), std::task::Poll::Ready(Ok(_)));
        *self = Spare::new();
        shed
    }
}

/// What an accept loop hands each connection.
struct Listening<S> {
    /// Where the listener is bound.
    bound: SocketAddr,
    capture: Option<Direction>,
    service: S,
}

async fn accept_loop<S: Captures>(
    listener: TcpListener,
    listening: Listening<S>,
    shared: Arc<Shared>,
    settings: crate::config::ListenerConfig,
    mut stopped: watch::Receiver<bool>,
) {
    let mut spare = Spare::new();
    loop {
        tokio::select! {
            biased;
            _ = stopped.changed() => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    if shared.connections() >= shared.client_cap {
                        // Over the limit: close at once rather than queue.
                        drop(stream);
                        continue;
                    }
                    shared.connections.fetch_add(1, AcqRel);
                    let shutdown = shared.shutdown.subscribe();
                    // Spawned as it is, not wrapped in a block of its own: the task's
                    // future would hold it twice (as what it was given and as what it
                    // awaits), or behind a box, one more allocation a connection's task
                    // reaches through on every wake-up.
                    tokio::spawn(redirect::connection(
                        stream,
                        peer,
                        listening.bound,
                        listening.capture,
                        listening.service.clone(),
                        ConnCount(shared.clone()),
                        settings,
                        shutdown,
                    ));
                }
                Err(e) if descriptors::is_exhaustion(&e) => {
                    shared.metrics.exhausted(Shortage::Accept).inc();
                    if let Some(n) = ACCEPT_EXHAUSTED.due() {
                        tracing::warn!(count = n, error = %e, "out of file descriptors: new client connections are closed at once (raise the open-file limit, or lower listener.max_connections)");
                    }
                    if !spare.shed(&listener) {
                        // Nothing to shed with: wait for descriptors to be freed.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                Err(e) => {
                    // Back off instead of spinning.
                    if let Some(n) = ACCEPT_FAILED.due() {
                        tracing::warn!(count = n, error = %e, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}
