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
    pub service: String,
    pub namespace: String,
    pub port: u16,
    /// Where it was named: `CONTAINER: VAR=value`.
    pub named_in: String,
}

/// The ConfigMap's name for a workload.
pub fn name_for(owner: &Owner) -> String {
    format!("{}-tollgate", owner.name)
}

/// The Services the app's containers name in their environment, each once (by name and
/// namespace; the first port named wins).
pub fn services(spec: &Yaml, namespace: &str) -> (Vec<Called>, Vec<String>) {
    let mut found: Vec<Called> = Vec::new();
    let mut notes = Vec::new();
    for c in items(spec, "containers") {
        let container = str_at(c, "name").unwrap_or_default();
        for var in items(c, "env") {
            let (Some(name), Some(value)) = (str_at(var, "name"), str_at(var, "value")) else {
                continue;
            };
            if let Some(tls) = value.strip_prefix("https://") {
                if let Some((service, _, _)) = service_in(tls) {
                    notes.push(format!(
                        "{container}: {name} calls {service} over https: passed through untouched \
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
            let Some((service, ns, port)) = service_in(rest) else {
                continue;
            };
            let port = match (port, value.starts_with("http://")) {
                (Some(p), _) => p,
                (None, true) => 80,
                (None, false) => continue,
            };
            let namespace = ns.unwrap_or(namespace).to_string();
            if !found
                .iter()
                .any(|f| f.service == service && f.namespace == namespace)
            {
                found.push(Called {
                    service,
                    namespace,
                    port,
                    named_in: format!("{container}: {name}={value}"),
                });
            }
        }
    }
    (found, notes)
}

/// `service[.namespace[.svc[.cluster.local]]][:port]` at the start of `rest`; a name
/// of two labels is taken for an outside host (`example.com`), not `service.namespace`.
fn service_in(rest: &str) -> Option<(String, Option<&str>, Option<u16>)> {
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
    let namespace = match labels.as_slice() {
        [one] if *one != "localhost" => None,
        [_, ns, "svc"] | [_, ns, "svc", "cluster", "local"] => Some(*ns),
        _ => return None,
    };
    Some((labels[0].to_string(), namespace, port))
}

/// The app's port for `[inbound] app`: the port its HTTP probes ask, else the first
/// TCP port the first container declares.
pub fn app_port(spec: &Yaml, probes: &Probes) -> Option<u16> {
    probes.http_ports.first().copied().or_else(|| {
        let first = items(spec, "containers").first()?;
        items(first, "ports")
            .iter()
            .filter(|p| str_at(p, "protocol").is_none_or(|p| p == "TCP"))
            .find_map(|p| {
                u16::try_from(
                    p.as_hash()?
                        .get(&super::yaml::s("containerPort"))?
                        .as_i64()?,
                )
                .ok()
            })
    })
}

/// The text of `tollgate.toml`.
pub fn config_text(
    owner: &Owner,
    called: &[Called],
    probes: &Probes,
    app_port: Option<u16>,
    capture: bool,
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
        upstream(&mut t, c);
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

fn upstream(t: &mut String, c: &Called) {
    let (s, ns) = (&c.service, &c.namespace);
    let _ = writeln!(
        t,
        "\n# From {}.\n[upstreams.{s}]\n\
         authorities = [\"{s}\", \"{s}.{ns}\", \"{s}.{ns}.svc\", \"{s}.{ns}.svc.cluster.local\"]\n\
         endpoints = [\"{s}.{ns}.svc.cluster.local:{port}\"]\n\
         connect_timeout = \"200ms\"\n\
         request_timeout = \"2s\"\n\
         \n[upstreams.{s}.retry]\n\
         max_attempts = 3\n\
         on = [\"connect-failure\", \"reset\", \"502\", \"503\", \"504\"]\n\
         \n[upstreams.{s}.budget]\n\
         # Retries add at most 10% to what {s} sees, plus a floor for quiet minutes.\n\
         ratio = 0.1\n\
         min_per_sec = 5\n\
         window = \"10s\"",
        c.named_in,
        port = c.port,
    );
}

fn inbound(t: &mut String, port: u16, probes: &Probes, capture: bool) {
    let how = if capture {
        "Capture sends every caller here."
    } else {
        "Callers come here once the Service's\n# targetPort is tollgate-inbound (15006)."
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
             - {name: J, value: \"https://vault\"}\n",
        )
        .unwrap_or(Yaml::Null);
        let (found, notes) = services(&spec, "shop");
        let got: Vec<_> = found
            .iter()
            .map(|c| format!("{}.{}:{}", c.service, c.namespace, c.port))
            .collect();
        assert_eq!(
            got,
            [
                "payments.shop:8080",
                "inventory.shop:80",
                "ledger.money:9000"
            ]
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
    }
}
