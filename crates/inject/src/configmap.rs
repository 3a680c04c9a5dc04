//! The ConfigMap `inject` writes beside a workload: a `tollgate.toml` to review, with
//! one upstream per Kubernetes Service the app's environment names (a URL such as
//! `http://payments:8080`, or `payments.shop.svc.cluster.local:8080`), or none, the
//! admin port open to the kubelet's probes, and the inbound side in front of the app's
//! port. It passes `tollgate check --strict` as written.

use std::fmt::Write as _;

use yaml_rust2::Yaml;

use super::pod::Owner;
use super::probes::{ADMIN_PORT, Probes};
use super::yaml::{items, str_at};

/// The Service the app calls, as its environment names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Called {
    /// The upstream's name: the Service's (the first label of the host).
    pub service: String,
    /// The host as the app wrote it (`payments`, `ledger.money.svc`): kept so, resolved
    /// in the namespace the pod runs in, as the app's own call is.
    pub host: String,
    pub port: u16,
    /// Where it was named: `CONTAINER: VAR=value`.
    pub named_in: String,
}

/// Ports that speak something other than HTTP, well known enough that a `host:port` on
/// them is never taken for an upstream, and that capture leaves alone: SMTP, MySQL,
/// NATS, PostgreSQL, Redis, Cassandra, Kafka, Elasticsearch's transport, memcached,
/// MongoDB.
pub const OPAQUE_PORTS: [u16; 11] = [
    25, 587, 3306, 4222, 5432, 6379, 9042, 9092, 9300, 11211, 27017,
];

/// How the upstreams find their endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Discovery {
    /// The name the app calls, resolved as the app's own call is.
    #[default]
    Dns,
    /// The Service's EndpointSlices, watched (the namespace carries the RBAC).
    Kubernetes,
}

/// The namespace a host names (`ledger.finance`, `ledger.finance.svc...`: `finance`);
/// `None` for a bare name, resolved in the pod's own.
pub fn namespace_named(host: &str) -> Option<&str> {
    host.split('.').nth(1)
}

/// The ConfigMap's name for a workload.
pub fn name_for(owner: &Owner) -> String {
    format!("{}-tollgate", owner.name)
}

/// The Services the app's containers name in their environment, each once (by host as
/// written; the first port named wins). A port in `opaque` is not HTTP: never an
/// upstream.
pub fn services(spec: &Yaml, opaque: &[u16]) -> (Vec<Called>, Vec<String>) {
    let mut found: Vec<Called> = Vec::new();
    let mut notes = Vec::new();
    for c in items(spec, "containers") {
        let container = str_at(c, "name").unwrap_or_default();
        for var in items(c, "env") {
            let (Some(name), Some(value)) = (str_at(var, "name"), str_at(var, "value")) else {
                continue;
            };
            if let Some(tls) = value.strip_prefix("https://") {
                if let Some((host, _)) = service_in(tls) {
                    notes.push(format!(
                        "{container}: {name} calls {host} over https: passed through untouched \
                         (call http:// and let tollgate originate TLS to retry it)"
                    ));
                }
                continue;
            }
            let rest = match value.strip_prefix("http://") {
                Some(rest) => rest,
                // Without a scheme only `host:port` is taken for an address.
                None if value.contains(':') && !value.contains('/') => value,
                None => continue,
            };
            let Some((host, port)) = service_in(rest) else {
                continue;
            };
            let port = match (port, value.starts_with("http://")) {
                (Some(p), _) => p,
                (None, true) => 80,
                (None, false) => continue,
            };
            if opaque.contains(&port) {
                notes.push(format!(
                    "{container}: {name}={value}: port {port} is not HTTP: no upstream, and \
                     capture leaves it alone"
                ));
                continue;
            }
            if found.iter().any(|f| f.host == host) {
                continue;
            }
            let first = host.split('.').next().unwrap_or(&host).to_string();
            let service = if found.iter().any(|f| f.service == first) {
                host.replace('.', "-")
            } else {
                first
            };
            found.push(Called {
                service,
                host,
                port,
                named_in: format!("{container}: {name}={value}"),
            });
        }
    }
    (found, notes)
}

