//! TOML syntax errors as diagnostics.
//!
//! A file with a syntax error is reported with its syntax errors alone. The tree toml
//! recovers from a broken file is a guess: a table header whose `]` is missing is
//! dropped and its keys land in the table above, so checking that guess would report
//! keys as missing that are plainly in the file, and bury the one real mistake under
//! false ones.
//!
//! Recovery also invents things of its own: a line whose key is missing (`= "2s"`) is
//! kept under an empty stand-in key, and a second such line, or a header with no name
//! (`[`, `[ ]`), then collides with it and comes back as a "duplicate key" that names
//! nothing written in the file. Such an echo is dropped: the missing key it comes from
//! is reported already, at the same place.

use std::ops::Range;

use super::walker::join;
use crate::config::diagnostic::{Diagnostic, Severity, Source};

/// The syntax errors of `src`, each named by the key it is about where that is known.
pub(super) fn diagnostics(src: &Source<'_>, errors: Vec<toml::de::Error>) -> Vec<Diagnostic> {
    let alone = errors.len() == 1;
    errors
        .into_iter()
        .filter(|e| alone || !is_echo(src.text, e))
        .map(|e| {
            let span = e.span().unwrap_or(0..0);
            let message = e.message().trim();
            match duplicate(src.text, message, span.clone()) {
                Some((key, message, fix)) => {
                    src.diagnostic(Severity::Error, span, &key, message, fix)
                }
                None => src.diagnostic(
                    Severity::Error,
                    span,
                    "(syntax)",
                    message,
                    "fix the TOML syntax",
                ),
            }
        })
        .collect()
}

/// A "duplicate key" that names nothing written: a collision of recovery's stand-in
/// keys (see the module doc), not a mistake of its own.
fn is_echo(text: &str, e: &toml::de::Error) -> bool {
    e.message().trim() == "duplicate key"
        && e.span()
            .and_then(|span| text.get(span))
            .is_none_or(|name| name.trim().is_empty())
}

/// For a duplicate key or table: its dotted name, what is wrong, and the fix. `None`
/// when the error names no key written in the file.
fn duplicate(text: &str, message: &str, span: Range<usize>) -> Option<(String, String, String)> {
    if message != "duplicate key" {
        return None;
    }
    let line_start = text.get(..span.start)?.rfind('\n').map_or(0, |i| i + 1);
    let written = text.get(line_start..span.end)?.trim_start();
    let name = text.get(span)?.trim();
    if name.is_empty() {
        return None;
    }
    if let Some(header) = written.strip_prefix('[') {
        let table = dotted(header.trim_start_matches('['));
        if headers_before(text, line_start).any(|h| h == table) {
            return Some((
                table.clone(),
                format!("duplicate key `{name}`: [{table}] is written twice"),
                format!("merge the two [{table}] sections into one"),
            ));
        }
        // No [table] above: the name is taken by a value (`b = 1` in [a], or `b.c = 1`).
        return Some((
            table.clone(),
            format!(
                "duplicate key `{name}`: it is already set as a key, so [{table}] cannot be a section"
            ),
            format!("keep either the key `{name}` or the [{table}] section, not both"),
        ));
    }
    let key = join(&enclosing_table(text, line_start), &dotted(written));
    Some((
        key,
        format!("duplicate key `{name}`: it is already set in this section"),
        format!("keep one `{name} = ...` and remove the other"),
    ))
}

/// The dotted names of the table headers above `line_start`, nearest first.
fn headers_before(text: &str, line_start: usize) -> impl Iterator<Item = String> + '_ {
    text[..line_start]
        .lines()
        .rev()
        .map(str::trim_start)
        .filter_map(|l| l.strip_prefix('['))
        .map(|header| {
            let header = header.trim_start_matches('[');
            dotted(header.split(']').next().unwrap_or(header))
        })
}

/// The table a line belongs to: the nearest header above it.
fn enclosing_table(text: &str, line_start: usize) -> String {
    headers_before(text, line_start).next().unwrap_or_default()
}

/// A dotted key as written (`a . b`), without the spaces TOML allows around the dots.
fn dotted(written: &str) -> String {
    written
        .split('.')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<Diagnostic> {
        let (_, errors) = toml::de::DeTable::parse_recoverable(text);
        diagnostics(&Source::new("t.toml", text), errors)
    }

    #[test]
    fn a_duplicate_key_is_named_with_its_table() {
        let d = errors("[upstreams.p]\nauthorities = [\"p\"]\nauthorities = [\"q\"]\n");
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            d[0].to_string(),
            "t.toml:3:1: upstreams.p.authorities: duplicate key `authorities`: it is already \
             set in this section (keep one `authorities = ...` and remove the other)"
        );
    }

    #[test]
    fn a_duplicate_table_is_named() {
        let d = errors("[upstreams.p]\na = 1\n[upstreams . p]\nb = 2\n");
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].key, "upstreams.p");
        assert!(
            d[0].message.contains("[upstreams.p] is written twice"),
            "{}",
            d[0]
        );
    }

    #[test]
    fn a_dotted_duplicate_keeps_its_dots() {
        let d = errors(
            "[upstreams.p.retry]\nmax_attempts = 3\n[upstreams.p]\nretry.max_attempts = 2\n",
        );
        assert_eq!(d[0].key, "upstreams.p.retry");
    }

    #[test]
    fn a_missing_key_is_reported_where_it_is_missing_and_not_as_a_duplicate() {
        // Recovery keeps each key-less line under the same empty stand-in key; the
        // second one, or a header without a name, collides with the first.
        for (text, places) in [
            ("=1\n=2\n", ["t.toml:1:1:", "t.toml:2:1:"]),
            ("=\n[", ["t.toml:1:1:", "t.toml:2:2:"]),
            ("= 1\n[ ]\n", ["t.toml:1:1:", "t.toml:2:3:"]),
        ] {
            let d = errors(text);
            for place in places {
                assert!(
                    d.iter().any(|d| d.to_string().starts_with(place)),
                    "{text:?}: nothing at {place} in {d:#?}"
                );
            }
            for d in &d {
                assert_eq!(d.key, "(syntax)", "{text:?}: {d}");
                assert!(!d.message.contains("duplicate"), "{text:?}: {d}");
                assert!(
                    d.message.contains("keys cannot be empty") || d.message.contains("quoted"),
                    "{text:?}: {d}"
                );
            }
        }
    }

    #[test]
    fn a_section_over_a_key_is_not_called_a_second_section() {
        let d = errors("[upstreams.p]\nretry = 3\n[upstreams.p.retry]\nmax_attempts = 3\n");
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(
            d[0].to_string(),
            "t.toml:3:14: upstreams.p.retry: duplicate key `retry`: it is already set as a key, \
             so [upstreams.p.retry] cannot be a section (keep either the key `retry` or the \
             [upstreams.p.retry] section, not both)"
        );
    }
}
