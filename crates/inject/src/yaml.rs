//! YAML as Kubernetes reads it: a stream cut into its documents (so a document
//! `inject` leaves alone is written back byte for byte, comments and all), each loaded
//! with the YAML 1.1 meanings the API server's parser gives plain scalars, and written
//! back in block style; and the few helpers the rest of `inject` needs to walk maps.
//!
//! yaml-rust2 reads YAML 1.2, where a plain `0644` is the decimal 644 and `on` a
//! string; Kubernetes reads YAML 1.1, where they are the octal 420 (a volume's
//! `defaultMode`) and `true`. Loading with 1.1's rules for those scalars keeps a
//! manifest meaning what it meant once it is written back.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};
use yaml_rust2::yaml::Hash;
use yaml_rust2::{Yaml, YamlEmitter};

/// One document of a stream: the separator line it came after (`---`, kept as written)
/// and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub separator: Option<String>,
    pub text: String,
}

/// Cuts a stream at its `---` lines. A `...` line ends a document and is kept with it.
pub fn split(stream: &str) -> Vec<Chunk> {
    let mut chunks = vec![Chunk {
        separator: None,
        text: String::new(),
    }];
    for line in stream.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_separator = bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t");
        if is_separator {
            chunks.push(Chunk {
                separator: Some(line.to_string()),
                text: String::new(),
            });
        } else if let Some(last) = chunks.last_mut() {
            last.text.push_str(line);
        }
    }
    if chunks.len() > 1 && chunks[0].text.trim().is_empty() {
        // Only blank lines before the first `---`: they go with it.
        let lead = chunks.remove(0).text;
        if let Some(sep) = chunks[0].separator.as_mut() {
            sep.insert_str(0, &lead);
        }
    }
    chunks
}

/// The documents of `text`: none for a text of comments only.
pub fn load(text: &str) -> Result<Vec<Yaml>, String> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, true).map_err(|e| e.to_string())?;
    match builder.error {
        Some(e) => Err(e),
        None => Ok(builder.docs),
    }
}

/// One document that `text` must hold (used for the templates of this module).
pub fn one(text: &str) -> Result<Yaml, String> {
    let mut docs = load(text)?;
    match docs.len() {
        1 => Ok(docs.remove(0)),
        n => Err(format!("expected one document, found {n}")),
    }
}

/// A document in block style, without the leading `---`, ending in a newline.
pub fn emit(doc: &Yaml) -> String {
    let mut out = String::new();
    let mut emitter = YamlEmitter::new(&mut out);
    emitter.multiline_strings(true);
    if emitter.dump(doc).is_err() {
        // Writing to a String cannot fail; a document the emitter refuses (a bad value
        // from a failed load never gets this far) is written as null.
        out = "---\n~".to_string();
    }
    let body = out.strip_prefix("---\n").unwrap_or(&out);
    let body = body.strip_prefix("---").unwrap_or(body);
    format!("{}\n", body.trim_start_matches(' '))
}

/// A key or a string value.
pub fn s(text: &str) -> Yaml {
    Yaml::String(text.to_string())
}

pub fn get<'a>(y: &'a Yaml, key: &str) -> Option<&'a Yaml> {
    y.as_hash()?.get(&s(key))
}

pub fn get_mut<'a>(y: &'a mut Yaml, key: &str) -> Option<&'a mut Yaml> {
    y.as_mut_hash()?.get_mut(&s(key))
}

pub fn str_at<'a>(y: &'a Yaml, key: &str) -> Option<&'a str> {
    get(y, key)?.as_str()
}

/// The map under `key`, made (empty, at the end) when missing; `None` when `y` is not a
/// map or `key` holds something else. An existing key keeps its place.
pub fn map_at<'a>(y: &'a mut Yaml, key: &str) -> Option<&'a mut Hash> {
    slot(y, key, || Yaml::Hash(Hash::new()))?.as_mut_hash()
}

/// The list under `key`, made (empty, at the end) when missing.
pub fn list_at<'a>(y: &'a mut Yaml, key: &str) -> Option<&'a mut Vec<Yaml>> {
    slot(y, key, || Yaml::Array(Vec::new()))?.as_mut_vec()
}

