//! A typed config for tests, written out as TOML from the keys tollgate declares
//! (`tollgate_core::config::keys`): a setter exists for each declared key and is named after
//! it, so a key renamed or removed is a compile error here, never a test that quietly
//! tests something else.
//!
//! ```ignore
//! let toml = Config::new()
//!     .upstream("api", |u| {
//!         u.authorities(["api"])
//!             .endpoint(addr)
//!             .retry(|r| r.max_attempts(3).backoff_base("1ms"))
//!     })
//!     .to_toml();
//! ```
//!
//! Listener and admin addresses default to ephemeral loopback ports, as
//! [`super::config`] writes them. A file that must be broken keeps its text.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use tollgate_core::config::keys;

/// A value as TOML writes it.
pub trait Toml {
    fn toml(&self) -> String;
}

impl Toml for &str {
    fn toml(&self) -> String {
        format!("{self:?}")
    }
}

impl Toml for String {
    fn toml(&self) -> String {
        self.as_str().toml()
    }
}

impl Toml for SocketAddr {
    fn toml(&self) -> String {
        self.to_string().toml()
    }
}

impl Toml for Duration {
    /// In whole milliseconds when it is one, else microseconds.
    fn toml(&self) -> String {
        if self.as_micros().is_multiple_of(1000) {
            format!("\"{}ms\"", self.as_millis())
        } else {
            format!("\"{}us\"", self.as_micros())
        }
    }
}

impl Toml for bool {
    fn toml(&self) -> String {
        self.to_string()
    }
}

impl Toml for f64 {
    fn toml(&self) -> String {
        format!("{self:?}")
    }
}

