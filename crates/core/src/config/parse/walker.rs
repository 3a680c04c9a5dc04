//! Typed reads from toml's spanned tree, each problem reported where it was written.
//!
//! Every reader returns what it could read (or the default) and reports the rest, so
//! the walk goes on to find every mistake in one pass. It also remembers which keys had
//! a value it could not use: such a key was *given*, only wrongly, and a check that
//! relates it to another key ("neither authorities nor listen is set",
//! "backoff_base is longer than backoff_max") must not run on a default that stands in
//! for it, or one mistake would be reported as two.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::ops::{Range, RangeInclusive};
use std::time::Duration;

use http::HeaderName;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::schema::{self, Section};
use crate::config::diagnostic::{Diagnostic, Severity, Source};
use crate::config::units::{format_duration, format_size, parse_duration, parse_size};

pub(super) type Value<'i> = Spanned<DeValue<'i>>;

/// A value read from the file, with where it was written.
pub(super) type At<T> = (T, Range<usize>);

/// A table of the file and the dotted path it was written at.
pub(super) struct Table<'t, 'i> {
    pub items: &'t DeTable<'i>,
    pub path: String,
}

impl<'t, 'i> Table<'t, 'i> {
    pub(super) fn new(items: &'t DeTable<'i>, path: impl Into<String>) -> Self {
        Table {
            items,
            path: path.into(),
        }
    }

    /// The dotted name of `key` in this table.
    pub(super) fn key(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub(super) fn get(&self, key: &str) -> Option<&'t Value<'i>> {
        self.items
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v)
    }

    /// Where `key` was written, or `fallback` when it was not.
    pub(super) fn span_of(&self, key: &str, fallback: &Range<usize>) -> Range<usize> {
        self.get(key).map_or(fallback.clone(), |v| v.span())
    }
}

pub(super) struct Walker<'a> {
    pub src: Source<'a>,
    pub diags: Vec<Diagnostic>,
    /// Where each key was written, for lints that point at it.
    pub positions: BTreeMap<String, (usize, usize)>,
    /// The dotted keys whose value was written but could not be used.
    invalid: HashSet<String>,
}

/// The dotted name of `key` under `path`. An empty key (`"" = 1` is valid TOML) is
/// written as TOML spells it, so a diagnostic always names a key.
pub(super) fn join(path: &str, key: &str) -> String {
    let key = if key.is_empty() { "\"\"" } else { key };
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

pub(super) fn kind(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// A value the config takes within bounds: a count, a number, a duration, a size.
pub(super) trait Ranged: Copy + PartialOrd {
    /// The value as written; the error is the whole message.
    fn read(v: &DeValue<'_>) -> Result<Self, String>;
    /// The value the way the config would write it.
    fn show(self) -> String;
    /// The fix for a value that cannot be read at all.
    fn how_to_write(range: &RangeInclusive<Self>) -> String;
}

impl Ranged for u64 {
    fn read(v: &DeValue<'_>) -> Result<Self, String> {
        match v {
            DeValue::Integer(i) => u64::from_str_radix(i.as_str(), i.radix())
                .map_err(|_| format!("{} is not a whole number of at least 0", i.as_str())),
            other => Err(format!("expected an integer, found {}", kind(other))),
        }
    }

    fn show(self) -> String {
        self.to_string()
    }

    fn how_to_write(range: &RangeInclusive<Self>) -> String {
        format!(
            "use a whole number from {} to {}",
            range.start(),
            range.end()
        )
    }
}

impl Ranged for f64 {
    fn read(v: &DeValue<'_>) -> Result<Self, String> {
        match v {
            DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                .map(|n| n as f64)
                .map_err(|_| format!("{} is not a number", i.as_str())),
            DeValue::Float(f) => f
                .as_str()
                .replace('_', "")
                .parse::<f64>()
                .map_err(|_| format!("{} is not a number", f.as_str())),
            other => Err(format!("expected a number, found {}", kind(other))),
        }
    }

    fn show(self) -> String {
        self.to_string()
    }

    fn how_to_write(_: &RangeInclusive<Self>) -> String {
        "write a number such as 0.1".to_string()
    }
}

impl Ranged for Duration {
    fn read(v: &DeValue<'_>) -> Result<Self, String> {
        let parsed = match v {
            DeValue::String(s) => parse_duration(s),
            DeValue::Integer(i) => Err(format!(
                "a bare number is ambiguous; write \"{}ms\" or \"{}s\"",
                i.as_str(),
                i.as_str()
            )),
            other => Err(format!("expected a duration string, found {}", kind(other))),
        };
        parsed.map_err(|e| format!("invalid duration: {e}"))
    }

    fn show(self) -> String {
        format_duration(self)
    }

    fn how_to_write(_: &RangeInclusive<Self>) -> String {
        "write a number with a unit: \"250ms\", \"2s\", \"1m\"".to_string()
    }
}

/// A key that takes one of a few words, each standing for a value of `T`.
pub(super) struct Choice<T: 'static> {
    /// What such a word is, for the message: "a protocol".
    pub what: &'static str,
    /// The words to choose from, for the fix.
    pub fix: &'static str,
    pub words: &'static [(&'static str, T)],
}

