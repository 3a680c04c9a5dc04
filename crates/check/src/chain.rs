//! A call chain of configs, top layer first, each file one layer whose upstream calls
//! the next. The attempts of the layers multiply, and a layer's patience has to shrink
//! with depth: an inner layer that keeps working after the outer layer stopped waiting
//! holds connections for an answer nobody reads, while the outer layer retries on top.

use tollgate_core::config::units::format_duration;
use tollgate_core::config::{Config, Diagnostic, Severity, UpstreamConfig};

use tollgate_core::config::figures::{effective_patience, plain};
use tollgate_core::config::lint::warning;

/// One layer of a chain: a file and the upstream through which it calls the next layer.
#[derive(Clone, Debug)]
pub struct ChainLayer {
    pub file: String,
    /// `None` when the file has no upstream, or not the one asked for.
    pub upstream: Option<UpstreamConfig>,
}

impl ChainLayer {
    pub fn max_attempts(&self) -> u32 {
        self.upstream.as_ref().map_or(1, |u| u.retry.max_attempts)
    }
}

/// A chain as checked: its layers, the worst case at the bottom, and what is wrong.
#[derive(Clone, Debug)]
pub struct ChainReport {
    /// Top first.
    pub layers: Vec<ChainLayer>,
    /// `Π max_attempts`: requests at the bottom per request at the top, every attempt failing.
    pub worst_case: f64,
    pub diagnostics: Vec<Diagnostic>,
}

/// Checks a call chain, top layer first. Each layer is a config and, optionally, the
/// name of the upstream that calls the next layer; without a name it is the upstream
/// with the most attempts (then the most patience, then the first by name), which is
/// the one that can cost the chain the most.
pub fn check_chain(layers: &[(&Config, Option<&str>)]) -> ChainReport {
    let mut diagnostics = Vec::new();
    let resolved: Vec<ChainLayer> = layers
        .iter()
        .map(|(config, name)| ChainLayer {
            file: config.file.clone(),
            upstream: pick_link(config, *name, &mut diagnostics).cloned(),
        })
        .collect();
    let retries: Vec<u32> = resolved
        .iter()
        .map(|l| l.max_attempts().saturating_sub(1))
        .collect();
    let worst_case = tollgate_calc::worst_case(&retries);

    diagnostics.extend(retrying_layers(layers, &resolved, worst_case));
    diagnostics.extend(growing_patience(layers, &resolved));
    diagnostics.extend(differing_key_headers(layers, &resolved));

    ChainReport {
        layers: resolved,
        worst_case,
        diagnostics,
    }
}

/// More than one layer retries: the bottom gets the product. Reported once, at the top
/// retrying layer.
fn retrying_layers(
    layers: &[(&Config, Option<&str>)],
    resolved: &[ChainLayer],
    worst_case: f64,
) -> Option<Diagnostic> {
    let retrying: Vec<usize> = (0..resolved.len())
        .filter(|i| resolved[*i].max_attempts() > 1)
        .collect();
    let [first, _, ..] = retrying[..] else {
        return None;
    };
    let (config, _) = layers[first];
    let name = resolved[first]
        .upstream
        .as_ref()
        .map_or("", |u| u.name.as_str());
    let who: Vec<String> = retrying
        .iter()
        .map(|i| {
            let layer = &resolved[*i];
            format!("{} ({} attempts)", layer.file, layer.max_attempts())
        })
        .collect();
    Some(warning(
        config,
        &format!("upstreams.{name}.retry.max_attempts"),
        format!(
            "{} layers of the chain retry: {}; when the bottom fails, it gets {}× the \
             requests of the top",
            retrying.len(),
            who.join(", "),
            plain(worst_case)
        ),
        "retry at one layer only: set max_attempts = 1 at the others; the ownership \
         header does the rest"
            .to_string(),
    ))
}

