//! The layering of the request path's crate (crates/core): its build keeps it (its build.rs
//! runs build/layering.rs, which
//! holds the FLOORS table and says what is read and how), and these tests run the same
//! reader, so a violation also fails `cargo test` with the same words, and test the
//! reader itself on sources written for it. docs/architecture.md is held to the same
//! table: its table of floors is generated from it (`TOLLGATE_UPDATE_DOCS=1 cargo test
//! --test it layering::` rewrites it), and its layers are described in the table's order.

/// The build's reader of the imports, crates/core/build/layering.rs.
#[path = "../../crates/core/build/layering.rs"]
mod reader;

use std::path::Path;

use reader::{Import, imports};

/// The repository: its docs.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The request path's crate, whose floors are kept.
fn core() -> std::path::PathBuf {
    root().join("crates/core")
}

fn read() -> reader::Graph {
    reader::read(&core()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_module_names_only_the_floors_below_its_own() {
    let g = read();
    let unplaced = reader::unplaced(&g);
    assert!(unplaced.is_empty(), "\n  {}", unplaced.join("\n  "));
    let upward = reader::upward(&g);
    assert!(upward.is_empty(), "\n  {}", upward.join("\n  "));
    // The reading itself: the lowest floors name nothing, and the proxy is seen
    // importing the retry engine (an empty graph would pass every check above).
    assert!(g.edges[&vec!["http".to_string()]].is_empty());
    assert!(
        g.edges
            .iter()
            .any(|(f, t)| f.first().is_some_and(|m| m == "proxy")
                && t.keys().any(|x| x.first().is_some_and(|m| m == "retry")))
    );
}

#[test]
fn no_file_imports_a_file_that_imports_it() {
    let circles = reader::circles(&read());
    assert!(circles.is_empty(), "\n  {}", circles.join("\n  "));
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
    let got: Vec<_> = imports(&m("proxy::handler"), src)
        .into_iter()
        .map(|i| i.path)
        .collect();
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

#[test]
fn the_reader_counts_lines_past_comments_and_strings_that_span_lines() {
    let src = "/* one\n two */ use crate::a;\nconst S: &str = \"x\n y\";\nuse crate::{\n    b,\n    c::D,\n};\n";
    let got = imports(&[], src);
    let at = |line, path: &str| Import {
        path: vec![path.to_string()],
        line,
    };
    assert_eq!(got[0], at(2, "a"));
    assert_eq!(got[1], at(6, "b"));
    assert_eq!(got[2].line, 7);
}

/// A crate written for the test, with one of each violation, checked as the build
/// checks: each is said with its file and line.
#[test]
fn the_check_names_the_file_line_import_and_floors() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("layering-check");
    let _ = std::fs::remove_dir_all(&root);
    let files = [
        (
            "src/lib.rs",
            "pub mod http;\npub mod retry;\npub mod nowhere;\n",
        ),
        (
            "src/http.rs",
            "//! The wire.\n\nuse crate::retry::policy::Policy;\n",
        ),
        (
            "src/retry/mod.rs",
            "pub mod a;\npub mod b;\npub mod policy;\n",
        ),
        ("src/retry/policy.rs", "pub struct Policy;\n"),
        ("src/retry/a.rs", "use super::b::B;\n"),
        ("src/retry/b.rs", "\nuse super::a::A;\n"),
        ("src/nowhere.rs", ""),
    ];
    for (path, text) in files {
        let path = root.join(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("the test's own directory");
        }
        std::fs::write(&path, text).expect("the test's own file");
    }
    let found = reader::check(&root).unwrap_or_else(|e| panic!("{e}"));
    let said = found.join("\n");
    assert_eq!(found.len(), 3, "{said}");
    assert!(found[0].starts_with("src/nowhere.rs: the top-level module `nowhere` has no floor"));
    assert!(
        found[1].starts_with(
            "src/http.rs:3: upward import `crate::retry::policy::Policy`: `http` is on floor 1 \
             and `retry` on floor 7, above it;"
        ),
        "{said}"
    );
    assert!(
        found[2].starts_with(
            "import cycle: src/retry/a.rs:1 imports `crate::retry::b::B`; src/retry/b.rs:2 \
             imports `crate::retry::a::A`; and so back to src/retry/a.rs"
        ),
        "{said}"
    );
}

const DOC: &str = "docs/architecture.md";

/// How docs/architecture.md shows a top-level module: its file, its folder, or both
/// (`metrics.rs` with `metrics/`).
fn shown(top: &str) -> Option<String> {
    let src = core().join("src");
    let file = src.join(format!("{top}.rs")).is_file();
    let dir = src.join(top).is_dir();
    match (file, dir) {
        (true, true) => Some(format!("`{top}.rs` with `{top}/`")),
        (true, false) => Some(format!("`{top}.rs`")),
        (false, true) => Some(format!("`{top}/`")),
        (false, false) => None,
    }
}

/// The table of floors as docs/architecture.md shows it, from the bottom.
fn floors_table() -> String {
    let mut out = String::from("| floor | modules |\n|---|---|\n");
    for (i, floor) in reader::FLOORS.iter().enumerate() {
        let modules: Vec<String> = floor
            .iter()
            .map(|m| {
                shown(m)
                    .unwrap_or_else(|| panic!("FLOORS names `{m}`, which crates/core/src/ has not"))
            })
            .collect();
        out.push_str(&format!("| {} | {} |\n", i + 1, modules.join(", ")));
    }
    out
}

/// The table of floors in docs/architecture.md is FLOORS: rewritten with
/// `TOLLGATE_UPDATE_DOCS=1`, else checked.
#[test]
fn the_docs_table_of_floors_is_the_floor_table() {
    const BEGIN: &str = "<!-- floors:begin -->\n";
    const END: &str = "<!-- floors:end -->";
    let path = root().join(DOC);
    let text = std::fs::read_to_string(&path).expect("docs/architecture.md is readable");
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        panic!("{DOC} has no {BEGIN:?} … {END:?}");
    };
    let table = floors_table();
    if text[b + BEGIN.len()..e] == table {
        return;
    }
    if std::env::var_os("TOLLGATE_UPDATE_DOCS").is_some() {
        let updated = format!("{}{BEGIN}{table}{}", &text[..b], &text[e..]);
        std::fs::write(&path, updated).expect("docs/architecture.md is writable");
        return;
    }
    panic!(
        "the table of floors in {DOC} is not FLOORS (crates/core/build/layering.rs): run \
         TOLLGATE_UPDATE_DOCS=1 cargo test --test it layering::\n\nit should read:\n{table}"
    );
}

/// The headings of the paragraphs of `## The layers` (the bold text each opens with),
/// in order, each with the line it is on.
fn layer_headings(text: &str) -> Vec<(usize, String)> {
    let mut headings = Vec::new();
    let mut inside = false;
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        if line.starts_with("## ") {
            inside = line == "## The layers";
            continue;
        }
        let Some(rest) = line.strip_prefix("**").filter(|_| inside) else {
            continue;
        };
        // A heading may run onto the paragraph's next lines.
        let mut heading = rest.to_string();
        while !heading.contains("**") {
            match lines.next_if(|(_, l)| !l.is_empty()) {
                Some((_, l)) => {
                    heading.push(' ');
                    heading.push_str(l);
                }
                None => break,
            }
        }
        let end = heading.find("**").unwrap_or(heading.len());
        heading.truncate(end);
        headings.push((i + 1, heading));
    }
    headings
}

