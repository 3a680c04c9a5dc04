//! Resolving an endpoint's name: re-resolved every few seconds, so Kubernetes Service
//! DNS changes are followed, and rotated through the addresses it returns (a headless
//! Service returns one per pod).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
const DNS_TTL: Duration = Duration::from_secs(5);

/// Resolves an endpoint's name, caching the answer briefly and rotating through the
/// addresses it returns (a headless Service returns one per pod).
#[derive(Debug)]
pub struct Resolver {
    addr: EndpointAddr,
    literal: Option<SocketAddr>,
    cache: Mutex<Option<(Arc<[SocketAddr]>, Instant)>>,
    next: AtomicUsize,
}

impl Resolver {
    pub fn new(addr: EndpointAddr) -> Self {
        Resolver {
            literal: addr.ip(),
            addr,
            cache: Mutex::new(None),
            next: AtomicUsize::new(0),
        }
    }

    pub async fn resolve(&self) -> Result<SocketAddr, ResolveError> {
        if let Some(a) = self.literal {
            return Ok(a);
        }
        let cached = {
            let guard = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            guard
                .as_ref()
                .filter(|(_, at)| at.elapsed() < DNS_TTL)
                .map(|(addrs, _)| addrs.clone())
        };
        let addrs = match cached {
            Some(a) => a,
            None => {
                let found: Arc<[SocketAddr]> =
                    tokio::net::lookup_host((self.addr.host.as_str(), self.addr.port))
                        .await
                        .map_err(|source| ResolveError {
                            host: self.addr.host.clone(),
                            source,
                        })?
                        .collect();
                if found.is_empty() {
                    return Err(ResolveError {
                        host: self.addr.host.clone(),
                        source: io::Error::new(io::ErrorKind::NotFound, "no addresses"),
                    });
                }
                *self.cache.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((found.clone(), Instant::now()));
                found
            }
        };
        let i = self.next.fetch_add(1, Relaxed) % addrs.len();
        Ok(addrs[i])
    }

    /// Forget the cached answer (after a connect failure: the pod may be gone).
    pub fn invalidate(&self) {
        if self.literal.is_none() {
            *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}
