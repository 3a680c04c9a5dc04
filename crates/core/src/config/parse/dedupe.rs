//! `[inbound.dedupe]`: which keyed requests run once, how long and how large an answer
//! is kept, and where the keys live.
//!
//! `store` is `"memory"` or a Redis address. The address may carry a password, so no
//! message about it ever repeats what was written: a mistake is named by its part
//! (the scheme, the port, the database), and the address is shown, where it is shown
//! at all, with `***` in the password's place.

use std::time::Duration;

use super::retry::methods;
use super::schema::Section;
use super::walker::{Choice, Size, Table, Walker};
use crate::config::keys::dedupe as key;
use crate::config::model::*;

/// `[inbound.dedupe]`; a key not written takes its default.
pub(super) fn dedupe(w: &mut Walker<'_>, t: &Table) -> DedupeConfig {
    w.check_keys(Section::InboundDedupe, "", t);
    let d = DedupeConfig::default();
    let (secs, ms) = (Duration::from_secs, Duration::from_millis);
    let store = match w.string(t, key::store) {
        None => d.store.clone(),
        Some((text, _)) if text == "memory" => DedupeStore::Memory,
        Some((text, span)) => match redis_addr(&text) {
            Ok(addr) => DedupeStore::Redis(addr),
            Err(problem) => {
                w.reject(span, &t.key(key::store), problem, FIX_STORE);
                DedupeStore::Memory
            }
        },
    };
    let methods = match methods(w, t) {
        Some(list) if list.is_empty() => {
            let span = t.span_of(key::methods, &(0..0));
            let message = "empty: no keyed request would ever run once";
            w.reject(span, &t.key(key::methods), message, FIX_METHODS);
            d.methods
        }
        Some(list) => list,
        None => d.methods,
    };
    let header = match w.string(t, key::header) {
        None => d.header.clone(),
        Some((text, span)) if text.is_empty() => {
            let message = "empty: a key must be read from some header";
            w.reject(span, &t.key(key::header), message, FIX_HEADER);
            d.header.clone()
        }
        Some(written) => w
            .header_name(written, &t.key(key::header))
            .unwrap_or_else(|| d.header.clone()),
    };
    let identity_headers = match w.strings(t, key::identity_headers) {
        None => d.identity_headers.clone(),
        Some(list) => {
            let full = t.key(key::identity_headers);
            list.into_iter()
                .filter_map(|written| w.header_name(written, &full))
                .collect()
        }
    };
    DedupeConfig {
        header,
        identity_headers,
        methods,
        ttl: w.ranged(t, key::ttl, d.ttl, secs(1)..=secs(30 * 24 * 3600)),
        max_response: w
            .ranged(
                t,
                key::max_response,
                Size(d.max_response),
                Size(1)..=Size(64 << 20),
            )
            .0,
        store,
        max_entries: w.ranged(t, key::max_entries, d.max_entries as u64, 1..=100_000_000) as usize,
        store_timeout: w.ranged(t, key::store_timeout, d.store_timeout, ms(1)..=secs(10)),
        on_store_error: w
            .word(t, key::on_store_error, &ON_STORE_ERROR)
            .unwrap_or(d.on_store_error),
    }
}

const FIX_STORE: &str = "write \"memory\" (this replica only) or \"redis://HOST:PORT/DB\" (one \
                         store for every replica), e.g. \"redis://redis.default.svc:6379/0\"";

const FIX_HEADER: &str = "write the header callers put their keys in, e.g. \"idempotency-key\" \
                          (the default)";

const FIX_METHODS: &str = "list the methods whose keyed requests run once, e.g. [\"POST\", \"PATCH\"], \
                           or remove [inbound.dedupe]";

const ON_STORE_ERROR: Choice<OnStoreError> = Choice {
    what: "a way to answer while the store fails",
    fix: "use \"closed\" (a keyed request gets 503 dedupe-unavailable) or \"open\" (this \
          replica's memory store stands in)",
    words: &[
        ("closed", OnStoreError::Closed),
        ("open", OnStoreError::Open),
    ],
};

