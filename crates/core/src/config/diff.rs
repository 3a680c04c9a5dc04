//! What a reload changes: a new file set against the config in force. Some settings
//! take effect only at a restart (the listeners, the admin address, the worker
//! threads, the kubeconfig; [`keys`] declares which): the config in force keeps their running values, so that `/config` shows
//! what is really in effect and every later reload keeps reporting the difference
//! until a restart. Everything else is applied, and each upstream added, removed or
//! changed is named, with the keys that changed as [`keys`] declares them, so a
//! reload says what it did.

use super::Config;
use super::keys;
use super::model::{AdminConfig, InboundConfig, UpstreamConfig};

/// A new file, reconciled with the config in force.
#[derive(Debug)]
pub struct Reconciled {
    /// The new file's config with the settings that need a restart as they run now.
    pub in_effect: Config,
    /// The settings that differ in the file but need a restart, each with both values.
    pub restart_needed: Vec<String>,
    /// One line per upstream added, removed or changed.
    pub changes: Vec<String>,
}

/// Reconciles the file's `new` config with the `running` one.
pub fn reconcile(running: &Config, new: Config) -> Reconciled {
    // The keys declared to wait for a restart, section by section; `[inbound]`'s
    // address below, with the section itself.
    let restart_needed: Vec<String> = [
        keys::listener::SECTION.restart_needed(&running.listener, &new.listener),
        keys::admin::SECTION.restart_needed(&running.admin, &new.admin),
        keys::runtime::SECTION.restart_needed(&running.runtime, &new.runtime),
        keys::kubernetes::SECTION.restart_needed(&running.kubernetes, &new.kubernetes),
    ]
    .into_iter()
    .flatten()
    .map(|(key, was, is)| format!("{key}: {was} in effect, {is} in the file"))
    .collect();
    let mut restart_needed = restart_needed;
    let mut changes = upstream_changes(running, &new);
    changes.extend(tracing_change(running, &new));
    let inbound = inbound_in_effect(running, &new, &mut restart_needed, &mut changes);
    let in_effect = Config {
        listener: running.listener,
        // Only the address waits for a restart: the probe ports are read per probe.
        admin: AdminConfig {
            addr: running.admin.addr,
            ..new.admin
        },
        runtime: running.runtime.clone(),
        // The watches running were started with these credentials.
        kubernetes: running.kubernetes.clone(),
        inbound,
        ..new
    };
    Reconciled {
        in_effect,
        restart_needed,
        changes,
    }
}

/// The `[inbound]` in effect after a reload: its settings from the file, at the address
/// it is bound to. Adding, removing or moving the section needs a restart (it is a
/// listener): the running one stays, and the difference is reported.
fn inbound_in_effect(
    running: &Config,
    new: &Config,
    restart_needed: &mut Vec<String>,
    changes: &mut Vec<String>,
) -> Option<InboundConfig> {
    let addr = |c: &Config| {
        c.inbound
            .as_ref()
            .map_or("none".into(), |i| i.addr.to_string())
    };
    let (was, is) = (addr(running), addr(new));
    if was != is {
        let key = format!("{}.{}", keys::inbound::SECTION.path, keys::inbound::addr);
        restart_needed.push(format!("{key}: {was} in effect, {is} in the file"));
    }
    match (&running.inbound, &new.inbound) {
        (Some(r), Some(n)) => {
            let fields = keys::inbound::SECTION.changed(r, n);
            if !fields.is_empty() {
                changes.push(format!("inbound changed: {}", fields.join(", ")));
            }
            Some(InboundConfig {
                addr: r.addr,
                ..n.clone()
            })
        }
        (running, _) => running.clone(),
    }
}

/// `[tracing]` added, removed or changed (applied: the tracer is rebuilt).
fn tracing_change(running: &Config, new: &Config) -> Option<String> {
    match (&running.tracing, &new.tracing) {
        (None, Some(_)) => Some("tracing added".into()),
        (Some(_), None) => Some("tracing removed".into()),
        (Some(a), Some(b)) => {
            let fields = keys::tracing::SECTION.changed(a, b);
            (!fields.is_empty()).then(|| format!("tracing changed: {}", fields.join(", ")))
        }
        (None, None) => None,
    }
}

