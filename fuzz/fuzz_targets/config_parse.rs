//! The config parser takes any text: it returns a config or a list of problems, each
//! placed in the text, and never panics. A config it accepts can be shown as JSON
//! (`/config`), linted (`tollgate check`) and checked as a one-layer chain. Parsing
//! opens no file (certificate files are read by a later step), so any text is safe to
//! feed it.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match tollgate_core::config::parse("fuzz.toml", text, Path::new("/nonexistent")) {
        Ok(config) => {
            let _ = config.to_json().to_string();
            for d in tollgate_check::lint(&config) {
                assert!(d.line >= 1 && d.column >= 1, "{d}");
            }
            let _ = tollgate_check::check_chain(&[(&config, None)]);
            for up in &config.upstreams {
                let _ = up.total_patience();
                let _ = tollgate_check::budget_cap(up);
            }
        }
        Err(errors) => {
            assert!(!errors.0.is_empty(), "an error without a problem");
            let lines = text.split('\n').count();
            for d in &errors.0 {
                assert!(d.line >= 1 && d.column >= 1, "{d}");
                assert!(d.line <= lines, "{d} is past the last line ({lines})");
                assert!(!d.key.is_empty(), "{d} names no key");
            }
            let _ = errors.to_string();
        }
    }
});
