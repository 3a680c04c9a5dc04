//! The layering of the library, enforced: each top-level module sits on a floor, and a
//! module names only modules on floors below its own (docs/architecture.md says what
//! each floor is for); and no file imports, through any chain, a file that imports it.
//! A new top-level module fails this test until it is given its floor here.
//!
//! The imports are read from the source text as the compiler resolves them: every path
//! that starts with `crate::` or `super::` (in `use` items, `{...}` groups, and paths
//! written inline), resolved to the longest module prefix that is a file. A module's
//! `mod child;` declaration is not an import, nor is a folder's `mod.rs` naming the
//! files of its own folder (it is their front door); `super::` inside an inline module
//! (`mod tests { use super::*; }`) is the file itself. Comments and string literals are
//! skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, from the bottom. A module may name modules of lower floors only.
const FLOORS: &[&[&str]] = &[
    // Ground: plain data and the bytes on the wire, knowing nothing of requests.
    &["print", "loops", "http", "metrics"],
    &["config", "deadline", "descriptors"],
    // Traces: spans recorded in place and their export, below everything that records.
    &["trace"],
    &["worker"],
    // An upstream's endpoints: connections, pools, health.
    &["upstream"],
    // Deciding and looping.
    &["retry"],
    // The app-facing server, shared by both sides.
    &["server"],
    // What both sides write: their own answers, the access log.
    &["answer", "access_log"],
    // The two sides.
    &["inbound"],
    &["proxy"],
    // The process: its admin endpoint, reloads, and the whole run.
    &["admin", "reload"],
    &["run"],
    // The tools, on top: they use the proxy, never the other way round.
    &["calc", "capture"],
    &["check", "lab", "inject"],
];

fn floor_of(top: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&top))
}

/// A module path (`["retry", "forward"]`) by the file that holds it.
type Files = BTreeMap<Vec<String>, PathBuf>;

fn collect(dir: &Path, module: &[String], files: &mut Files) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        panic!("cannot read {}", dir.display());
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if path.is_dir() {
            let mut sub = module.to_vec();
            sub.push(name.to_string());
            collect(&path, &sub, files);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut m = module.to_vec();
            match stem {
                "mod" | "lib" => {}
                "main" if module.is_empty() => continue, // the binary: it uses the library
                _ => m.push(stem.to_string()),
            }
            files.insert(m, path);
        }
    }
}

/// The source without comments and with string and character literals emptied, so
/// neither hides nor invents a path or a brace.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0usize;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"'
                    && b[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{7f}'), or a lifetime ('a), left as it is.
            let close = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                // A multi-byte character: up to four bytes, then the quote.
                (i + 2..(i + 6).min(b.len())).find(|&k| b[k] == b'\'' && !b[i + 1].is_ascii())
            };
            match close {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn ident_at(b: &[u8], mut i: usize) -> (String, usize) {
    let start = i;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
        i += 1;
    }
    (String::from_utf8_lossy(&b[start..i]).into_owned(), i)
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Reads the path that continues at `i` (after a `::`), pushing each full path it names
/// (a `{...}` group names several) onto `paths`, prefixed by `prefix`.
fn read_path(b: &[u8], i: usize, prefix: Vec<String>, paths: &mut Vec<Vec<String>>) -> usize {
    let i = skip_space(b, i);
    if b.get(i) == Some(&b'{') {
        let mut i = i + 1;
        loop {
            i = skip_space(b, i);
            match b.get(i) {
                None => return i,
                Some(b'}') => return i + 1,
                Some(b',') => i += 1,
                _ => {
                    let before = i;
                    i = read_segment(b, i, prefix.clone(), paths);
                    if i == before {
                        i += 1;
                    }
                }
            }
        }
    }
    read_segment(b, i, prefix, paths)
}

fn read_segment(
    b: &[u8],
    i: usize,
    mut prefix: Vec<String>,
    paths: &mut Vec<Vec<String>>,
) -> usize {
    let (name, mut i) = ident_at(b, i);
    if name.is_empty() {
        // `*` or `self`-less end: the prefix itself.
        if b.get(i) == Some(&b'*') {
            i += 1;
        }
        paths.push(prefix);
        return i;
    }
    if name != "self" {
        prefix.push(name);
    }
    let j = skip_space(b, i);
    if b.get(j) == Some(&b':') && b.get(j + 1) == Some(&b':') {
        return read_path(b, j + 2, prefix, paths);
    }
    paths.push(prefix);
    i
}

/// The module paths a file names, resolved against its own module path.
fn imports(module: &[String], src: &str) -> Vec<Vec<String>> {
    let code = code_only(src);
    let b = code.as_bytes();
    let mut paths = Vec::new();
    // Inline modules open at these brace depths.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let word_start = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if c == b'{' {
            depth += 1;
            i += 1;
        } else if c == b'}' {
            if inline.last() == Some(&depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
        } else if word_start && b[i..].starts_with(b"mod ") {
            let (name, j) = ident_at(b, skip_space(b, i + 4));
            let j = skip_space(b, j);
            if !name.is_empty() && b.get(j) == Some(&b'{') {
                inline.push(depth + 1);
            }
            i = j;
        } else if word_start && b[i..].starts_with(b"crate::") {
            i = read_path(b, i + 7, Vec::new(), &mut paths);
        } else if word_start && b[i..].starts_with(b"super::") {
            // The module `super` names: the file's parent, or the file itself from
            // inside an inline module; each further `super::` goes one up.
            let mut base: Vec<String> = module.to_vec();
            let mut ups = 0usize;
            let mut j = i;
            while b[j..].starts_with(b"super::") {
                ups += 1;
                j += 7;
            }
            let own = inline.len();
            let file_ups = ups.saturating_sub(own);
            // A mod.rs file is its directory's module, so its parent is one up too.
            for _ in 0..file_ups {
                base.pop();
            }
            i = read_path(b, j, base, &mut paths);
        } else {
            i += 1;
        }
    }
    paths
}

