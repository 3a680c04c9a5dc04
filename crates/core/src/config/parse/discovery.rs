//! `discovery`, `service` and `port` of an upstream, and the `[kubernetes]` section.
//!
//! The three keys go together: `discovery = "kubernetes"` needs `service` and `port`
//! and takes no `endpoints` (the Service's pods are the endpoints); `service` and `port`
//! mean nothing without it. Each mistake is reported where it was written, naming the
//! key and what to write instead. Names are checked as the API would check them, so a
//! Service that can never exist is an error at load, not a watch that never lists.

use std::ops::Range;
use std::path::Path;

use toml::de::DeValue;

use super::schema::Section;
use super::walker::{Choice, Table, Walker, kind};
use crate::config::keys::{kubernetes as kube_key, root as root_key, upstream as key};
use crate::config::model::*;

/// The words of `discovery`; `Kubernetes`' Service is read from `service` and `port`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Word {
    Dns,
    Kubernetes,
}

const DISCOVERY: Choice<Word> = Choice {
    what: "a discovery",
    fix: "use \"dns\" (resolve `endpoints`, the default) or \"kubernetes\" (watch a Service)",
    words: &[("dns", Word::Dns), ("kubernetes", Word::Kubernetes)],
};

/// What an upstream's discovery keys say, and whether it still needs `endpoints`.
pub(super) struct Found {
    pub discovery: Discovery,
    /// `false` with `discovery = "kubernetes"`, and when `discovery` was written wrongly
    /// (it may have meant kubernetes: a missing `endpoints` would be a second error
    /// for one mistake).
    pub needs_endpoints: bool,
}

/// `discovery`, `service` and `port` of the upstream `t`; `name_span` is where its name
/// is written (a key missing is reported there).
pub(super) fn discovery(w: &mut Walker<'_>, t: &Table, name_span: &Range<usize>) -> Found {
    let word = w.word(t, key::discovery, &DISCOVERY);
    let discovery_invalid = w.is_invalid(&t.key(key::discovery));
    let service = service(w, t);
    let port = port(w, t);
    match word {
        Some(Word::Kubernetes) => {
            if let Some(v) = t.get(key::endpoints) {
                w.reject(
                    v.span(),
                    &t.key(key::endpoints),
                    "`endpoints` with discovery = \"kubernetes\": the Service's pods are the \
                     endpoints",
                    "remove endpoints, or remove discovery = \"kubernetes\" to call these \
                     names",
                );
            }
            let at = t.span_of(key::discovery, name_span);
            let missing = |w: &mut Walker<'_>, k: &str, what: &str, fix: &str| {
                if t.get(k).is_none() {
                    w.error(
                        at.clone(),
                        &t.key(k),
                        format!("missing: discovery = \"kubernetes\" needs {what}"),
                        fix,
                    );
                }
            };
            missing(
                w,
                key::service,
                "the Service to watch",
                "add service = \"NAME\" (in the pod's own namespace) or \"NAME.NAMESPACE\"",
            );
            missing(
                w,
                key::port,
                "the Service port to call",
                "add port = \"http\" (the port's name in the Service) or its number, e.g. \
                 port = 8080",
            );
            let discovery = match (service, port) {
                (Some((name, namespace)), Some(port)) => Discovery::Kubernetes(ServiceRef {
                    name,
                    namespace,
                    port,
                }),
                _ => Discovery::Dns,
            };
            Found {
                discovery,
                needs_endpoints: false,
            }
        }
        _ if discovery_invalid => Found {
            discovery: Discovery::Dns,
            needs_endpoints: false,
        },
        Some(Word::Dns) | None => {
            for k in [key::service, key::port] {
                if let Some(v) = t.get(k) {
                    w.reject(
                        v.span(),
                        &t.key(k),
                        format!("`{k}` is read only with discovery = \"kubernetes\""),
                        &format!(
                            "add discovery = \"kubernetes\" to watch the Service, or remove \
                             {k} (with dns discovery `endpoints` names where it is)"
                        ),
                    );
                }
            }
            Found {
                discovery: Discovery::Dns,
                needs_endpoints: true,
            }
        }
    }
}

