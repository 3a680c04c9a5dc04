//! `[upstreams.NAME.retry]`, `[upstreams.NAME.budget]` and `[upstreams.NAME.throttle]`:
//! what may be retried, how often, the sleep between attempts, the share of retries an
//! upstream may take (and how far it may adapt), and when first attempts are rejected
//! locally.

use std::time::Duration;

use http::Method;

use super::schema::Section;
use super::walker::{Choice, Size, Table, Walker};
use crate::config::keys::{budget as budget_key, retry as key, throttle as throttle_key};
use crate::config::model::*;

/// Envoy's `retry_on` words that people carry over, each with what to write instead.
/// `connect-failure` and `reset` are tollgate's words too and stay valid.
const ENVOY_WORDS: [(&str, &str); 4] = [
    (
        "5xx",
        "list the statuses from 500 to 599 you mean, e.g. \"500\", \"502\", \"503\", \"504\"",
    ),
    ("gateway-error", "write \"502\", \"503\", \"504\""),
    ("retriable-4xx", "write \"409\""),
    ("refused-stream", "write \"reset\""),
];

/// `[upstreams.NAME.retry]`; a key not written takes its default.
pub(super) fn retry(w: &mut Walker<'_>, upstream: &str, t: &Table) -> RetryConfig {
    w.check_keys(Section::Retry, upstream, t);
    let d = RetryConfig::default();
    let secs = Duration::from_secs;
    let idempotency_header = match w.string(t, key::idempotency_header) {
        None => d.idempotency_header.clone(),
        Some((text, _)) if text.is_empty() => None,
        Some(written) => w.header_name(written, &t.key(key::idempotency_header)),
    };
    let max_body = Size(0)..=Size(64 << 20);
    let mint_idempotency_key = method_list(w, t, key::mint_idempotency_key).unwrap_or_default();
    if !mint_idempotency_key.is_empty()
        && idempotency_header.is_none()
        && let Some(v) = t.get(key::mint_idempotency_key)
    {
        w.reject(
            v.span(),
            &t.key(key::mint_idempotency_key),
            "a key is minted into the idempotency header, and idempotency_header is off",
            "remove idempotency_header = \"\" (the default is \"idempotency-key\"), or remove \
             mint_idempotency_key",
        );
    }
    RetryConfig {
        max_attempts: w.ranged(t, key::max_attempts, u64::from(d.max_attempts), 1..=10u64) as u32,
        on: retry_on(w, t).unwrap_or(d.on),
        methods: methods(w, t).unwrap_or(d.methods),
        idempotency_header,
        mint_idempotency_key,
        backoff: backoff(w, t),
        retry_after: match honors(w, t, key::retry_after, "a Retry-After mode") {
            Some(true) => RetryAfterMode::Honor,
            Some(false) => RetryAfterMode::Ignore,
            None => d.retry_after,
        },
        max_retry_after: w.ranged(
            t,
            key::max_retry_after,
            d.max_retry_after,
            Duration::ZERO..=secs(3600),
        ),
        max_body: w.ranged(t, key::max_body, Size(d.max_body), max_body).0,
        ownership: match honors(w, t, key::ownership, "an ownership mode") {
            Some(true) => Ownership::Honor,
            Some(false) => Ownership::Ignore,
            None => d.ownership,
        },
    }
}

/// The failure conditions of `on`; `None` when the key is absent or not a list.
fn retry_on(w: &mut Walker<'_>, t: &Table) -> Option<RetryOn> {
    let key = t.key(key::on);
    let list = w.strings(t, key::on)?;
    let mut on = RetryOn::none();
    for (word, span) in list {
        match word.as_str() {
            "connect-failure" => on.connect_failure = true,
            "reset" => on.reset = true,
            "timeout" => on.timeout = true,
            "unavailable" => on.unavailable = true,
            code => match (
                code.parse::<u16>(),
                ENVOY_WORDS.iter().find(|(e, _)| *e == code),
            ) {
                (Ok(c), _) if (400..600).contains(&c) => on.add_status(c),
                (_, Some((_, instead))) => w.reject(
                    span,
                    &key,
                    format!("`{word}` is Envoy's retry_on word, not a tollgate retry condition"),
                    instead,
                ),
                _ => w.reject(
                    span,
                    &key,
                    format!("`{word}` is not a retry condition"),
                    "use connect-failure, reset, timeout, unavailable or a status from 400 to 599",
                ),
            },
        }
    }
    Some(on)
}

