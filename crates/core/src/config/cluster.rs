//! The names a Service goes by inside its cluster. An app in namespace `shop` calls
//! `payments`, and its resolver tries `payments.shop.svc.cluster.local` for it; the
//! same call may be written `payments.shop`, `payments.shop.svc` or in full. So an
//! authority without a dot also matches those three forms for the pod's own namespace
//! (`POD_NAMESPACE`, else the service account's namespace file, else no expansion)
//! and cluster domain (the resolv.conf search entry `NS.svc.D`), and a config written
//! once serves in whichever namespace the pod runs in.

use std::sync::OnceLock;

/// Where the pod runs: what a dotless authority expands with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNames {
    pub namespace: String,
    /// The cluster's DNS domain, when resolv.conf says it.
    pub domain: Option<String>,
}

/// The service account's namespace file, as the kubelet mounts it.
const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

impl ClusterNames {
    /// Read once from the process's environment and files; `None` outside a pod.
    pub fn from_env() -> Option<&'static ClusterNames> {
        static NAMES: OnceLock<Option<ClusterNames>> = OnceLock::new();
        NAMES
            .get_or_init(|| {
                let namespace = std::env::var("POD_NAMESPACE")
                    .ok()
                    .or_else(|| std::fs::read_to_string(NAMESPACE_FILE).ok())
                    .map(|n| n.trim().to_ascii_lowercase())
                    .filter(|n| !n.is_empty())?;
                let domain = std::fs::read_to_string("/etc/resolv.conf")
                    .ok()
                    .and_then(|t| cluster_domain(&t));
                Some(ClusterNames { namespace, domain })
            })
            .as_ref()
    }

    /// The other names of `authority` (`host` or `host:port`, lower case): none unless
    /// its host has no dot and is no IP literal.
    pub fn expand(&self, authority: &str) -> Vec<String> {
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => {
                (h, Some(p))
            }
            _ => (authority, None),
        };
        if host.is_empty()
            || host.contains(['.', '[', ':'])
            || host.bytes().all(|b| b.is_ascii_digit())
            || host == "localhost"
        {
            return Vec::new();
        }
        let ns = &self.namespace;
        let mut hosts = vec![format!("{host}.{ns}"), format!("{host}.{ns}.svc")];
        if let Some(d) = &self.domain {
            hosts.push(format!("{host}.{ns}.svc.{d}"));
        }
        match port {
            Some(p) => hosts.into_iter().map(|h| format!("{h}:{p}")).collect(),
            None => hosts,
        }
    }
}

/// The cluster's DNS domain, from a resolv.conf's search list: `D` of its
/// `NS.svc.D` (or `svc.D`) entry; `None` when there is none.
pub fn cluster_domain(resolv_conf: &str) -> Option<String> {
    let search = resolv_conf
        .lines()
        .filter_map(|l| l.strip_prefix("search"))
        .filter(|rest| rest.starts_with([' ', '\t']))
        .flat_map(str::split_whitespace);
    for entry in search {
        let entry = entry.trim_end_matches('.');
        let domain = match entry.split_once(".svc.") {
            Some((ns, domain)) if !ns.is_empty() && !ns.contains('.') => domain,
            _ => match entry.strip_prefix("svc.") {
                Some(domain) => domain,
                None => continue,
            },
        };
        if !domain.is_empty() {
            return Some(domain.to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dotless_name_has_its_namespace_forms() {
        let c = ClusterNames {
            namespace: "shop".into(),
            domain: Some("cluster.example".into()),
        };
        assert_eq!(
            c.expand("payments"),
            [
                "payments.shop",
                "payments.shop.svc",
                "payments.shop.svc.cluster.example"
            ]
        );
        assert_eq!(
            c.expand("payments:8080"),
            [
                "payments.shop:8080",
                "payments.shop.svc:8080",
                "payments.shop.svc.cluster.example:8080"
            ]
        );
        for none in ["payments.shop", "10.0.0.1:80", "[::1]:80", "localhost", ""] {
            assert!(c.expand(none).is_empty(), "{none}");
        }
        let bare = ClusterNames {
            namespace: "shop".into(),
            domain: None,
        };
        assert_eq!(bare.expand("p"), ["p.shop", "p.shop.svc"]);
    }
}
