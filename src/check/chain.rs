//! A call chain of configs, top layer first, each file one layer whose upstream calls
//! the next. The attempts of the layers multiply, and a layer's patience has to shrink
//! with depth: an inner layer that keeps working after the outer layer stopped waiting
//! holds connections for an answer nobody reads, while the outer layer retries on top.

use crate::config::units::format_duration;
use crate::config::{Config, Diagnostic, Severity, UpstreamConfig};

use crate::config::figures::{effective_patience, plain, total_backoff};
use crate::config::lint::warning;

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
    let worst_case = crate::calc::worst_case(&retries);

    diagnostics.extend(retrying_layers(layers, &resolved, worst_case));
    diagnostics.extend(growing_patience(layers, &resolved));

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
        let outer_wait = outer.attempt_timeout.min(outer.request_timeout);
        let inner_work = effective_patience(inner);
        if inner_work < outer_wait {
            continue;
        }
        let d = format_duration;
        let (inner_config, _) = layers[i];
        let total = inner.total_patience();
        let how = if total > inner.request_timeout {
            format!("{} cut to its request_timeout", d(total))
        } else {
            format!(
                "{} × {} + {} backoff",
                inner.retry.max_attempts,
                d(inner.attempt_timeout),
                d(total_backoff(inner))
            )
        };
        let then = if outer.retry.max_attempts > 1 {
            "retries while this layer is still working on the first call"
        } else {
            "has stopped waiting while this layer is still working"
        };
        diagnostics.push(warning(
            inner_config,
            &format!("upstreams.{}.attempt_timeout", inner.name),
            format!(
                "patience does not shrink with depth: this layer may work {} ({how}) on a call \
                 that {} gives up after {} (upstreams.{}.attempt_timeout), so the outer layer {then}",
                d(inner_work),
                resolved[i - 1].file,
                d(outer_wait),
                outer.name
            ),
            format!(
                "make this layer's total patience, attempts × attempt_timeout + backoff, shorter \
                 than {}, or raise attempt_timeout in {}",
                d(outer_wait),
                resolved[i - 1].file
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
            let found = config
                .upstreams
                .iter()
                .rev()
                .max_by_key(|u| (u.retry.max_attempts, effective_patience(u)));
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
    use crate::check::tests::{BASE, parse};

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

    #[test]
    fn patience_must_shrink_with_depth() {
        let outer = parse(
            &BASE
                .replacen("max_attempts = 3", "max_attempts = 1", 1)
                .replacen(
                    r#"attempt_timeout = "600ms""#,
                    r#"attempt_timeout = "2s""#,
                    1,
                ),
        );
        // 3 × 600ms + 75ms = 1875ms of work under an outer attempt of 2s: fine.
        let ok = check_chain(&[(&outer, None), (&parse(BASE), None)]);
        assert!(ok.diagnostics.is_empty(), "{:?}", ok.diagnostics);
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
        let bad = check_chain(&[(&outer, None), (&slow, None)]);
        assert_eq!(bad.diagnostics.len(), 1, "{:?}", bad.diagnostics);
        let d = &bad.diagnostics[0];
        assert_eq!(d.key, "upstreams.api.attempt_timeout");
        assert!(
            d.message.contains("2s") && d.message.contains("2025ms"),
            "{d}"
        );
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