/// `service[.namespace[.svc[.cluster.local]]][:port]` at the start of `rest`, the host
/// as written (without a trailing dot); a name of two labels is taken for an outside
/// host (`example.com`), not `service.namespace`.
fn service_in(rest: &str) -> Option<(String, Option<u16>)> {
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().ok()?)),
        None => (authority, None),
    };
    let host = host.trim_end_matches('.');
    let labels: Vec<&str> = host.split('.').collect();
    let dns_label = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
    };
    if !labels.iter().all(dns_label) || labels[0].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match labels.as_slice() {
        [one] if *one != "localhost" => {}
        [_, _, "svc", ..] => {}
        _ => return None,
    }
    Some((host.to_string(), port))
}

/// The app's port for `[inbound] app`: the port its HTTP probes ask, else the first
/// TCP port the first container declares, unless that one is not HTTP (`opaque`).
pub fn app_port(spec: &Yaml, probes: &Probes, opaque: &[u16]) -> Option<u16> {
    probes.http_ports.first().copied().or_else(|| {
        let first = items(spec, "containers").first()?;
        tcp_ports(first)
            .into_iter()
            .next()
            .filter(|p| !opaque.contains(p))
    })
}

/// The TCP ports a container declares, in order.
pub fn tcp_ports(container: &Yaml) -> Vec<u16> {
    items(container, "ports")
        .iter()
        .filter(|p| str_at(p, "protocol").is_none_or(|p| p == "TCP"))
        .filter_map(|p| {
            u16::try_from(
                p.as_hash()?
                    .get(&super::yaml::s("containerPort"))?
                    .as_i64()?,
            )
            .ok()
        })
        .collect()
}

/// The text of `tollgate.toml`.
pub fn config_text(
    owner: &Owner,
    called: &[Called],
    probes: &Probes,
    app_port: Option<u16>,
    capture: bool,
    discovery: &dyn Fn(&Called) -> Discovery,
) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# tollgate's config for {}, written by `tollgate inject`: review it (every key:\n\
         # docs/config.md), then `tollgate check --strict` it. Edits reach running pods\n\
         # without a restart.",
        owner.show()
    );
    t.push_str("[listener]\n");
    t.push_str("addr = \"127.0.0.1:15001\"\n");
    t.push_str("drain_timeout = \"20s\"\n");
    if called.is_empty() && app_port.is_none() {
        t.push_str(
            "# No Service found in the app's environment: every call passes through as it is\n\
             # until an upstream is added below.\n\
             unknown_authorities = \"pass\"\n",
        );
    }
    let _ = writeln!(
        t,
        "\n[admin]\n# The pod's interface: the kubelet probes it and Prometheus scrapes it.\n\
         addr = \"0.0.0.0:{ADMIN_PORT}\""
    );
    if !probes.declared.is_empty() {
        let _ = writeln!(
            t,
            "# The app's HTTP probes, through GET /probe/PORT/PATH here: only these exact\n\
             # ports and paths, with their own fields, reach the app.\n\
             probes = ["
        );
        for (port, path, fields) in &probes.declared {
            let fields: Vec<String> = fields
                .iter()
                .map(|(n, v)| format!("{} = {}", quoted(n), quoted(v)))
                .collect();
            let headers = if fields.is_empty() {
                String::new()
            } else {
                format!(", headers = {{ {} }}", fields.join(", "))
            };
            let _ = writeln!(
                t,
                "  {{ port = {port}, path = {}{headers} }},",
                quoted(path)
            );
        }
        t.push_str("]\n");
    }
    for c in called {
        upstream(&mut t, c, discovery(c));
    }
    if let Some(port) = app_port {
        inbound(&mut t, port, probes, capture);
    }
    t
}

/// `text` as a TOML basic string.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn upstream(t: &mut String, c: &Called, discovery: Discovery) {
    let (s, host) = (&c.service, &c.host);
    let port = c.port;
    let _ = write!(
        t,
        "\n# From {}.\n[upstreams.{s}]\n\
         # The name as the app wrote it, resolved in the pod's namespace; a name without\n\
         # dots also matches NAME.NAMESPACE, NAME.NAMESPACE.svc and its full cluster name.\n\
         authorities = [\"{host}\"]\n",
        c.named_in,
    );
    match discovery {
        Discovery::Dns => {
            let _ = writeln!(t, "endpoints = [\"{host}:{port}\"]");
        }
        Discovery::Kubernetes => {
            // `NAME` or `NAME.NAMESPACE`, as the host names it.
            let mut labels = host.split('.');
            let service = match (labels.next(), labels.next()) {
                (Some(name), Some(ns)) => format!("{name}.{ns}"),
                (Some(name), None) => name.to_string(),
                _ => host.clone(),
            };
            let _ = writeln!(
                t,
                "discovery = \"kubernetes\"\nservice = \"{service}\"\nport = \"{port}\""
            );
        }
    }
    let _ = writeln!(
        t,
        "connect_timeout = \"200ms\"\n\
         # No timeout of tollgate's own: a request waits as long as the app's direct call\n\
         # would. To bound it, add request_timeout = \"5s\" (the deadline when the caller\n\
         # sends none) and attempt_timeout = \"1s\" (a retry starts beside a slow attempt).\n\
         \n[upstreams.{s}.retry]\n\
         max_attempts = 3\n\
         on = [\"connect-failure\", \"reset\", \"502\", \"503\", \"504\"]\n\
         \n[upstreams.{s}.budget]\n\
         # Retries add at most 10% to what {s} sees, plus a floor for quiet minutes.\n\
         ratio = 0.1\n\
         min_per_sec = 5\n\
         window = \"10s\"",
    );
}

