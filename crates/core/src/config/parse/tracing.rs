//! The `[tracing]` section: the collector's address, the sampling share, and the
//! bounds of the export.

use std::time::Duration;

use super::schema::Section;
use super::walker::{Table, Walker};
use crate::config::keys::{root as root_key, tracing as key};
use crate::config::model::{OtlpAddr, TracingConfig};

pub(super) fn tracing(w: &mut Walker<'_>, root: &Table) -> Option<TracingConfig> {
    let (t, _) = w.table(root, root_key::tracing)?;
    w.check_keys(Section::Tracing, "", &t);
    let d = TracingConfig::default();
    let otlp = match w.string(&t, key::otlp) {
        None => d.otlp,
        Some((text, span)) => OtlpAddr::parse(&text).unwrap_or_else(|why| {
            w.reject(
                span,
                &t.key(key::otlp),
                // Never the text as written: it may carry a password or a token.
                format!("`{}` {why}", OtlpAddr::masked(&text)),
                "write the collector's OTLP/HTTP base address, e.g. \"http://127.0.0.1:4318\" \
                 (spans go to its /v1/traces)",
            );
            d.otlp.clone()
        }),
    };
    let ms = Duration::from_millis;
    let secs = Duration::from_secs;
    Some(TracingConfig {
        otlp,
        sample: w.ranged(&t, key::sample, d.sample, 0.0..=1.0),
        batch: w.ranged(&t, key::batch, d.batch as u64, 1..=65_536) as usize,
        queue: w.ranged(&t, key::queue, d.queue as u64, 1..=1_048_576) as usize,
        timeout: w.ranged(&t, key::timeout, d.timeout, ms(10)..=secs(60)),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::parse;

    const BASE: &str = "[upstreams.a]\nauthorities = [\"a\"]\nendpoints = [\"127.0.0.1:1\"]\n";

    #[test]
    fn without_the_section_nothing_is_traced_and_with_it_the_defaults_hold() {
        let c = parse("t.toml", BASE, Path::new(".")).unwrap();
        assert!(c.tracing.is_none());
        let c = parse("t.toml", &format!("{BASE}[tracing]\n"), Path::new(".")).unwrap();
        let t = c.tracing.unwrap();
        assert_eq!(t, crate::config::TracingConfig::default());
        assert_eq!(t.otlp.as_str(), "http://127.0.0.1:4318");
        assert_eq!((t.sample, t.batch, t.queue), (0.0, 512, 8192));
        assert_eq!(t.timeout, std::time::Duration::from_secs(2));
    }

    #[test]
    fn every_key_is_read() {
        let text = format!(
            "{BASE}[tracing]\notlp = \"http://collector:4318\"\nsample = 0.25\nbatch = 100\n\
             queue = 1000\ntimeout = \"500ms\"\n"
        );
        let c = parse("t.toml", &text, Path::new(".")).unwrap();
        let t = c.tracing.as_ref().unwrap();
        assert_eq!(t.otlp.authority(), "collector:4318");
        assert_eq!((t.sample, t.batch, t.queue), (0.25, 100, 1000));
        assert_eq!(t.timeout.as_millis(), 500);
        assert_eq!(
            c.to_json()["tracing"],
            serde_json::json!({
                "otlp": "http://collector:4318",
                "sample": 0.25,
                "batch": 100,
                "queue": 1000,
                "timeout": "500ms",
            }),
            "/config shows it as the file writes it"
        );
    }

    #[test]
    fn an_address_with_a_password_or_token_is_refused_without_showing_it() {
        for (otlp, shown) in [
            (
                "http://user:hunter2@collector:4318",
                "`http://user:***@collector:4318` carries credentials",
            ),
            (
                "http://collector:4318/?token=hunter2",
                "`http://collector:4318/?token=***` has a query",
            ),
        ] {
            let text = format!("{BASE}[tracing]\notlp = \"{otlp}\"\n");
            let e = parse("t.toml", &text, Path::new("."))
                .unwrap_err()
                .to_string();
            assert!(e.contains(shown), "{e}");
            assert!(!e.contains("hunter2"), "the secret leaked: {e}");
        }
    }

    #[test]
    fn errors_name_the_place_the_key_and_the_fix() {
        let text = format!(
            "{BASE}[tracing]\notlp = \"https://collector:4318\"\nsample = 1.5\nqueue = 0\nsampel = 1\n"
        );
        let e = parse("t.toml", &text, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.toml:5:8: tracing.otlp: `https://collector:4318` uses https"),
            "{e}"
        );
        assert!(
            e.contains("t.toml:6:10: tracing.sample: 1.5 is out of range"),
            "{e}"
        );
        assert!(
            e.contains("t.toml:7:9: tracing.queue: 0 is out of range"),
            "{e}"
        );
        assert!(
            e.contains("t.toml:8:1: tracing.sampel: unknown key `sampel`"),
            "{e}"
        );
        assert!(e.contains("did you mean `sample`?"), "{e}");
    }
}
