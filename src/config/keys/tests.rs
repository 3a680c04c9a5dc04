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
    const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/config.md");
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
        "| `upstreams.NAME.endpoints` | list of host:port | **required** | reload |",
        "| `inbound.dedupe.methods` | list of methods | `[\"POST\", \"PATCH\"]` | reload |",
        "| `inbound.addr` | address | `\"0.0.0.0:15006\"` | restart |",
        "| `admin.probe_ports` | list of ports | `[]` | reload |",
        "| `tracing.sample` | number | `0.0` | reload |",
    ] {
        assert!(table.contains(row), "no {row} in\n{table}");
    }
}
