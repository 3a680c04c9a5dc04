//! The app's probes, as the kubelet sends them. An HTTP probe is moved to tollgate's
//! admin port, `GET /probe/PORT/PATH` (as Istio moves probes to its agent): the
//! kubelet reaches an app that listens on loopback, or behind transparent capture,
//! and the admin endpoint asks the app itself (`[admin] probes`: each probe's exact
//! port, path and `httpHeaders`, and nothing else). A TCP probe
//! stays (its port is kept off capture, or tollgate's inbound listener would accept
//! the connection for a dead app); an exec probe runs in the container, and a gRPC
//! probe speaks to the app as any caller does.

use yaml_rust2::Yaml;

use super::record::Record;
use super::yaml::{get, get_mut, items, s, set, str_at, to_json};
use tollgate_core::config::NOT_A_PROBE_FIELD;

/// tollgate's admin port, where the kubelet's HTTP probes now go.
pub const ADMIN_PORT: u16 = 15090;
/// The path of the admin endpoint that forwards a probe.
const PROBE_PREFIX: &str = "/probe/";
/// The path every gRPC health check asks for.
pub const GRPC_HEALTH: &str = "/grpc.health.v1.Health/Check";
const KINDS: [&str; 3] = ["startupProbe", "readinessProbe", "livenessProbe"];

/// An HTTP probe as `[admin] probes` declares it: port, path (query included), and
/// its `httpHeaders` as name and value.
pub type Declared = (u16, String, Vec<(String, String)>);

/// What the app's probes need from tollgate's config and capture.
#[derive(Debug, Default)]
pub struct Probes {
    /// The app ports HTTP probes ask.
    pub http_ports: Vec<u16>,
    /// The HTTP probes moved, as `[admin] probes` declares them: port, path (query
    /// included), and the probe's `httpHeaders` as name and value.
    pub declared: Vec<Declared>,
    /// Their paths (and the gRPC health check's): `[inbound] probe_paths`.
    pub paths: Vec<String>,
    /// Ports the kubelet checks with TCP: kept off inbound capture.
    pub tcp_ports: Vec<u16>,
    /// One line per probe moved, for the summary.
    pub moved: Vec<String>,
    /// Probes left as they were, and why.
    pub kept: Vec<String>,
}

fn push<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port_of(container: &Yaml, port: Option<&Yaml>) -> Option<u16> {
    match port? {
        Yaml::Integer(n) => u16::try_from(*n).ok(),
        Yaml::String(name) => name.parse().ok().or_else(|| {
            items(container, "ports")
                .iter()
                .find(|p| str_at(p, "name") == Some(name))
                .and_then(|p| get(p, "containerPort")?.as_i64())
                .and_then(|n| u16::try_from(n).ok())
        }),
        _ => None,
    }
}

/// Moves the HTTP probes of every app container to the admin port, noting each
/// original in `record`; collects what the config needs.
pub fn move_to_admin(spec: &mut Yaml, record: &mut Record) -> Probes {
    let mut found = Probes::default();
    let Some(containers) = get_mut(spec, "containers").and_then(Yaml::as_mut_vec) else {
        return found;
    };
    for container in containers.iter_mut() {
        let name = str_at(container, "name").unwrap_or_default().to_string();
        // In the order they are written.
        let written: Vec<&'static str> = container
            .as_hash()
            .map(|h| {
                h.keys()
                    .filter_map(|k| KINDS.into_iter().find(|kind| k.as_str() == Some(kind)))
                    .collect()
            })
            .unwrap_or_default();
        for kind in written {
            let Some(probe) = get(container, kind) else {
                continue;
            };
            if let Some(tcp) = get(probe, "tcpSocket") {
                match port_of(container, get(tcp, "port")) {
                    Some(port) => push(&mut found.tcp_ports, port),
                    None => found
                        .kept
                        .push(format!("{name} {kind}: tcpSocket port unknown")),
                }
            }
            if get(probe, "grpc").is_some() {
                push(&mut found.paths, GRPC_HEALTH.to_string());
            }
            let Some(http) = get(probe, "httpGet").cloned() else {
                continue;
            };
            let refused = items(&http, "httpHeaders")
                .iter()
                .filter_map(|h| str_at(h, "name"))
                .find(|n| NOT_A_PROBE_FIELD.contains(&n.to_ascii_lowercase().as_str()))
                .map(|n| format!("it sends {n}, which the admin port never passes to the app"));
            let why_not =
                if str_at(&http, "scheme").is_some_and(|s| s.eq_ignore_ascii_case("https")) {
                    Some("HTTPS: the kubelet checks TLS itself".to_string())
                } else if get(&http, "host").is_some() {
                    Some("it names a host other than the pod".to_string())
                } else {
                    refused
                };
            let port = port_of(container, get(&http, "port"));
            let (Some(port), None) = (port, &why_not) else {
                let why =
                    why_not.unwrap_or_else(|| "its port names no port of the container".into());
                found
                    .kept
                    .push(format!("{name} {kind}: left as it is ({why})"));
                continue;
            };
            let path = str_at(&http, "path").unwrap_or("/");
            let path = if path.starts_with('/') {
                path.to_string()
            } else {
                format!("/{path}")
            };
            let mut moved = http.clone();
            set(
                &mut moved,
                "path",
                s(&format!("{PROBE_PREFIX}{port}{path}")),
            );
            set(&mut moved, "port", Yaml::Integer(i64::from(ADMIN_PORT)));
            if let Some(p) = get_mut(container, kind) {
                set(p, "httpGet", moved);
            }
            record
                .probes
                .insert(format!("{name}/{kind}"), to_json(&http));
            push(&mut found.http_ports, port);
            let fields: Vec<(String, String)> = items(&http, "httpHeaders")
                .iter()
                .filter_map(|h| {
                    Some((
                        str_at(h, "name")?.to_string(),
                        str_at(h, "value")?.to_string(),
                    ))
                })
                .collect();
            if !found
                .declared
                .iter()
                .any(|(p, q, _)| *p == port && *q == path)
            {
                found.declared.push((port, path.clone(), fields));
            }
            let bare = path.split('?').next().unwrap_or("/").to_string();
            push(&mut found.paths, bare);
            found
                .moved
                .push(format!("{name} {kind} {path} on port {port}"));
        }
    }
    found
}

