//! From TOML text to a validated `Config`, collecting every problem on the way.
//!
//! The document is parsed into toml's spanned tree and walked by hand rather than
//! deserialised with serde: serde stops at the first error, and a user fixing a file
//! wants every mistake at once, each at its line and column and with the fix.
//!
//! Parsing is a function of the text: it opens no file. The certificate files a
//! config names are read afterwards by [`crate::config::read_files`].
//!
//! The walk is split by section: this file has the top level and the small sections,
//! [`upstream`] an upstream and the clashes between upstreams, [`discovery`] where its
//! endpoints come from (and `[kubernetes]`), [`retry`] its retry and budget sections,
//! [`health`] its outlier and hedge sections, [`tls`] its TLS section, [`inbound`] the
//! inbound side and [`dedupe`] its `[inbound.dedupe]`, [`tracing`] the trace export;
//! [`walker`] reads typed values and [`schema`] knows which keys each section takes.

mod dedupe;
mod discovery;
mod health;
mod inbound;
mod retry;
mod schema;
mod syntax;
mod tls;
mod tracing;
mod upstream;
mod walker;

use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toml::de::{DeTable, DeValue};

use super::diagnostic::{ConfigErrors, Diagnostic, Source};
use super::keys::{access_log as access_log_key, admin as admin_key, root as root_key};
use super::keys::{deadline as deadline_key, listener as listener_key, runtime as runtime_key};
use super::model::*;
use http::{HeaderName, HeaderValue};
use schema::Section;
pub use upstream::{normalize_authority, parse_endpoint};
use walker::{Choice, Size, Table, Walker, kind};

