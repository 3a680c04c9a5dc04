//! Which upstream a captured connection is for, by the address the app connected to.
//!
//! With capture, the app connects to the upstream itself (a Service's ClusterIP, a pod,
//! an IP from its own config) and the connection arrives at the outbound listener
//! redirected. The address it was meant for belongs to an upstream when it is one of
//! the upstream's endpoints (an IP literal, or a name's address as tollgate resolves it
//! for connecting), the `clusterIP:port` of the Service it watches (`discovery =
//! "kubernetes"`), or an `ip:port` among its authorities. Such a connection is HTTP to
//! that upstream; any other is passed through untouched.
//!
//! Built once per snapshot: the literals are a map; names are asked of the endpoints'
//! own resolvers (the addresses they last found), and a name of the right port that has
//! no address yet is resolved before the connection is judged, within the upstream's
//! `connect_timeout`. The endpoints of an upstream with `[tls]` are left out: an app that
//! connects to them speaks TLS itself, which tollgate cannot read, so it is passed
//! through (its `ip:port` authorities still count: an app sends plain HTTP to those).
//! When two upstreams claim an address, the first in the file has it.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::net::SocketAddr;
use std::sync::Arc;

use super::Upstream;
use super::handler::Outbound;
use super::route::Fnv;
use crate::config::Config;
use crate::listen::Captures;

/// The addresses that belong to upstreams.
#[derive(Debug, Default)]
pub struct Destinations {
    /// IP-literal endpoints and `ip:port` authorities -> upstream index.
    literal: HashMap<SocketAddr, usize, BuildHasherDefault<Fnv>>,
    /// Whether any upstream that counts has an endpoint given by name.
    named: bool,
}

impl Destinations {
    pub fn new(config: &Config) -> Self {
        let mut literal = HashMap::default();
        let mut named = false;
        for (i, u) in config.upstreams.iter().enumerate() {
            // A watched Service is known by its cluster IP, read at run time.
            named |= u.discovery != crate::config::Discovery::Dns && u.tls.is_none();
            let endpoints = u.endpoints.iter().filter(|_| u.tls.is_none());
            for e in endpoints {
                match e.ip() {
                    Some(a) => {
                        literal.entry(a.canonical()).or_insert(i);
                    }
                    None => named = true,
                }
            }
            for a in &u.authorities {
                if let Ok(a) = a.parse::<SocketAddr>() {
                    literal.entry(a.canonical()).or_insert(i);
                }
            }
        }
        Destinations { literal, named }
    }

    /// The upstream that `dst` belongs to, if any (an index into `upstreams`, the
    /// snapshot's, built from the same config).
    pub async fn upstream_of(&self, upstreams: &[Arc<Upstream>], dst: SocketAddr) -> Option<usize> {
        let dst = dst.canonical();
        if let Some(i) = self.literal.get(&dst) {
            return Some(*i);
        }
        if !self.named {
            return None;
        }
        // Names of this port: their known addresses, and which have none yet.
        let mut unknown = Vec::new();
        for (i, up) in upstreams.iter().enumerate() {
            if up.config().tls.is_some() {
                continue;
            }
            // A watched Service: its cluster IP, as the app dials it.
            if up.endpoints().service_ips().any(|a| a.canonical() == dst) {
                return Some(i);
            }
            let names = up
                .endpoints()
                .names()
                .filter(|r| r.addr().port == dst.port());
            for r in names {
                match r.known() {
                    Some(addrs) if holds(&addrs, dst) => return Some(i),
                    Some(_) => {}
                    None => unknown.push((i, r)),
                }
            }
        }
        if unknown.is_empty() {
            return None;
        }
        // Looked up now (the lookups were started above, side by side); a name that
        // cannot be resolved in time owns nothing.
        let limit = unknown
            .iter()
            .map(|(i, _)| upstreams[*i].config().connect_timeout)
            .max()
            .unwrap_or_default();
        tokio::time::timeout(limit, async {
            for (i, r) in unknown {
                if let Ok(addrs) = r.addresses().await
                    && holds(&addrs, dst)
                {
                    return Some(i);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }
}

/// A connection redirected to the outbound listener is HTTP to the upstream its
/// original destination belongs to, as on the upstream's own `listen` port.
impl Captures for Outbound {
    async fn redirected(&self, original: SocketAddr) -> Option<Self> {
        let snap = self.shared.snapshot();
        let i = snap
            .destinations
            .upstream_of(&snap.upstreams, original)
            .await?;
        Some(Outbound {
            shared: self.shared.clone(),
            dedicated: Some(snap.upstreams[i].name().into()),
            captured: Some(original),
            wire: super::handler::Endpoints,
        })
    }
}

fn holds(addrs: &[SocketAddr], dst: SocketAddr) -> bool {
    addrs.iter().any(|a| a.canonical() == dst)
}

/// An address with an IPv4-mapped IPv6 address made IPv4, so both spellings match.
trait Canonical {
    fn canonical(self) -> Self;
}

impl Canonical for SocketAddr {
    fn canonical(self) -> Self {
        SocketAddr::new(self.ip().to_canonical(), self.port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_endpoints_and_ip_authorities_belong_to_their_upstream_and_tls_ones_do_not() {
        let text = r#"
[upstreams.a]
authorities = ["a", "10.1.1.1:80"]
endpoints = ["10.0.0.1:8080", "a-1:8080"]
[upstreams.b]
authorities = ["b"]
endpoints = ["10.0.0.1:8080", "10.0.0.2:9000"]
[upstreams.secure]
authorities = ["secure", "10.9.9.9:8443"]
endpoints = ["10.0.0.3:443"]
[upstreams.secure.tls]
server_name = "secure.example"
"#;
        let config = crate::config::parse("t.toml", text, std::path::Path::new("."))
            .unwrap_or_else(|e| panic!("{e}"));
        let d = Destinations::new(&config);
        let at = |s: &str| {
            d.literal
                .get(&s.parse::<SocketAddr>().unwrap_or_else(|e| panic!("{e}")))
                .copied()
        };
        assert_eq!(
            at("10.0.0.1:8080"),
            Some(0),
            "the first upstream in the file"
        );
        assert_eq!(at("10.1.1.1:80"), Some(0));
        assert_eq!(at("10.0.0.2:9000"), Some(1));
        assert_eq!(at("10.0.0.3:443"), None, "the app speaks TLS to it itself");
        assert_eq!(at("10.9.9.9:8443"), Some(2));
        assert_eq!(at("10.0.0.1:8081"), None);
        assert!(d.named);
    }
}
