//! Every key of the config file, declared once: its name, its TOML type or unit, its
//! default, a line saying what it does, and whether a reload applies it or it waits
//! for a restart. One file per section; the parser's known keys (and so its "did you
//! mean" and "it belongs in"), the JSON of `/config`, the reload's restart list, the
//! names of what a reload changed and the keys table of docs/config.md all come from
//! here.
//!
//! A default is never written here: a key whose default is the model's shows it from
//! the model's `Default`, the same value the parser starts from. What the parser does
//! with a value (units, ranges, checks across keys) stays in `parse/`, which names each
//! key by the constant declared here, so a key cannot be read that is not declared.

#[macro_use]
mod declare;

pub mod access_log;
pub mod admin;
pub mod budget;
pub mod deadline;
pub mod dedupe;
pub mod hedge;
pub mod inbound;
pub mod inbound_retries;
pub mod kubernetes;
pub mod listener;
pub mod outlier;
pub mod retry;
pub mod root;
pub mod runtime;
pub mod throttle;
pub mod tls;
pub mod tracing;
pub mod upstream;

use serde_json::{Map, Value};

/// When a changed key takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// At the next reload.
    Applied,
    /// Only at a restart: a reload keeps the running value and says so.
    Restart,
}

impl Reload {
    pub fn as_str(self) -> &'static str {
        match self {
            Reload::Applied => "reload",
            Reload::Restart => "restart",
        }
    }
}

/// What a key that is not written stands at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unset {
    /// The model's default, as [`Key::show`] shows it.
    Model,
    /// Nothing: the key must be written.
    Required,
    /// What it means, in words (a section absent, a value found at run time).
    Said(&'static str),
}

/// One key of a section whose model is `T`.
pub struct Key<T: 'static> {
    pub name: &'static str,
    /// The TOML type, with the unit: "duration", "size", "list of methods".
    pub kind: &'static str,
    pub unset: Unset,
    pub reload: Reload,
    /// One line, for the keys table.
    pub doc: &'static str,
    /// The value in the model, as `/config` shows it (the way the file writes it).
    pub show: fn(&T) -> Value,
    /// Whether `a` and `b` hold the same value, for a key whose shown value hides part
    /// of it; else the shown values are compared.
    pub same: Option<fn(&T, &T) -> bool>,
    /// The keys of the section below that a reload names on their own.
    pub parts: &'static [Part<T>],
}

/// A key of a section below that the model holds beside the section (`[inbound.retries]
/// per_caller`, kept apart from the budget): a reload names its change on its own,
/// `retries.per_caller`, and the section's change without it.
pub struct Part<T: 'static> {
    pub name: &'static str,
    /// Its value in the model, as `/config` shows it under the key.
    pub show: fn(&T) -> Value,
}

/// A section of the file: its keys, in the order messages list them, and the model the
/// keys not written take their values from.
pub struct Section<T: 'static> {
    /// The dotted path, `NAME` standing for an upstream's name.
    pub path: &'static str,
    pub keys: &'static [Key<T>],
    /// The model of a section written empty; `None` when none of its keys takes the
    /// model's default.
    pub defaults: Option<fn() -> T>,
}

impl<T> Section<T> {
    /// The section as `/config` shows it: every key with its value.
    pub fn json(&self, model: &T) -> Value {
        let map: Map<String, Value> = self
            .keys
            .iter()
            .map(|k| (k.name.to_string(), (k.show)(model)))
            .collect();
        Value::Object(map)
    }

    /// As [`Section::json`], `null` for a section not written.
    pub fn json_of(&self, model: Option<&T>) -> Value {
        model.map_or(Value::Null, |m| self.json(m))
    }

    /// The keys that differ between `was` and `is` and wait for a restart: each with
    /// its dotted name and both values as a message says them.
    pub fn restart_needed(&self, was: &T, is: &T) -> Vec<(String, String, String)> {
        self.keys
            .iter()
            .filter(|k| k.reload == Reload::Restart)
            .map(|k| (k, plain(&(k.show)(was)), plain(&(k.show)(is))))
            .filter(|(_, a, b)| a != b)
            .map(|(k, a, b)| (format!("{}.{}", self.path, k.name), a, b))
            .collect()
    }

