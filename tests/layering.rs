//! The layering of the library: the build keeps it (build.rs runs build/layering.rs, which
//! holds the FLOORS table and says what is read and how), and these tests run the same
//! reader, so a violation also fails `cargo test` with the same words, and test the
//! reader itself on sources written for it.

#[path = "../build/layering.rs"]
mod layering;

use std::path::Path;

use layering::{Import, imports};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read() -> layering::Graph {
    layering::read(root()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_module_names_only_the_floors_below_its_own() {
    let g = read();
    let unplaced = layering::unplaced(&g);
    assert!(unplaced.is_empty(), "\n  {}", unplaced.join("\n  "));
    let upward = layering::upward(&g);
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
    let circles = layering::circles(&read());
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
    let found = layering::check(&root).unwrap_or_else(|e| panic!("{e}"));
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