/// A size in bytes, written `"64KiB"` or as a bare number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub(super) struct Size(pub usize);

impl Ranged for Size {
    fn read(v: &DeValue<'_>) -> Result<Self, String> {
        let parsed = match v {
            DeValue::String(s) => parse_size(s),
            DeValue::Integer(i) => i
                .as_str()
                .parse::<u64>()
                .map_err(|_| format!("`{}` is not a size", i.as_str())),
            other => Err(format!("expected a size, found {}", kind(other))),
        };
        parsed
            .map(|n| Size(usize::try_from(n).unwrap_or(usize::MAX)))
            .map_err(|e| format!("invalid size: {e}"))
    }

    fn show(self) -> String {
        format_size(self.0 as u64)
    }

    fn how_to_write(_: &RangeInclusive<Self>) -> String {
        "write a whole number with a unit: \"64KiB\", \"1MiB\"".to_string()
    }
}

impl<'a> Walker<'a> {
    pub(super) fn new(src: Source<'a>) -> Self {
        Walker {
            src,
            diags: Vec::new(),
            positions: BTreeMap::new(),
            invalid: HashSet::new(),
        }
    }

    /// Reports a problem at `span`.
    pub(super) fn error(
        &mut self,
        span: Range<usize>,
        key: &str,
        msg: impl Into<String>,
        fix: &str,
    ) {
        let d = self.src.diagnostic(Severity::Error, span, key, msg, fix);
        self.diags.push(d);
    }

    /// Reports that the value of `key` cannot be used, and remembers that it was given.
    pub(super) fn reject(
        &mut self,
        span: Range<usize>,
        key: &str,
        msg: impl Into<String>,
        fix: &str,
    ) {
        self.invalid.insert(key.to_string());
        self.error(span, key, msg, fix);
    }

    /// Whether `key` was written with a value that could not be used.
    pub(super) fn is_invalid(&self, key: &str) -> bool {
        self.invalid.contains(key)
    }

    pub(super) fn note_position(&mut self, key: &str, span: &Range<usize>) {
        let pos = self.src.position(span.start);
        self.positions.entry(key.to_string()).or_insert(pos);
    }

    /// Reports the keys `section` does not take; records where each key was written.
    /// `upstream` names the upstream whose section this is.
    pub(super) fn check_keys(&mut self, section: Section, upstream: &str, t: &Table) {
        for (k, _) in t.items.iter() {
            let name = k.get_ref().as_ref();
            let full = t.key(name);
            self.note_position(&full, &k.span());
            if !section.keys().contains(&name) {
                let (message, fix) = schema::unknown_key(section, upstream, name);
                self.reject(k.span(), &full, message, &fix);
            }
        }
    }

    /// The table under `key`, with the span of its value.
    pub(super) fn table<'t, 'i>(
        &mut self,
        t: &Table<'t, 'i>,
        key: &str,
    ) -> Option<At<Table<'t, 'i>>> {
        let v = t.get(key)?;
        let full = t.key(key);
        match v.get_ref() {
            DeValue::Table(items) => Some((Table::new(items, full), v.span())),
            other => {
                let fix = format!("write it as a [{full}] section");
                let message = format!("expected a table, found {}", kind(other));
                self.reject(v.span(), &full, message, &fix);
                None
            }
        }
    }