/// Each pair of adjacent layers where the inner one may work longer than the outer one
/// waits for an attempt.
fn growing_patience(
    layers: &[(&Config, Option<&str>)],
    resolved: &[ChainLayer],
) -> Vec<Diagnostic> {
    let mut diagnostics = Vec::new();
    for i in 1..resolved.len() {
        let (Some(outer), Some(inner)) = (&resolved[i - 1].upstream, &resolved[i].upstream) else {
            continue;
        };
        // The outer layer starts a retry beside its call after its attempt timeout (when
        // it may retry at all), and stops waiting at its request timeout.
        let retries_after = outer
            .attempt_timeout
            .filter(|_| outer.retry.max_attempts > 1)
            .map(|a| outer.request_timeout.map_or(a, |r| a.min(r)));
        let (outer_wait, then, what) = match (retries_after, outer.request_timeout) {
            (Some(w), _) => (
                w,
                "retries while this layer is still working on the first call",
                "attempt_timeout",
            ),
            (None, Some(r)) => (
                r,
                "has stopped waiting while this layer is still working",
                "request_timeout",
            ),
            (None, None) => continue,
        };
        let inner_work = effective_patience(inner);
        if inner_work.is_some_and(|w| w < outer_wait) {
            continue;
        }
        let d = format_duration;
        let (inner_config, _) = layers[i];
        let how = match (
            inner.total_patience(),
            inner.attempt_timeout,
            inner.request_timeout,
        ) {
            (Some(total), _, Some(r)) if total > r => {
                format!("{} cut to its request_timeout", d(total))
            }
            (Some(total), Some(a), _) => format!(
                "{} × {} + {} backoff",
                inner.retry.max_attempts,
                d(a),
                d(total - a * inner.retry.max_attempts)
            ),
            _ => "no attempt_timeout".to_string(),
        };
        let work = inner_work.map_or_else(|| "until the caller's deadline".to_string(), d);
        diagnostics.push(warning(
            inner_config,
            &format!("upstreams.{}.attempt_timeout", inner.name),
            format!(
                "patience does not shrink with depth: this layer may work {work} ({how}) on a call \
                 that {} gives up after {} (upstreams.{}.{what}), so the outer layer {then}",
                resolved[i - 1].file,
                d(outer_wait),
                outer.name
            ),
            format!(
                "make this layer's total patience, attempts × attempt_timeout + backoff, shorter \
                 than {}, or raise {what} in {}",
                d(outer_wait),
                resolved[i - 1].file
            ),
        ));
    }
    diagnostics
}

/// Each pair of adjacent layers where the outer one sends idempotency keys in one header
/// and the inner one's dedupe reads another: the inner one never sees a key, and its
/// answers name its own header, so the outer one never sends a keyed request again
/// after a failure that may have run (and, before it read them, may not know why).
fn differing_key_headers(
    layers: &[(&Config, Option<&str>)],
    resolved: &[ChainLayer],
) -> Vec<Diagnostic> {
    let mut diagnostics = Vec::new();
    for i in 1..resolved.len() {
        let Some(outer) = &resolved[i - 1].upstream else {
            continue;
        };
        let Some(sent) = &outer.retry.idempotency_header else {
            continue;
        };
        let (inner_config, _) = layers[i];
        let Some(dedupe) = inner_config
            .inbound
            .as_ref()
            .and_then(|i| i.dedupe.as_ref())
        else {
            continue;
        };
        if dedupe.header == *sent {
            continue;
        }
        let (outer_config, _) = layers[i - 1];
        diagnostics.push(warning(
            outer_config,
            &format!("upstreams.{}.retry.idempotency_header", outer.name),
            format!(
                "this layer sends idempotency keys in `{sent}`, and {} reads them from `{}` \
                 ([inbound.dedupe] header): its dedupe never sees them, so a keyed request \
                 that may have run is not sent again",
                resolved[i].file, dedupe.header
            ),
            format!(
                "name one header on both sides: idempotency_header = \"{}\" here, or \
                 header = \"{sent}\" in [inbound.dedupe] of {}",
                dedupe.header, resolved[i].file
            ),
        ));
    }
    diagnostics
}

