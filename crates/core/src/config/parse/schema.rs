//! Every section of the config file and where it is written, in one table.
//!
//! Unknown keys are errors (a typo must never silently disable a safety limit), and
//! the most common unknown key is a known one in the wrong section: `max_attempts`
//! written under `[upstreams.p]` instead of `[upstreams.p.retry]`. Knowing every
//! section's keys in one place lets the error say where such a key belongs, and a
//! near miss which key was meant. The keys themselves are declared in
//! [`crate::config::keys`]; this file knows the sections, where each is written, and
//! other proxies' words.

/// A section of the file. The sections of an upstream are written once per upstream,
/// under its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Section {
    Root,
    Runtime,
    Listener,
    Admin,
    Deadline,
    AccessLog,
    Upstream,
    Retry,
    Budget,
    Tls,
    Outlier,
    Hedge,
    Throttle,
    Inbound,
    InboundRetries,
    InboundDedupe,
    Tracing,
    Kubernetes,
}

impl Section {
    const ALL: [Section; 18] = [
        Section::Root,
        Section::Runtime,
        Section::Listener,
        Section::Admin,
        Section::Deadline,
        Section::AccessLog,
        Section::Upstream,
        Section::Retry,
        Section::Budget,
        Section::Tls,
        Section::Outlier,
        Section::Hedge,
        Section::Throttle,
        Section::Inbound,
        Section::InboundRetries,
        Section::InboundDedupe,
        Section::Tracing,
        Section::Kubernetes,
    ];

    /// The keys this section takes, as [`crate::config::keys`] declares them.
    pub(super) fn keys(self) -> &'static [&'static str] {
        use crate::config::keys::{
            access_log, admin, budget, deadline, dedupe, hedge, inbound, inbound_retries,
            kubernetes, listener, outlier, retry, root, runtime, throttle, tls, tracing, upstream,
        };
        match self {
            Section::Root => root::NAMES,
            Section::Runtime => runtime::NAMES,
            Section::Listener => listener::NAMES,
            Section::Admin => admin::NAMES,
            Section::Deadline => deadline::NAMES,
            Section::AccessLog => access_log::NAMES,
            Section::Upstream => upstream::NAMES,
            Section::Retry => retry::NAMES,
            Section::Budget => budget::NAMES,
            Section::Tls => tls::NAMES,
            Section::Outlier => outlier::NAMES,
            Section::Hedge => hedge::NAMES,
            Section::Inbound => inbound::NAMES,
            Section::InboundRetries => inbound_retries::NAMES,
            Section::InboundDedupe => dedupe::NAMES,
            Section::Throttle => throttle::NAMES,
            Section::Tracing => tracing::NAMES,
            Section::Kubernetes => kubernetes::NAMES,
        }
    }

    /// The section this one is written inside, and the key it is written as there.
    fn parent(self) -> Option<(Section, &'static str)> {
        match self {
            Section::Root | Section::Upstream => None,
            Section::Runtime => Some((Section::Root, "runtime")),
            Section::Listener => Some((Section::Root, "listener")),
            Section::Admin => Some((Section::Root, "admin")),
            Section::Deadline => Some((Section::Root, "deadline")),
            Section::AccessLog => Some((Section::Root, "access_log")),
            Section::Retry => Some((Section::Upstream, "retry")),
            Section::Budget => Some((Section::Upstream, "budget")),
            Section::Tls => Some((Section::Upstream, "tls")),
            Section::Outlier => Some((Section::Upstream, "outlier")),
            Section::Hedge => Some((Section::Upstream, "hedge")),
            Section::Inbound => Some((Section::Root, "inbound")),
            Section::InboundRetries => Some((Section::Inbound, "retries")),
            Section::InboundDedupe => Some((Section::Inbound, "dedupe")),
            Section::Throttle => Some((Section::Upstream, "throttle")),
            Section::Tracing => Some((Section::Root, "tracing")),
            Section::Kubernetes => Some((Section::Root, "kubernetes")),
        }
    }

    /// The dotted path of this section; `upstream` names the upstream for its sections.
    pub(super) fn path(self, upstream: &str) -> String {
        match self {
            Section::Root => String::new(),
            Section::Upstream => format!("upstreams.{upstream}"),
            _ => match self.parent() {
                Some((Section::Root, key)) => key.to_string(),
                Some((parent, key)) => format!("{}.{key}", parent.path(upstream)),
                None => String::new(),
            },
        }
    }

    fn is_upstreams(self) -> bool {
        matches!(
            self,
            Section::Upstream
                | Section::Retry
                | Section::Budget
                | Section::Tls
                | Section::Outlier
                | Section::Hedge
                | Section::Throttle
        )
    }
}

