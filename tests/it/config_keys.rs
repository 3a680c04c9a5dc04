//! The table of keys changes nothing a user sees: for thousands of random files, valid
//! and not, the parse (the model, or every error with its line, key and fix), what a
//! file with errors still reads as, and the JSON of `/config` are those recorded before
//! the keys were declared once. `TOLLGATE_UPDATE_GOLDEN=1` records them anew.

#![allow(clippy::unwrap_used)]

mod generate;

use std::path::Path;
use std::time::Duration;

use tollgate_core::config;

/// Files checked against the recorded outputs.
const FILES: u64 = 3000;
const GOLDEN: &str = "tests/fixtures/config_keys/golden.txt";

/// Everything a file gives: the model or the errors, what it reads as leniently, and
/// the JSON of each config.
fn outputs(text: &str) -> (bool, String) {
    let base = Path::new("/base");
    let lenient = match config::parse_lenient("gen.toml", text, base) {
        Some(c) => format!("{c:?}\n{}", c.to_json()),
        None => "not TOML".to_string(),
    };
    match config::parse("gen.toml", text, base) {
        Ok(c) => (true, format!("{c:?}\n{}\n{lenient}", c.to_json())),
        Err(e) => (false, format!("{:?}\n{e}\n{lenient}", e.0)),
    }
}

/// FNV-1a: a digest that is the same in every build.
fn digest(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[test]
fn random_files_parse_and_show_as_recorded() {
    let mut lines = Vec::new();
    let mut valid = 0;
    for seed in 0..FILES {
        let (ok, out) = outputs(&generate::config(seed));
        valid += usize::from(ok);
        lines.push(format!("{seed} {:016x}", digest(&out)));
    }
    let got = lines.join("\n") + "\n";
    println!(
        "{FILES} files: {valid} valid, {} with errors",
        FILES as usize - valid
    );
    assert!(valid > FILES as usize / 5, "too few valid files: {valid}");
    assert!(
        valid < FILES as usize * 4 / 5,
        "too few invalid files: {valid} valid"
    );
    if std::env::var_os("TOLLGATE_UPDATE_GOLDEN").is_some() {
        std::fs::write(GOLDEN, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(GOLDEN).unwrap();
    for (g, w) in got.lines().zip(want.lines()) {
        if g != w {
            let seed: u64 = g.split(' ').next().unwrap().parse().unwrap();
            let text = generate::config(seed);
            panic!("seed {seed} differs:\n{text}\n{}", outputs(&text).1);
        }
    }
    assert_eq!(got.lines().count(), want.lines().count());
}

mod old_json;

use crate::common::config as builder;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// Beyond the recorded files: `/config` of any file, valid or as read with its
    /// errors, is what the hand-written JSON showed.
    #[test]
    fn config_json_is_what_the_hand_written_json_was(seed in 3000u64..) {
        let text = generate::config(seed);
        if let Some(c) = config::parse_lenient("gen.toml", &text, Path::new("/base")) {
            proptest::prop_assert_eq!(c.to_json(), old_json::config(&c), "{}", text);
        }
    }
}

#[test]
fn the_builder_writes_what_the_parser_reads() {
    let text = builder::Config::new()
        .listener(|l| l.unknown_authorities("refuse"))
        .upstream("api", |u| {
            u.authorities(["api"])
                .endpoint("127.0.0.1:9")
                .endpoint("127.0.0.1:10")
                .request_timeout(Duration::from_secs(2))
                .retry(|r| r.max_attempts(3).on(["502", "reset"]))
                .budget(|b| b)
        })
        .inbound("127.0.0.1:8080".parse().unwrap(), |i| {
            i.max_inflight("adaptive").dedupe(|d| d.ttl("1h"))
        })
        .to_toml();
    let c = tollgate_core::config::parse("t.toml", &text, std::path::Path::new("."))
        .unwrap_or_else(|e| panic!("{text}\n{e}"));
    let u = c.upstream("api").unwrap();
    assert_eq!(u.endpoints.len(), 2);
    assert_eq!(u.retry.max_attempts, 3);
    assert_eq!(u.request_timeout, Some(Duration::from_secs(2)));
    assert_eq!(u.budget, Some(Default::default()));
    let i = c.inbound.unwrap();
    assert_eq!(
        i.max_inflight,
        tollgate_core::config::InflightLimit::Adaptive
    );
    assert_eq!(i.dedupe.unwrap().ttl, Duration::from_secs(3600));
    assert_eq!(c.listener.addr.port(), 0);
    assert_eq!(
        c.listener.unknown_authorities,
        tollgate_core::config::UnknownAuthorities::Refuse
    );
}

/// Every declared key can be set: by its setter, or, for a section, by the closure
/// that builds it.
#[test]
fn the_builder_has_a_setter_for_every_declared_key() {
    use builder::*;
    use tollgate_core::config::keys;
    let sections: [(&[&str], &[&str], &[&str]); 17] = [
        (Runtime::KEYS, keys::runtime::NAMES, &[]),
        (Listener::KEYS, keys::listener::NAMES, &[]),
        (Admin::KEYS, keys::admin::NAMES, &[]),
        (Deadline::KEYS, keys::deadline::NAMES, &[]),
        (AccessLog::KEYS, keys::access_log::NAMES, &[]),
        (
            Upstream::KEYS,
            keys::upstream::NAMES,
            &["retry", "tls", "budget", "outlier", "hedge", "throttle"],
        ),
        (Retry::KEYS, keys::retry::NAMES, &[]),
        (Budget::KEYS, keys::budget::NAMES, &[]),
        (Throttle::KEYS, keys::throttle::NAMES, &[]),
        (Outlier::KEYS, keys::outlier::NAMES, &[]),
        (Hedge::KEYS, keys::hedge::NAMES, &[]),
        (Tls::KEYS, keys::tls::NAMES, &[]),
        (Inbound::KEYS, keys::inbound::NAMES, &["retries", "dedupe"]),
        (InboundRetries::KEYS, keys::inbound_retries::NAMES, &[]),
        (Dedupe::KEYS, keys::dedupe::NAMES, &[]),
        (Tracing::KEYS, keys::tracing::NAMES, &[]),
        (Kubernetes::KEYS, keys::kubernetes::NAMES, &[]),
    ];
    for (setters, declared, nested) in sections {
        for key in declared {
            assert!(
                setters.contains(key) || nested.contains(key),
                "no setter for `{key}` in tests/it/common/config.rs"
            );
        }
    }
}