/// Validates config text. `base` is where relative file paths (certificates) are
/// resolved; nothing is read from it.
pub fn parse(file: &str, text: &str, base: &Path) -> Result<Config, ConfigErrors> {
    let source = Source::new(file, text);
    let (root, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        return Err(ConfigErrors(syntax::diagnostics(&source, syntax_errors)));
    }
    let mut w = Walker::new(source);
    let config = top_level(&mut w, root.get_ref(), base);
    let mut errors: Vec<Diagnostic> = w.diags;
    errors.sort_by_key(|d| (d.line, d.column));
    errors.dedup();
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The config as far as it could be read, errors or not (a value in error stands at its
/// default): what the lints of a file that also has errors look at. `None` when the text
/// is not TOML at all.
pub fn parse_lenient(file: &str, text: &str, base: &Path) -> Option<Config> {
    let (root, syntax_errors) = DeTable::parse_recoverable(text);
    if !syntax_errors.is_empty() {
        return None;
    }
    let mut w = Walker::new(Source::new(file, text));
    Some(top_level(&mut w, root.get_ref(), base))
}

/// A digest of config text (stable within one build of tollgate).
pub fn source_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

fn top_level(w: &mut Walker<'_>, root: &DeTable<'_>, base: &Path) -> Config {
    let root = Table::new(root, "");
    w.check_keys(Section::Root, "", &root);
    let runtime = runtime(w, &root);
    let listener = listener(w, &root);
    let (admin, probe_spans) = admin(w, &root);
    let deadline = deadline(w, &root);
    let access_log = access_log(w, &root);
    let upstreams = upstream::upstreams(w, &root, &listener, &admin, base);
    let mut taken = vec![
        (listener.addr, "listener.addr".to_string()),
        (admin.addr, "admin.addr".to_string()),
    ];
    for u in &upstreams {
        if let Some(a) = u.listen {
            taken.push((a, format!("upstreams.{}.listen", u.name)));
        }
    }
    let inbound = inbound::inbound(w, &root, &taken);
    if let Some(i) = &inbound {
        taken.push((i.addr, "inbound.addr".to_string()));
    }
    probes_reach_the_app(w, &probe_spans, &taken);
    let tracing = tracing::tracing(w, &root);
    let kubernetes = discovery::kubernetes(w, &root, base);
    let config = Config {
        file: w.src.file.to_string(),
        runtime,
        listener,
        admin,
        deadline,
        access_log,
        upstreams,
        inbound,
        tracing,
        kubernetes,
        positions: Arc::new(std::mem::take(&mut w.positions)),
        source_hash: source_hash(w.src.text),
    };
    require_something_to_serve(w, &root, &config);
    config
}

/// The rule of [`Config::serves_anything`], as an error that says what to add. Only
/// when neither an upstream nor `[inbound]` was written at all: one that was written
/// but is invalid has its own errors already. `unknown_authorities = "pass"` written
/// out is a forward proxy asked for, not a file left empty.
fn require_something_to_serve(w: &mut Walker<'_>, root: &Table, config: &Config) {
    let forward_proxy = config.listener.unknown_authorities == UnknownAuthorities::Pass
        && config
            .positions
            .contains_key("listener.unknown_authorities");
    if config.serves_anything() || forward_proxy || root.get(root_key::inbound).is_some() {
        return;
    }
    let span = match root.get(root_key::upstreams) {
        None => 0..0,
        Some(v) => match v.get_ref() {
            DeValue::Table(t) if t.is_empty() => v.span(),
            _ => return,
        },
    };
    let would = match config.listener.unknown_authorities {
        UnknownAuthorities::Pass => "own no retry, only pass every request through",
        UnknownAuthorities::Refuse => "answer every request with 404 no-route",
    };
    w.error(
        span,
        "upstreams",
        format!(
            "no upstream is configured: tollgate would {would} (an empty or half-written \
             file reads this way)"
        ),
        "add an [upstreams.NAME] section with authorities and endpoints, as in \
         config/tollgate.toml (or an [inbound] section, to stand in front of the app; or \
         write unknown_authorities = \"pass\" in [listener] for a plain forward proxy)",
    );
}

fn runtime(w: &mut Walker<'_>, root: &Table) -> RuntimeConfig {
    let Some((t, _)) = w.table(root, root_key::runtime) else {
        return RuntimeConfig::default();
    };
    w.check_keys(Section::Runtime, "", &t);
    RuntimeConfig {
        worker_threads: w
            .optional(&t, runtime_key::worker_threads, 1..=1024u64)
            .map(|n| n as usize),
    }
}

fn listener(w: &mut Walker<'_>, root: &Table) -> ListenerConfig {
    use listener_key as key;
    let d = ListenerConfig::default();
    let Some((t, _)) = w.table(root, root_key::listener) else {
        return d;
    };
    w.check_keys(Section::Listener, "", &t);
    let ms = Duration::from_millis;
    let secs = Duration::from_secs;
    let max_header_bytes = Size(1024)..=Size(1 << 20);
    ListenerConfig {
        addr: w.socket_addr(&t, key::addr).map_or(d.addr, |(a, _)| a),
        drain_timeout: w.ranged(
            &t,
            key::drain_timeout,
            d.drain_timeout,
            Duration::ZERO..=secs(3600),
        ),
        header_read_timeout: w.ranged(
            &t,
            key::header_read_timeout,
            d.header_read_timeout,
            ms(10)..=secs(600),
        ),
        max_header_bytes: w
            .ranged(
                &t,
                key::max_header_bytes,
                Size(d.max_header_bytes),
                max_header_bytes,
            )
            .0,
        max_headers: w.ranged(&t, key::max_headers, d.max_headers as u64, 1..=1000u64) as usize,
        idle_timeout: w.ranged(
            &t,
            key::idle_timeout,
            d.idle_timeout,
            ms(100)..=secs(24 * 3600),
        ),
        max_connections: w.ranged(
            &t,
            key::max_connections,
            d.max_connections as u64,
            1..=1_000_000u64,
        ) as usize,
        unknown_authorities: w
            .word(&t, key::unknown_authorities, &UNKNOWN_AUTHORITIES)
            .unwrap_or(d.unknown_authorities),
        passthrough_connect_timeout: w.ranged(
            &t,
            key::passthrough_connect_timeout,
            d.passthrough_connect_timeout,
            ms(10)..=secs(120),
        ),
    }
}

const UNKNOWN_AUTHORITIES: Choice<UnknownAuthorities> = Choice {
    what: "a way to treat unknown authorities",
    fix: "use \"pass\" (forward them as they are, the default) or \"refuse\" (404 no-route)",
    words: &[
        ("pass", UnknownAuthorities::Pass),
        ("refuse", UnknownAuthorities::Refuse),
    ],
};

/// `[admin]`, and where each probe's port is written (checked once every address
/// tollgate binds is known).
fn admin(w: &mut Walker<'_>, root: &Table) -> (AdminConfig, Vec<(u16, Range<usize>)>) {
    let d = AdminConfig::default();
    let Some((t, _)) = w.table(root, root_key::admin) else {
        return (d, Vec::new());
    };
    w.check_keys(Section::Admin, "", &t);
    let mut spans = Vec::new();
    let config = AdminConfig {
        addr: w
            .socket_addr(&t, admin_key::addr)
            .map_or(d.addr, |(a, _)| a),
        probes: probes(w, &t, &mut spans),
    };
    (config, spans)
}

/// A probe goes to the app at 127.0.0.1:PORT: a port tollgate binds there is tollgate,
/// not the app (a container port that clashed with tollgate's).
fn probes_reach_the_app(
    w: &mut Walker<'_>,
    spans: &[(u16, Range<usize>)],
    ours: &[(SocketAddr, String)],
) {
    for (port, span) in spans {
        let taken = ours
            .iter()
            .find(|(a, _)| a.port() == *port && (a.ip().is_loopback() || a.ip().is_unspecified()));
        if let Some((addr, by)) = taken {
            w.reject(
                span.clone(),
                &format!("admin.{}", admin_key::probes),
                format!(
                    "port {port} is tollgate's own {by} ({addr}): the probe would ask \
                     tollgate, not the app"
                ),
                "write the port the app listens on (and move an app port that clashes \
                 with tollgate's)",
            );
        }
    }
}

const PROBE_FIX: &str =
    "write probes = [{ port = 8080, path = \"/healthz\", headers = { \"X-Probe\" = \"1\" } }]";

/// Fields a probe may not declare: credentials and forwarding fields never reach the
/// app through the admin port, and the framing and `Host` are the forwarder's.
pub const NOT_A_PROBE_FIELD: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "upgrade",
    "keep-alive",
];

/// `[admin] probes`: each an exact port and path, with its own fields; a pair given
/// twice is one probe.
fn probes(w: &mut Walker<'_>, t: &Table, spans: &mut Vec<(u16, Range<usize>)>) -> Vec<Probe> {
    let mut out: Vec<Probe> = Vec::new();
    let Some(v) = t.get(admin_key::probes) else {
        return out;
    };
    let full = t.key(admin_key::probes);
    let DeValue::Array(items) = v.get_ref() else {
        let message = format!("expected a list of probes, found {}", kind(v.get_ref()));
        w.reject(v.span(), &full, message, PROBE_FIX);
        return out;
    };
    for item in items.iter() {
        let DeValue::Table(entry) = item.get_ref() else {
            let message = format!(
                "expected a probe {{ port, path }}, found {}",
                kind(item.get_ref())
            );
            w.reject(item.span(), &full, message, PROBE_FIX);
            continue;
        };
        let e = Table::new(entry, full.clone());
        for (k, _) in entry.iter() {
            let name = k.get_ref().as_ref();
            if !["port", "path", "headers"].contains(&name) {
                let message = format!("unknown key `{name}` in a probe");
                w.reject(
                    k.span(),
                    &full,
                    message,
                    "a probe takes port, path and headers",
                );
            }
        }
        let port = w.optional::<u64>(&e, "port", 1..=65_535);
        let path = w.string(&e, "path");
        let (Some(port), Some((path, span))) = (port, path) else {
            if e.get("port").is_none() || e.get("path").is_none() {
                w.reject(
                    item.span(),
                    &full,
                    "a probe needs a port and a path",
                    PROBE_FIX,
                );
            }
            continue;
        };
        if !path.starts_with('/') || path.contains(['#', ' ', '\t', '\r', '\n']) {
            let message = format!("`{path}` is not a path to probe");
            w.reject(
                span,
                &full,
                message,
                "write the path as the probe asks for it, from its `/`",
            );
            continue;
        }
        let mut headers = Vec::new();
        if let Some(h) = e.get("headers") {
            let DeValue::Table(fields) = h.get_ref() else {
                let message = format!("expected a table of fields, found {}", kind(h.get_ref()));
                w.reject(h.span(), &full, message, PROBE_FIX);
                continue;
            };
            for (name, value) in fields.iter() {
                let name_text = name.get_ref().as_ref();
                let DeValue::String(value_text) = value.get_ref() else {
                    w.reject(
                        value.span(),
                        &full,
                        "a field's value must be a string",
                        PROBE_FIX,
                    );
                    continue;
                };
                match (
                    HeaderName::from_bytes(name_text.as_bytes()),
                    HeaderValue::from_str(value_text),
                ) {
                    (Ok(n), _) if NOT_A_PROBE_FIELD.contains(&n.as_str()) => w.reject(
                        name.span(),
                        &full,
                        format!("a probe may not send `{name_text}`"),
                        "leave it out: credentials, cookies and forwarding fields never reach the app through the admin port",
                    ),
                    (Ok(n), Ok(v)) => headers.push((n, v)),
                    _ => w.reject(
                        name.span(),
                        &full,
                        format!("`{name_text}` is not a usable header field"),
                        PROBE_FIX,
                    ),
                }
            }
        }
        let port = port as u16;
        spans.push((port, item.span()));
        if !out.iter().any(|p| p.port == port && p.path == path) {
            out.push(Probe {
                port,
                path,
                headers,
            });
        }
    }
    out
}

fn access_log(w: &mut Walker<'_>, root: &Table) -> AccessLogConfig {
    let d = AccessLogConfig::default();
    let Some((t, _)) = w.table(root, root_key::access_log) else {
        return d;
    };
    w.check_keys(Section::AccessLog, "", &t);
    const FORMAT: Choice<AccessLogFormat> = Choice {
        what: "an access log format",
        fix: "use \"text\" (the default) or \"json\"",
        words: &[
            ("text", AccessLogFormat::Text),
            ("json", AccessLogFormat::Json),
        ],
    };
    AccessLogConfig {
        enabled: w.boolean(&t, access_log_key::enabled).unwrap_or(d.enabled),
        format: w
            .word(&t, access_log_key::format, &FORMAT)
            .unwrap_or(d.format),
        query: w.boolean(&t, access_log_key::query).unwrap_or(d.query),
    }
}

fn deadline(w: &mut Walker<'_>, root: &Table) -> DeadlineConfig {
    let mut cfg = DeadlineConfig::default();
    let Some((t, _)) = w.table(root, root_key::deadline) else {
        return cfg;
    };
    w.check_keys(Section::Deadline, "", &t);
    if let Some(written) = w.string(&t, deadline_key::header)
        && let Some(h) = w.header_name(written, &t.key(deadline_key::header))
    {
        cfg.header = h;
    }
    if let Some(list) = w.strings(&t, deadline_key::accept) {
        let key = t.key(deadline_key::accept);
        cfg.accept = list
            .into_iter()
            .filter_map(|written| w.header_name(written, &key))
            .collect();
    }
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_key_is_named_as_toml_spells_it() {
        let Err(e) = parse("t.toml", "\"\" = 1\n", Path::new(".")) else {
            panic!("an empty key is unknown");
        };
        assert_eq!(e.0[0].key, "\"\"");
        assert!(
            e.to_string().starts_with("t.toml:1:1: \"\": unknown key"),
            "{e}"
        );
    }

    #[test]
    fn probes_are_exact_port_and_path_pairs_with_their_fields() {
        let up = "[upstreams.p]\nauthorities = [\"p\"]\nendpoints = [\"127.0.0.1:1\"]\n";
        let text = format!(
            "[admin]\nprobes = [{{ port = 8080, path = \"/healthz?full=1\", headers = {{ \"X-Probe\" = \"1\" }} }}, \
             {{ port = 8080, path = \"/healthz?full=1\" }}, {{ port = 9090, path = \"/ready\" }}]\n{up}"
        );
        let config = parse("t.toml", &text, Path::new(".")).unwrap();
        let probes = &config.admin.probes;
        assert_eq!(probes.len(), 2, "a pair given twice is one probe");
        assert_eq!(probes[0].target(), "/probe/8080/healthz?full=1");
        assert_eq!(probes[0].headers.len(), 1);
        assert_eq!(probes[1].target(), "/probe/9090/ready");
        for (bad, said) in [
            ("{ port = 0, path = \"/h\" }", "out of range"),
            ("{ port = 80, path = \"h\" }", "is not a path to probe"),
            ("{ port = 80 }", "needs a port and a path"),
            (
                "{ port = 80, path = \"/h\", headers = { Authorization = \"x\" } }",
                "may not send `Authorization`",
            ),
            (
                "{ port = 15001, path = \"/h\" }",
                "port 15001 is tollgate's own listener.addr",
            ),
            (
                "{ port = 15090, path = \"/h\" }",
                "port 15090 is tollgate's own admin.addr",
            ),
        ] {
            let text = format!("[admin]\nprobes = [{bad}]\n{up}");
            let Err(e) = parse("t.toml", &text, Path::new(".")) else {
                panic!("{bad} was taken");
            };
            assert!(e.to_string().contains(said), "{bad}: {e}");
        }
    }

    #[test]
    fn an_endpoint_that_is_tollgate_itself_is_refused() {
        // Every request to it would come back to the same upstream, and again.
        for (listener, endpoint, said) in [
            (
                "127.0.0.1:25101",
                "127.0.0.1:25101",
                "t.toml:4:14: upstreams.me.endpoints: 127.0.0.1:25101 is tollgate's own \
                 listener.addr: every request would come back round",
            ),
            (
                "0.0.0.0:15001",
                "localhost:15001",
                "is tollgate's own listener.addr",
            ),
            (
                "0.0.0.0:15001",
                "127.0.0.1:15001",
                "is tollgate's own listener.addr",
            ),
            (
                "127.0.0.1:15001",
                "[::1]:15001",
                "is tollgate's own listener.addr",
            ),
        ] {
            let text = format!(
                "[listener]\naddr = \"{listener}\"\n[upstreams.me]\nendpoints = [\"{endpoint}\"]\n\
                 authorities = [\"me\"]\n"
            );
            let Err(e) = parse("t.toml", &text, Path::new(".")) else {
                panic!("{endpoint} was taken with the listener at {listener}");
            };
            assert!(e.to_string().contains(said), "{endpoint}: {e}");
        }
        let own_listen =
            "[upstreams.me]\nlisten = \"127.0.0.1:7001\"\nendpoints = [\"127.0.0.1:7001\"]\n";
        let Err(e) = parse("t.toml", own_listen, Path::new(".")) else {
            panic!("its own listen port was taken");
        };
        assert!(
            e.to_string()
                .contains("is tollgate's own upstreams.me.listen"),
            "{e}"
        );
        // Another port, another address: no loop.
        for endpoint in ["127.0.0.1:15002", "10.0.0.5:15001", "api:15001"] {
            let text = format!(
                "[listener]\naddr = \"127.0.0.1:15001\"\n[upstreams.me]\nauthorities = [\"me\"]\n\
                 endpoints = [\"{endpoint}\"]\n"
            );
            parse("t.toml", &text, Path::new(".")).unwrap_or_else(|e| panic!("{endpoint}: {e}"));
        }
    }

    #[test]
    fn probe_ports_is_replaced_by_probes_and_says_so() {
        let text = "[admin]\nprobe_ports = [8080]\n\
                    [upstreams.p]\nauthorities = [\"p\"]\nendpoints = [\"127.0.0.1:1\"]\n";
        let Err(e) = parse("t.toml", text, Path::new(".")) else {
            panic!("the old key was taken");
        };
        let e = e.to_string();
        assert!(
            e.contains("admin.probe_ports: `probe_ports` was replaced by `probes`"),
            "{e}"
        );
        assert!(e.contains("probes = [{ port = 8080"), "{e}");
    }

    #[test]
    fn parsing_reads_no_file() {
        let text = "[upstreams.p]\nauthorities = [\"p\"]\nendpoints = [\"127.0.0.1:1\"]\n\
                    [upstreams.p.tls]\nserver_name = \"p.example\"\nca_file = \"/nonexistent/ca.pem\"\n";
        let config = parse("t.toml", text, Path::new("/base")).unwrap();
        let tls = config.upstreams[0].tls.as_ref().unwrap();
        let ca = tls.ca_file.as_ref().unwrap();
        assert_eq!(ca.path, Path::new("/nonexistent/ca.pem"));
        assert_eq!(ca.named_at, (6, 11));
        assert!(tls.material.is_none(), "the file is named, not read");
    }
}