/// A list of HTTP methods, written in upper case; shared with `[inbound.dedupe]`.
pub(super) fn methods(w: &mut Walker<'_>, t: &Table) -> Option<Vec<Method>> {
    method_list(w, t, key::methods)
}

/// The list of HTTP methods at `name`.
fn method_list(w: &mut Walker<'_>, t: &Table, name: &str) -> Option<Vec<Method>> {
    let key = t.key(name);
    let list = w.strings(t, name)?;
    let mut out = Vec::new();
    for (m, span) in list {
        let upper = !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase());
        match Method::from_bytes(m.as_bytes()) {
            Ok(method) if upper => out.push(method),
            _ => w.reject(
                span,
                &key,
                format!("`{m}` is not an HTTP method"),
                "write methods in upper case, e.g. \"GET\"",
            ),
        }
    }
    Some(out)
}

/// `backoff_base`, `backoff_max` and `backoff_jitter`. The base must not be longer than
/// the maximum; that is checked only when both were readable, since a default standing
/// in for an unreadable one would make up a second problem.
fn backoff(w: &mut Walker<'_>, t: &Table) -> BackoffConfig {
    let ms = Duration::from_millis;
    let secs = Duration::from_secs;
    let d = BackoffConfig::default();
    let base = w.ranged(t, key::backoff_base, d.base(), ms(1)..=secs(60));
    let max = w.ranged(t, key::backoff_max, d.max(), ms(1)..=secs(600));
    let jitter = w
        .word(t, key::backoff_jitter, &JITTER)
        .unwrap_or(d.jitter());
    let (base_key, max_key) = (t.key(key::backoff_base), t.key(key::backoff_max));
    if w.is_invalid(&base_key) || w.is_invalid(&max_key) {
        return d.with_jitter(jitter);
    }
    match BackoffConfig::try_new(base, max) {
        Ok(b) => b.with_jitter(jitter),
        Err(e) => {
            // At the key that was written: a base above the default maximum, or a
            // maximum below the default base.
            let (key, span) = match (t.get(key::backoff_base), t.get(key::backoff_max)) {
                (Some(v), _) => (base_key, v.span()),
                (None, Some(v)) => (max_key, v.span()),
                (None, None) => (base_key, 0..0),
            };
            w.error(
                span,
                &key,
                e.to_string(),
                "make backoff_base at most backoff_max",
            );
            d.with_jitter(jitter)
        }
    }
}

/// `[upstreams.NAME.budget]`; a key not written takes its default.
pub(super) fn budget(w: &mut Walker<'_>, upstream: &str, t: &Table) -> BudgetConfig {
    w.check_keys(Section::Budget, upstream, t);
    let d = BudgetConfig::default();
    let window = Duration::from_millis(100)..=Duration::from_secs(3600);
    let ratio = w.ranged(t, budget_key::ratio, d.ratio, 0.0..=1000.0);
    BudgetConfig {
        ratio,
        min_per_sec: w.ranged(t, budget_key::min_per_sec, d.min_per_sec, 0.0..=1e6),
        window: w.ranged(t, budget_key::window, d.window, window),
        max_ratio: max_ratio(w, t, ratio),
    }
}

