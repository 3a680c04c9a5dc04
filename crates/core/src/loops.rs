//! tollgate's own connections coming back to it. With transparent capture, the NAT
//! rules must spare tollgate's own outgoing connections (by its UID); when they do not
//! (`tollgate iptables --uid` given another UID than the one tollgate runs as), every
//! connection tollgate opens is redirected to its own listener, which opens another,
//! and so on: one request became hundreds of connections and log lines. Two defences:
//!
//! - At the start, [`self_capture`] connects to one of the pod's own addresses at a
//!   port nothing listens on, as the capture rules would redirect an app's connection,
//!   and sees whether the connection arrives at its own listener: if it does, `run`
//!   refuses to start, naming the UID it runs as. (Spared by the rules, it is refused
//!   at once.)
//! - While running, each outgoing connection's local port is remembered for a moment
//!   ([`outgoing`]); a redirected connection that comes from one of those ports is
//!   tollgate's own coming back ([`is_own`]), and is closed at the first turn (an HTTP
//!   request on it is answered `508`, outcome `loop`).
//!
//! # The table
//!
//! One word per local port (65,536 of them, 256 KiB): the second the port was last used
//! for an outgoing connection. A loop comes back within the connect itself, so a port is
//! remembered for [`REMEMBER`] only. Until a network namespace shows connection tracking
//! (a capture rule exists), nothing is recorded: an outgoing connection costs one
//! atomic load.

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

use socket2::SockRef;
use tokio::net::TcpStream;

/// How long an outgoing connection's port is remembered.
pub const REMEMBER: Duration = Duration::from_secs(10);

/// Whether outgoing connections are recorded: capture may be in use.
static WATCHING: AtomicBool = AtomicBool::new(false);
/// Per local port: the second (since [`origin`], plus one) it last left; 0: never.
static PORTS: [AtomicU32; 65536] = [const { AtomicU32::new(0) }; 65536];

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn second() -> u32 {
    u32::try_from(origin().elapsed().as_secs()).unwrap_or(u32::MAX - 1) + 1
}

/// Records outgoing connections from now on: a capture rule exists, or may.
pub fn watch() {
    if !WATCHING.load(Relaxed) {
        origin();
        WATCHING.store(true, Relaxed);
    }
}

pub fn watching() -> bool {
    WATCHING.load(Relaxed)
}

/// An outgoing connection tollgate opened: its local port is remembered, in case the
/// capture rules send it back here.
#[inline]
pub fn outgoing(stream: &TcpStream) {
    if !WATCHING.load(Relaxed) {
        return;
    }
    if let Ok(local) = stream.local_addr() {
        PORTS[usize::from(local.port())].store(second(), Relaxed);
    }
}

/// Whether a connection from `peer` is one of tollgate's own coming back: from a local
/// address, at a port tollgate connected from a moment ago.
pub fn is_own(peer: SocketAddr) -> bool {
    if !WATCHING.load(Relaxed) {
        return false;
    }
    let at = PORTS[usize::from(peer.port())].load(Relaxed);
    at != 0 && second().saturating_sub(at) <= REMEMBER.as_secs() as u32 && is_local(peer.ip())
}

