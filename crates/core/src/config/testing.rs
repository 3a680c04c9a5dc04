//! Fixtures for the unit tests of the config and of the layers above it that read
//! configs (the `check` crate): one config that no lint fires on, and a parse that expects a
//! valid one.

use std::path::Path;

use super::Config;

/// One upstream that retries within a budget and its deadline: no lint fires.
pub const BASE: &str = r#"
[listener]
addr = "127.0.0.1:15001"

[admin]
addr = "127.0.0.1:15090"

[upstreams.api]
authorities = ["api"]
endpoints = ["127.0.0.1:8080"]
request_timeout = "2s"
attempt_timeout = "600ms"

[upstreams.api.retry]
max_attempts = 3

[upstreams.api.budget]
ratio = 0.1
"#;

/// The config of `text`, which must be valid.
pub fn parse(text: &str) -> Config {
    super::parse("test.toml", text, Path::new("."))
        .unwrap_or_else(|e| panic!("test config invalid:\n{e}"))
}
