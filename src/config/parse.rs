//! From TOML text to a validated `Config`, collecting every problem on the way.
//!
//! The document is parsed into toml's spanned tree and walked by hand rather than
//! deserialised with serde: serde stops at the first error, and a user fixing a file
//! wants every mistake at once, each at its line and column and with the fix.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::diagnostic::{ConfigErrors, Diagnostic, Severity, Source};
use super::model::*;
use super::units::{parse_duration, parse_size};
use crate::retry::backoff::{Backoff, Jitter};

type Value<'i> = Spanned<DeValue<'i>>;

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![Diagnostic {
            severity: Severity::Error,
            file: name.clone(),
            line: 1,
            column: 1,
            key: "(file)".into(),
            message: format!("cannot read the config file: {e}"),
            fix: "pass --config PATH or set TOLLGATE_CONFIG to a readable TOML file".into(),
        }])
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&name, &text, base)
}

/// Validates config text. `base` is where relative file paths (certificates) are found.
pub fn parse(file: &str, text: &str, base: &Path) -> Result<Config, ConfigErrors> {
    let source = Source::new(file, text);
    let (root, syntax_errors) = DeTable::parse_recoverable(text);
    let mut w = Walker {
        src: source,
        diags: Vec::new(),
        positions: BTreeMap::new(),
        base,
    };
    for e in syntax_errors {
        let span = e.span().unwrap_or(0..0);
        w.error(
            span,
            "(syntax)",
            e.message().trim().to_string(),
            "fix the TOML syntax",
        );
    }
    let config = w.root(root.get_ref(), root.span());
    let mut errors: Vec<Diagnostic> = w.diags;
    errors.sort_by_key(|d| (d.line, d.column));
    errors.dedup();
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(errors))
    }
}

struct Walker<'a> {
    src: Source<'a>,
    diags: Vec<Diagnostic>,
    positions: BTreeMap<String, (usize, usize)>,
    base: &'a Path,
}