/// `max_ratio`: the most the share may adapt to. One below `ratio` is an error (a
/// ceiling under the floor has no meaning to guess at); checked only when `ratio` was
/// readable, since a default standing in for it would make up a second problem.
fn max_ratio(w: &mut Walker<'_>, t: &Table, ratio: f64) -> Option<f64> {
    let max = w.optional(t, budget_key::max_ratio, 0.0..=1000.0)?;
    if max < ratio && !w.is_invalid(&t.key(budget_key::ratio)) {
        let span = t.get(budget_key::max_ratio).map_or(0..0, |v| v.span());
        w.reject(
            span,
            &t.key(budget_key::max_ratio),
            format!("max_ratio {max} is below ratio {ratio}: the share adapts upwards from ratio"),
            "make max_ratio greater than ratio (e.g. 3 × ratio), or remove it to keep the share fixed",
        );
        return None;
    }
    Some(max)
}

/// `[upstreams.NAME.throttle]`; a key not written takes its default. `k` below 1 would
/// reject requests of an upstream that accepts every one of them.
pub(super) fn throttle(w: &mut Walker<'_>, upstream: &str, t: &Table) -> ThrottleConfig {
    w.check_keys(Section::Throttle, upstream, t);
    let d = ThrottleConfig::default();
    let window = Duration::from_millis(100)..=Duration::from_secs(3600);
    ThrottleConfig {
        k: w.ranged(t, throttle_key::k, d.k, 1.0..=100.0),
        window: w.ranged(t, throttle_key::window, d.window, window),
    }
}

/// `app_retries`: `count` (the default) or `refuse`.
pub(super) const APP_RETRIES: Choice<AppRetries> = Choice {
    what: "an app_retries mode",
    fix: "use \"count\" (the default: counted and sent as a retry) or \"refuse\"",
    words: &[
        ("count", AppRetries::Count),
        ("refuse", AppRetries::Refuse),
        ("ignore", AppRetries::Ignore),
    ],
};

/// `backoff_jitter`: `none` only to demonstrate synchronised retries.
const JITTER: Choice<Jitter> = Choice {
    what: "a jitter mode",
    fix: "use \"full\" (recommended) or \"none\"",
    words: &[("full", Jitter::Full), ("none", Jitter::None)],
};

/// Whether the switch `key` says `honor` (or `honour`) rather than `ignore`; `None`
/// when it is not written or not readable.
fn honors(w: &mut Walker<'_>, t: &Table, key: &str, what: &'static str) -> Option<bool> {
    let choice = Choice {
        what,
        fix: "use \"honor\" (the default) or \"ignore\"",
        words: &[("honor", true), ("honour", true), ("ignore", false)],
    };
    w.word(t, key, &choice)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        crate::config::parse("t.toml", text, Path::new(".")).map_err(|e| e.to_string())
    }

    const HEAD: &str = "[upstreams.pay]\nauthorities = [\"pay\"]\nendpoints = [\"127.0.0.1:9\"]\n\
                        [upstreams.pay.retry]\n";

    #[test]
    fn mint_idempotency_key_is_read_shown_and_off_by_default() {
        let off = parse(HEAD).unwrap();
        assert!(off.upstreams[0].retry.mint_idempotency_key.is_empty());
        let on = parse(&format!(
            "{HEAD}mint_idempotency_key = [\"POST\", \"PATCH\"]\n"
        ))
        .unwrap();
        let r = &on.upstreams[0].retry;
        assert_eq!(
            r.mint_idempotency_key,
            [http::Method::POST, http::Method::PATCH]
        );
        let json = on.to_json();
        assert_eq!(
            json["upstreams"]["pay"]["retry"]["mint_idempotency_key"],
            serde_json::json!(["POST", "PATCH"])
        );
    }

    #[test]
    fn minting_without_an_idempotency_header_is_an_error_with_its_fix() {
        let e = parse(&format!(
            "{HEAD}idempotency_header = \"\"\nmint_idempotency_key = [\"POST\"]\n"
        ))
        .unwrap_err();
        assert!(
            e.contains("t.toml:6:24: upstreams.pay.retry.mint_idempotency_key:"),
            "{e}"
        );
        assert!(e.contains("remove idempotency_header = \"\""), "{e}");
        let e = parse(&format!("{HEAD}mint_idempotency_key = [\"post\"]\n")).unwrap_err();
        assert!(e.contains("`post` is not an HTTP method"), "{e}");
    }
}
