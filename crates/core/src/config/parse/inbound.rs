//! `[inbound]` and `[inbound.retries]`: tollgate in front of its own app. The app's
//! address is required; the inbound port must not be one tollgate already listens on,
//! and the app must not be tollgate itself (requests would go round in a loop).

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use toml::de::DeValue;

use super::schema::Section;
use super::walker::{Choice, Table, Walker, kind};
use crate::config::keys::{inbound as key, inbound_retries as retries_key, root as root_key};
use crate::config::model::*;

/// `[inbound]`, if written. `taken` are the addresses tollgate's other listeners bind,
/// each with its key.
pub(super) fn inbound(
    w: &mut Walker<'_>,
    root: &Table,
    taken: &[(SocketAddr, String)],
) -> Option<InboundConfig> {
    let (t, span) = w.table(root, root_key::inbound)?;
    w.check_keys(Section::Inbound, "", &t);
    let d = InboundConfig::default();
    let addr = match w.socket_addr(&t, key::addr) {
        Some((addr, at)) => {
            if let Some((_, key)) = taken.iter().find(|(a, _)| same_port(*a, addr)) {
                w.reject(
                    at,
                    &t.key(key::addr),
                    format!("{addr} is already used by {key}"),
                    "give the inbound side a port of its own, e.g. \"0.0.0.0:15006\"",
                );
            }
            addr
        }
        None => d.addr,
    };
    let app = app(w, &t, &span, addr, taken)?;
    let ms = Duration::from_millis;
    let day = Duration::from_secs(24 * 3600);
    Some(InboundConfig {
        addr,
        app,
        max_inflight: max_inflight(w, &t, d.max_inflight),
        request_timeout: w.optional(&t, key::request_timeout, ms(1)..=day),
        retries: w.table(&t, key::retries).map(|(r, _)| retries(w, &r)),
        probe_paths: probe_paths(w, &t),
        owned_failures: w
            .word(&t, key::owned_failures, &OWNED_FAILURES)
            .unwrap_or(d.owned_failures),
        per_caller: w
            .table(&t, key::retries)
            .and_then(|(r, _)| w.word(&r, retries_key::per_caller, &PER_CALLER))
            .unwrap_or(d.per_caller),
        dedupe: w
            .table(&t, key::dedupe)
            .map(|(d, _)| super::dedupe::dedupe(w, &d)),
    })
}

/// Two addresses that cannot both be bound: the same port on the same address, or on
/// the unspecified address and any other.
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// `app`: required, and not one of tollgate's own ports.
fn app(
    w: &mut Walker<'_>,
    t: &Table,
    span: &Range<usize>,
    addr: SocketAddr,
    taken: &[(SocketAddr, String)],
) -> Option<EndpointAddr> {
    let full = t.key(key::app);
    let Some((text, at)) = w.string(t, key::app) else {
        if t.get(key::app).is_none() {
            w.error(
                span.clone(),
                &full,
                "missing: the inbound side needs the address of the app it stands in front of",
                "add app = \"127.0.0.1:8080\" (the port the app listens on, on loopback)",
            );
        }
        return None;
    };
    let app = match super::parse_endpoint(&text) {
        Ok(e) => e,
        Err(msg) => {
            w.reject(at, &full, msg, "write it as \"127.0.0.1:8080\"");
            return None;
        }
    };
    let ours = std::iter::once((addr, t.key(key::addr)))
        .chain(taken.iter().cloned())
        .find(|(a, _)| {
            app.ip()
                .is_some_and(|ip| same_port(*a, ip) || loops(*a, ip))
        });
    if let Some((_, by)) = ours {
        w.reject(
            at,
            &full,
            format!("{app} is tollgate's own {by}: requests would go round in a loop"),
            "write the address the app itself listens on",
        );
    }
    Some(app)
}

/// An app on loopback at the port tollgate binds on every address.
fn loops(ours: SocketAddr, app: SocketAddr) -> bool {
    ours.port() == app.port() && app.ip().is_loopback() && ours.ip().is_unspecified()
}

/// `max_inflight`: a whole number, or `"adaptive"`.
fn max_inflight(w: &mut Walker<'_>, t: &Table, d: InflightLimit) -> InflightLimit {
    let Some(v) = t.get(key::max_inflight) else {
        return d;
    };
    let full = t.key(key::max_inflight);
    match v.get_ref() {
        DeValue::String(s) if s.as_ref() == "adaptive" => InflightLimit::Adaptive,
        DeValue::Integer(_) => w
            .optional(t, key::max_inflight, 1..=10_000_000u64)
            .map_or(d, |n| InflightLimit::Fixed(n as usize)),
        DeValue::String(s) => {
            let message = format!("`{s}` is neither a number nor \"adaptive\"");
            w.reject(v.span(), &full, message, FIX_INFLIGHT);
            d
        }
        other => {
            let message = format!("expected an integer or \"adaptive\", found {}", kind(other));
            w.reject(v.span(), &full, message, FIX_INFLIGHT);
            d
        }
    }
}

const FIX_INFLIGHT: &str =
    "write a whole number such as 200, or \"adaptive\" for a limit learned from the app's latency";

/// `probe_paths`: absolute paths, without a query.
fn probe_paths(w: &mut Walker<'_>, t: &Table) -> Vec<String> {
    let full = t.key(key::probe_paths);
    let mut out = Vec::new();
    for (path, span) in w.strings(t, key::probe_paths).unwrap_or_default() {
        if path.starts_with('/') && !path.contains(['?', '#', ' ']) {
            out.push(path);
        } else {
            w.reject(
                span,
                &full,
                format!("`{path}` is not a path"),
                "write the path the kubelet probes, starting with `/` and without a query, e.g. \"/healthz\"",
            );
        }
    }
    out
}

