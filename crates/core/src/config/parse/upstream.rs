//! `[upstreams.NAME]`: one upstream, and what upstreams must not share (an authority,
//! a port). A clash is reported at the second place, naming the first.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use http::HeaderValue;

use super::schema::Section;
use super::walker::{At, Choice, Table, Walker};
use crate::config::cluster::ClusterNames;
use crate::config::keys::{root as root_key, upstream as key};
use crate::config::model::*;

/// `protocol`: the HTTP the upstream is spoken to in (`h2` and `http2` mean `h2c`).
const PROTOCOL: Choice<Protocol> = Choice {
    what: "a protocol",
    fix: "use \"http1\", \"h2c\" or \"auto\"",
    words: &[
        ("http1", Protocol::Http1),
        ("h2c", Protocol::H2),
        ("h2", Protocol::H2),
        ("http2", Protocol::H2),
        ("auto", Protocol::Auto),
    ],
};

/// Where something was first claimed: by whom, and at which line and column when it
/// was written (a default address was not).
struct Claim {
    by: String,
    at: Option<(usize, usize)>,
}

impl Claim {
    fn describe(&self) -> String {
        match self.at {
            Some((line, column)) => format!("{} at {line}:{column}", self.by),
            None => format!("{} (the default)", self.by),
        }
    }
}

/// What the upstreams claimed so far, to report the second claim of anything at the
/// second place, naming the first.
struct Claims {
    authorities: HashMap<String, Claim>,
    ports: HashMap<SocketAddr, Claim>,
    /// `listener.addr`: an endpoint there is tollgate itself.
    listener: SocketAddr,
    /// Every authority written, where, and by which upstream: for the names it
    /// stands for in the pod's namespace.
    written: Vec<(String, Range<usize>, String)>,
}

impl Claims {
    fn new(w: &Walker<'_>, listener: &ListenerConfig, admin: &AdminConfig) -> Self {
        let mut ports = HashMap::new();
        for (addr, key) in [(listener.addr, "listener.addr"), (admin.addr, "admin.addr")] {
            ports.entry(addr).or_insert(Claim {
                by: key.to_string(),
                at: w.positions.get(key).copied(),
            });
        }
        Claims {
            authorities: HashMap::new(),
            ports,
            listener: listener.addr,
            written: Vec::new(),
        }
    }

    /// A dotless authority also stands for its names in the pod's namespace: one that
    /// another upstream lists explicitly is claimed twice.
    fn expansions(&self, w: &mut Walker<'_>, cluster: Option<&ClusterNames>) {
        let Some(cluster) = cluster else {
            return;
        };
        for (auth, span, upstream) in &self.written {
            for name in cluster.expand(auth) {
                let Some(other) = self.authorities.get(&name) else {
                    continue;
                };
                if other.by == format!("upstream `{upstream}`") {
                    continue;
                }
                w.error(
                    span.clone(),
                    &format!("upstreams.{upstream}.authorities"),
                    format!(
                        "`{auth}` also stands for `{name}` in namespace {} (POD_NAMESPACE), \
                         which {} lists",
                        cluster.namespace,
                        other.describe()
                    ),
                    "give each Service's names to one upstream",
                );
            }
        }
    }

    /// Each authority belongs to one upstream.
    fn authority(&mut self, w: &mut Walker<'_>, auth: &str, span: Range<usize>, upstream: &str) {
        self.written
            .push((auth.to_string(), span.clone(), upstream.to_string()));
        match self.authorities.get(auth) {
            Some(first) => w.error(
                span,
                &format!("upstreams.{upstream}.authorities"),
                format!("`{auth}` is already claimed by {}", first.describe()),
                "give each authority to exactly one upstream",
            ),
            None => {
                let claim = Claim {
                    by: format!("upstream `{upstream}`"),
                    at: Some(w.src.position(span.start)),
                };
                self.authorities.insert(auth.to_string(), claim);
            }
        }
    }

    /// Each port is bound once: the listener, the admin endpoint, each `listen`.
    fn port(&mut self, w: &mut Walker<'_>, addr: SocketAddr, span: Range<usize>, key: String) {
        match self.ports.get(&addr) {
            Some(first) => w.error(
                span,
                &key,
                format!("{addr} is already used by {}", first.describe()),
                "give every listener its own port",
            ),
            None => {
                let at = Some(w.src.position(span.start));
                self.ports.insert(addr, Claim { by: key, at });
            }
        }
    }
}