/// `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`, or `redis://PASSWORD@HOST...` (a
/// password without a user, as Redis clients read it). The error never quotes the
/// text: it may hold a password.
fn redis_addr(text: &str) -> Result<RedisAddr, String> {
    let Some(rest) = text.strip_prefix("redis://") else {
        return Err(match text.split_once("://") {
            Some(("rediss", _)) => "TLS to Redis (rediss://) is not supported".to_string(),
            Some((scheme, _)) if scheme.len() <= 16 => {
                format!("`{scheme}://` is neither \"memory\" nor a redis:// address")
            }
            _ => "neither \"memory\" nor a redis:// address".to_string(),
        });
    };
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(u) => {
            // Redis's own convention: userinfo without a colon is a password (AUTH
            // with no user name), never a user name to show.
            let (user, pass) = match u.split_once(':') {
                Some((user, pass)) => (user, Some(pass)),
                None => ("", Some(u)),
            };
            let user = decode(user).ok_or("the user name has a bad %-escape")?;
            let pass = pass
                .map(|p| decode(p).ok_or("the password has a bad %-escape"))
                .transpose()?;
            ((!user.is_empty()).then_some(user), pass)
        }
    };
    let (hostport, db) = match rest.split_once('/') {
        Some((hp, "")) => (hp, 0),
        Some((hp, db)) => match db.parse::<i64>() {
            Ok(n) if (0..=1_000_000).contains(&n) && db.bytes().all(|b| b.is_ascii_digit()) => {
                (hp, n)
            }
            _ => return Err("the database after `/` is not a whole number".to_string()),
        },
        None => (rest, 0),
    };
    if hostport.contains(['?', '#']) {
        return Err("options after `?` are not supported".to_string());
    }
    let (host, port) = host_port(hostport)?;
    Ok(RedisAddr {
        host,
        port,
        db,
        username,
        password,
    })
}

/// `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
fn host_port(text: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or("an IPv6 host misses its `]`")?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("the host in brackets is not an IPv6 address".to_string());
        }
        (host, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    let name_ok = |h: &str| {
        !h.is_empty()
            && h.len() <= 253
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b':')
    };
    if !name_ok(host) {
        return Err("the host is missing or not a name or an IP address".to_string());
    }
    let port = match port {
        None => RedisAddr::DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err("the port is not a number from 1 to 65535".to_string()),
        },
    };
    Ok((host.to_string(), port))
}

