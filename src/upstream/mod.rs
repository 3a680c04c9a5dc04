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
//! tunnel); [`pool`] keeps one endpoint's connections and sends on one of them; this
//! file chooses the endpoint.

pub mod connect;
pub mod dns;
pub mod h1;
pub mod pool;
pub mod request;
pub mod response;
pub mod tls;
pub mod tls_failure;
pub mod upgraded;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use bytes::Bytes;
use http::Version;
use http_body::Body;

use crate::config::{Protocol, UpstreamConfig};
use crate::http::BoxError;
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
}

impl<B> std::fmt::Debug for Endpoints<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list.iter()).finish()
    }
}

impl<B: OutgoingBody> Endpoints<B> {
    /// The endpoints of `config`, with `workers` pools each; `open` counts their
    /// connections.
    pub fn new(config: &UpstreamConfig, open: &Arc<AtomicUsize>, workers: usize) -> Self {
        let name: Arc<str> = config.name.as_str().into();
        Endpoints {
            list: config
                .endpoints
                .iter()
                .map(|a| {
                    Arc::new(Endpoint::new(
                        name.clone(),
                        a.clone(),
                        open.clone(),
                        workers,
                    ))
                })
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// The same endpoints (and their pools), with a choice of their own.
    pub fn share(&self) -> Self {
        Endpoints {
            list: self.list.clone(),
            next: AtomicUsize::new(0),
        }
    }

    /// Round-robin over the endpoints, skipping `avoid` (the one that just failed) and
    /// endpoints that refused a connection a moment ago, when there is another.
    ///
    /// Round-robin rather than least-loaded on purpose: an endpoint that fails fast has
    /// the fewest requests in flight, so a least-loaded balancer sends retries straight
    /// back to the broken one.
    pub fn pick(&self, avoid: Option<usize>) -> usize {
        let n = self.list.len();
        if n <= 1 {
            return 0;
        }
        let start = self.next.fetch_add(1, Relaxed) % n;
        let now = pool::clock_ms();
        for k in 0..n {
            let i = (start + k) % n;
            if Some(i) != avoid && !self.list[i].skipped(now) {
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
}

impl<B> Endpoints<B> {
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
