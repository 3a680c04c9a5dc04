//! `[deadline]`: the deadline headers read from the app and written on every attempt.

use serde_json::json;

use crate::config::model::DeadlineConfig;

keys! {
    section "deadline" of DeadlineConfig = Some(DeadlineConfig::default);
    header: "header name", model, Applied, "written on every attempt: the whole milliseconds left",
        |c| json!(c.header.as_str());
    accept: "list of header names", model, Applied, "read from the app; the smallest valid value wins",
        |c| json!(c.accept.iter().map(|h| h.as_str()).collect::<Vec<_>>());
}