/// Where a section is, as a message says it: `in [upstreams.p.retry]`, `at the top level`.
pub(super) fn place(path: &str) -> String {
    if path.is_empty() {
        "at the top level".to_string()
    } else {
        format!("in [{path}]")
    }
}

/// What is wrong with `key`, unknown in `here` (written for `upstream` when `here` is one
/// of an upstream's sections), and how to fix it.
pub(super) fn unknown_key(here: Section, upstream: &str, key: &str) -> (String, String) {
    if let Some((_, _, message, fix)) = RETIRED.iter().find(|(s, k, ..)| *s == here && *k == key) {
        return (message.to_string(), fix.to_string());
    }
    let upstream = if here.is_upstreams() {
        upstream
    } else {
        "NAME"
    };
    let here_place = place(&here.path(upstream));
    let homes: Vec<String> = Section::ALL
        .iter()
        .filter(|s| **s != here && s.keys().contains(&key))
        .map(|s| home(*s, upstream, key))
        .collect();
    // Another proxy's word is what an upstream's sections most likely meant by it;
    // elsewhere a key of ours by the same name (`[tracing] timeout`) comes first.
    if let Some((ours, section, proxy)) = foreign(key)
        && (here.is_upstreams() || homes.is_empty())
    {
        let at = place(&section.path(upstream));
        return (
            format!("unknown key `{key}` ({proxy}'s word)"),
            format!("use `{ours}` {at}"),
        );
    }
    if !homes.is_empty() {
        return (
            format!("`{key}` does not belong {here_place}"),
            format!("it belongs {}", homes.join(" or ")),
        );
    }
    let message = format!("unknown key `{key}`");
    if let Some(near) = suggest(key, here.keys()) {
        return (message, format!("did you mean `{near}`?"));
    }
    let elsewhere = Section::ALL
        .iter()
        .filter(|s| **s != here)
        .find_map(|s| suggest(key, s.keys()).map(|near| (*s, near)));
    if let Some((section, near)) = elsewhere {
        let at = home(section, upstream, near);
        return (message, format!("did you mean `{near}`? it belongs {at}"));
    }
    (
        message,
        format!("allowed {here_place}: {}", here.keys().join(", ")),
    )
}

/// Keys tollgate took once and no longer does, with what replaced them: the section,
/// the key, what is wrong, how to fix it.
const RETIRED: &[(Section, &str, &str, &str)] = &[(
    Section::Admin,
    "probe_ports",
    "`probe_ports` was replaced by `probes`",
    "declare each probe as the kubelet sends it: probes = [{ port = 8080, path = \"/healthz\" }] \
     (tollgate inject writes them); any other port or path is 404",
)];

/// Other proxies' words for tollgate's keys, which a user moving a config over is likely
/// to write: the word (compared without case), the proxy, tollgate's key and its
/// section.
const FOREIGN: &[(&str, &str, &str, Section)] = &[
    ("timeout", "Envoy", "request_timeout", Section::Upstream),
    (
        "per_try_timeout",
        "Envoy",
        "attempt_timeout",
        Section::Upstream,
    ),
    (
        "perTryTimeout",
        "Istio",
        "attempt_timeout",
        Section::Upstream,
    ),
    (
        "num_retries",
        "Envoy",
        "max_attempts (the first try included: retries + 1)",
        Section::Retry,
    ),
    (
        "attempts",
        "Istio",
        "max_attempts (the first try included: retries + 1)",
        Section::Retry,
    ),
    ("retry_on", "Envoy", "on", Section::Retry),
    ("retryOn", "Istio", "on", Section::Retry),
    (
        "retry_budget",
        "Envoy",
        "a [budget] section",
        Section::Upstream,
    ),
];

/// tollgate's key for another proxy's word: (our key, its section, the proxy).
fn foreign(key: &str) -> Option<(&'static str, Section, &'static str)> {
    FOREIGN
        .iter()
        .find(|(word, ..)| word.eq_ignore_ascii_case(key))
        .map(|(_, proxy, ours, section)| (*ours, *section, *proxy))
}