/// Gives a moved probe back: the `httpGet` the record kept, or, without a record, the
/// one `/probe/PORT/PATH` names.
pub fn give_back(container: &mut Yaml, kind: &str, original: Option<Yaml>) {
    let Some(probe) = get_mut(container, kind) else {
        return;
    };
    let Some(http) = get(probe, "httpGet") else {
        return;
    };
    let original = original.or_else(|| {
        let path = str_at(http, "path")?.strip_prefix(PROBE_PREFIX)?;
        let (port, rest) = path.split_once('/').unwrap_or((path, ""));
        let port: i64 = port.parse().ok()?;
        let mut back = http.clone();
        set(&mut back, "path", s(&format!("/{rest}")));
        set(&mut back, "port", Yaml::Integer(port));
        Some(back)
    });
    if let Some(original) = original {
        let ordered = in_order_of(http, original);
        set(probe, "httpGet", ordered);
    }
}

/// `original`'s fields in the order `moved` has them (the order they were written in:
/// moving a probe changes values in place), any others after.
fn in_order_of(moved: &Yaml, original: Yaml) -> Yaml {
    let (Some(order), Yaml::Hash(mut fields)) = (moved.as_hash(), original.clone()) else {
        return original;
    };
    let mut out = yaml_rust2::yaml::Hash::new();
    for key in order.keys() {
        if let Some(v) = fields.remove(key) {
            out.insert(key.clone(), v);
        }
    }
    out.extend(fields);
    Yaml::Hash(out)
}

/// The probe kinds a container may have.
pub fn kinds() -> [&'static str; 3] {
    KINDS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::{emit, one};

    #[test]
    fn http_probes_move_and_come_back_as_they_were() {
        let text = "containers:\n- name: app\n  ports:\n  - name: http\n    containerPort: 8080\n  \
                    livenessProbe:\n    httpGet:\n      path: /healthz\n      port: http\n  \
                    readinessProbe:\n    httpGet:\n      path: ready\n      port: 8081\n      scheme: HTTP\n  \
                    startupProbe:\n    tcpSocket:\n      port: 9000\n";
        let before = one(text).unwrap_or(Yaml::Null);
        let mut spec = before.clone();
        let mut record = Record::new();
        let found = move_to_admin(&mut spec, &mut record);
        assert_eq!(found.http_ports, [8080, 8081]);
        assert_eq!(found.paths, ["/healthz", "/ready"]);
        assert_eq!(found.tcp_ports, [9000]);
        let out = emit(&spec);
        assert!(
            out.contains("path: /probe/8080/healthz\n        port: 15090"),
            "{out}"
        );
        assert!(
            out.contains("path: /probe/8081/ready\n        port: 15090\n        scheme: HTTP"),
            "{out}"
        );
        let app = &mut spec["containers"][0];
        for kind in KINDS {
            let original = record
                .probes
                .get(&format!("app/{kind}"))
                .map(crate::yaml::from_json);
            give_back(app, kind, original);
        }
        assert_eq!(spec, before);
    }

    #[test]
    fn https_probes_and_other_hosts_stay() {
        let text = "containers:\n- name: app\n  livenessProbe:\n    httpGet:\n      port: 8443\n      \
                    scheme: HTTPS\n  readinessProbe:\n    httpGet:\n      host: example.org\n      port: 80\n";
        let before = one(text).unwrap_or(Yaml::Null);
        let mut spec = before.clone();
        let found = move_to_admin(&mut spec, &mut Record::new());
        assert_eq!(spec, before);
        assert_eq!(found.kept.len(), 2, "{:?}", found.kept);
    }
}