/// The dotted name of `key` under `path`. An empty key (`"" = 1` is valid TOML) is
/// written as TOML spells it, so a diagnostic always names a key.
fn join(path: &str, key: &str) -> String {
    let key = if key.is_empty() { "\"\"" } else { key };
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn kind(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// The closest allowed key, when it is close enough to be a typo.
fn suggest<'k>(key: &str, allowed: &[&'k str]) -> Option<&'k str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1];
            for (j, cb) in b.iter().enumerate() {
                let cost = usize::from(ca != *cb);
                cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
            }
            prev = cur;
        }
        prev[b.len()]
    }
    allowed
        .iter()
        .map(|k| (distance(key, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min()
        .map(|(_, k)| k)
}

impl<'a> Walker<'a> {
    fn error(&mut self, span: Range<usize>, key: &str, msg: impl Into<String>, fix: &str) {
        let d = self.src.diagnostic(Severity::Error, span, key, msg, fix);
        self.diags.push(d);
    }

    fn note_position(&mut self, key: &str, span: &Range<usize>) {
        let pos = self.src.position(span.start);
        self.positions.entry(key.to_string()).or_insert(pos);
    }

    /// Reports keys not in `allowed`; records where each key was written.
    fn keys(&mut self, path: &str, table: &DeTable<'_>, allowed: &[&str]) {
        for (k, v) in table.iter() {
            let name = k.get_ref().as_ref();
            let full = join(path, name);
            self.note_position(&full, &k.span());
            if !allowed.contains(&name) {
                let fix = match suggest(name, allowed) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("allowed here: {}", allowed.join(", ")),
                };
                self.error(k.span(), &full, format!("unknown key `{name}`"), &fix);
            }
            let _ = v;
        }
    }

    fn get<'t, 'i>(&self, table: &'t DeTable<'i>, key: &str) -> Option<&'t Value<'i>> {
        table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v)
    }

    fn sub_table<'t, 'i>(
        &mut self,
        table: &'t DeTable<'i>,
        path: &str,
        key: &str,
    ) -> Option<(&'t DeTable<'i>, Range<usize>)> {
        let v = self.get(table, key)?;
        match v.get_ref() {
            DeValue::Table(t) => Some((t, v.span())),
            other => {
                let full = join(path, key);
                self.error(
                    v.span(),
                    &full,
                    format!("expected a table, found {}", kind(other)),
                    &format!("write it as a [{full}] section"),
                );
                None
            }
        }
    }

    fn string(
        &mut self,
        table: &DeTable<'_>,
        path: &str,
        key: &str,
    ) -> Option<(String, Range<usize>)> {
        let v = self.get(table, key)?;
        match v.get_ref() {
            DeValue::String(s) => Some((s.to_string(), v.span())),
            other => {
                let full = join(path, key);
                self.error(
                    v.span(),
                    &full,
                    format!("expected a string, found {}", kind(other)),
                    "put the value in double quotes",
                );
                None
            }
        }
    }

    fn strings(
        &mut self,
        table: &DeTable<'_>,
        path: &str,
        key: &str,
    ) -> Option<Vec<(String, Range<usize>)>> {
        let v = self.get(table, key)?;
        let full = join(path, key);
        match v.get_ref() {
            DeValue::Array(items) => {
                let mut out = Vec::new();
                for item in items.iter() {
                    match item.get_ref() {
                        DeValue::String(s) => out.push((s.to_string(), item.span())),
                        // Status codes may be written as numbers: on = [502, 503].
                        DeValue::Integer(i) if i.radix() == 10 => {
                            out.push((i.as_str().to_string(), item.span()))
                        }
                        other => self.error(
                            item.span(),
                            &full,
                            format!("expected a string in the list, found {}", kind(other)),
                            "put each entry in double quotes",
                        ),
                    }
                }
                Some(out)
            }
            other => {
                self.error(
                    v.span(),
                    &full,
                    format!("expected a list of strings, found {}", kind(other)),
                    "write it as [\"a\", \"b\"]",
                );
                None
            }
        }
    }

    fn duration(
        &mut self,
        table: &DeTable<'_>,
        path: &str,
        key: &str,
        default: Duration,
        range: (Duration, Duration),
    ) -> Duration {
        let full = join(path, key);
        let Some(v) = self.get(table, key) else {
            return default;
        };
        let span = v.span();
        let parsed = match v.get_ref() {
            DeValue::String(s) => parse_duration(s),
            DeValue::Integer(i) => Err(format!(
                "a bare number is ambiguous; write \"{}ms\" or \"{}s\"",
                i.as_str(),
                i.as_str()
            )),
            other => Err(format!("expected a duration string, found {}", kind(other))),
        };
        match parsed {
            Ok(d) if d >= range.0 && d <= range.1 => d,
            Ok(d) => {
                self.error(
                    span,
                    &full,
                    format!("{} is out of range", super::units::format_duration(d)),
                    &format!(
                        "use a value from {} to {}",
                        super::units::format_duration(range.0),
                        super::units::format_duration(range.1)
                    ),
                );
                default
            }
            Err(e) => {
                self.error(
                    span,
                    &full,
                    format!("invalid duration: {e}"),
                    "write a number with a unit: \"250ms\", \"2s\", \"1m\"",
                );
                default
            }
        }
    }

    fn size(
        &mut self,
        table: &DeTable<'_>,
        path: &str,
        key: &str,
        default: usize,
        range: (usize, usize),
    ) -> usize {
        let full = join(path, key);
        let Some(v) = self.get(table, key) else {
            return default;
        };
        let span = v.span();
        let parsed = match v.get_ref() {
            DeValue::String(s) => parse_size(s),
            DeValue::Integer(i) => i
                .as_str()
                .parse::<u64>()
                .map_err(|_| format!("`{}` is not a size", i.as_str())),
            other => Err(format!("expected a size, found {}", kind(other))),
        };
        let fmt = |n: usize| super::units::format_size(n as u64);
        match parsed.map(|n| usize::try_from(n).unwrap_or(usize::MAX)) {
            Ok(n) if n >= range.0 && n <= range.1 => n,
            Ok(n) => {
                self.error(
                    span,
                    &full,
                    format!("{} is out of range", fmt(n)),
                    &format!("use a size from {} to {}", fmt(range.0), fmt(range.1)),
                );
                default
            }
            Err(e) => {
                self.error(
                    span,
                    &full,
                    format!("invalid size: {e}"),
                    "write a whole number with a unit: \"64KiB\", \"1MiB\"",
                );
                default
            }
        }
    }

    fn integer(
        &mut self,
        table: &DeTable<'_>,
        path: &str,
        key: &str,
        default: u64,
        range: (u64, u64),
    ) -> u64 {
        let full = join(path, key);
        let Some(v) = self.get(table, key) else {
            return default;
        };
        let span = v.span();
        let parsed = match v.get_ref() {
            DeValue::Integer(i) => u64::from_str_radix(i.as_str(), i.radix())
                .map_err(|_| format!("{} is not a whole number of at least 0", i.as_str())),
            other => Err(format!("expected an integer, found {}", kind(other))),
        };
        match parsed {
            Ok(n) if n >= range.0 && n <= range.1 => n,
            Ok(n) => {
                self.error(
                    span,
                    &full,
                    format!("{n} is out of range"),
                    &format!("use a value from {} to {}", range.0, range.1),
                );
                default
            }
            Err(e) => {
                self.error(
                    span,
                    &full,
                    e,
                    &format!("use a whole number from {} to {}", range.0, range.1),
                );
                default
            }
        }
    }

    fn number(
        &mut self,
        table: &DeTable<'_>,
        path: &str,
        key: &str,
        default: f64,
        range: (f64, f64),
    ) -> f64 {
        let full = join(path, key);
        let Some(v) = self.get(table, key) else {
            return default;
        };
        let span = v.span();
        let parsed = match v.get_ref() {
            DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                .map(|n| n as f64)
                .map_err(|_| format!("{} is not a number", i.as_str())),
            DeValue::Float(f) => f
                .as_str()
                .replace('_', "")
                .parse::<f64>()
                .map_err(|_| format!("{} is not a number", f.as_str())),
            other => Err(format!("expected a number, found {}", kind(other))),
        };
        match parsed {
            Ok(n) if n.is_finite() && n >= range.0 && n <= range.1 => n,
            Ok(n) => {
                self.error(
                    span,
                    &full,
                    format!("{n} is out of range"),
                    &format!("use a value from {} to {}", range.0, range.1),
                );
                default
            }
            Err(e) => {
                self.error(span, &full, e, "write a number such as 0.1");
                default
            }
        }
    }

    fn socket_addr(
        &mut self,
        table: &DeTable<'_>,
        path: &str,
        key: &str,
    ) -> Option<(SocketAddr, Range<usize>)> {
        let (text, span) = self.string(table, path, key)?;
        match text.parse::<SocketAddr>() {
            Ok(a) => Some((a, span)),
            Err(_) => {
                self.error(
                    span,
                    &join(path, key),
                    format!("`{text}` is not an IP address with a port"),
                    "write it as \"127.0.0.1:15001\" or \"[::1]:15001\"",
                );
                None
            }
        }
    }

    fn header_name(&mut self, text: &str, span: Range<usize>, full: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(text.as_bytes()) {
            Ok(h) => Some(h),
            Err(_) => {
                self.error(
                    span,
                    full,
                    format!("`{text}` is not a valid header name"),
                    "use letters, digits and dashes, e.g. \"x-timeout-ms\"",
                );
                None
            }
        }
    }

    fn root(&mut self, root: &DeTable<'_>, _span: Range<usize>) -> Config {
        self.keys(
            "",
            root,
            &["runtime", "listener", "admin", "deadline", "upstreams"],
        );
        let runtime = self.runtime(root);
        let listener = self.listener(root);
        let admin = self.admin(root);
        let deadline = self.deadline(root);
        let upstreams = self.upstreams(root, &listener, &admin);
        Config {
            file: self.src.file.to_string(),
            runtime,
            listener,
            admin,
            deadline,
            upstreams,
            positions: Arc::new(std::mem::take(&mut self.positions)),
            source_hash: source_hash(self.src.text),
        }
    }

    fn runtime(&mut self, root: &DeTable<'_>) -> RuntimeConfig {
        let Some((t, _)) = self.sub_table(root, "", "runtime") else {
            return RuntimeConfig {
                worker_threads: None,
            };
        };
        self.keys("runtime", t, &["worker_threads"]);
        let threads = self
            .get(t, "worker_threads")
            .is_some()
            .then(|| self.integer(t, "runtime", "worker_threads", 1, (1, 1024)) as usize);
        RuntimeConfig {
            worker_threads: threads,
        }
    }

    fn listener(&mut self, root: &DeTable<'_>) -> ListenerConfig {
        let defaults = ListenerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 15001)),
            drain_timeout: Duration::from_secs(20),
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
        };
        let Some((t, _)) = self.sub_table(root, "", "listener") else {
            return defaults;
        };
        let p = "listener";
        self.keys(
            p,
            t,
            &[
                "addr",
                "drain_timeout",
                "header_read_timeout",
                "max_header_bytes",
                "max_headers",
                "idle_timeout",
                "max_connections",
            ],
        );
        let secs = Duration::from_secs;
        ListenerConfig {
            addr: self
                .socket_addr(t, p, "addr")
                .map_or(defaults.addr, |(a, _)| a),
            drain_timeout: self.duration(
                t,
                p,
                "drain_timeout",
                defaults.drain_timeout,
                (Duration::ZERO, secs(3600)),
            ),
            header_read_timeout: self.duration(
                t,
                p,
                "header_read_timeout",
                defaults.header_read_timeout,
                (Duration::from_millis(10), secs(600)),
            ),
            max_header_bytes: self.size(
                t,
                p,
                "max_header_bytes",
                defaults.max_header_bytes,
                (1024, 1 << 20),
            ),
            max_headers: self.integer(t, p, "max_headers", 100, (1, 1000)) as usize,
            idle_timeout: self.duration(
                t,
                p,
                "idle_timeout",
                defaults.idle_timeout,
                (Duration::from_millis(100), secs(24 * 3600)),
            ),
            max_connections: self.integer(t, p, "max_connections", 10_000, (1, 1_000_000)) as usize,
        }
    }

    fn admin(&mut self, root: &DeTable<'_>) -> AdminConfig {
        let default = SocketAddr::from(([127, 0, 0, 1], 15090));
        let Some((t, _)) = self.sub_table(root, "", "admin") else {
            return AdminConfig { addr: default };
        };
        self.keys("admin", t, &["addr"]);
        AdminConfig {
            addr: self
                .socket_addr(t, "admin", "addr")
                .map_or(default, |(a, _)| a),
        }
    }

    fn deadline(&mut self, root: &DeTable<'_>) -> DeadlineConfig {
        let mut cfg = DeadlineConfig {
            header: HeaderName::from_static("x-timeout-ms"),
            accept: [
                "x-timeout-ms",
                "grpc-timeout",
                "x-envoy-expected-rq-timeout-ms",
            ]
            .into_iter()
            .map(HeaderName::from_static)
            .collect(),
        };
        let Some((t, _)) = self.sub_table(root, "", "deadline") else {
            return cfg;
        };
        self.keys("deadline", t, &["header", "accept"]);
        if let Some((text, span)) = self.string(t, "deadline", "header")
            && let Some(h) = self.header_name(&text, span, "deadline.header")
        {
            cfg.header = h;
        }
        if let Some(list) = self.strings(t, "deadline", "accept") {
            cfg.accept = list
                .into_iter()
                .filter_map(|(text, span)| self.header_name(&text, span, "deadline.accept"))
                .collect();
        }
        cfg
    }

    fn upstreams(
        &mut self,
        root: &DeTable<'_>,
        listener: &ListenerConfig,
        admin: &AdminConfig,
    ) -> Vec<UpstreamConfig> {
        let mut out = Vec::new();
        let Some((t, _)) = self.sub_table(root, "", "upstreams") else {
            return out;
        };
        // authority -> (upstream, span) and listen -> (upstream, span), to report clashes.
        let mut claimed: HashMap<String, String> = HashMap::new();
        let mut ports: HashMap<SocketAddr, String> = HashMap::new();
        ports.insert(listener.addr, "listener.addr".into());
        if admin.addr != listener.addr {
            ports.insert(admin.addr, "admin.addr".into());
        }
        for (name, value) in t.iter() {
            let name_str = name.get_ref().to_string();
            let path = format!("upstreams.{name_str}");
            self.note_position(&path, &name.span());
            if name_str.is_empty()
                || !name_str
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                self.error(
                    name.span(),
                    &path,
                    format!("`{name_str}` is not a usable upstream name"),
                    "use letters, digits, `-` and `_` (it becomes a metric label)",
                );
            }
            let DeValue::Table(ut) = value.get_ref() else {
                self.error(
                    value.span(),
                    &path,
                    format!("expected a table, found {}", kind(value.get_ref())),
                    &format!("write it as a [{path}] section"),
                );
                continue;
            };
            let Some(up) = self.upstream(&name_str, &path, ut, name.span()) else {
                continue;
            };
            for (i, auth) in up.authorities.iter().enumerate() {
                if let Some(other) = claimed.get(auth) {
                    let span = self
                        .get(ut, "authorities")
                        .and_then(|v| match v.get_ref() {
                            DeValue::Array(a) => a.get(i).map(|x| x.span()),
                            _ => None,
                        })
                        .unwrap_or(name.span());
                    self.error(
                        span,
                        &format!("{path}.authorities"),
                        format!("`{auth}` is already claimed by upstream `{other}`"),
                        "give each authority to exactly one upstream",
                    );
                } else {
                    claimed.insert(auth.clone(), name_str.clone());
                }
            }
            if let Some(listen) = up.listen {
                if let Some(other) = ports.get(&listen) {
                    let span = self.get(ut, "listen").map_or(name.span(), |v| v.span());
                    self.error(
                        span,
                        &format!("{path}.listen"),
                        format!("{listen} is already used by {other}"),
                        "give every listener its own port",
                    );
                } else {
                    ports.insert(listen, format!("{path}.listen"));
                }
            }
            out.push(up);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn upstream(
        &mut self,
        name: &str,
        path: &str,
        t: &DeTable<'_>,
        name_span: Range<usize>,
    ) -> Option<UpstreamConfig> {
        self.keys(
            path,
            t,
            &[
                "authorities",
                "listen",
                "endpoints",
                "host",
                "protocol",
                "connect_timeout",
                "request_timeout",
                "attempt_timeout",
                "max_inflight",
                "retry",
                "tls",
                "budget",
            ],
        );
        let mut authorities = Vec::new();
        if let Some(list) = self.strings(t, path, "authorities") {
            for (text, span) in list {
                match normalize_authority(&text) {
                    Some(a) => authorities.push(a),
                    None => self.error(
                        span,
                        &format!("{path}.authorities"),
                        format!("`{text}` is not a host name or host:port"),
                        "write the name the app calls, e.g. \"payments\" or \"payments:8080\"",
                    ),
                }
            }
        }
        let listen = self.socket_addr(t, path, "listen").map(|(a, _)| a);
        if authorities.is_empty() && listen.is_none() {
            self.error(
                name_span.clone(),
                path,
                "no way to reach this upstream: neither `authorities` nor `listen` is set",
                "add authorities = [\"<name the app calls>\"] or listen = \"127.0.0.1:<port>\"",
            );
        }

        let mut endpoints = Vec::new();
        match self.strings(t, path, "endpoints") {
            None if self.get(t, "endpoints").is_none() => self.error(
                name_span.clone(),
                &format!("{path}.endpoints"),
                "missing: an upstream needs at least one endpoint",
                "add endpoints = [\"host:port\"]",
            ),
            None => {}
            Some(list) => {
                if list.is_empty() {
                    let span = self
                        .get(t, "endpoints")
                        .map_or(name_span.clone(), |v| v.span());
                    self.error(
                        span,
                        &format!("{path}.endpoints"),
                        "the list is empty",
                        "add at least one \"host:port\"",
                    );
                }
                for (text, span) in list {
                    match parse_endpoint(&text) {
                        Ok(e) => endpoints.push(e),
                        Err(msg) => self.error(
                            span,
                            &format!("{path}.endpoints"),
                            msg,
                            "write each endpoint as \"host:port\" or \"10.0.0.5:8080\"",
                        ),
                    }
                }
            }
        }

        let host = self.string(t, path, "host").and_then(|(text, span)| {
            match (normalize_authority(&text), HeaderValue::from_str(&text)) {
                (Some(_), Ok(v)) => Some(v),
                _ => {
                    self.error(
                        span,
                        &format!("{path}.host"),
                        format!("`{text}` is not a valid Host value"),
                        "write a host name, optionally with :port",
                    );
                    None
                }
            }
        });

        let protocol = match self.string(t, path, "protocol") {
            None => Protocol::Auto,
            Some((p, span)) => match p.as_str() {
                "http1" => Protocol::Http1,
                "h2c" | "h2" | "http2" => Protocol::H2,
                "auto" => Protocol::Auto,
                other => {
                    self.error(
                        span,
                        &format!("{path}.protocol"),
                        format!("unknown protocol `{other}`"),
                        "use \"http1\", \"h2c\" or \"auto\"",
                    );
                    Protocol::Auto
                }
            },
        };

        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        let connect_timeout =
            self.duration(t, path, "connect_timeout", ms(200), (ms(1), secs(600)));
        let request_timeout = self.duration(
            t,
            path,
            "request_timeout",
            secs(2),
            (ms(1), secs(24 * 3600)),
        );
        let attempt_timeout = self.duration(
            t,
            path,
            "attempt_timeout",
            ms(600),
            (ms(1), secs(24 * 3600)),
        );
        let max_inflight = self.integer(t, path, "max_inflight", 1000, (1, 10_000_000)) as usize;

        let retry = match self.sub_table(t, path, "retry") {
            Some((rt, _)) => self.retry(&format!("{path}.retry"), rt),
            None => RetryConfig::off(),
        };
        let budget = self
            .sub_table(t, path, "budget")
            .map(|(bt, _)| self.budget(&format!("{path}.budget"), bt));
        let tls = self
            .sub_table(t, path, "tls")
            .and_then(|(tt, span)| self.tls(&format!("{path}.tls"), tt, span, protocol));

        Some(UpstreamConfig {
            name: name.to_string(),
            authorities,
            listen,
            endpoints,
            host,
            protocol,
            connect_timeout,
            request_timeout,
            attempt_timeout,
            max_inflight,
            retry,
            budget,
            tls,
        })
    }

    fn retry(&mut self, path: &str, t: &DeTable<'_>) -> RetryConfig {
        self.keys(
            path,
            t,
            &[
                "max_attempts",
                "on",
                "methods",
                "idempotency_header",
                "backoff_base",
                "backoff_max",
                "retry_after",
                "max_retry_after",
                "max_body",
                "backoff_jitter",
                "ownership",
            ],
        );
        let d = RetryConfig::default();
        let max_attempts = self.integer(t, path, "max_attempts", 3, (1, 10)) as u32;

        let on = match self.strings(t, path, "on") {
            None => d.on.clone(),
            Some(list) => {
                let mut on = RetryOn::none();
                for (word, span) in list {
                    match word.as_str() {
                        "connect-failure" => on.connect_failure = true,
                        "reset" => on.reset = true,
                        "timeout" => on.timeout = true,
                        "unavailable" => on.unavailable = true,
                        code => match code.parse::<u16>() {
                            Ok(c) if (400..600).contains(&c) => on.add_status(c),
                            _ => self.error(
                                span,
                                &format!("{path}.on"),
                                format!("`{word}` is not a retry condition"),
                                "use connect-failure, reset, timeout, unavailable or a status from 400 to 599",
                            ),
                        },
                    }
                }
                on
            }
        };

        let methods = match self.strings(t, path, "methods") {
            None => d.methods.clone(),
            Some(list) => list
                .into_iter()
                .filter_map(|(m, span)| {
                    let valid = !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase());
                    match Method::from_bytes(m.as_bytes()) {
                        Ok(method) if valid => Some(method),
                        _ => {
                            self.error(
                                span,
                                &format!("{path}.methods"),
                                format!("`{m}` is not an HTTP method"),
                                "write methods in upper case, e.g. \"GET\"",
                            );
                            None
                        }
                    }
                })
                .collect(),
        };

        let idempotency_header = match self.string(t, path, "idempotency_header") {
            None => d.idempotency_header.clone(),
            Some((text, _)) if text.is_empty() => None,
            Some((text, span)) => {
                self.header_name(&text, span, &format!("{path}.idempotency_header"))
            }
        };

        let ms = Duration::from_millis;
        let secs = Duration::from_secs;
        let base_given = self.get(t, "backoff_base").map(|v| v.span());
        let base = self.duration(t, path, "backoff_base", ms(25), (ms(1), secs(60)));
        let max = self.duration(t, path, "backoff_max", secs(1), (ms(1), secs(600)));
        let jitter = match self.string(t, path, "backoff_jitter") {
            None => Jitter::Full,
            Some((text, span)) => match text.as_str() {
                "full" => Jitter::Full,
                "none" => Jitter::None,
                other => {
                    self.error(
                        span,
                        &format!("{path}.backoff_jitter"),
                        format!("`{other}` is not a jitter mode"),
                        "use \"full\" (recommended) or \"none\"",
                    );
                    Jitter::Full
                }
            },
        };
        let ownership = match self.string(t, path, "ownership") {
            None => Ownership::Honor,
            Some((text, span)) => match text.as_str() {
                "honor" | "honour" => Ownership::Honor,
                "ignore" => Ownership::Ignore,
                other => {
                    self.error(
                        span,
                        &format!("{path}.ownership"),
                        format!("`{other}` is not an ownership mode"),
                        "use \"honor\" (recommended) or \"ignore\"",
                    );
                    Ownership::Honor
                }
            },
        };
        let backoff = match Backoff::try_new(base, max) {
            Ok(b) => b.with_jitter(jitter),
            Err(e) => {
                let span = base_given.unwrap_or(0..0);
                self.error(
                    span,
                    &format!("{path}.backoff_base"),
                    e.to_string(),
                    "make backoff_base at most backoff_max",
                );
                Backoff::default()
            }
        };

        let retry_after = match self.string(t, path, "retry_after") {
            None => RetryAfterMode::Honor,
            Some((text, span)) => match text.as_str() {
                "honor" | "honour" => RetryAfterMode::Honor,
                "ignore" => RetryAfterMode::Ignore,
                other => {
                    self.error(
                        span,
                        &format!("{path}.retry_after"),
                        format!("`{other}` is not a Retry-After mode"),
                        "use \"honor\" or \"ignore\"",
                    );
                    RetryAfterMode::Honor
                }
            },
        };
        let max_retry_after = self.duration(
            t,
            path,
            "max_retry_after",
            secs(5),
            (Duration::ZERO, secs(3600)),
        );
        let max_body = self.size(t, path, "max_body", 64 * 1024, (0, 64 << 20));

        RetryConfig {
            max_attempts,
            on,
            methods,
            idempotency_header,
            backoff,
            retry_after,
            max_retry_after,
            max_body,
            ownership,
        }
    }

    fn budget(&mut self, path: &str, t: &DeTable<'_>) -> BudgetConfig {
        self.keys(path, t, &["ratio", "min_per_sec", "window"]);
        let d = BudgetConfig::default();
        BudgetConfig {
            ratio: self.number(t, path, "ratio", d.ratio, (0.0, 1000.0)),
            min_per_sec: self.number(t, path, "min_per_sec", d.min_per_sec, (0.0, 1e6)),
            window: self.duration(
                t,
                path,
                "window",
                d.window,
                (Duration::from_millis(100), Duration::from_secs(3600)),
            ),
        }
    }

    fn tls(
        &mut self,
        path: &str,
        t: &DeTable<'_>,
        span: Range<usize>,
        protocol: Protocol,
    ) -> Option<TlsConfig> {
        self.keys(
            path,
            t,
            &["server_name", "ca_file", "client_cert", "client_key"],
        );
        let server_name = self.string(t, path, "server_name");
        let ca = self.string(t, path, "ca_file");
        let cert = self.string(t, path, "client_cert");
        let key = self.string(t, path, "client_key");
        let Some((server_name, sn_span)) = server_name else {
            self.error(
                span,
                &format!("{path}.server_name"),
                "missing: TLS needs the name the upstream's certificate carries",
                "add server_name = \"api.example.com\"",
            );
            return None;
        };
        if rustls_pki_types::ServerName::try_from(server_name.as_str()).is_err() {
            self.error(
                sn_span,
                &format!("{path}.server_name"),
                format!("`{server_name}` is not a DNS name or IP address"),
                "write the host name the certificate is issued for",
            );
            return None;
        }
        if cert.is_some() != key.is_some() {
            let (span, missing) = match (&cert, &key) {
                (Some((_, s)), None) => (s.clone(), "client_key"),
                (None, Some((_, s))) => (s.clone(), "client_cert"),
                _ => (span.clone(), "client_key"),
            };
            self.error(
                span,
                &format!("{path}.{missing}"),
                "mTLS needs both client_cert and client_key",
                &format!("add {missing}, or remove the other one"),
            );
            return None;
        }
        let resolve = |p: &str| {
            let p = Path::new(p);
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                self.base.join(p)
            }
        };
        let ca_path = ca.as_ref().map(|(p, s)| (resolve(p), s.clone()));
        let cert_path = cert.as_ref().map(|(p, s)| (resolve(p), s.clone()));
        let key_path = key.as_ref().map(|(p, s)| (resolve(p), s.clone()));
        match crate::upstream::tls::client_config(
            ca_path.as_ref().map(|(p, _)| p.as_path()),
            cert_path
                .as_ref()
                .zip(key_path.as_ref())
                .map(|((c, _), (k, _))| (c.as_path(), k.as_path())),
            protocol,
        ) {
            Ok((client, fingerprint)) => Some(TlsConfig {
                server_name,
                ca_file: ca_path.map(|(p, _)| p),
                client_cert: cert_path.map(|(p, _)| p),
                client_key: key_path.map(|(p, _)| p),
                client: Arc::new(client),
                fingerprint,
            }),
            Err(e) => {
                let (key_name, span) = match e.file {
                    crate::upstream::tls::TlsFile::Ca => ("ca_file", ca_path.map(|(_, s)| s)),
                    crate::upstream::tls::TlsFile::Cert => {
                        ("client_cert", cert_path.map(|(_, s)| s))
                    }
                    crate::upstream::tls::TlsFile::Key => ("client_key", key_path.map(|(_, s)| s)),
                };
                self.error(
                    span.unwrap_or(sn_span),
                    &format!("{path}.{key_name}"),
                    e.message,
                    e.fix,
                );
                None
            }
        }
    }
}

/// A digest of config text (stable within one build of tollgate).
pub fn source_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
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
}