/// Where `key` of `section` is written: the section itself, or, for a key that is a
/// section of its own (`retry`), that section.
fn home(section: Section, upstream: &str, key: &str) -> String {
    let own = Section::ALL
        .iter()
        .find(|s| s.parent() == Some((section, key)));
    match own {
        Some(s) => format!("in its own section, [{}]", s.path(upstream)),
        None => place(&section.path(upstream)),
    }
}

/// The closest allowed key, when it is close enough to be a typo.
fn suggest<'k>(key: &str, allowed: &[&'k str]) -> Option<&'k str> {
    allowed
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_of_another_section_is_sent_where_it_belongs() {
        let (message, _) = unknown_key(Section::Upstream, "p", "max_attempts");
        assert_eq!(message, "`max_attempts` does not belong in [upstreams.p]");
        let (message, _) = unknown_key(Section::Root, "", "addr");
        assert_eq!(message, "`addr` does not belong at the top level");
        let fixes = [
            (Section::Upstream, "max_attempts", "in [upstreams.p.retry]"),
            (Section::Retry, "endpoints", "in [upstreams.p]"),
            (
                Section::Budget,
                "retry",
                "in its own section, [upstreams.p.retry]",
            ),
            (
                Section::Root,
                "addr",
                "in [listener] or in [admin] or in [inbound]",
            ),
            (Section::Upstream, "upstreams", "at the top level"),
            (
                Section::Listener,
                "ratio",
                "in [upstreams.NAME.budget] or in [inbound.retries]",
            ),
            (Section::Upstream, "app", "in [inbound]"),
            (Section::Listener, "timeout", "in [tracing]"),
            (Section::Root, "sample", "in [tracing]"),
        ];
        for (here, key, place) in fixes {
            let (_, fix) = unknown_key(here, "p", key);
            assert_eq!(fix, format!("it belongs {place}"), "{key} in {here:?}");
        }
    }

    #[test]
    fn every_key_of_every_section_has_a_home_from_every_other_section() {
        for here in Section::ALL {
            for there in Section::ALL.iter().filter(|s| **s != here) {
                let ours = |k: &&&str| !(here.is_upstreams() && foreign(k).is_some());
                for key in there
                    .keys()
                    .iter()
                    .filter(|k| !here.keys().contains(k))
                    .filter(ours)
                {
                    let (message, fix) = unknown_key(here, "p", key);
                    assert!(message.contains("does not belong "), "{key}: {message}");
                    assert!(fix.starts_with("it belongs "), "{key}: {fix}");
                }
            }
        }
    }

    #[test]
    fn near_misses_are_suggested_here_first_then_elsewhere() {
        let (message, fix) = unknown_key(Section::Retry, "p", "max_atempts");
        assert_eq!(message, "unknown key `max_atempts`");
        assert_eq!(fix, "did you mean `max_attempts`?");
        let (_, fix) = unknown_key(Section::Upstream, "p", "max_atempts");
        assert_eq!(
            fix,
            "did you mean `max_attempts`? it belongs in [upstreams.p.retry]"
        );
        let (_, fix) = unknown_key(Section::Admin, "", "zzzzzzzzzz");
        assert_eq!(fix, "allowed in [admin]: addr, probes");
    }

    #[test]
    fn other_proxies_words_name_tollgates_key() {
        let (message, fix) = unknown_key(Section::Upstream, "p", "per_try_timeout");
        assert_eq!(message, "unknown key `per_try_timeout` (Envoy's word)");
        assert_eq!(fix, "use `attempt_timeout` in [upstreams.p]");
        let (_, fix) = unknown_key(Section::Upstream, "p", "timeout");
        assert_eq!(fix, "use `request_timeout` in [upstreams.p]");
        let (_, fix) = unknown_key(Section::Retry, "p", "num_retries");
        assert!(fix.starts_with("use `max_attempts"), "{fix}");
        assert!(fix.ends_with("in [upstreams.p.retry]"), "{fix}");
    }

    #[test]
    fn sections_know_their_paths() {
        assert_eq!(Section::Tls.path("p"), "upstreams.p.tls");
        assert_eq!(Section::Listener.path("p"), "listener");
        assert_eq!(Section::Root.path("p"), "");
        assert_eq!(Section::InboundRetries.path("p"), "inbound.retries");
    }
}
