//! Which upstream a request is for: by the authority the app called (`Host`,
//! `:authority`, or the authority of an absolute-form URI as sent to an HTTP proxy).
//! Anything no upstream claims gets 404: tollgate is never an open proxy.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::config::cluster::ClusterNames;

/// Authority -> upstream index.
/// A map from names in the config to what they stand for, looked up on every request.
///
/// Hashed with FNV-1a rather than the standard SipHash: SipHash protects maps that
/// requests insert into from collision floods, and these maps are built from the config
/// alone; a request only looks a name up, which hashes its name once whatever it is.
pub type NameMap<V> = HashMap<String, V, BuildHasherDefault<Fnv>>;

/// FNV-1a, 64 bits.
#[derive(Clone, Copy, Debug)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[derive(Debug, Default)]
pub struct Routes {
    exact: NameMap<usize>,
}

impl Routes {
    /// The upstreams' authorities; with `cluster`, a dotless one also under its names in
    /// the pod's namespace (an authority written out wins over an expanded one).
    pub fn new<'a>(
        upstreams: impl Iterator<Item = (usize, &'a [String])>,
        cluster: Option<&ClusterNames>,
    ) -> Self {
        let mut exact = NameMap::default();
        let mut dotless = Vec::new();
        for (i, authorities) in upstreams {
            for a in authorities {
                exact.insert(a.clone(), i);
                dotless.push((a, i));
            }
        }
        if let Some(cluster) = cluster {
            for (a, i) in dotless {
                for name in cluster.expand(a) {
                    exact.entry(name).or_insert(i);
                }
            }
        }
        Routes { exact }
    }

    /// Matches `host:port` exactly first, then the host alone, case-insensitively and
    /// ignoring a trailing dot.
    pub fn lookup(&self, authority: &str) -> Option<usize> {
        let authority = authority.trim_end_matches('.');
        if authority.bytes().any(|b| b.is_ascii_uppercase()) {
            return self.lookup_lower(&authority.to_ascii_lowercase());
        }
        self.lookup_lower(authority)
    }

    fn lookup_lower(&self, authority: &str) -> Option<usize> {
        if let Some(i) = self.exact.get(authority) {
            return Some(*i);
        }
        let host = strip_port(authority);
        if host.len() != authority.len() {
            return self.exact.get(host.trim_end_matches('.')).copied();
        }
        None
    }
}

/// `host:port` -> `host`; `[::1]:80` -> `[::1]`.
fn strip_port(authority: &str) -> &str {
    match authority.rfind(':') {
        Some(i)
            if !authority[i..].contains(']')
                && authority[i + 1..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            &authority[..i]
        }
        _ => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> Routes {
        let a = vec![
            "payments".to_string(),
            "payments.default.svc.cluster.local".to_string(),
        ];
        let b = vec!["ledger:9000".to_string()];
        Routes::new([(0, a.as_slice()), (1, b.as_slice())].into_iter(), None)
    }

    #[test]
    fn a_dotless_authority_matches_its_names_in_the_pods_namespace() {
        let a = vec!["payments".to_string()];
        let b = vec!["ledger:9000".to_string(), "ledger.shop.svc".to_string()];
        let c = vec!["audit".to_string()];
        let cluster = ClusterNames {
            namespace: "shop".into(),
            domain: Some("cluster.local".into()),
        };
        let r = Routes::new(
            [(0, a.as_slice()), (1, b.as_slice()), (2, c.as_slice())].into_iter(),
            Some(&cluster),
        );
        for name in [
            "payments",
            "payments.shop",
            "payments.shop.svc:8080",
            "Payments.Shop.svc.cluster.local.",
            "payments.shop.svc.cluster.local:80",
        ] {
            assert_eq!(r.lookup(name), Some(0), "{name}");
        }
        assert_eq!(r.lookup("ledger.shop:9000"), Some(1));
        assert_eq!(r.lookup("ledger.shop"), None, "the port written stays");
        assert_eq!(r.lookup("payments.default"), None, "another namespace");
        assert_eq!(r.lookup("payments.shop.svc.cluster.other"), None);
        // Outside a pod nothing is expanded.
        let bare = Routes::new([(0, a.as_slice())].into_iter(), None);
        assert_eq!(bare.lookup("payments.shop"), None);
    }

    #[test]
    fn host_matches_with_or_without_port_and_in_any_case() {
        let r = routes();
        assert_eq!(r.lookup("payments"), Some(0));
        assert_eq!(r.lookup("payments:8080"), Some(0));
        assert_eq!(r.lookup("PAYMENTS"), Some(0));
        assert_eq!(r.lookup("payments.default.svc.cluster.local."), Some(0));
        assert_eq!(r.lookup("ledger:9000"), Some(1));
    }

    #[test]
    fn unclaimed_authorities_do_not_match() {
        let r = routes();
        assert_eq!(
            r.lookup("ledger"),
            None,
            "an authority with a port matches only that port"
        );
        assert_eq!(r.lookup("ledger:9001"), None);
        assert_eq!(r.lookup("evil.example.com"), None);
        assert_eq!(r.lookup("payments.evil.example.com"), None);
        assert_eq!(r.lookup(""), None);
    }
}