/// Every `[upstreams.NAME]`, sorted by name.
pub(super) fn upstreams(
    w: &mut Walker<'_>,
    root: &Table,
    listener: &ListenerConfig,
    admin: &AdminConfig,
    base: &Path,
) -> Vec<UpstreamConfig> {
    let mut out = Vec::new();
    let Some((all, _)) = w.table(root, root_key::upstreams) else {
        return out;
    };
    let mut claims = Claims::new(w, listener, admin);
    for (name, _) in all.items.iter() {
        let name_str = name.get_ref().to_string();
        let path = all.key(&name_str);
        w.note_position(&path, &name.span());
        let usable = !name_str.is_empty()
            && name_str
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !usable {
            w.error(
                name.span(),
                &path,
                format!("`{name_str}` is not a usable upstream name"),
                "use letters, digits, `-` and `_` (it becomes a metric label)",
            );
        } else if name_str == PASSTHROUGH {
            w.error(
                name.span(),
                &path,
                format!(
                    "`{PASSTHROUGH}` is reserved: requests for unknown authorities are counted \
                     under upstream=\"{PASSTHROUGH}\""
                ),
                "give the upstream another name",
            );
        }
        let Some((t, _)) = w.table(&all, &name_str) else {
            continue;
        };
        out.push(upstream(w, &name_str, &t, name.span(), &mut claims, base));
    }
    claims.expansions(w, ClusterNames::from_env());
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// One upstream; `name_span` is where its name is written.
fn upstream(
    w: &mut Walker<'_>,
    name: &str,
    t: &Table,
    name_span: Range<usize>,
    claims: &mut Claims,
    base: &Path,
) -> UpstreamConfig {
    w.check_keys(Section::Upstream, name, t);
    let mut authorities = Vec::new();
    for (auth, span) in self::authorities(w, t) {
        claims.authority(w, &auth, span, name);
        authorities.push(auth);
    }
    let listen = w.socket_addr(t, key::listen).map(|(addr, span)| {
        claims.port(w, addr, span, t.key(key::listen));
        addr
    });
    let unreachable = authorities.is_empty()
        && listen.is_none()
        && !w.is_invalid(&t.key(key::authorities))
        && !w.is_invalid(&t.key(key::listen));
    if unreachable {
        w.error(
            name_span.clone(),
            &t.path,
            "no way to reach this upstream: neither `authorities` nor `listen` is set",
            "add authorities = [\"<name the app calls>\"] or listen = \"127.0.0.1:<port>\"",
        );
    }
    let found = super::discovery::discovery(w, t, &name_span);
    let d = UpstreamConfig::default();
    let protocol = w.word(t, key::protocol, &PROTOCOL).unwrap_or(d.protocol);
    let ms = Duration::from_millis;
    let secs = Duration::from_secs;
    let day = secs(24 * 3600);
    UpstreamConfig {
        name: name.to_string(),
        authorities,
        listen,
        endpoints: endpoints(w, t, &name_span, found.needs_endpoints, &{
            let mut ours = vec![(claims.listener, "listener.addr".to_string())];
            ours.extend(listen.map(|l| (l, t.key(key::listen))));
            ours
        }),
        discovery: found.discovery,
        host: host(w, t),
        protocol,
        connect_timeout: w.ranged(
            t,
            key::connect_timeout,
            d.connect_timeout,
            ms(1)..=secs(600),
        ),
        request_timeout: w.optional(t, key::request_timeout, ms(1)..=day),
        attempt_timeout: w.optional(t, key::attempt_timeout, ms(1)..=day),
        max_inflight: w.ranged(
            t,
            key::max_inflight,
            d.max_inflight as u64,
            1..=10_000_000u64,
        ) as usize,
        retry: match w.table(t, key::retry) {
            Some((retry, _)) => super::retry::retry(w, name, &retry),
            None => d.retry,
        },
        budget: w
            .table(t, key::budget)
            .map(|(budget, _)| super::retry::budget(w, name, &budget)),
        tls: w
            .table(t, key::tls)
            .and_then(|(tls, span)| super::tls::tls(w, name, &tls, span, base)),
        max_connection_age: w.optional(t, key::max_connection_age, ms(100)..=secs(7 * 24 * 3600)),
        outlier: w
            .table(t, key::outlier)
            .map(|(outlier, _)| super::health::outlier(w, name, &outlier)),
        hedge: w
            .table(t, key::hedge)
            .map(|(hedge, _)| super::health::hedge(w, name, &hedge)),
        throttle: w
            .table(t, key::throttle)
            .map(|(throttle, _)| super::retry::throttle(w, name, &throttle)),
        app_retries: w
            .word(t, key::app_retries, &super::retry::APP_RETRIES)
            .unwrap_or(d.app_retries),
    }
}

/// The valid authorities, each with where it was written.
fn authorities(w: &mut Walker<'_>, t: &Table) -> Vec<At<String>> {
    let full = t.key(key::authorities);
    let mut out = Vec::new();
    for (text, span) in w.strings(t, key::authorities).unwrap_or_default() {
        match normalize_authority(&text) {
            Some(a) => out.push((a, span)),
            None => w.reject(
                span,
                &full,
                format!("`{text}` is not a host name or host:port"),
                "write the name the app calls, e.g. \"payments\" or \"payments:8080\"",
            ),
        }
    }
    out
}

/// `endpoints`; `needed` when the upstream has no other way to find them.
/// `endpoints`; `ours` are tollgate's own listening addresses that would send a request
/// back to this upstream (the listener, the upstream's own `listen`), each with its key.
fn endpoints(
    w: &mut Walker<'_>,
    t: &Table,
    name_span: &Range<usize>,
    needed: bool,
    ours: &[(SocketAddr, String)],
) -> Vec<EndpointAddr> {
    let full = t.key(key::endpoints);
    let Some(list) = w.strings(t, key::endpoints) else {
        if needed && t.get(key::endpoints).is_none() {
            w.error(
                name_span.clone(),
                &full,
                "missing: an upstream needs at least one endpoint",
                "add endpoints = [\"host:port\"]",
            );
        }
        return Vec::new();
    };
    if list.is_empty() {
        let span = t.span_of(key::endpoints, name_span);
        w.error(
            span,
            &full,
            "the list is empty",
            "add at least one \"host:port\"",
        );
    }
    let mut out = Vec::new();
    for (text, span) in list {
        match parse_endpoint(&text) {
            Ok(e) if let Some((_, by)) = ours.iter().find(|(a, _)| is_tollgate(*a, &e)) => w
                .reject(
                    span,
                    &full,
                    format!("{e} is tollgate's own {by}: every request would come back round"),
                    "write the address of the service itself (its Service name and port)",
                ),
            Ok(e) => out.push(e),
            Err(msg) => w.reject(
                span,
                &full,
                msg,
                "write each endpoint as \"host:port\" or \"10.0.0.5:8080\"",
            ),
        }
    }
    out
}

/// Whether endpoint `e` is tollgate's own socket `ours`: the same port at the same
/// address, or at loopback (an IP or `localhost`) where tollgate listens on loopback or
/// on every address.
fn is_tollgate(ours: SocketAddr, e: &EndpointAddr) -> bool {
    if ours.port() == 0 || ours.port() != e.port {
        return false;
    }
    let on_loopback = ours.ip().is_loopback() || ours.ip().is_unspecified();
    match e.ip() {
        Some(a) => {
            let ip = a.ip().to_canonical();
            ip == ours.ip().to_canonical()
                || ip.is_unspecified()
                || (ip.is_loopback() && on_loopback)
        }
        None => e.host.eq_ignore_ascii_case("localhost") && on_loopback,
    }
}

fn host(w: &mut Walker<'_>, t: &Table) -> Option<HeaderValue> {
    let (text, span) = w.string(t, key::host)?;
    match (normalize_authority(&text), HeaderValue::from_str(&text)) {
        (Some(_), Ok(v)) => Some(v),
        _ => {
            w.reject(
                span,
                &t.key(key::host),
                format!("`{text}` is not a valid Host value"),
                "write a host name, optionally with :port",
            );
            None
        }
    }
}

/// Lower-cases an authority and checks it is `host` or `host:port`.
pub fn normalize_authority(text: &str) -> Option<String> {
    let lower = text.trim().trim_end_matches('.').to_ascii_lowercase();
    if lower.is_empty() {
        return None;
    }
    let auth: http::uri::Authority = lower.parse().ok()?;
    if auth.as_str().contains('@') || auth.host().is_empty() {
        return None;
    }
    Some(lower)
}

/// `host:port`, `[v6]:port`.
pub fn parse_endpoint(text: &str) -> Result<EndpointAddr, String> {
    let text = text.trim();
    if text.contains("://") {
        return Err(format!(
            "`{text}` has a scheme; endpoints are host:port (TLS is set in the tls section)"
        ));
    }
    if let Ok(sa) = text.parse::<SocketAddr>() {
        return Ok(EndpointAddr {
            host: sa.ip().to_string(),
            port: sa.port(),
        });
    }
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("`{text}` has no port"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("`{port}` is not a port number in `{text}`"))?;
    let valid_host = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if !valid_host {
        return Err(format!("`{host}` is not a host name in `{text}`"));
    }
    Ok(EndpointAddr {
        host: host.to_ascii_lowercase(),
        port,
    })
}
