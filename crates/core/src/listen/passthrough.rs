//! A redirected connection that tollgate does not own, passed through to where it was
//! going: connected at once, before the client has said anything (a server that speaks
//! first, SMTP or MySQL, is heard), and the bytes carried both ways untouched.
//!
//! Each side's end is passed on as a half-close (the other direction goes on until it
//! ends too), and a reset as a reset. A destination that cannot be reached is told to
//! the client the nearest way there is: its connection, already accepted, is reset. No
//! idle timeout: the connection lives as long as it would without tollgate. On a
//! drain, it is given `drain_timeout` to end by itself, like a request in flight, and is
//! closed then.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use socket2::SockRef;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::ListenerConfig;
use crate::descriptors::{self, Throttled};
use crate::metrics::Metrics;
use crate::metrics::Shortage;
use crate::metrics::passthrough::{Direction, PassFailure};

static NO_DESCRIPTOR: Throttled = Throttled::new();

/// Connects to `dst` within `timeout` (`passthrough_connect_timeout`): a SYN that is
/// never answered would otherwise hold the client (and two descriptors) for the
/// kernel's two minutes. A shortage of descriptors is counted and warned about here.
pub async fn connect(
    dst: SocketAddr,
    timeout: Duration,
    metrics: &Metrics,
) -> io::Result<TcpStream> {
    let e = match tokio::time::timeout(timeout, TcpStream::connect(dst)).await {
        Ok(Ok(s)) => {
            crate::loops::outgoing(&s);
            let _ = s.set_nodelay(true);
            return Ok(s);
        }
        Ok(Err(e)) => e,
        Err(_) => io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
    };
    if descriptors::is_exhaustion(&e) {
        metrics.exhausted(Shortage::Connect).inc();
        if let Some(n) = NO_DESCRIPTOR.due() {
            tracing::warn!(count = n, error = %e, "out of file descriptors: a connection to be passed through is not opened (raise the open-file limit)");
        }
    }
    Err(e)
}

/// Carries `client`'s connection to `dst` and back until both sides have ended, or
/// `drain_timeout` after a drain began. The connect may take
/// `passthrough_connect_timeout`.
pub async fn relay(
    mut client: TcpStream,
    dst: SocketAddr,
    direction: Direction,
    metrics: &Metrics,
    mut shutdown: watch::Receiver<bool>,
    settings: &ListenerConfig,
) {
    let drain_timeout = settings.drain_timeout;
    let mut server = match connect(dst, settings.passthrough_connect_timeout, metrics).await {
        Ok(s) => s,
        Err(e) => {
            metrics
                .passthrough()
                .failure(direction, PassFailure::ConnectFailure)
                .inc();
            tracing::debug!(%dst, error = %e, "cannot pass the connection through");
            reset(&client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let drained = async {
        if shutdown.wait_for(|draining| *draining).await.is_ok() {
            tokio::time::sleep(drain_timeout).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let ended = tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut server) => Some(r),
        _ = drained => None,
    };
    match ended {
        Some(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => {
            // One side reset: so is the other (the one that did is gone already).
            reset(&client);
            reset(&server);
        }
        Some(_) => {}
        None => tracing::debug!(%dst, "passed-through connection closed at the drain timeout"),
    }
}

/// Makes the socket's close a reset (`SO_LINGER` 0).
fn reset(s: &TcpStream) {
    let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
}