/// The top-level module a name in backticks stands for (`retry/`, `fault.rs`, `check`).
fn module_named(span: &str) -> &str {
    let span = span.strip_suffix('/').unwrap_or(span);
    span.strip_suffix(".rs").unwrap_or(span)
}

/// The layers of docs/architecture.md are the floors: each paragraph of `## The layers`
/// opens with the modules it describes, every top-level module is named so, and they
/// are named from the bottom floor up, so none is named after a module of a higher
/// floor (a module in the wrong paragraph, or a paragraph in the wrong place).
#[test]
fn the_docs_describe_the_layers_in_the_order_of_the_floors() {
    let text = std::fs::read_to_string(root().join(DOC)).expect("docs/architecture.md is readable");
    let headings = layer_headings(&text);
    assert!(
        !headings.is_empty(),
        "{DOC} has no paragraphs under `## The layers`"
    );
    let mut problems = Vec::new();
    let mut named = std::collections::BTreeSet::new();
    // The highest floor named so far, with the module and the line of its heading.
    let mut highest: Option<(usize, &str, usize)> = None;
    for (line, heading) in &headings {
        for span in heading.split('`').skip(1).step_by(2) {
            let module = module_named(span);
            if module == "main" {
                continue; // the binary, on top of everything
            }
            let Some(floor) = reader::floor_of(module) else {
                problems.push(format!(
                    "{DOC}:{line}: `{span}` is no top-level module of crates/core/src/ \
                     (FLOORS in crates/core/build/layering.rs)"
                ));
                continue;
            };
            named.insert(module);
            match highest {
                Some((top, by, at)) if floor < top => problems.push(format!(
                    "{DOC}:{line}: `{module}` is on floor {floor}, below `{by}` (floor {top}, \
                     line {at}), which comes first; the layers run from the bottom floor up, \
                     as the table of floors does"
                )),
                Some((top, ..)) if floor == top => {}
                _ => highest = Some((floor, module, *line)),
            }
        }
    }
    for (i, floor) in reader::FLOORS.iter().enumerate() {
        for module in *floor {
            if !named.contains(module) {
                problems.push(format!(
                    "{DOC}: `{module}` (floor {}) opens no paragraph of `## The layers`",
                    i + 1
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n  {}", problems.join("\n  "));
}
