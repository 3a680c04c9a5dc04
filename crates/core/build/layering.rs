//! The layering of the library, enforced by the build: each top-level module sits on a
//! floor, and a module names only modules on floors below its own (docs/architecture.md
//! says what each floor is for); and no file imports, through any chain, a file that
//! imports it. `build.rs` runs this reader on every build whose `src/` changed and fails
//! the build with the file, the line, the import and the floors of each violation;
//! `tests/it/layering.rs` runs it too, and tests the reader itself. A new top-level module
//! fails the build until it is given its floor in [`FLOORS`].
//!
//! The imports are read from the source text as the compiler resolves them: every path
//! that starts with `crate::` or `super::` (in `use` items, `{...}` groups, and paths
//! written inline), resolved to the longest module prefix that is a file. A module's
//! `mod child;` declaration is not an import, nor is a folder's `mod.rs` naming the
//! files of its own folder (it is their front door); `super::` inside an inline module
//! (`mod tests { use super::*; }`) is the file itself. Comments and string literals are
//! skipped. Only the standard library: the build script has no dependencies.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// The floors, from the bottom. A module may name modules of lower floors only.
pub const FLOORS: &[&[&str]] = &[
    // Ground: plain data and the bytes on the wire, knowing nothing of requests.
    &["print", "loops", "http", "metrics"],
    // What every layer reads: the config, deadlines, faults, and the contract tollgates
    // speak to each other (their own headers and words), with no retry engine behind it.
    &["config", "deadline", "descriptors", "fault", "contract"],
    // Traces: spans recorded in place and their export, below everything that records.
    &["trace"],
    &["worker"],
    // Where an upstream's endpoints come from: a Service watched in the Kubernetes API.
    &["discovery"],
    // An upstream's endpoints: connections, pools, health.
    &["upstream"],
    // Deciding and looping.
    &["retry"],
    // The app-facing server, shared by both sides.
    &["server"],
    // What both sides write: their own answers, the access log.
    &["answer", "access_log"],
    // A request's edge: the one way in and the two ways out, on either side.
    &["served"],
    // The listeners both sides are served on: binding, accepting, capture, the drain.
    &["listen"],
    // The two sides, peers: neither names the other.
    &["inbound", "proxy"],
    // Both sides on their listeners, wired together.
    &["sides"],
    // The process: its admin endpoint, reloads, and the whole run.
    &["admin", "reload"],
    &["run"],
];

/// The floor of a top-level module, counted from 1 at the bottom.
pub fn floor_of(top: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&top)).map(|f| f + 1)
}

/// A module path (`["retry", "forward"]`).
pub type Module = Vec<String>;

/// One path a file names: resolved against the file's own module, and the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub path: Module,
    pub line: usize,
}

/// The library's files and which files each one imports.
pub struct Graph {
    /// Each module's file, relative to the crate's root (`src/retry/forward.rs`).
    pub files: BTreeMap<Module, PathBuf>,
    /// For each file, the files it imports, with the imports that name each one.
    pub edges: BTreeMap<Module, BTreeMap<Module, Vec<Import>>>,
}

/// Every violation in the crate at `root`, one line each: top-level modules without a
/// floor, imports that do not run downwards, and circles of files.
pub fn check(root: &Path) -> Result<Vec<String>, String> {
    let g = read(root)?;
    let mut found = unplaced(&g);
    found.extend(upward(&g));
    found.extend(circles(&g));
    Ok(found)
}

/// Reads `src/` of the crate at `root` (the binaries aside, `main.rs` and `bin/`: they use
/// the library).
pub fn read(root: &Path) -> Result<Graph, String> {
    let mut files = BTreeMap::new();
    collect(root, Path::new("src"), &[], &mut files)?;
    let mut edges = BTreeMap::new();
    for (module, path) in &files {
        let src = std::fs::read_to_string(root.join(path))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        // A folder's mod.rs is its front door: what it declares and re-exports of its
        // own files is structure, not an import (its files may use its names).
        let front_door = path
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs");
        let mut to: BTreeMap<Module, Vec<Import>> = BTreeMap::new();
        for import in imports(module, &src) {
            if let Some(target) = resolve(&files, &import.path) {
                let own_file = front_door && target.starts_with(module);
                if target != module && !target.is_empty() && !own_file {
                    to.entry(target.clone()).or_default().push(import);
                }
            }
        }
        edges.insert(module.clone(), to);
    }
    Ok(Graph { files, edges })
}

fn collect(
    root: &Path,
    dir: &Path,
    module: &[String],
    files: &mut BTreeMap<Module, PathBuf>,
) -> Result<(), String> {
    let entries = std::fs::read_dir(root.join(dir))
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut names: Vec<_> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        if root.join(&path).is_dir() {
            if module.is_empty() && name == "bin" {
                continue; // the other binaries: they use the library
            }
            let mut sub = module.to_vec();
            sub.push(name);
            collect(root, &path, &sub, files)?;
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
    Ok(())
}

/// The top-level modules with no floor in [`FLOORS`].
pub fn unplaced(g: &Graph) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut found = Vec::new();
    for (module, path) in &g.files {
        let Some(top) = module.first() else { continue };
        if floor_of(top).is_none() && seen.insert(top) {
            found.push(format!(
                "{}: the top-level module `{top}` has no floor; give it one in FLOORS \
                 (build/layering.rs), above every module it imports",
                path.display()
            ));
        }
    }
    found
}