fn pick_link<'c>(
    config: &'c Config,
    name: Option<&str>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<&'c UpstreamConfig> {
    let names = || {
        config
            .upstreams
            .iter()
            .map(|u| u.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(name) => {
            let found = config.upstream(name);
            if found.is_none() {
                let (line, column) = config.position("upstreams");
                diagnostics.push(Diagnostic {
                    severity: Severity::Error,
                    file: config.file.clone(),
                    line,
                    column,
                    key: format!("upstreams.{name}"),
                    message: format!(
                        "--chain names upstream `{name}`, which this file does not have"
                    ),
                    fix: if config.upstreams.is_empty() {
                        "add the upstream that calls the next layer".to_string()
                    } else {
                        format!("name one of: {}", names())
                    },
                });
            }
            found
        }
        None => {
            let found = config.upstreams.iter().rev().max_by_key(|u| {
                let patience = effective_patience(u).unwrap_or(std::time::Duration::MAX);
                (u.retry.max_attempts, patience)
            });
            if found.is_none() {
                diagnostics.push(warning(
                    config,
                    "upstreams",
                    "no upstream, so this layer cannot call the next one; it counts as 1 attempt"
                        .to_string(),
                    "add the upstream that calls the next layer, or leave the file out of --chain"
                        .to_string(),
                ));
            }
            found
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::config::testing::{BASE, parse};

    #[test]
    fn a_chain_multiplies_its_layers_and_flags_every_retrying_layer() {
        let a = parse(BASE);
        let report = check_chain(&[(&a, None), (&a, None), (&a, None)]);
        assert_eq!(report.worst_case, 27.0);
        let multiply: Vec<_> = report
            .diagnostics
            .iter()
            .filter(|d| d.message.contains("layers of the chain retry"))
            .collect();
        assert_eq!(multiply.len(), 1);
        assert!(multiply[0].message.contains("27×"));
        assert!(multiply[0].fix.starts_with("retry at one layer only"));
    }

    /// The chain's warnings about patience that grows with depth.
    fn patience(layers: &[(&Config, Option<&str>)]) -> Vec<Diagnostic> {
        check_chain(layers)
            .diagnostics
            .into_iter()
            .filter(|d| d.message.starts_with("patience does not shrink"))
            .collect()
    }

    #[test]
    fn patience_must_shrink_with_depth() {
        // The outer layer starts a retry beside a call still running after 2 s.
        let outer = parse(
            &BASE
                .replacen("max_attempts = 3", "max_attempts = 2", 1)
                .replacen(
                    r#"attempt_timeout = "600ms""#,
                    r#"attempt_timeout = "2s""#,
                    1,
                ),
        );
        // 3 × 600ms + 75ms = 1875ms of work under an outer attempt of 2s: fine.
        let ok = patience(&[(&outer, None), (&parse(BASE), None)]);
        assert!(ok.is_empty(), "{ok:?}");
        // 3 × 650ms + 75ms = 2025ms: longer than the outer layer waits.
        let slow = parse(
            &BASE
                .replacen(
                    r#"attempt_timeout = "600ms""#,
                    r#"attempt_timeout = "650ms""#,
                    1,
                )
                .replacen(r#"request_timeout = "2s""#, r#"request_timeout = "3s""#, 1),
        );
        let bad = patience(&[(&outer, None), (&slow, None)]);
        assert_eq!(bad.len(), 1, "{bad:?}");
        let d = &bad[0];
        assert_eq!(d.key, "upstreams.api.attempt_timeout");
        assert!(
            d.message.contains("2s") && d.message.contains("2025ms"),
            "{d}"
        );
        // An inner layer with no timeouts of its own works until the caller's deadline.
        let unbounded = parse(
            &BASE.replacen("request_timeout = \"2s\"\n", "", 1).replacen(
                "attempt_timeout = \"600ms\"\n",
                "",
                1,
            ),
        );
        let bad = patience(&[(&outer, None), (&unbounded, None)]);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].message.contains("until the caller's deadline"),
            "{}",
            bad[0]
        );
        // An outer layer with no attempt timeout waits for its call: nothing to shrink.
        let patient = parse(
            &BASE.replacen("request_timeout = \"2s\"\n", "", 1).replacen(
                "attempt_timeout = \"600ms\"\n",
                "",
                1,
            ),
        );
        let fine = patience(&[(&patient, None), (&unbounded, None)]);
        assert!(fine.is_empty(), "{fine:?}");
    }

    #[test]
    fn a_caller_and_callee_whose_key_headers_differ_are_reported() {
        let caller = |header: &str| {
            parse(&BASE.replace(
                "max_attempts = 3\n",
                &format!("max_attempts = 3\nidempotency_header = \"{header}\"\n"),
            ))
        };
        let callee = parse(&format!(
            "{BASE}\n[inbound]\napp = \"127.0.0.1:8081\"\n[inbound.dedupe]\n"
        ));
        let differ = |a: &Config| {
            check_chain(&[(a, None), (&callee, None)])
                .diagnostics
                .into_iter()
                .filter(|d| d.message.contains("idempotency keys"))
                .collect::<Vec<_>>()
        };
        let other = caller("x-idempotency-key");
        let found = differ(&other);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].message.contains("`x-idempotency-key`"),
            "{}",
            found[0].message
        );
        assert!(
            found[0].message.contains("`idempotency-key`"),
            "{}",
            found[0].message
        );
        assert_eq!(found[0].key, "upstreams.api.retry.idempotency_header");
        assert!(differ(&caller("idempotency-key")).is_empty());
        assert!(differ(&parse(BASE)).is_empty(), "the defaults agree");
    }

    #[test]
    fn a_chain_layer_may_name_its_upstream() {
        let two = parse(&format!(
            "{BASE}\n[upstreams.db]\nauthorities = [\"db\"]\nendpoints = [\"127.0.0.1:5432\"]\n"
        ));
        let by_default = check_chain(&[(&two, None)]);
        assert_eq!(by_default.layers[0].max_attempts(), 3);
        let picked = check_chain(&[(&two, Some("db"))]);
        assert_eq!(picked.layers[0].max_attempts(), 1);
        let missing = check_chain(&[(&two, Some("nope"))]);
        assert!(missing.diagnostics[0].is_error());
        assert!(missing.diagnostics[0].fix.contains("api, db"));
    }
}
