use super::*;

#[test]
fn every_section_has_keys_and_each_key_once() {
    for section in sections() {
        let names = section.names();
        assert!(!names.is_empty(), "[{}]", section.path());
        for (i, name) in names.iter().enumerate() {
            assert!(
                !names[..i].contains(name),
                "{name} twice in [{}]",
                section.path()
            );
        }
    }
}

/// The keys table of docs/config.md is the declarations': rewritten with
/// `TOLLGATE_UPDATE_DOCS=1`, else checked.
#[test]
fn the_docs_keys_table_is_up_to_date() {
    const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md");
    const BEGIN: &str = "<!-- keys:begin -->\n";
    const END: &str = "<!-- keys:end -->";
    let text = std::fs::read_to_string(DOC).expect("docs/config.md is readable");
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        panic!("docs/config.md has no {BEGIN:?} … {END:?}");
    };
    let table = markdown();
    let written = &text[b + BEGIN.len()..e];
    if written == table {
        return;
    }
    if std::env::var_os("TOLLGATE_UPDATE_DOCS").is_some() {
        let updated = format!("{}{BEGIN}{table}{}", &text[..b], &text[e..]);
        std::fs::write(DOC, updated).expect("docs/config.md is writable");
        return;
    }
    panic!(
        "the keys table of docs/config.md is out of date: run \
         TOLLGATE_UPDATE_DOCS=1 cargo test --lib config::keys"
    );
}

#[test]
fn a_key_shows_its_default_in_the_model_it_is_read_into() {
    let table = markdown();
    for row in [
        "| `listener.drain_timeout` | duration | `\"20s\"` | restart |",
        "| `upstreams.NAME.retry.max_attempts` | integer | `3` | reload |",
        "| `upstreams.NAME.retry.max_body` | size | `\"64KiB\"` | reload |",
        "| `upstreams.NAME.connect_timeout` | duration | `\"200ms\"` | reload |",
        "| `upstreams.NAME.endpoints` | list of host:port | **required** (none with `discovery = \"kubernetes\"`) | reload |",
        "| `upstreams.NAME.discovery` | `\"dns\"` or `\"kubernetes\"` | `\"dns\"` | reload |",
        "| `inbound.dedupe.methods` | list of methods | `[\"POST\", \"PATCH\"]` | reload |",
        "| `inbound.addr` | address | `\"0.0.0.0:15006\"` | restart |",
        "| `admin.probes` | list of { port, path, headers } | `[]` | reload |",
        "| `tracing.sample` | number | `0.0` | reload |",
    ] {
        assert!(table.contains(row), "no {row} in\n{table}");
    }
}

/// The default column of every section's table in docs/config.md is the declarations':
/// rewritten with `TOLLGATE_UPDATE_DOCS=1`, else checked. A table belongs to the
/// section its nearest heading above names (`` ## `[upstreams.NAME.retry]` ``), and
/// lists only that section's keys.
#[test]
fn the_docs_section_tables_show_the_declared_defaults() {
    const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md");
    let text = std::fs::read_to_string(DOC).expect("docs/config.md is readable");
    let (updated, problems) = section_defaults(&text);
    assert!(
        problems.is_empty(),
        "docs/config.md:\n{}",
        problems.join("\n")
    );
    if updated == text {
        return;
    }
    if std::env::var_os("TOLLGATE_UPDATE_DOCS").is_some() {
        std::fs::write(DOC, updated).expect("docs/config.md is writable");
        return;
    }
    let stale: Vec<String> = text
        .lines()
        .zip(updated.lines())
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| format!("line {}: {a}\n  should be: {b}", i + 1))
        .collect();
    panic!(
        "docs/config.md's section tables are out of date (run \
         TOLLGATE_UPDATE_DOCS=1 cargo test --lib config::keys):\n{}",
        stale.join("\n")
    );
}

/// `text` with the default column of each section table set from the declarations,
/// and the rows that name no key of their section.
fn section_defaults(text: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    let mut section: Option<&'static dyn Described> = None;
    let mut in_table = false;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches('\n');
        if bare.starts_with('#') {
            if let Some(path) = bare.split("`[").nth(1).and_then(|r| r.split("]`").next()) {
                section = sections().into_iter().find(|s| s.path() == path);
            }
            in_table = false;
        } else if bare.starts_with("| key | default |") {
            in_table = true;
        } else if !bare.starts_with('|') {
            in_table = false;
        }
        let row = in_table.then(|| bare.strip_prefix("| `")).flatten();
        let Some((name, rest)) = row.and_then(|r| r.split_once("` | ")) else {
            out.push_str(line);
            continue;
        };
        let declared = section.and_then(|s| s.rows().into_iter().find(|r| r.name == name));
        let (Some(declared), Some((_, meaning))) = (declared, rest.split_once(" | ")) else {
            problems.push(format!(
                "{}: `{name}` is not a key of [{}]",
                i + 1,
                section.map_or("?", |s| s.path())
            ));
            out.push_str(line);
            continue;
        };
        out.push_str(&format!("| `{name}` | {} | {meaning}", declared.default));
        out.push_str(&line[bare.len()..]);
    }
    (out, problems)
}
