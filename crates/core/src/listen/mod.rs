//! The app-facing listeners, whichever side they serve: binding, the accept loops, the
//! count of open client connections, and the drain. A listener is handed a
//! [`crate::server::Service`] (the outbound side's, or the inbound side's) and knows
//! nothing of what its requests are for; what runs the process decides which listener
//! gets which service, and when one is opened or closed.
//!
//! - [`redirect`]: transparent capture, a redirected connection served by the service
//!   its original destination calls for ([`Captures`]), or passed through to it;
//! - [`passthrough`]: a connection passed through, its bytes untouched;
//! - [`sniff`]: whether a captured connection to an upstream's port speaks HTTP.
//!
//! Client connections past `listener.max_connections`, or past what the open-file limit
//! leaves for them ([`crate::descriptors::client_cap`]), are accepted and closed at
//! once. An accept that fails for want of a descriptor sheds the waiting connection
//! with a spare descriptor kept for that, and backs off; it warns once per few seconds.

pub mod passthrough;
pub mod redirect;
pub mod sniff;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::config::ListenerConfig;
use crate::descriptors::{self, Throttled};
use crate::metrics::passthrough::Direction;
use crate::metrics::{Metrics, Shortage};
use crate::worker::Workers;
pub use redirect::Captures;

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what}): {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub what: String,
    pub source: std::io::Error,
}

/// tollgate's own addresses: a redirected connection to one of them is refused, never
/// passed through (it would loop).
pub trait Own: Send + Sync {
    fn is_own(&self, dst: SocketAddr) -> bool;
}

/// The client connections of every listener: how many are open, how many may be, and
/// the drain they are told of.
pub struct Listeners {
    connections: AtomicUsize,
    /// The most client connections open at once: `max_connections`, lowered to what
    /// the open-file limit leaves for them.
    client_cap: usize,
    all_closed: Notify,
    shutdown: watch::Sender<bool>,
}

impl Listeners {
    /// The connections of listeners with `settings`, capped by the open-file limit too.
    pub fn new(settings: &ListenerConfig) -> Arc<Self> {
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
        let (shutdown, _) = watch::channel(false);
        Arc::new(Listeners {
            connections: AtomicUsize::new(0),
            client_cap,
            all_closed: Notify::new(),
            shutdown,
        })
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Acquire)
    }

    /// Told `true` when the drain begins.
    pub fn draining(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Stops `accepting`, asks every connection to finish, and waits for them up to
    /// `drain_timeout`. Returns the connections still open when it gave up.
    pub async fn drain(&self, accepting: Vec<Accepting>, drain_timeout: Duration) -> usize {
        for a in accepting {
            a.stop_accepting().await;
        }
        let _ = self.shutdown.send(true);
        let drained = tokio::time::timeout(drain_timeout, async {
            loop {
                let notified = self.all_closed.notified();
                if self.connections() == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
        if drained.is_err() {
            self.connections()
        } else {
            0
        }
    }
}

/// What every connection of a listener reaches: the count it is in, the metrics, and
/// tollgate's own addresses.
pub struct Serving {
    pub listeners: Arc<Listeners>,
    pub metrics: Arc<Metrics>,
    pub own: Arc<dyn Own>,
}

/// The accept loops of one address, one per worker.
pub struct Accepting {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Accepting {
    /// Where it is bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub async fn stop_accepting(self) {
        let _ = self.stop.send(true);
        // The listeners are dropped with the tasks: the port refuses new connections.
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Listening sockets for one address, one per worker.
pub struct Bound {
    addr: SocketAddr,
    listeners: Vec<(Option<Handle>, TcpListener)>,
}

impl Bound {
    /// Where it is bound (the port the system chose, for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Binds `addr` (`what` names it in the config, for the error) once per worker.
pub async fn bind(addr: SocketAddr, what: &str, workers: &Workers) -> Result<Bound, BindError> {
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

/// One open client connection in its listener's count, given back when dropped; it
/// carries what the listener's connections reach too.
struct ConnCount(Arc<Serving>);

impl Drop for ConnCount {
    fn drop(&mut self) {
        let listeners = &self.0.listeners;
        if listeners.connections.fetch_sub(1, AcqRel) == 1 {
            listeners.all_closed.notify_waiters();
        }
    }
}

/// Serves the connections of `bound` with `service`; with `capture`, connections
/// redirected to it are told apart ([`redirect`]).
pub fn accept<S: Captures>(
    bound: Bound,
    serving: &Arc<Serving>,
    service: S,
    capture: Option<Direction>,
    settings: ListenerConfig,
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
            serving.clone(),
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
    serving: Arc<Serving>,
    settings: ListenerConfig,
    mut stopped: watch::Receiver<bool>,
) {
    let mut spare = Spare::new();
    let listeners = &serving.listeners;
    loop {
        tokio::select! {
            biased;
            _ = stopped.changed() => break,
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    if listeners.connections() >= listeners.client_cap {
                        // Over the limit: close at once rather than queue.
                        drop(stream);
                        continue;
                    }
                    listeners.connections.fetch_add(1, AcqRel);
                    let shutdown = listeners.shutdown.subscribe();
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
                        ConnCount(serving.clone()),
                        settings,
                        shutdown,
                    ));
                }
                Err(e) if descriptors::is_exhaustion(&e) => {
                    serving.metrics.exhausted(Shortage::Accept).inc();
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