/// The value under `key`, made with `make` when missing or null. (The map's own
/// `entry` would move an existing key to the end.)
fn slot<'a>(y: &'a mut Yaml, key: &str, make: impl Fn() -> Yaml) -> Option<&'a mut Yaml> {
    let h = y.as_mut_hash()?;
    if h.get(&s(key)).is_none_or(Yaml::is_null) {
        h.replace(s(key), make());
    }
    h.get_mut(&s(key))
}

/// Makes `key` (an empty list) just before `next` when it is missing, so that a new
/// `initContainers` reads before `containers`, as people write it.
pub fn make_list_before(y: &mut Yaml, key: &str, next: &str) {
    let Some(h) = y.as_mut_hash() else {
        return;
    };
    if h.contains_key(&s(key)) || !h.contains_key(&s(next)) {
        return;
    }
    let old = std::mem::take(h);
    for (k, v) in old {
        if k == s(next) {
            h.insert(s(key), Yaml::Array(Vec::new()));
        }
        h.insert(k, v);
    }
}

/// The comment lines (and blank ones) a document's text starts with: kept when the
/// document is written anew.
pub fn leading_comments(text: &str) -> &str {
    let mut end = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if !(t.is_empty() || t.starts_with('#')) {
            break;
        }
        end += line.len();
    }
    &text[..end]
}

/// Sets `key` to `value` in place (a new key goes last); returns what was there.
pub fn set(y: &mut Yaml, key: &str, value: Yaml) -> Option<Yaml> {
    y.as_mut_hash()?.replace(s(key), value)
}

/// Removes `key`; returns what was there.
pub fn remove(y: &mut Yaml, key: &str) -> Option<Yaml> {
    y.as_mut_hash()?.remove(&s(key))
}

/// Removes `key` when it holds an empty map or list (what `inject` made and emptied).
pub fn drop_if_empty(y: &mut Yaml, key: &str) {
    let empty = match get(y, key) {
        Some(Yaml::Hash(h)) => h.is_empty(),
        Some(Yaml::Array(a)) => a.is_empty(),
        _ => false,
    };
    if empty {
        remove(y, key);
    }
}

/// The items of the list under `key` (none when missing).
pub fn items<'a>(y: &'a Yaml, key: &str) -> &'a [Yaml] {
    get(y, key)
        .and_then(Yaml::as_vec)
        .map_or(&[], Vec::as_slice)
}

/// A scalar as JSON, for the record `inject` keeps of what it replaced.
pub fn to_json(y: &Yaml) -> serde_json::Value {
    use serde_json::Value;
    match y {
        Yaml::Real(r) => r
            .parse::<f64>()
            .ok()
            .and_then(|f| serde_json::Number::from_f64(f).map(Value::Number))
            .unwrap_or_else(|| Value::String(r.clone())),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(t) => Value::String(t.clone()),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(to_json).collect()),
        Yaml::Hash(h) => Value::Object(h.iter().map(|(k, v)| (key_text(k), to_json(v))).collect()),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
    }
}

pub fn from_json(v: &serde_json::Value) -> Yaml {
    use serde_json::Value;
    match v {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Yaml::Integer(i),
            None => Yaml::Real(n.to_string()),
        },
        Value::String(t) => s(t),
        Value::Array(a) => Yaml::Array(a.iter().map(from_json).collect()),
        Value::Object(o) => Yaml::Hash(o.iter().map(|(k, v)| (s(k), from_json(v))).collect()),
    }
}

fn key_text(k: &Yaml) -> String {
    match k {
        Yaml::String(t) | Yaml::Real(t) => t.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        _ => String::new(),
    }
}

/// Nodes an alias may add, at least: a manifest's anchors are small, an expansion bomb
/// (each alias naming a list of the one before) is not.
const ALIAS_NODES_MIN: usize = 100_000;
/// And at most this many times the nodes written out in the text.
const ALIAS_NODES_RATIO: usize = 10;

/// Builds documents from parser events, as yaml-rust2's own loader does, with YAML
/// 1.1's meaning for the plain scalars where it differs from 1.2's, merge keys (`<<`)
/// resolved as Kubernetes resolves them, and the nodes aliases add bounded (a bomb is an
/// error, found before its memory is spent).
#[derive(Default)]
struct Builder {
    docs: Vec<Yaml>,
    /// Open collections, with their anchor id, and the key waiting for its value.
    stack: Vec<(Yaml, usize, Option<Yaml>)>,
    /// Anchored nodes, with their size in nodes.
    anchors: std::collections::HashMap<usize, (Yaml, usize)>,
    /// Nodes read from the text, and nodes added by aliases.
    written: usize,
    aliased: usize,
    error: Option<String>,
}

