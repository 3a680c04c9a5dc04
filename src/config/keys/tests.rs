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