/// `service = "NAME"` or `"NAME.NAMESPACE"`: the name and the namespace written.
fn service(w: &mut Walker<'_>, t: &Table) -> Option<(String, Option<String>)> {
    let (text, span) = w.string(t, key::service)?;
    let (name, namespace) = match text.split_once('.') {
        Some((name, ns)) => (name, Some(ns)),
        None => (text.as_str(), None),
    };
    let why = if !is_service_name(name) {
        Some(format!(
            "`{name}` is not a Service name (lower-case letters, digits and `-`, starting \
             with a letter, at most 63)"
        ))
    } else if namespace.is_some_and(|ns| !is_label(ns)) {
        Some(format!(
            "`{}` is not a namespace (lower-case letters, digits and `-`, at most 63; the \
             cluster domain is not written)",
            namespace.unwrap_or_default()
        ))
    } else {
        None
    };
    if let Some(why) = why {
        w.reject(
            span,
            &t.key(key::service),
            why,
            "write the Service's name, or NAME.NAMESPACE, e.g. service = \"payments\" or \
             \"payments.shop\"",
        );
        return None;
    }
    Some((name.to_string(), namespace.map(str::to_string)))
}

/// `port = "http"` or `port = 8080`.
fn port(w: &mut Walker<'_>, t: &Table) -> Option<ServicePort> {
    let v = t.get(key::port)?;
    let full = t.key(key::port);
    let fix =
        "write the Service port's name, e.g. port = \"http\", or its number, e.g. port = 8080";
    let port = match v.get_ref() {
        DeValue::Integer(i) => i
            .as_str()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .map(ServicePort::Number)
            .ok_or_else(|| format!("{} is not a port number (1 to 65535)", i.as_str())),
        DeValue::String(s) => match s.parse::<u16>() {
            Ok(p) if p != 0 => Ok(ServicePort::Number(p)),
            _ if is_port_name(s) => Ok(ServicePort::Name(s.to_string())),
            _ => Err(format!(
                "`{s}` is not a port name (lower-case letters, digits and `-`, with a letter, \
                 at most 15)"
            )),
        },
        other => Err(format!(
            "expected a port name or number, found {}",
            kind(other)
        )),
    };
    port.map_err(|why| w.reject(v.span(), &full, why, fix)).ok()
}