/// Every import of a module on the importer's own floor or above, at its line.
pub fn upward(g: &Graph) -> Vec<String> {
    let mut found = Vec::new();
    for (from, tos) in &g.edges {
        let Some(top) = from.first() else { continue };
        let Some(floor) = floor_of(top) else { continue };
        for (to, imports) in tos {
            let Some(to_top) = to.first() else { continue };
            if to_top == top {
                continue;
            }
            let Some(to_floor) = floor_of(to_top) else {
                continue; // said by `unplaced`
            };
            if to_floor < floor {
                continue;
            }
            let whose = if to_floor == floor {
                "the same floor"
            } else {
                "above it"
            };
            for import in imports {
                found.push(format!(
                    "{}:{}: upward import `crate::{}`: `{top}` is on floor {floor} and \
                     `{to_top}` on floor {to_floor}, {whose}; a module names only the floors \
                     below its own (FLOORS in build/layering.rs), so a name both need \
                     belongs in the lower one",
                    g.files[from].display(),
                    import.line,
                    import.path.join("::"),
                ));
            }
        }
    }
    found
}

/// Every circle of files importing each other through any chain, one line each, with
/// the import that makes each step.
pub fn circles(g: &Graph) -> Vec<String> {
    components(g)
        .into_iter()
        .filter_map(|scc| {
            // The shortest circle in the component: the one most plainly read.
            let steps = scc
                .iter()
                .filter_map(|start| circle_through(g, &scc, start))
                .min_by_key(Vec::len)?;
            let start = steps.first()?.0.clone();
            let said: Vec<String> = steps
                .iter()
                .map(|(from, to)| {
                    let import = &g.edges[from][to][0];
                    format!(
                        "{}:{} imports `crate::{}`",
                        g.files[from].display(),
                        import.line,
                        import.path.join("::")
                    )
                })
                .collect();
            Some(format!(
                "import cycle: {}; and so back to {} (files that import each other, through \
                 any chain, are one idea in two places, or a name in the wrong one)",
                said.join("; "),
                g.files[&start].display()
            ))
        })
        .collect()
}

/// The shortest circle from `start` back to itself inside one component, as its steps.
fn circle_through(
    g: &Graph,
    scc: &BTreeSet<Module>,
    start: &Module,
) -> Option<Vec<(Module, Module)>> {
    let mut came_from: BTreeMap<&Module, &Module> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in g.edges.get(v).into_iter().flat_map(|t| t.keys()) {
            if !scc.contains(w) {
                continue;
            }
            if w == start {
                let mut steps = vec![(v.clone(), w.clone())];
                let mut at = v;
                while at != start {
                    let before = came_from.get(at)?;
                    steps.push(((*before).clone(), at.clone()));
                    at = before;
                }
                steps.reverse();
                return Some(steps);
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    None
}

/// Tarjan's strongly connected components with two or more files.
fn components(g: &Graph) -> Vec<BTreeSet<Module>> {
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        found: Vec<BTreeSet<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.edges.get(v).into_iter().flat_map(|t| t.keys()) {
            let low = if !s.index.contains_key(w) {
                visit(s, w);
                s.low[w]
            } else if s.on.contains(w) {
                s.index[w]
            } else {
                continue;
            };
            if let Some(lv) = s.low.get_mut(v) {
                *lv = (*lv).min(low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.insert(w.clone());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                s.found.push(scc);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in g.edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

/// The source without comments and with string and character literals emptied, so
/// neither hides nor invents a path or a brace; every line break is kept, so a position
/// in it is on the same line as in the source.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    // The line breaks of a skipped stretch, kept.
    let breaks = |out: &mut String, skipped: &[u8]| {
        for _ in skipped.iter().filter(|&&c| c == b'\n') {
            out.push('\n');
        }
    };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let start = i;
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
            breaks(&mut out, &b[start..i.min(b.len())]);
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
            breaks(&mut out, &b[i..j.min(b.len())]);
            i = j;
        } else if c == b'"' {
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            breaks(&mut out, &b[start..i.min(b.len())]);
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

/// The paths read so far, each with the position its last segment ends at.
type Found = Vec<(Module, usize)>;

/// Reads the path that continues at `i` (after a `::`), pushing each full path it names
/// (a `{...}` group names several) onto `paths`, prefixed by `prefix`.
fn read_path(b: &[u8], i: usize, prefix: Module, paths: &mut Found) -> usize {
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

fn read_segment(b: &[u8], i: usize, mut prefix: Module, paths: &mut Found) -> usize {
    let (name, mut i) = ident_at(b, i);
    if name.is_empty() {
        // `*` or `self`-less end: the prefix itself.
        if b.get(i) == Some(&b'*') {
            i += 1;
        }
        paths.push((prefix, i));
        return i;
    }
    if name != "self" {
        prefix.push(name);
    }
    let j = skip_space(b, i);
    if b.get(j) == Some(&b':') && b.get(j + 1) == Some(&b':') {
        return read_path(b, j + 2, prefix, paths);
    }
    paths.push((prefix, i));
    i
}

/// The module paths a file names, resolved against its own module path, each with the
/// line (from 1) it is named on.
pub fn imports(module: &[String], src: &str) -> Vec<Import> {
    let code = code_only(src);
    let b = code.as_bytes();
    let mut paths = Found::new();
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
            let mut base: Module = module.to_vec();
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
    // Positions to lines, in one pass: the paths were found in order.
    let mut line = 1;
    let mut at = 0;
    paths
        .into_iter()
        .map(|(path, end)| {
            let end = end.min(b.len());
            line += b[at.min(end)..end].iter().filter(|&&c| c == b'\n').count();
            at = at.max(end);
            Import { path, line }
        })
        .collect()
}

/// The file a path names: the longest prefix of it that is a module with a file.
fn resolve<'a>(files: &'a BTreeMap<Module, PathBuf>, path: &[String]) -> Option<&'a Module> {
    (1..=path.len())
        .rev()
        .find_map(|n| files.get_key_value(&path[..n]).map(|(k, _)| k))
}
