//! The comments of a workload `inject` writes anew. A document is changed through its
//! loaded tree, which has no comments, and written back in block style; the comments of
//! the text it came from are then put back where they were: a comment line before the
//! line it stood before, a trailing comment after its line, each found in order among
//! the lines written (the same key and value, whatever the quoting and indentation). A
//! comment whose line is gone (what `--uninject` removed, a value inject changed) is
//! dropped; nothing is ever put inside a block scalar (`|`, `>`), whose lines are text,
//! not YAML.

/// `written` (the document as emitted) with the comments of `original` (its text as
/// read) put back.
pub fn carry(original: &str, written: &str) -> String {
    let notes = comments_of(original);
    if notes.is_empty() {
        return written.to_string();
    }
    let lines: Vec<&str> = written.lines().collect();
    let in_block = block_lines(&lines);
    let anchors = anchors(&lines, &in_block);
    // Comment lines to put before a written line, and a trailing comment after it.
    let mut before: Vec<Vec<String>> = vec![Vec::new(); lines.len() + 1];
    let mut after: Vec<Option<String>> = vec![None; lines.len()];
    let mut cursor = 0;
    for note in notes {
        let found = (cursor..lines.len()).find(|&i| !in_block[i] && anchors[i] == note.anchor);
        match (found, note.kind) {
            (Some(i), Kind::Before(text)) => {
                let indent = indent_of(lines[i]);
                before[i].extend(text.iter().map(|t| format!("{indent}{t}")));
                cursor = i;
            }
            (Some(i), Kind::Trailing(text)) => {
                if after[i].is_none() {
                    after[i] = Some(text);
                }
                cursor = i + 1;
            }
            (None, Kind::Before(text)) if note.anchor.is_empty() => {
                // Comments at the end of the document: at the end still.
                before[lines.len()].extend(text);
            }
            (None, _) => {}
        }
    }
    let mut out = String::with_capacity(written.len() + original.len() / 4);
    for (i, line) in lines.iter().enumerate() {
        for c in &before[i] {
            out.push_str(c);
            out.push('\n');
        }
        out.push_str(line);
        if let Some(t) = &after[i] {
            out.push_str("  ");
            out.push_str(t);
        }
        out.push('\n');
    }
    for c in &before[lines.len()] {
        out.push_str(c);
        out.push('\n');
    }
    out
}

enum Kind {
    /// Comment lines (without their indentation) before the anchor line.
    Before(Vec<String>),
    /// A comment after the anchor line's content.
    Trailing(String),
}

struct Note {
    kind: Kind,
    /// The normalized content of the line it belongs to (empty: the document's end).
    anchor: String,
}

/// The comments of a document's text, in order, each with the line it belongs to. The
/// comment lines at the very start are the document's leading comments, kept apart.
fn comments_of(text: &str) -> Vec<Note> {
    let lines: Vec<&str> = text.lines().collect();
    let in_block = block_lines(&lines);
    let anchors = anchors(&lines, &in_block);
    let mut notes = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    let mut started = false;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if in_block[i] {
            continue;
        }
        if t.starts_with('#') {
            if started {
                pending.push(t.to_string());
            }
            continue;
        }
        if t.is_empty() || t == "---" || t == "..." {
            continue;
        }
        started = true;
        let anchor = anchors[i].clone();
        if !pending.is_empty() {
            notes.push(Note {
                kind: Kind::Before(std::mem::take(&mut pending)),
                anchor: anchor.clone(),
            });
        }
        if let Some(c) = trailing_comment(line) {
            notes.push(Note {
                kind: Kind::Trailing(c.to_string()),
                anchor,
            });
        }
    }
    if !pending.is_empty() {
        notes.push(Note {
            kind: Kind::Before(pending),
            anchor: String::new(),
        });
    }
    notes
}

/// Each line's anchor: its [`normalized`] content after the keys of the maps it is in
/// (`metadata:/name: web` is not `containers:/name: web`), found by indentation, a list
/// item's content counting as indented past its dash (however the list is indented).
/// Empty for lines in a block scalar, blank lines and comments.
fn anchors(lines: &[&str], in_block: &[bool]) -> Vec<String> {
    let mut out = vec![String::new(); lines.len()];
    // The keys of the maps the line is in, each with its content's indentation.
    let mut open: Vec<(usize, String)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if in_block[i] || t.is_empty() || t.starts_with('#') {
            continue;
        }
        if t == "---" || t == "..." {
            open.clear();
            continue;
        }
        let mut at = indent_of(line).len();
        let mut rest = line.trim_start();
        while let Some(r) = rest.strip_prefix("- ") {
            at += 2 + (r.len() - r.trim_start().len());
            rest = r.trim_start();
        }
        while open.last().is_some_and(|(n, _)| *n >= at) {
            open.pop();
        }
        let here = normalized(line);
        let mut anchor = String::new();
        for (_, k) in &open {
            anchor.push_str(k);
            anchor.push('/');
        }
        anchor.push_str(&here);
        if here.ends_with(':') {
            open.push((at, here));
        }
        out[i] = anchor;
    }
    out
}