/// A DNS label as the API takes it for a namespace (RFC 1123).
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A Service's name (RFC 1035: a label that starts with a letter).
fn is_service_name(s: &str) -> bool {
    is_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// A port's name (IANA_SVC_NAME: at most 15, a letter among them, no `--`).
fn is_port_name(s: &str) -> bool {
    is_label(s) && s.len() <= 15 && s.bytes().any(|b| b.is_ascii_lowercase()) && !s.contains("--")
}

/// `[kubernetes]`, its kubeconfig resolved against `base`.
pub(super) fn kubernetes(w: &mut Walker<'_>, root: &Table, base: &Path) -> KubernetesConfig {
    let Some((t, _)) = w.table(root, root_key::kubernetes) else {
        return KubernetesConfig::default();
    };
    w.check_keys(Section::Kubernetes, "", &t);
    let kubeconfig = w.string(&t, kube_key::kubeconfig).map(|(text, _)| {
        let named = Path::new(&text);
        if named.is_absolute() {
            named.to_path_buf()
        } else {
            base.join(named)
        }
    });
    KubernetesConfig { kubeconfig }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Discovery, ServicePort, ServiceRef, parse};

    const HEAD: &str = "[upstreams.p]\nauthorities = [\"p\"]\n";

    fn errors(text: &str) -> String {
        match parse("t.toml", text, Path::new("/etc/tollgate")) {
            Ok(_) => panic!("valid:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_service_and_its_port_are_read_by_name_or_number() {
        let text = format!(
            "{HEAD}discovery = \"kubernetes\"\nservice = \"payments.shop\"\nport = \"http\"\n"
        );
        let c = parse("t.toml", &text, Path::new(".")).unwrap();
        let u = &c.upstreams[0];
        assert!(u.endpoints.is_empty(), "no endpoints needed");
        let want = ServiceRef {
            name: "payments".into(),
            namespace: Some("shop".into()),
            port: ServicePort::Name("http".into()),
        };
        assert_eq!(u.discovery, Discovery::Kubernetes(want));
        let json = c.to_json();
        let shown = &json["upstreams"]["p"];
        assert_eq!(shown["discovery"], "kubernetes");
        assert_eq!(shown["service"], "payments.shop");
        assert_eq!(shown["port"], "http");

        for port in ["8080", "\"8080\""] {
            let text = format!(
                "{HEAD}discovery = \"kubernetes\"\nservice = \"payments\"\nport = {port}\n"
            );
            let c = parse("t.toml", &text, Path::new(".")).unwrap();
            let s = c.upstreams[0].discovery.service().unwrap();
            assert_eq!(
                (s.namespace.as_deref(), &s.port),
                (None, &ServicePort::Number(8080))
            );
        }
    }

    #[test]
    fn dns_is_the_default_and_needs_endpoints() {
        let c = parse(
            "t.toml",
            &format!("{HEAD}endpoints = [\"127.0.0.1:1\"]\n"),
            Path::new("."),
        )
        .unwrap();
        assert_eq!(c.upstreams[0].discovery, Discovery::Dns);
        assert_eq!(
            c.to_json()["upstreams"]["p"]["service"],
            serde_json::Value::Null
        );
        let e = errors(&format!("{HEAD}discovery = \"dns\"\n"));
        assert!(
            e.contains("t.toml:1:12: upstreams.p.endpoints: missing"),
            "{e}"
        );
    }

    #[test]
    fn kubernetes_with_endpoints_is_an_error_at_the_endpoints() {
        let e = errors(&format!(
            "{HEAD}discovery = \"kubernetes\"\nservice = \"payments\"\nport = \"http\"\n\
             endpoints = [\"payments:80\"]\n"
        ));
        assert!(
            e.contains(
                "t.toml:6:13: upstreams.p.endpoints: `endpoints` with discovery = \"kubernetes\""
            ),
            "{e}"
        );
        assert!(e.contains("(remove endpoints, or remove discovery"), "{e}");
    }

    #[test]
    fn kubernetes_without_a_service_or_port_names_what_to_add() {
        let e = errors(&format!("{HEAD}discovery = \"kubernetes\"\n"));
        assert!(
            e.contains("t.toml:3:13: upstreams.p.service: missing: discovery = \"kubernetes\" needs the Service to watch"),
            "{e}"
        );
        assert!(
            e.contains("t.toml:3:13: upstreams.p.port: missing: discovery = \"kubernetes\" needs the Service port"),
            "{e}"
        );
        assert!(!e.contains("endpoints"), "endpoints are not needed: {e}");
    }

    #[test]
    fn service_or_port_without_kubernetes_is_an_error_at_each() {
        let e = errors(&format!(
            "{HEAD}endpoints = [\"127.0.0.1:1\"]\nservice = \"payments\"\nport = 80\n"
        ));
        assert!(
            e.contains("t.toml:4:11: upstreams.p.service: `service` is read only with discovery = \"kubernetes\""),
            "{e}"
        );
        assert!(
            e.contains("t.toml:5:8: upstreams.p.port: `port` is read only with discovery"),
            "{e}"
        );
        assert!(e.contains("(add discovery = \"kubernetes\""), "{e}");
    }

    #[test]
    fn names_the_api_would_refuse_are_refused() {
        for (service, port, key) in [
            ("\"Payments\"", "\"http\"", "service"),
            ("\"1payments\"", "\"http\"", "service"),
            ("\"payments.shop.svc\"", "\"http\"", "service"),
            ("\"payments.\"", "\"http\"", "service"),
            ("\"payments\"", "\"a-very-long-port-name\"", "port"),
            ("\"payments\"", "0", "port"),
            ("\"payments\"", "70000", "port"),
            ("\"payments\"", "\"HTTP\"", "port"),
            ("\"payments\"", "true", "port"),
        ] {
            let e = errors(&format!(
                "{HEAD}discovery = \"kubernetes\"\nservice = {service}\nport = {port}\n"
            ));
            assert!(
                e.contains(&format!("upstreams.p.{key}: ")),
                "{service} {port}: {e}"
            );
            assert!(!e.contains("missing"), "one mistake, one error: {e}");
        }
    }

    #[test]
    fn a_discovery_written_wrongly_is_one_error() {
        let e = errors(&format!("{HEAD}discovery = \"k8s\"\n"));
        assert!(
            e.contains("t.toml:3:13: upstreams.p.discovery: `k8s` is not a discovery"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn the_kubeconfig_is_found_beside_the_config_file() {
        let text = format!(
            "{HEAD}discovery = \"kubernetes\"\nservice = \"p\"\nport = 80\n\
             [kubernetes]\nkubeconfig = \"kube/config\"\n"
        );
        let c = parse("t.toml", &text, Path::new("/etc/tollgate")).unwrap();
        assert_eq!(
            c.kubernetes.kubeconfig.as_deref(),
            Some(Path::new("/etc/tollgate/kube/config"))
        );
        assert_eq!(
            c.to_json()["kubernetes"]["kubeconfig"],
            "/etc/tollgate/kube/config"
        );
        let absent = parse(
            "t.toml",
            &format!("{HEAD}endpoints = [\"p:1\"]\n"),
            Path::new("."),
        )
        .unwrap();
        assert_eq!(absent.kubernetes.kubeconfig, None);
        let e = errors(&format!(
            "{HEAD}endpoints = [\"p:1\"]\n[kubernetes]\nkubeconfg = \"x\"\n"
        ));
        assert!(e.contains("kubernetes.kubeconfg: unknown key"), "{e}");
        assert!(e.contains("did you mean `kubeconfig`?"), "{e}");
    }
}
