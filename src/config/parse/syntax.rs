//! TOML syntax errors as diagnostics.
//!
//! A file with a syntax error is reported with its syntax errors alone. The tree toml
//! recovers from a broken file is a guess: a table header whose `]` is missing is
//! dropped and its keys land in the table above, so checking that guess would report
//! keys as missing that are plainly in the file, and bury the one real mistake under
//! false ones.

use std::ops::Range;

use super::walker::join;
use crate::config::diagnostic::{Diagnostic, Severity, Source};

/// The syntax errors of `src`, each named by the key it is about where that is known.
pub(super) fn diagnostics(src: &Source<'_>, errors: Vec<toml::de::Error>) -> Vec<Diagnostic> {
    errors
        .into_iter()
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

/// For a duplicate key or table: its dotted name, what is wrong, and the fix.
fn duplicate(text: &str, message: &str, span: Range<usize>) -> Option<(String, String, String)> {
    if message != "duplicate key" {
        return None;
    }
    let line_start = text.get(..span.start)?.rfind('\n').map_or(0, |i| i + 1);
    let written = text.get(line_start..span.end)?.trim_start();
    let name = text.get(span)?.trim();
    if let Some(header) = written.strip_prefix('[') {
        let table = dotted(header.trim_start_matches('['));
        return Some((
            table.clone(),
            format!("duplicate key `{name}`: [{table}] is written twice"),
            format!("merge the two [{table}] sections into one"),
        ));
    }
    let key = join(&enclosing_table(text, line_start), &dotted(written));
    Some((
        key,
        format!("duplicate key `{name}`: it is already set in this section"),
        format!("keep one `{name} = ...` and remove the other"),
    ))
}

/// The table a line belongs to: the nearest header above it.
fn enclosing_table(text: &str, line_start: usize) -> String {
    text[..line_start]
        .lines()
        .rev()
        .map(str::trim_start)
        .find_map(|l| l.strip_prefix('['))
        .map(|header| {
            let header = header.trim_start_matches('[');
            dotted(header.split(']').next().unwrap_or(header))
        })
        .unwrap_or_default()
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
}