macro_rules! whole {
    ($($t:ty),*) => {$(
        impl Toml for $t {
            fn toml(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

whole!(u16, u32, u64, usize, i32, i64);

impl<T: Toml> Toml for [T] {
    fn toml(&self) -> String {
        let items: Vec<String> = self.iter().map(Toml::toml).collect();
        format!("[{}]", items.join(", "))
    }
}

impl<T: Toml, const N: usize> Toml for [T; N] {
    fn toml(&self) -> String {
        self[..].toml()
    }
}

impl<T: Toml> Toml for Vec<T> {
    fn toml(&self) -> String {
        self[..].toml()
    }
}

/// A value written as it is, for what no other type says (`"adaptive"` is a `&str`).
pub struct Raw(pub &'static str);

impl Toml for Raw {
    fn toml(&self) -> String {
        self.0.to_string()
    }
}

/// A value written as it is, made at run time (`probes = [{ port = ... }]`).
pub struct RawOwned(pub String);

impl Toml for RawOwned {
    fn toml(&self) -> String {
        self.0.clone()
    }
}

/// One section: its keys as written, in order, and its sections.
#[derive(Default)]
struct Table {
    lines: Vec<String>,
    sections: Vec<(String, Table)>,
}

impl Table {
    /// `key = value`, once: a key set again replaces the first.
    fn set(&mut self, key: &str, value: String) {
        let line = format!("{key} = {value}");
        let prefix = format!("{key} = ");
        match self.lines.iter_mut().find(|l| l.starts_with(&prefix)) {
            Some(l) => *l = line,
            None => self.lines.push(line),
        }
    }

    fn write(&self, path: &str, out: &mut String) {
        if !path.is_empty() {
            let _ = writeln!(out, "[{path}]");
        }
        for line in &self.lines {
            let _ = writeln!(out, "{line}");
        }
        for (key, t) in &self.sections {
            let sub = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            t.write(&sub, out);
        }
    }

    fn section(&mut self, key: &str) -> &mut Table {
        let i = match self.sections.iter().position(|(k, _)| k == key) {
            Some(i) => i,
            None => {
                self.sections.push((key.to_string(), Table::default()));
                self.sections.len() - 1
            }
        };
        &mut self.sections[i].1
    }
}

/// Declares a section builder: one setter per key, named as the key and writing the
/// name `keys::$module` declares.
macro_rules! section {
    ($(#[$doc:meta])* $ty:ident, $module:ident { $($key:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Default)]
        pub struct $ty(Table);

        impl $ty {
            /// The keys with a setter, for the test that every declared key has one.
            pub const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];

            $(
                pub fn $key(mut self, value: impl Toml) -> Self {
                    self.0.set(keys::$module::$key, value.toml());
                    self
                }
            )*

            /// Any key the section declares, by name; for a value no setter takes.
            pub fn set(mut self, key: &str, value: impl Toml) -> Self {
                assert!(
                    keys::$module::NAMES.contains(&key),
                    "`{key}` is not a key of [{}]",
                    keys::$module::SECTION.path
                );
                self.0.set(key, value.toml());
                self
            }
        }
    };
}

section!(Runtime, runtime { worker_threads });
section!(
    Listener,
    listener {
        addr,
        drain_timeout,
        header_read_timeout,
        max_header_bytes,
        max_headers,
        idle_timeout,
        max_connections,
        unknown_authorities,
        passthrough_connect_timeout,
    }
);
section!(Admin, admin { addr, probes });
section!(Deadline, deadline { header, accept });
section!(
    AccessLog,
    access_log {
        enabled,
        format,
        query
    }
);
section!(
    Upstream,
    upstream {
        authorities,
        listen,
        endpoints,
        host,
        protocol,
        connect_timeout,
        request_timeout,
        attempt_timeout,
        max_inflight,
        max_connection_age,
        app_retries,
        discovery,
        service,
        port,
    }
);
section!(
    Retry,
    retry {
        max_attempts,
        on,
        methods,
        idempotency_header,
        mint_idempotency_key,
        backoff_base,
        backoff_max,
        backoff_jitter,
        retry_after,
        max_retry_after,
        max_body,
        ownership,
    }
);
section!(
    Budget,
    budget {
        ratio,
        min_per_sec,
        window,
        max_ratio
    }
);
section!(Throttle, throttle { k, window });
section!(
    Outlier,
    outlier {
        consecutive_failures,
        base_ejection,
        max_ejected
    }
);
section!(Hedge, hedge { after, max_extra });
section!(
    Tls,
    tls {
        server_name,
        ca_file,
        client_cert,
        client_key
    }
);
section!(
    Inbound,
    inbound {
        addr,
        app,
        max_inflight,
        request_timeout,
        probe_paths,
        owned_failures,
    }
);
section!(
    InboundRetries,
    inbound_retries {
        ratio,
        min_per_sec,
        window,
        per_caller
    }
);
section!(
    Dedupe,
    dedupe {
        methods,
        ttl,
        max_response,
        store,
        max_entries,
        store_timeout,
        on_store_error,
        header,
        identity_headers,
    }
);
section!(
    Tracing,
    tracing {
        otlp,
        sample,
        batch,
        queue,
        timeout
    }
);
section!(Kubernetes, kubernetes { kubeconfig });

/// A section written inside another: built by `f` from empty, and written even when
/// it stays empty (an empty `[upstreams.p.budget]` takes every default).
fn nest<S: Default + Into<Table>>(parent: &mut Table, key: &str, f: impl FnOnce(S) -> S) {
    *parent.section(key) = f(S::default()).into();
}

macro_rules! into_table {
    ($($ty:ident),*) => {$(
        impl From<$ty> for Table {
            fn from(s: $ty) -> Table {
                s.0
            }
        }
    )*};
}

into_table!(
    Runtime,
    Listener,
    Admin,
    Deadline,
    AccessLog,
    Upstream,
    Retry,
    Budget,
    Throttle,
    Outlier,
    Hedge,
    Tls,
    Inbound,
    InboundRetries,
    Dedupe,
    Tracing,
    Kubernetes
);

impl Upstream {
    /// One more endpoint.
    pub fn endpoint(mut self, addr: impl std::fmt::Display) -> Self {
        let key = keys::upstream::endpoints;
        let prefix = format!("{key} = [");
        let item = format!("{:?}", addr.to_string());
        match self.0.lines.iter_mut().find(|l| l.starts_with(&prefix)) {
            Some(l) => {
                l.pop();
                let sep = if l.ends_with('[') { "" } else { ", " };
                l.push_str(&format!("{sep}{item}]"));
            }
            None => self.0.lines.push(format!("{prefix}{item}]")),
        }
        self
    }

    pub fn retry(mut self, f: impl FnOnce(Retry) -> Retry) -> Self {
        nest(&mut self.0, keys::upstream::retry, f);
        self
    }

    pub fn budget(mut self, f: impl FnOnce(Budget) -> Budget) -> Self {
        nest(&mut self.0, keys::upstream::budget, f);
        self
    }

    pub fn throttle(mut self, f: impl FnOnce(Throttle) -> Throttle) -> Self {
        nest(&mut self.0, keys::upstream::throttle, f);
        self
    }

    pub fn outlier(mut self, f: impl FnOnce(Outlier) -> Outlier) -> Self {
        nest(&mut self.0, keys::upstream::outlier, f);
        self
    }

    pub fn hedge(mut self, f: impl FnOnce(Hedge) -> Hedge) -> Self {
        nest(&mut self.0, keys::upstream::hedge, f);
        self
    }

    pub fn tls(mut self, f: impl FnOnce(Tls) -> Tls) -> Self {
        nest(&mut self.0, keys::upstream::tls, f);
        self
    }
}

impl Inbound {
    pub fn retries(mut self, f: impl FnOnce(InboundRetries) -> InboundRetries) -> Self {
        nest(&mut self.0, keys::inbound::retries, f);
        self
    }

    pub fn dedupe(mut self, f: impl FnOnce(Dedupe) -> Dedupe) -> Self {
        nest(&mut self.0, keys::inbound::dedupe, f);
        self
    }
}

/// A whole config file.
pub struct Config(Table);

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

impl Config {
    /// The listener and the admin endpoint on ephemeral loopback ports, nothing else.
    pub fn new() -> Self {
        let mut root = Table::default();
        let any = "127.0.0.1:0";
        nest(&mut root, keys::root::listener, |l: Listener| l.addr(any));
        nest(&mut root, keys::root::admin, |a: Admin| a.addr(any));
        Config(root)
    }

    pub fn runtime(mut self, f: impl FnOnce(Runtime) -> Runtime) -> Self {
        nest(&mut self.0, keys::root::runtime, f);
        self
    }

    /// `[listener]`, its ephemeral address kept unless `f` sets another.
    pub fn listener(mut self, f: impl FnOnce(Listener) -> Listener) -> Self {
        let t = self.0.section(keys::root::listener);
        *t = f(Listener(std::mem::take(t))).into();
        self
    }

    /// `[admin]`, its ephemeral address kept unless `f` sets another.
    pub fn admin(mut self, f: impl FnOnce(Admin) -> Admin) -> Self {
        let t = self.0.section(keys::root::admin);
        *t = f(Admin(std::mem::take(t))).into();
        self
    }

    pub fn deadline(mut self, f: impl FnOnce(Deadline) -> Deadline) -> Self {
        nest(&mut self.0, keys::root::deadline, f);
        self
    }

    pub fn access_log(mut self, f: impl FnOnce(AccessLog) -> AccessLog) -> Self {
        nest(&mut self.0, keys::root::access_log, f);
        self
    }

    /// `[upstreams.NAME]`.
    pub fn upstream(mut self, name: &str, f: impl FnOnce(Upstream) -> Upstream) -> Self {
        let all = self.0.section(keys::root::upstreams);
        nest(all, name, f);
        self
    }

    /// `[inbound]` in front of `app`, on an ephemeral loopback port unless `f` sets
    /// another.
    pub fn inbound(mut self, app: SocketAddr, f: impl FnOnce(Inbound) -> Inbound) -> Self {
        let base = Inbound::default().addr("127.0.0.1:0").app(app);
        nest(&mut self.0, keys::root::inbound, |_: Inbound| f(base));
        self
    }

    pub fn tracing(mut self, f: impl FnOnce(Tracing) -> Tracing) -> Self {
        nest(&mut self.0, keys::root::tracing, f);
        self
    }

    pub fn kubernetes(mut self, f: impl FnOnce(Kubernetes) -> Kubernetes) -> Self {
        nest(&mut self.0, keys::root::kubernetes, f);
        self
    }

    /// The file.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        self.0.write("", &mut out);
        out
    }

    /// The file less `[listener]` and `[admin]`, for a [`super::Process`], which writes
    /// those itself on the ports it picked. A listener key set here would be lost, so
    /// none may be (`Process::start_logged_listening` takes them).
    pub fn to_toml_for_process(&self) -> String {
        let mut out = String::new();
        for line in &self.0.lines {
            let _ = writeln!(out, "{line}");
        }
        for (key, t) in &self.0.sections {
            if key == keys::root::listener || key == keys::root::admin {
                assert!(
                    t.lines.len() == 1 && t.sections.is_empty(),
                    "[{key}] holds more than its address: {:?}",
                    t.lines
                );
                continue;
            }
            t.write(key, &mut out);
        }
        out
    }
}