/// `[inbound.retries] per_caller`.
const OWNED_FAILURES: Choice<OwnedFailures> = Choice {
    what: "a way to treat the app's failures",
    fix: "use \"mark\" (the app's 502/503/504 after its own call was given up on is marked downstream-owned) or \"off\"",
    words: &[("mark", OwnedFailures::Mark), ("off", OwnedFailures::Off)],
};

const PER_CALLER: Choice<PerCaller> = Choice {
    what: "a way to share the budget",
    fix: "use \"fair\" (no caller gets more than an equal share while others ask) or \"off\"",
    words: &[("fair", PerCaller::Fair), ("off", PerCaller::Off)],
};

/// `[inbound.retries]`; a key not written takes its default.
fn retries(w: &mut Walker<'_>, t: &Table) -> BudgetConfig {
    w.check_keys(Section::InboundRetries, "", t);
    let d = BudgetConfig::default();
    let window = Duration::from_millis(100)..=Duration::from_secs(3600);
    // Written this way so that a setting the outbound budget gains later keeps its
    // default here.
    #[allow(clippy::needless_update)]
    BudgetConfig {
        ratio: w.ranged(t, retries_key::ratio, d.ratio, 0.0..=1000.0),
        min_per_sec: w.ranged(t, retries_key::min_per_sec, d.min_per_sec, 0.0..=1e6),
        window: w.ranged(t, retries_key::window, d.window, window),
        ..d
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, String> {
        crate::config::parse("t.toml", text, Path::new(".")).map_err(|e| e.to_string())
    }

    #[test]
    fn an_inbound_section_alone_is_a_config_and_takes_its_defaults() {
        let c = parse("[inbound]\napp = \"127.0.0.1:8080\"\n").unwrap();
        let i = c.inbound.unwrap();
        assert_eq!(i.addr, "0.0.0.0:15006".parse().unwrap());
        assert_eq!(i.app.to_string(), "127.0.0.1:8080");
        assert_eq!(i.max_inflight, InflightLimit::Fixed(10_000));
        assert_eq!(
            i.request_timeout, None,
            "no default: the caller's deadline, if any"
        );
        assert!(i.retries.is_none());
        assert!(c.upstreams.is_empty());
    }

    #[test]
    fn every_key_is_read() {
        let c = parse(
            "[inbound]\naddr = \"127.0.0.1:7000\"\napp = \"localhost:9000\"\nmax_inflight = 64\n\
             request_timeout = \"3s\"\n[inbound.retries]\nratio = 0.05\nmin_per_sec = 2\nwindow = \"5s\"\n",
        )
        .unwrap();
        let i = c.inbound.unwrap();
        assert_eq!(i.max_inflight, InflightLimit::Fixed(64));
        assert_eq!(i.request_timeout, Some(Duration::from_secs(3)));
        let r = i.retries.unwrap();
        assert_eq!((r.ratio, r.min_per_sec), (0.05, 2.0));
        assert_eq!(r.window, Duration::from_secs(5));
    }

    #[test]
    fn mistakes_are_named_at_their_keys() {
        let cases = [
            ("[inbound]\n", "t.toml:1:1: inbound.app: missing"),
            (
                "[inbound]\napp = \"127.0.0.1:8080\"\nmax_inflight = \"lots\"\n",
                "t.toml:3:16: inbound.max_inflight: `lots` is neither a number nor \"adaptive\"",
            ),
            (
                "[inbound]\napp = \"127.0.0.1:8080\"\nmax_inflight = 0\n",
                "t.toml:3:16: inbound.max_inflight: 0 is out of range",
            ),
            (
                "[inbound]\napp = \"127.0.0.1:8080\"\nmax_inflight = 1.5\n",
                "inbound.max_inflight: expected an integer or \"adaptive\", found a float",
            ),
            (
                "[inbound]\napp = \"127.0.0.1:8080\"\naddr = \"127.0.0.1:15090\"\n",
                "t.toml:3:8: inbound.addr: 127.0.0.1:15090 is already used by admin.addr",
            ),
            (
                "[inbound]\napp = \"127.0.0.1:15006\"\n",
                "inbound.app: 127.0.0.1:15006 is tollgate's own inbound.addr",
            ),
            (
                "[inbound]\napp = \"127.0.0.1:15001\"\n",
                "inbound.app: 127.0.0.1:15001 is tollgate's own listener.addr",
            ),
            (
                "[inbound]\napp = \"127.0.0.1:8080\"\n[inbound.retries]\nratoi = 0.1\n",
                "t.toml:4:1: inbound.retries.ratoi: unknown key `ratoi` (did you mean `ratio`?)",
            ),
            (
                "[inbound]\napp = \"127.0.0.1:8080\"\nmax_attempts = 3\n",
                "inbound.max_attempts: `max_attempts` does not belong in [inbound]",
            ),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}:\n{e}\nwanted: {want}");
        }
    }

    #[test]
    fn an_inbound_port_of_an_upstream_listener_is_refused() {
        let e = parse(
            "[upstreams.p]\nlisten = \"127.0.0.1:7001\"\nendpoints = [\"127.0.0.1:1\"]\n\
             [inbound]\naddr = \"0.0.0.0:7001\"\napp = \"127.0.0.1:8080\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("inbound.addr: 0.0.0.0:7001 is already used by upstreams.p.listen"),
            "{e}"
        );
    }
}