fn inbound(t: &mut String, port: u16, probes: &Probes, capture: bool) {
    let how = if capture {
        "Capture sends every caller here."
    } else {
        "Callers come here once the Service's\n# targetPort is tollgate-in (15006)."
    };
    let _ = writeln!(
        t,
        "\n# The inbound side, in front of the app's port. {how}\n\
         [inbound]\naddr = \"0.0.0.0:15006\"\napp = \"127.0.0.1:{port}\""
    );
    if !probes.paths.is_empty() {
        let paths: Vec<String> = probes.paths.iter().map(|p| format!("\"{p}\"")).collect();
        let _ = writeln!(t, "probe_paths = [{}]", paths.join(", "));
    }
    t.push_str(
        "\n[inbound.retries]\n\
         # One budget for the retries of all callers of this app.\n\
         ratio = 0.1\nmin_per_sec = 5\nwindow = \"10s\"\n",
    );
}

/// The ConfigMap document.
pub fn document(owner: &Owner, config: &str) -> Result<Yaml, String> {
    let mut doc = super::yaml::one(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels:\n    \
         app.kubernetes.io/component: tollgate\n    app.kubernetes.io/part-of: {part}\ndata: {{}}\n",
        name = json(&name_for(owner)),
        part = json(&owner.name),
    ))?;
    if let Some(ns) = &owner.namespace
        && let Some(meta) = super::yaml::get_mut(&mut doc, "metadata")
    {
        let h = meta.as_mut_hash();
        if let Some(h) = h {
            let labels = h.remove(&super::yaml::s("labels"));
            h.insert(super::yaml::s("namespace"), super::yaml::s(ns));
            if let Some(labels) = labels {
                h.insert(super::yaml::s("labels"), labels);
            }
        }
    }
    if let Some(data) = super::yaml::map_at(&mut doc, "data") {
        data.insert(super::yaml::s("tollgate.toml"), super::yaml::s(config));
    }
    Ok(doc)
}

/// A string as a YAML double-quoted scalar.
pub fn json(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_are_read_from_urls_and_addresses() {
        let spec = super::super::yaml::one(
            "containers:\n- name: app\n  env:\n  \
             - {name: A, value: \"http://payments:8080/v1\"}\n  \
             - {name: B, value: \"http://inventory\"}\n  \
             - {name: C, value: \"ledger.money.svc.cluster.local:9000\"}\n  \
             - {name: D, value: \"https://api.example.com\"}\n  \
             - {name: E, value: \"http://example.com\"}\n  \
             - {name: F, value: \"127.0.0.1:8125\"}\n  \
             - {name: G, value: \"json\"}\n  \
             - {name: H, value: \"http://payments:8080/v2\"}\n  \
             - {name: I, value: \"http://localhost:9090\"}\n  \
             - {name: J, value: \"https://vault\"}\n  \
             - {name: K, value: \"redis-cart:6379\"}\n  \
             - {name: L, value: \"http://db:5432\"}\n",
        )
        .unwrap_or(Yaml::Null);
        let (found, notes) = services(&spec, &OPAQUE_PORTS);
        let got: Vec<_> = found
            .iter()
            .map(|c| format!("{}={}:{}", c.service, c.host, c.port))
            .collect();
        assert_eq!(
            got,
            [
                "payments=payments:8080",
                "inventory=inventory:80",
                "ledger=ledger.money.svc.cluster.local:9000"
            ]
        );
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[1].contains("port 6379 is not HTTP"), "{notes:?}");
    }
}