    /// The keys a reload applies whose values differ between `was` and `is`, in the
    /// order messages list them: a key by its name, a section below as a whole by its
    /// key (`retry`), and a part of it after it (`retries.per_caller`).
    pub fn changed(&self, was: &T, is: &T) -> Vec<String> {
        let mut out = Vec::new();
        for k in self.keys.iter().filter(|k| k.reload == Reload::Applied) {
            let rest = |model: &T| without_parts((k.show)(model), k.parts);
            let same = match k.same {
                Some(same) => same(was, is),
                None => rest(was) == rest(is),
            };
            if !same {
                out.push(k.name.to_string());
            }
            for p in k.parts.iter().filter(|p| (p.show)(was) != (p.show)(is)) {
                out.push(format!("{}.{}", k.name, p.name));
            }
        }
        out
    }
}

/// A section's value without the keys named on their own.
fn without_parts<T>(mut v: Value, parts: &[Part<T>]) -> Value {
    if let Value::Object(map) = &mut v {
        for p in parts {
            map.remove(p.name);
        }
    }
    v
}

/// A row of the keys table, whatever the section's model.
pub struct Row {
    pub name: &'static str,
    pub kind: &'static str,
    /// The default as the file would write it, or what the key stands at unwritten.
    pub default: String,
    pub reload: Reload,
    pub doc: &'static str,
}

/// A section, seen without its model.
pub trait Described: Sync {
    fn path(&self) -> &'static str;
    fn rows(&self) -> Vec<Row>;
    fn names(&self) -> Vec<&'static str>;
}

impl<T> Described for Section<T>
where
    Section<T>: Sync,
{
    fn path(&self) -> &'static str {
        self.path
    }

    fn rows(&self) -> Vec<Row> {
        let defaults = self.defaults.map(|d| d());
        self.keys
            .iter()
            .map(|k| Row {
                name: k.name,
                kind: k.kind,
                default: match k.unset {
                    Unset::Model => match defaults.as_ref().map(|d| (k.show)(d)) {
                        None | Some(Value::Null) => "none".to_string(),
                        Some(v) => format!("`{}`", toml(&v)),
                    },
                    Unset::Required => "**required**".to_string(),
                    Unset::Said(words) => words.to_string(),
                },
                reload: k.reload,
                doc: k.doc,
            })
            .collect()
    }

    fn names(&self) -> Vec<&'static str> {
        self.keys.iter().map(|k| k.name).collect()
    }
}

/// Every section, in the order of the file's reference.
pub fn sections() -> [&'static dyn Described; 18] {
    [
        &root::SECTION,
        &runtime::SECTION,
        &listener::SECTION,
        &admin::SECTION,
        &deadline::SECTION,
        &access_log::SECTION,
        &upstream::SECTION,
        &retry::SECTION,
        &budget::SECTION,
        &throttle::SECTION,
        &outlier::SECTION,
        &hedge::SECTION,
        &tls::SECTION,
        &inbound::SECTION,
        &inbound_retries::SECTION,
        &dedupe::SECTION,
        &tracing::SECTION,
        &kubernetes::SECTION,
    ]
}

/// The keys table of docs/config.md: one row per key of every section.
pub fn markdown() -> String {
    let mut out = String::from(
        "| key | type | default | takes effect at | meaning |\n|---|---|---|---|---|\n",
    );
    // The top level's keys are the sections themselves.
    for section in sections().into_iter().skip(1) {
        for row in section.rows() {
            let key = match section.path() {
                "" => row.name.to_string(),
                path => format!("{path}.{}", row.name),
            };
            out.push_str(&format!(
                "| `{key}` | {} | {} | {} | {} |\n",
                row.kind,
                row.default,
                row.reload.as_str(),
                row.doc
            ));
        }
    }
    out
}

/// A value as a message says it: a string without its quotes.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "none".to_string(),
        other => other.to_string(),
    }
}

/// A value as TOML writes it.
fn toml(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(toml).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