    pub(super) fn string(&mut self, t: &Table, key: &str) -> Option<At<String>> {
        let v = t.get(key)?;
        match v.get_ref() {
            DeValue::String(s) => Some((s.to_string(), v.span())),
            other => {
                self.reject(
                    v.span(),
                    &t.key(key),
                    format!("expected a string, found {}", kind(other)),
                    "put the value in double quotes",
                );
                None
            }
        }
    }

    /// A boolean (`true` or `false`).
    pub(super) fn boolean(&mut self, t: &Table, key: &str) -> Option<bool> {
        let v = t.get(key)?;
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                self.reject(
                    v.span(),
                    &t.key(key),
                    format!("expected true or false, found {}", kind(other)),
                    "write true or false, without quotes",
                );
                None
            }
        }
    }

    /// A list of strings; status codes may be written as numbers (`on = [502, 503]`).
    /// An entry of another type is reported and left out.
    pub(super) fn strings(&mut self, t: &Table, key: &str) -> Option<Vec<At<String>>> {
        let v = t.get(key)?;
        let full = t.key(key);
        let DeValue::Array(items) = v.get_ref() else {
            self.reject(
                v.span(),
                &full,
                format!("expected a list of strings, found {}", kind(v.get_ref())),
                "write it as [\"a\", \"b\"]",
            );
            return None;
        };
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push((s.to_string(), item.span())),
                DeValue::Integer(i) if i.radix() == 10 => {
                    out.push((i.as_str().to_string(), item.span()))
                }
                other => self.reject(
                    item.span(),
                    &full,
                    format!("expected a string in the list, found {}", kind(other)),
                    "put each entry in double quotes",
                ),
            }
        }
        Some(out)
    }

    /// A value within `range`: `default` when the key is absent, or when its value is
    /// unreadable or out of range (which is reported).
    pub(super) fn ranged<T: Ranged>(
        &mut self,
        t: &Table,
        key: &str,
        default: T,
        range: RangeInclusive<T>,
    ) -> T {
        self.optional(t, key, range).unwrap_or(default)
    }

    /// A value within `range`, `None` when the key is absent or its value unusable.
    pub(super) fn optional<T: Ranged>(
        &mut self,
        t: &Table,
        key: &str,
        range: RangeInclusive<T>,
    ) -> Option<T> {
        let v = t.get(key)?;
        let (span, full) = (v.span(), t.key(key));
        match T::read(v.get_ref()) {
            Ok(x) if range.contains(&x) => Some(x),
            Ok(x) => {
                let (lo, hi) = (range.start().show(), range.end().show());
                let fix = format!("use a value from {lo} to {hi}");
                self.reject(span, &full, format!("{} is out of range", x.show()), &fix);
                None
            }
            Err(e) => {
                self.reject(span, &full, e, &T::how_to_write(&range));
                None
            }
        }
    }

    /// One of the words of `choice`.
    pub(super) fn word<T: Copy>(&mut self, t: &Table, key: &str, choice: &Choice<T>) -> Option<T> {
        let (text, span) = self.string(t, key)?;
        if let Some((_, value)) = choice.words.iter().find(|(w, _)| *w == text) {
            return Some(*value);
        }
        let message = format!("`{text}` is not {}", choice.what);
        self.reject(span, &t.key(key), message, choice.fix);
        None
    }

    pub(super) fn socket_addr(&mut self, t: &Table, key: &str) -> Option<At<SocketAddr>> {
        let (text, span) = self.string(t, key)?;
        match text.parse::<SocketAddr>() {
            Ok(a) => Some((a, span)),
            Err(_) => {
                self.reject(
                    span,
                    &t.key(key),
                    format!("`{text}` is not an IP address with a port"),
                    "write it as \"127.0.0.1:15001\" or \"[::1]:15001\"",
                );
                None
            }
        }
    }

    pub(super) fn header_name(
        &mut self,
        (text, span): At<String>,
        full: &str,
    ) -> Option<HeaderName> {
        match HeaderName::from_bytes(text.as_bytes()) {
            Ok(h) => Some(h),
            Err(_) => {
                self.reject(
                    span,
                    full,
                    format!("`{text}` is not a valid header name"),
                    "use letters, digits and dashes, e.g. \"x-timeout-ms\"",
                );
                None
            }
        }
    }
}
