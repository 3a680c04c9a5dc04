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
//! [`outlier`] is each endpoint's health; [`endpoints`] follows an upstream's
//! endpoints, chooses among them, and ejects and re-admits them as their results come
//! in.

pub mod connect;
pub mod dns;
pub mod endpoints;
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

use bytes::Bytes;
use http::Version;
use http_body::Body;

use crate::config::{Protocol, UpstreamConfig};
use crate::http::BoxError;
use pool::Want;

pub use endpoints::Endpoints;

/// What this layer can send as a request body: any body of bytes, its errors boxed.
pub trait OutgoingBody:
    Body<Data = Bytes, Error = BoxError> + Unpin + Send + Sync + 'static
{
}

impl<T> OutgoingBody for T where
    T: Body<Data = Bytes, Error = BoxError> + Unpin + Send + Sync + 'static
{
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