/// One line per upstream added, removed or changed, in name order.
pub fn upstream_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut lines = Vec::new();
    for u in &new.upstreams {
        match old.upstream(&u.name) {
            None => lines.push(format!("upstream {} added", u.name)),
            Some(o) => {
                let fields = changed_fields(o, u);
                if !fields.is_empty() {
                    lines.push(format!(
                        "upstream {} changed: {}",
                        u.name,
                        fields.join(", ")
                    ));
                }
            }
        }
    }
    for o in &old.upstreams {
        if new.upstream(&o.name).is_none() {
            lines.push(format!("upstream {} removed", o.name));
        }
    }
    lines.sort();
    lines
}

/// The settings of an upstream that differ, by the names the file gives them.
fn changed_fields(a: &UpstreamConfig, b: &UpstreamConfig) -> Vec<String> {
    let mut out = keys::upstream::SECTION.changed(a, b);
    // A difference no declared key shows: still a change, said plainly.
    if out.is_empty() && a != b {
        out.push("other settings".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use keys::Reload;
    use std::path::Path;

    fn config(text: &str) -> Config {
        crate::config::parse("t.toml", text, Path::new(".")).unwrap()
    }

    const BASE: &str = "[upstreams.a]\nauthorities = [\"a\"]\nendpoints = [\"127.0.0.1:1\"]\n\
                        [upstreams.b]\nauthorities = [\"b\"]\nendpoints = [\"127.0.0.1:2\"]\n";

    #[test]
    fn every_upstream_added_removed_or_changed_is_named() {
        let old = config(BASE);
        let new = config(
            "[upstreams.a]\nauthorities = [\"a\"]\nendpoints = [\"127.0.0.1:9\"]\n\
             request_timeout = \"3s\"\n\
             [upstreams.c]\nauthorities = [\"c\"]\nendpoints = [\"127.0.0.1:3\"]\n",
        );
        assert_eq!(
            upstream_changes(&old, &new),
            [
                "upstream a changed: endpoints, request_timeout",
                "upstream b removed",
                "upstream c added",
            ]
        );
        assert!(upstream_changes(&old, &config(BASE)).is_empty());
    }

    /// TOML values to try for a key of this kind (its declared type), meant to differ
    /// from its default; a section is tried empty, then with one of its keys set.
    fn samples(kind: &str, path: &str) -> Vec<String> {
        if kind == "section" {
            let section = keys::sections().into_iter().find(|s| s.path() == path);
            let section = section.unwrap_or_else(|| panic!("no section [{path}] declared"));
            let mut out = vec!["{}".to_string()];
            for row in section.rows() {
                let path = format!("{path}.{}", row.name);
                for v in samples(row.kind, &path) {
                    out.push(format!("{{ {} = {v} }}", row.name));
                }
            }
            return out;
        }
        // The words a kind lists: `"http1"`, `"h2c"` or `"auto"`.
        let mut out: Vec<String> = kind
            .split('`')
            .filter(|w| w.starts_with('"'))
            .map(str::to_string)
            .collect();
        for (word, value) in [
            ("duration", "\"7s\""),
            ("integer", "7"),
            ("number", "0.5"),
            ("number", "7.0"),
            ("percentage", "\"70%\""),
            ("size", "\"7KiB\""),
            ("list of host names", "[\"z\"]"),
            ("list of host:port", "[\"127.0.0.1:9\"]"),
            ("list of methods", "[\"PUT\"]"),
            ("address", "\"127.0.0.1:17001\""),
            ("name", "\"z.example\""),
        ] {
            if kind.contains(word) {
                out.push(value.to_string());
            }
        }
        out
    }

    /// Each key of an upstream a reload applies, changed alone, is named alone: the
    /// declarations say which keys there are, so a key added later is covered too.
    #[test]
    fn a_change_to_each_declared_key_of_an_upstream_is_named() {
        let required = [
            ("authorities", "[\"a\"]"),
            ("endpoints", "[\"127.0.0.1:1\"]"),
        ];
        let upstream = |key: &str, value: &str| {
            let mut text = String::from("[upstreams.a]\n");
            for (k, v) in required.iter().filter(|(k, _)| *k != key) {
                text.push_str(&format!("{k} = {v}\n"));
            }
            if !key.is_empty() {
                text.push_str(&format!("{key} = {value}\n"));
            }
            crate::config::parse("t.toml", &text, Path::new(".")).ok()
        };
        let old = upstream("", "").unwrap();
        let section = &keys::upstream::SECTION;
        // The keys of a watched Service are valid only together: named in
        // `a_change_to_the_service_watched_is_named`.
        let together = [
            keys::upstream::discovery,
            keys::upstream::service,
            keys::upstream::port,
        ];
        let applied = section.keys.iter().filter(|k| k.reload == Reload::Applied);
        for key in applied.filter(|k| !together.contains(&k.name)) {
            let path = format!("{}.{}", section.path, key.name);
            let shown = |c: &Config| c.upstream("a").map(|u| (key.show)(u));
            let new = samples(key.kind, &path)
                .into_iter()
                .filter_map(|v| upstream(key.name, &v))
                .find(|new| shown(new) != shown(&old))
                .unwrap_or_else(|| panic!("no sample of `{}` changes {path}: add one", key.kind));
            assert_eq!(
                upstream_changes(&old, &new),
                [format!("upstream a changed: {}", key.name)],
                "{path}"
            );
        }
    }

    /// A reload that changes the Service watched, or its port, is a change of the
    /// upstream (its endpoints are rebuilt from a new watch).
    #[test]
    fn a_change_to_the_service_watched_is_named() {
        let watched = |service: &str, port: &str| {
            config(&format!(
                "{BASE}[upstreams.k]\nauthorities = [\"k\"]\ndiscovery = \"kubernetes\"\n\
                 service = \"{service}\"\nport = {port}\n"
            ))
        };
        let was = watched("payments", "\"http\"");
        assert!(upstream_changes(&was, &watched("payments", "\"http\"")).is_empty());
        assert_eq!(
            upstream_changes(&was, &watched("payments.shop", "\"http\"")),
            ["upstream k changed: service"]
        );
        assert_eq!(
            upstream_changes(&was, &watched("payments", "8080")),
            ["upstream k changed: port"]
        );
        let dns = config(&format!(
            "{BASE}[upstreams.k]\nauthorities = [\"k\"]\nendpoints = [\"k:80\"]\n"
        ));
        assert_eq!(
            upstream_changes(&dns, &was),
            ["upstream k changed: endpoints, discovery, service, port"]
        );
    }

    #[test]
    fn a_new_kubeconfig_waits_for_a_restart() {
        let with = |path: &str| config(&format!("{BASE}[kubernetes]\nkubeconfig = \"{path}\"\n"));
        let running = with("/a");
        let r = reconcile(&running, with("/b"));
        assert_eq!(r.in_effect.kubernetes, running.kubernetes);
        assert_eq!(
            r.restart_needed,
            ["kubernetes.kubeconfig: /a in effect, /b in the file"]
        );
        assert!(r.changes.is_empty());
    }

    #[test]
    fn changed_keys_are_named_in_the_order_they_are_declared() {
        let upstream = |extra: &str| config(&format!("{BASE}{extra}"));
        let both = "[upstreams.a.budget]\n[upstreams.a.tls]\nserver_name = \"a\"\n";
        assert_eq!(
            upstream_changes(&upstream(""), &upstream(both)),
            ["upstream a changed: tls, budget"]
        );

        // The sharing of `[inbound.retries]` lives beside the budget: named apart.
        let inbound = |retries: &str| {
            config(&format!(
                "{BASE}[inbound]\napp = \"127.0.0.1:8080\"\n{retries}"
            ))
        };
        let changes = |a: &str, b: &str| reconcile(&inbound(a), inbound(b)).changes;
        let fair = "[inbound.retries]\nratio = 0.2\n";
        let off = "[inbound.retries]\nratio = 0.2\nper_caller = \"off\"\n";
        assert_eq!(changes("", fair), ["inbound changed: retries"]);
        assert_eq!(
            changes("", off),
            ["inbound changed: retries, retries.per_caller"]
        );
        assert_eq!(changes(fair, off), ["inbound changed: retries.per_caller"]);
        assert_eq!(
            changes(
                off,
                "[inbound.retries]\nratio = 0.3\nper_caller = \"off\"\n"
            ),
            ["inbound changed: retries"]
        );
        assert!(changes(off, off).is_empty());
    }

    #[test]
    fn settings_that_need_a_restart_keep_their_running_values() {
        let running = config(BASE);
        let new = config(&format!(
            "[admin]\naddr = \"127.0.0.1:19999\"\n[listener]\nidle_timeout = \"5s\"\n{BASE}"
        ));
        let r = reconcile(&running, new);
        assert_eq!(r.in_effect.admin, running.admin);
        assert_eq!(r.in_effect.listener, running.listener);
        assert_eq!(r.restart_needed.len(), 2, "{:?}", r.restart_needed);
        assert_eq!(
            r.restart_needed[0],
            "listener.idle_timeout: 1m in effect, 5s in the file"
        );
        assert!(
            r.restart_needed[1]
                .starts_with("admin.addr: 127.0.0.1:15090 in effect, 127.0.0.1:19999 in the file")
        );
        assert!(r.changes.is_empty());
        // Reconciled again against what is in effect, the difference is still there.
        let again = reconcile(
            &r.in_effect,
            config(&format!("[admin]\naddr = \"127.0.0.1:19999\"\n{BASE}")),
        );
        assert_eq!(again.restart_needed.len(), 1);
    }

    #[test]
    fn the_keys_declared_for_a_restart_are_the_ones_kept_running() {
        use keys::Described;
        let restart = |s: &dyn Described| -> Vec<String> {
            s.rows()
                .into_iter()
                .filter(|r| r.reload == Reload::Restart)
                .map(|r| format!("{}.{}", s.path(), r.name))
                .collect()
        };
        // The whole of [listener], [runtime] and [kubernetes] is kept; of [admin] and
        // [inbound], the address; nothing of any other section.
        assert_eq!(
            restart(&keys::listener::SECTION).len(),
            keys::listener::NAMES.len()
        );
        assert_eq!(
            restart(&keys::runtime::SECTION).len(),
            keys::runtime::NAMES.len()
        );
        assert_eq!(restart(&keys::admin::SECTION), ["admin.addr"]);
        assert_eq!(restart(&keys::inbound::SECTION), ["inbound.addr"]);
        assert_eq!(
            restart(&keys::kubernetes::SECTION).len(),
            keys::kubernetes::NAMES.len()
        );
        for s in keys::sections().into_iter().skip(4) {
            if !["admin", "inbound", "kubernetes"].contains(&s.path()) {
                assert!(restart(s).is_empty(), "[{}]", s.path());
            }
        }
    }

    #[test]
    fn tracing_changes_are_named_and_applied() {
        let with = |extra: &str| config(&format!("{BASE}[tracing]\n{extra}"));
        let r = reconcile(&config(BASE), with(""));
        assert_eq!(r.changes, ["tracing added"]);
        assert!(r.in_effect.tracing.is_some(), "applied without a restart");
        assert!(r.restart_needed.is_empty());
        let r = reconcile(&with(""), with("sample = 0.5\ntimeout = \"1s\"\n"));
        assert_eq!(r.changes, ["tracing changed: sample, timeout"]);
        assert_eq!(
            reconcile(&with(""), config(BASE)).changes,
            ["tracing removed"]
        );
        assert!(reconcile(&with(""), with("")).changes.is_empty());
    }

    #[test]
    fn inbound_settings_apply_but_its_address_waits_for_a_restart() {
        let inbound = |addr: &str, limit: &str| {
            config(&format!(
                "{BASE}[inbound]\naddr = \"{addr}\"\napp = \"127.0.0.1:8080\"\nmax_inflight = {limit}\n"
            ))
        };
        let running = inbound("127.0.0.1:15006", "10");
        let r = reconcile(&running, inbound("127.0.0.1:15007", "20"));
        let i = r.in_effect.inbound.as_ref().unwrap();
        assert_eq!(i.addr.port(), 15006, "the bound address stays");
        assert_eq!(i.max_inflight, crate::config::InflightLimit::Fixed(20));
        assert_eq!(
            r.restart_needed,
            ["inbound.addr: 127.0.0.1:15006 in effect, 127.0.0.1:15007 in the file"]
        );
        assert_eq!(r.changes, ["inbound changed: max_inflight"]);

        // Added or removed: a listener to bind or close, so at a restart.
        let added = reconcile(&config(BASE), inbound("127.0.0.1:15006", "10"));
        assert!(added.in_effect.inbound.is_none());
        assert_eq!(
            added.restart_needed,
            ["inbound.addr: none in effect, 127.0.0.1:15006 in the file"]
        );
        let removed = reconcile(&running, config(BASE));
        assert_eq!(removed.in_effect.inbound, running.inbound);
        assert_eq!(removed.restart_needed.len(), 1);
    }
}