/// Whether `ip` is one of this network namespace's own addresses.
fn is_local(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Whether the kernel tracks this connection (a NAT rule exists in this network
/// namespace, so capture may be in use): its original destination can be read.
pub fn tracked(stream: &TcpStream) -> bool {
    let sock = SockRef::from(stream);
    let peer = stream.peer_addr();
    match peer {
        Ok(SocketAddr::V6(p)) if p.ip().to_ipv4_mapped().is_none() => {
            sock.original_dst_v6().is_ok()
        }
        Ok(_) => sock.original_dst_v4().is_ok(),
        Err(_) => false,
    }
}

/// The port [`self_capture`] connects to at one of the pod's own addresses: the discard
/// port, which nothing in a pod listens on.
pub const PROBE_PORT: u16 = 9;

/// Where [`self_capture`] connected, once it did.
static PROBE: OnceLock<SocketAddr> = OnceLock::new();
/// Set when a redirected connection to [`PROBE`] reached tollgate's listener.
static PROBE_ARRIVED: AtomicBool = AtomicBool::new(false);

/// A redirected connection whose original destination was `original` arrived; `true`
/// when it is [`self_capture`]'s probe (to be closed at once).
pub fn arrived(original: SocketAddr) -> bool {
    watch();
    let probe = PROBE.get() == Some(&original);
    if probe {
        PROBE_ARRIVED.store(true, Relaxed);
    }
    probe
}

/// Whether tollgate's own connections are captured: with connection tracking on (a
/// connection to `listener`, tollgate's own, shows it), a connection to one of the
/// pod's own addresses at [`PROBE_PORT`] that arrives at tollgate's listener says the
/// rules do not spare tollgate. `false` without tracking (no capture rules at all), or
/// when the probe went out as it should (refused at once, or nothing within `wait`).
pub async fn self_capture(listener: SocketAddr, wait: Duration) -> bool {
    let loopback = match listener {
        SocketAddr::V4(a) if a.ip().is_unspecified() => {
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, a.port()))
        }
        SocketAddr::V6(a) if a.ip().is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
        }
        a => a,
    };
    let Ok(Ok(own)) = tokio::time::timeout(wait, TcpStream::connect(loopback)).await else {
        return false;
    };
    if !tracked(&own) {
        return false;
    }
    drop(own);
    watch();
    let Some(ip) = pod_address() else {
        return false;
    };
    let probe = *PROBE.get_or_init(|| SocketAddr::new(ip, PROBE_PORT));
    let connected = tokio::time::timeout(wait, TcpStream::connect(probe))
        .await
        .is_ok_and(|r| r.is_ok());
    if connected {
        // Connected where nothing listens: redirected. Give the listener's accept a
        // moment to see it.
        let until = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < until && !PROBE_ARRIVED.load(Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    PROBE_ARRIVED.load(Relaxed)
}

/// One of this network namespace's own addresses that is not loopback (what capture
/// rules redirect a connection to): from the kernel's table of local routes.
fn pod_address() -> Option<IpAddr> {
    pod_address_in(&std::fs::read_to_string("/proc/net/fib_trie").ok()?)
}

fn pod_address_in(fib: &str) -> Option<IpAddr> {
    let mut last: Option<IpAddr> = None;
    for line in fib.lines() {
        let line = line.trim();
        if let Some(ip) = line.strip_prefix("|-- ") {
            last = ip.parse().ok();
        } else if line.starts_with("/32 host LOCAL")
            && let Some(ip) = last.filter(|ip| !ip.is_loopback())
        {
            return Some(ip);
        }
    }
    None
}

/// The real user id this process runs as, from `/proc/self/status` (no system call
/// binding needed).
pub fn uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_outgoing_connections_port_is_known_when_it_comes_back() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        watch();
        let out = TcpStream::connect(addr).await.unwrap();
        outgoing(&out);
        let (_, peer) = listener.accept().await.unwrap();
        assert!(is_own(peer), "tollgate's own connection, from {peer}");
        let other = std::net::TcpStream::connect(addr).unwrap();
        let (_, stranger) = listener.accept().await.unwrap();
        assert_eq!(other.local_addr().unwrap(), stranger);
        assert!(!is_own(stranger), "another process's connection");
    }

    #[test]
    fn the_pods_own_address_is_read_from_the_local_routes() {
        let fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n\
                   \x20          |-- 127.0.0.1\n              /32 host LOCAL\n\
                   \x20          |-- 10.213.77.0\n              /30 link UNICAST\n\
                   \x20          |-- 10.213.77.1\n              /32 host LOCAL\n";
        assert_eq!(pod_address_in(fib), Some(IpAddr::from([10, 213, 77, 1])));
        assert_eq!(
            pod_address_in("Main:\n  |-- 127.0.0.1\n  /32 host LOCAL\n"),
            None
        );
    }

    #[test]
    fn the_uid_is_read() {
        assert!(uid().is_some());
    }
}