/// Which lines are inside a block scalar: those after a line whose value opens one
/// (`|`, `>`, with their indicators), indented more than that line.
fn block_lines(lines: &[&str]) -> Vec<bool> {
    let mut out = vec![false; lines.len()];
    let mut open: Option<usize> = None;
    for (i, line) in lines.iter().enumerate() {
        if let Some(indent) = open {
            if line.trim().is_empty() || indent_of(line).len() > indent {
                out[i] = true;
                continue;
            }
            open = None;
        }
        let content = content_of(line);
        let value = content
            .rsplit_once(": ")
            .map(|(_, v)| v)
            .or_else(|| content.trim_start().strip_prefix("- "))
            .unwrap_or(content)
            .trim();
        let opens = (value.starts_with('|') || value.starts_with('>'))
            && value[1..]
                .bytes()
                .all(|b| matches!(b, b'-' | b'+' | b'0'..=b'9'));
        if opens {
            open = Some(indent_of(line).len());
        }
    }
    out
}

fn indent_of(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// A line without its trailing comment.
fn content_of(line: &str) -> &str {
    match comment_start(line) {
        Some(at) => line[..at].trim_end(),
        None => line.trim_end(),
    }
}

fn trailing_comment(line: &str) -> Option<&str> {
    let at = comment_start(line)?;
    if line[..at].trim().is_empty() {
        None
    } else {
        Some(&line[at..])
    }
}

/// Where a ` #` comment starts, outside quotes.
fn comment_start(line: &str) -> Option<usize> {
    let mut quote: Option<u8> = None;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match (quote, b) {
            (Some(q), _) if b == q => quote = None,
            (Some(_), _) => {}
            (None, b'"' | b'\'') => quote = Some(b),
            (None, b'#') if i == 0 || bytes[i - 1] == b' ' || bytes[i - 1] == b'\t' => {
                return Some(i);
            }
            _ => {}
        }
    }
    None
}

/// A line's content as the emitter may write it differently: without indentation,
/// list dashes, quotes around scalars, or its trailing comment.
fn normalized(line: &str) -> String {
    let mut t = content_of(line).trim_start();
    while let Some(rest) = t.strip_prefix("- ") {
        t = rest.trim_start();
    }
    if t == "-" {
        t = "";
    }
    let unquote = |s: &str| -> String {
        let s = s.trim();
        if s.len() >= 2
            && ((s.starts_with('"') && s.ends_with('"'))
                || (s.starts_with('\'') && s.ends_with('\'')))
        {
            s[1..s.len() - 1].to_string()
        } else {
            s.to_string()
        }
    };
    match t.split_once(": ") {
        Some((k, v)) => format!("{}: {}", unquote(k), unquote(v)),
        None => match t.strip_suffix(':') {
            Some(k) => format!("{}:", unquote(k)),
            None => unquote(t),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_come_back_to_their_lines() {
        let original = "kind: Deployment\n# the app\nspec:\n  template:\n    spec:\n      \
                        containers:\n        # the one that serves\n        - name: web # front\n          \
                        image: 'web:1'\n          args:\n            - |\n              # not a comment\n              \
                        run\n# the end\n";
        let written = "kind: Deployment\nspec:\n  template:\n    spec:\n      initContainers:\n        \
                       - name: tollgate\n          image: \"t:1\"\n      containers:\n        - name: web\n          \
                       image: \"web:1\"\n          args:\n            - |\n              # not a comment\n              \
                       run\n";
        let got = carry(original, written);
        assert_eq!(
            got,
            "kind: Deployment\n# the app\nspec:\n  template:\n    spec:\n      initContainers:\n        \
             - name: tollgate\n          image: \"t:1\"\n      containers:\n        # the one that serves\n        \
             - name: web  # front\n          image: \"web:1\"\n          args:\n            - |\n              \
             # not a comment\n              run\n# the end\n"
        );
        assert_eq!(carry("a: 1\n", "a: 1\n"), "a: 1\n");
    }

    #[test]
    fn a_line_that_repeats_keeps_its_comment_where_it_was() {
        // The workload and its container share a name: the comment is the container's.
        let original = "kind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      \
                        containers:\n      - name: web   # the app\n        image: web:1\n";
        let written = "kind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      \
                       containers:\n        - name: web\n          image: web:1\n";
        assert_eq!(
            carry(original, written),
            "kind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    spec:\n      \
             containers:\n        - name: web  # the app\n          image: web:1\n"
        );
    }
}