/// The file a path names: the longest prefix of it that is a module with a file.
fn resolve<'a>(files: &'a Files, path: &[String]) -> Option<&'a Vec<String>> {
    (1..=path.len())
        .rev()
        .find_map(|n| files.get_key_value(&path[..n]).map(|(k, _)| k))
}

struct Graph {
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn graph(root: &Path) -> (Files, Graph) {
    let mut files = Files::new();
    collect(&root.join("src"), &[], &mut files);
    let mut edges = BTreeMap::new();
    for (module, path) in &files {
        let src = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        // A folder's mod.rs is its front door: what it declares and re-exports of its
        // own files is structure, not an import (its files may use its names).
        let front_door = path
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs");
        let mut to = BTreeSet::new();
        for p in imports(module, &src) {
            if let Some(target) = resolve(&files, &p) {
                let own_file = front_door && target.starts_with(module);
                if target != module && !target.is_empty() && !own_file {
                    to.insert(target.clone());
                }
            }
        }
        edges.insert(module.clone(), to);
    }
    (files, Graph { edges })
}

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

#[test]
fn every_module_names_only_the_floors_below_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (files, g) = graph(root);
    let mut unplaced = BTreeSet::new();
    let mut upward = Vec::new();
    for (from, tos) in &g.edges {
        let Some(top) = from.first() else { continue };
        let Some(floor) = floor_of(top) else {
            unplaced.insert(top.clone());
            continue;
        };
        for to in tos {
            let Some(to_top) = to.first() else { continue };
            if to_top == top {
                continue;
            }
            match floor_of(to_top) {
                Some(f) if f < floor => {}
                _ => upward.push(format!(
                    "{} ({}) -> {} ({})",
                    name(from),
                    files[from].display(),
                    name(to),
                    files[to].display()
                )),
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "top-level modules with no floor in tests/layering.rs's FLOORS: {unplaced:?}"
    );
    assert!(
        upward.is_empty(),
        "imports that do not run downwards (a name two floors need belongs in the lower one):\n  {}",
        upward.join("\n  ")
    );
    // The reading itself: the lowest floors name nothing, and the proxy is seen
    // importing the retry engine (an empty graph would pass every check above).
    assert!(g.edges[&vec!["http".to_string()]].is_empty());
    assert!(
        g.edges
            .iter()
            .any(|(f, t)| f.first().is_some_and(|m| m == "proxy")
                && t.iter().any(|x| x.first().is_some_and(|m| m == "retry")))
    );
}

#[test]
fn no_file_imports_a_file_that_imports_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (_, g) = graph(root);
    // Tarjan's strongly connected components; any with two or more files is a circle.
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on: BTreeSet<&'a Vec<String>>,
        circles: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.push(name(w));
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.circles.push(scc);
            }
        }
    }
    let mut s = State {
        g: &g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        circles: Vec::new(),
    };
    for v in g.edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    assert!(
        s.circles.is_empty(),
        "files that import each other, through any chain:\n  {}",
        s.circles
            .iter()
            .map(|c| c.join(", "))
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

#[test]
fn the_reader_resolves_groups_nested_paths_and_super() {
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let src = r#"
        use crate::retry::{forward::Answer, headers::{A, B}, self};
        use super::sibling::Thing; // crate::not_this
        fn f() { let _ = "crate::nor_this"; crate::deadline::parse(); }
        #[cfg(test)]
        mod tests { use super::*; }
    "#;
    let got = imports(&m("proxy::handler"), src);
    for want in [
        m("retry::forward::Answer"),
        m("retry::headers::A"),
        m("retry::headers::B"),
        m("retry"),
        m("proxy::sibling::Thing"),
        m("deadline::parse"),
        m("proxy::handler"),
    ] {
        assert!(got.contains(&want), "{want:?} not in {got:?}");
    }
    assert!(
        !got.iter()
            .any(|p| p.iter().any(|s| s == "not_this" || s == "nor_this"))
    );
}