/// Percent-decoding of a URL's user name or password.
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> Result<Config, String> {
        crate::config::parse("t.toml", text, Path::new(".")).map_err(|e| e.to_string())
    }

    const HEAD: &str = "[inbound]\napp = \"127.0.0.1:8080\"\n[inbound.dedupe]\n";

    #[test]
    fn a_dedupe_section_alone_takes_the_defaults() {
        let c = parse(HEAD).unwrap();
        let d = c.inbound.unwrap().dedupe.unwrap();
        assert_eq!(d, DedupeConfig::default());
        assert_eq!(d.methods, [http::Method::POST, http::Method::PATCH]);
        assert_eq!(d.ttl, Duration::from_secs(86_400));
        assert_eq!(d.max_response, 1 << 20);
        assert_eq!(d.store, DedupeStore::Memory);
        assert_eq!(d.max_entries, 100_000);
        assert_eq!(d.store_timeout, Duration::from_millis(50));
        assert_eq!(d.on_store_error, OnStoreError::Closed);
        let none = parse("[inbound]\napp = \"127.0.0.1:8080\"\n").unwrap();
        assert!(none.inbound.unwrap().dedupe.is_none());
    }

    #[test]
    fn every_key_is_read() {
        let c = parse(&format!(
            "{HEAD}methods = [\"POST\"]\nttl = \"1h\"\nmax_response = \"64KiB\"\n\
             store = \"redis://app:s%40cret@redis.default.svc:6380/3\"\nmax_entries = 500\n\
             store_timeout = \"20ms\"\non_store_error = \"open\"\n"
        ))
        .unwrap();
        let d = c.inbound.unwrap().dedupe.unwrap();
        assert_eq!(d.methods, [http::Method::POST]);
        assert_eq!(d.ttl, Duration::from_secs(3600));
        assert_eq!(d.max_response, 64 << 10);
        assert_eq!(d.max_entries, 500);
        assert_eq!(d.store_timeout, Duration::from_millis(20));
        assert_eq!(d.on_store_error, OnStoreError::Open);
        let DedupeStore::Redis(r) = d.store else {
            panic!("not redis")
        };
        assert_eq!(
            (r.host.as_str(), r.port, r.db),
            ("redis.default.svc", 6380, 3)
        );
        assert_eq!(r.username.as_deref(), Some("app"));
        assert_eq!(r.password.as_deref(), Some("s@cret"));
        assert_eq!(r.to_string(), "redis://app:***@redis.default.svc:6380/3");
    }

    #[test]
    fn a_password_without_a_user_is_a_password() {
        let r = redis_addr("redis://hunter2@redis:6379/1").unwrap();
        assert_eq!(r.username, None);
        assert_eq!(r.password.as_deref(), Some("hunter2"));
        assert_eq!(r.to_string(), "redis://:***@redis:6379/1");
    }

    #[test]
    fn redis_addresses_take_their_defaults_and_ipv6() {
        for (text, host, port, db) in [
            ("redis://127.0.0.1", "127.0.0.1", 6379, 0),
            ("redis://127.0.0.1:7000/", "127.0.0.1", 7000, 0),
            ("redis://[::1]:7000/5", "::1", 7000, 5),
            ("redis://:pw@localhost/2", "localhost", 6379, 2),
        ] {
            let r = redis_addr(text).unwrap();
            assert_eq!((r.host.as_str(), r.port, r.db), (host, port, db), "{text}");
        }
    }

    #[test]
    fn mistakes_are_named_at_their_keys_and_never_show_a_password() {
        let cases = [
            (
                "store = \"redis://:hunter2@h:0/0\"",
                "t.toml:4:9: inbound.dedupe.store: the port is not a number from 1 to 65535",
            ),
            (
                "store = \"rediss://:hunter2@h:1/0\"",
                "TLS to Redis (rediss://) is not supported",
            ),
            (
                "store = \"memcached://h\"",
                "`memcached://` is neither \"memory\" nor a redis:// address",
            ),
            (
                "store = \"mem\"",
                "inbound.dedupe.store: neither \"memory\" nor a redis:// address",
            ),
            (
                "store = \"redis://:hunter2@h:1/x\"",
                "the database after `/` is not a whole number",
            ),
            ("store = \"redis://:hunter2@/0\"", "the host is missing"),
            (
                "store = \"redis://:hunter2@h:1/0?timeout=1\"",
                "the database after `/` is not a whole number",
            ),
            (
                "store = \"redis://:hunter2@h?timeout=1\"",
                "options after `?` are not supported",
            ),
            ("ttl = \"0s\"", "inbound.dedupe.ttl: 0s is out of range"),
            (
                "max_response = \"1GiB\"",
                "inbound.dedupe.max_response: 1GiB is out of range",
            ),
            (
                "max_entries = 0",
                "inbound.dedupe.max_entries: 0 is out of range",
            ),
            (
                "store_timeout = 50",
                "inbound.dedupe.store_timeout: invalid duration: a bare number is ambiguous",
            ),
            (
                "on_store_error = \"fail\"",
                "inbound.dedupe.on_store_error: `fail` is not a way to answer while the store fails",
            ),
            (
                "methods = [\"post\"]",
                "inbound.dedupe.methods: `post` is not an HTTP method",
            ),
            ("methods = []", "inbound.dedupe.methods: empty"),
            (
                "ttls = \"1h\"",
                "t.toml:4:1: inbound.dedupe.ttls: unknown key `ttls` (did you mean `ttl`?)",
            ),
        ];
        for (line, want) in cases {
            let text = format!("{HEAD}{line}\n");
            let e = parse(&text).unwrap_err();
            assert!(e.contains(want), "{line}:\n{e}\nwanted: {want}");
            assert!(!e.contains("hunter2"), "{line}: the password leaked: {e}");
        }
    }

    #[test]
    fn config_json_and_a_reload_name_it_without_the_password() {
        let with = |store: &str| {
            parse(&format!(
                "{HEAD}store = \"{store}\"\non_store_error = \"open\"\n"
            ))
            .unwrap()
        };
        let c = with("redis://:hunter2@127.0.0.1:6380/1");
        let json = c.to_json();
        let d = &json["inbound"]["dedupe"];
        assert_eq!(d["store"], "redis://:***@127.0.0.1:6380/1");
        assert_eq!(d["ttl"], "24h");
        assert_eq!(d["max_response"], "1MiB");
        assert_eq!(d["on_store_error"], "open");
        assert_eq!(d["methods"], serde_json::json!(["POST", "PATCH"]));
        assert!(!json.to_string().contains("hunter2"));
        let r = crate::config::diff::reconcile(&c, with("redis://:zebra9@127.0.0.1:6380/1"));
        assert_eq!(r.changes, ["inbound changed: dedupe"]);
        assert!(!format!("{:?}", r.in_effect).contains("zebra9"));
    }

    #[test]
    fn a_dedupe_key_elsewhere_is_sent_here() {
        let e =
            parse("[inbound]\napp = \"127.0.0.1:8080\"\non_store_error = \"open\"\n").unwrap_err();
        assert!(e.contains("it belongs in [inbound.dedupe]"), "{e}");
    }
}