/// The nodes in `y`, itself included.
fn size(y: &Yaml) -> usize {
    1 + match y {
        Yaml::Array(a) => a.iter().map(size).sum(),
        Yaml::Hash(h) => h.iter().map(|(k, v)| size(k) + size(v)).sum(),
        _ => 0,
    }
}

/// The key of a merge (`<<: *base`, or a list of them).
fn is_merge(k: &Yaml) -> bool {
    k.as_str() == Some("<<")
}

/// A mapping with its merge keys resolved: the merged maps' entries, the first map
/// listed first, under the mapping's own (which win), where `<<` was written.
fn merged(h: Hash) -> Result<Hash, String> {
    if !h.keys().any(is_merge) {
        return Ok(h);
    }
    let own: Vec<Yaml> = h.keys().filter(|k| !is_merge(k)).cloned().collect();
    let mut out = Hash::new();
    for (k, v) in h {
        if !is_merge(&k) {
            out.insert(k, v);
            continue;
        }
        let sources = match v {
            Yaml::Hash(m) => vec![m],
            Yaml::Array(list) => list
                .into_iter()
                .map(|m| match m {
                    Yaml::Hash(m) => Ok(m),
                    _ => Err("a merge key (<<) lists something other than a mapping".to_string()),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err("a merge key (<<) takes a mapping or a list of mappings".into()),
        };
        for m in sources {
            for (mk, mv) in m {
                if !own.contains(&mk) && !out.contains_key(&mk) {
                    out.insert(mk, mv);
                }
            }
        }
    }
    Ok(out)
}

impl Builder {
    fn insert(&mut self, node: Yaml, anchor: usize) {
        if anchor > 0 {
            let n = size(&node);
            self.anchors.insert(anchor, (node.clone(), n));
        }
        let Some((parent, _, key)) = self.stack.last_mut() else {
            self.docs.push(node);
            return;
        };
        match parent {
            Yaml::Array(a) => a.push(node),
            Yaml::Hash(h) => match key.take() {
                None => *key = Some(node),
                Some(k) => {
                    if h.insert(k.clone(), node).is_some() && self.error.is_none() {
                        self.error = Some(format!("{k:?}: duplicated key in a mapping"));
                    }
                }
            },
            _ => {}
        }
    }

    fn fail(&mut self, e: String) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, _mark: Marker) {
        if self.error.is_some() {
            // Nothing more is built once the document is known to be wrong.
            return;
        }
        match ev {
            Event::SequenceStart(anchor, _) => {
                self.written += 1;
                self.stack.push((Yaml::Array(vec![]), anchor, None))
            }
            Event::MappingStart(anchor, _) => {
                self.written += 1;
                self.stack.push((Yaml::Hash(Hash::new()), anchor, None))
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((node, anchor, _)) = self.stack.pop() {
                    let node = match node {
                        Yaml::Hash(h) => match merged(h) {
                            Ok(h) => Yaml::Hash(h),
                            Err(e) => return self.fail(e),
                        },
                        other => other,
                    };
                    self.insert(node, anchor);
                }
            }
            Event::Scalar(value, style, anchor, tag) => {
                self.written += 1;
                // A key is a string to Kubernetes (a JSON object's member name).
                let is_key = matches!(self.stack.last(), Some((Yaml::Hash(_), _, None)));
                let node = if is_key && style == TScalarStyle::Plain && tag.is_none() {
                    Yaml::String(value)
                } else {
                    scalar(value, style, tag.as_ref())
                };
                self.insert(node, anchor);
            }
            Event::Alias(id) => {
                let Some((node, n)) = self.anchors.get(&id) else {
                    return self.fail(format!("an alias to anchor {id}, which is not defined"));
                };
                self.aliased += n;
                let budget = ALIAS_NODES_MIN.max(ALIAS_NODES_RATIO * self.written);
                if self.aliased > budget {
                    return self.fail(format!(
                        "its aliases expand to more than {budget} nodes (an alias expansion \
                         bomb?): refused"
                    ));
                }
                let node = node.clone();
                self.insert(node, 0);
            }
            Event::DocumentEnd
            | Event::DocumentStart
            | Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd => {}
        }
    }
}

fn scalar(value: String, style: TScalarStyle, tag: Option<&Tag>) -> Yaml {
    if style != TScalarStyle::Plain {
        return Yaml::String(value);
    }
    if let Some(tag) = tag {
        return match (tag.handle.as_str(), tag.suffix.as_str()) {
            ("tag:yaml.org,2002:", "str") | ("!!", "str") => Yaml::String(value),
            _ => Yaml::from_str(&value),
        };
    }
    // YAML 1.1, as Kubernetes reads a manifest: the booleans it knows, and a leading
    // zero for octal.
    match value.as_str() {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => return Yaml::Boolean(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => return Yaml::Boolean(false),
        _ => {}
    }
    let digits = value.strip_prefix(['-', '+']).unwrap_or(&value);
    if digits.len() > 1
        && digits.starts_with('0')
        && digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
        && let Ok(n) = i64::from_str_radix(digits, 8)
    {
        return Yaml::Integer(if value.starts_with('-') { -n } else { n });
    }
    Yaml::from_str(&value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_cut_at_their_separators_and_keep_them() {
        let chunks = split("# head\na: 1\n---\nb: 2\n--- # c\nc: 3\n");
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].text, "# head\na: 1\n");
        assert_eq!(chunks[1].separator.as_deref(), Some("---\n"));
        assert_eq!(chunks[2].separator.as_deref(), Some("--- # c\n"));
        let joined: String = chunks
            .iter()
            .map(|c| format!("{}{}", c.separator.clone().unwrap_or_default(), c.text))
            .collect();
        assert_eq!(joined, "# head\na: 1\n---\nb: 2\n--- # c\nc: 3\n");
        let chunks = split("\n---\na: 1\n");
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].separator.as_deref(), Some("\n---\n"));
    }

    #[test]
    fn plain_scalars_mean_what_they_mean_to_kubernetes() {
        let doc = one("mode: 0644\nflag: on\nno: off\nq: \"0644\"\nn: 8080\ns: '1.10'\ny: 1\n")
            .unwrap_or(Yaml::Null);
        assert_eq!(get(&doc, "mode"), Some(&Yaml::Integer(0o644)));
        assert_eq!(get(&doc, "flag"), Some(&Yaml::Boolean(true)));
        assert_eq!(get(&doc, "q"), Some(&s("0644")));
        assert_eq!(get(&doc, "n"), Some(&Yaml::Integer(8080)));
        assert_eq!(get(&doc, "s"), Some(&s("1.10")));
        let text = emit(&doc);
        assert!(text.starts_with("mode: 420\nflag: true\n"), "{text}");
        assert!(text.contains("q: \"0644\"\n"), "{text}");
        assert_eq!(
            one(&text).unwrap_or(Yaml::Null),
            doc,
            "written back, read the same"
        );
    }

    #[test]
    fn merge_keys_are_resolved_and_own_keys_win() {
        let doc = one("base: &b {port: 8080, path: /healthz, scheme: HTTP}\n\
                       extra: &e {timeoutSeconds: 2}\n\
                       probe:\n  <<: [*b, *e]\n  path: /ready\n")
        .unwrap_or(Yaml::Null);
        let probe = get(&doc, "probe").unwrap_or(&Yaml::Null);
        assert_eq!(str_at(probe, "path"), Some("/ready"), "its own key wins");
        assert_eq!(get(probe, "port"), Some(&Yaml::Integer(8080)));
        assert_eq!(get(probe, "timeoutSeconds"), Some(&Yaml::Integer(2)));
        assert!(get(probe, "<<").is_none());
        assert!(!emit(&doc).contains("<<"), "{}", emit(&doc));
        assert!(one("a: {<<: 3}\n").is_err());
    }

    #[test]
    fn an_alias_bomb_is_refused_in_bounded_memory() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, \
                 *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        let e = load(&text).err().unwrap_or_default();
        assert!(e.contains("alias expansion bomb"), "{e}");
        // A manifest's anchors, used a few times, are nothing of the sort.
        assert!(load("x: &p {a: 1}\ny: *p\nz: [*p, *p]\n").is_ok());
    }

    #[test]
    fn a_block_of_text_stays_a_block() {
        let doc = one("data:\n  f.toml: |\n    a = 1\n    b = \"x\"\n").unwrap_or(Yaml::Null);
        assert_eq!(emit(&doc), "data:\n  f.toml: |\n    a = 1\n    b = \"x\"\n");
    }
}
