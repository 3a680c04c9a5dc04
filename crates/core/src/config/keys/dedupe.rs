//! `[inbound.dedupe]`: keyed requests run once. The Redis address is shown without its
//! password.

use serde_json::json;

use crate::config::model::DedupeConfig;
use crate::config::units::{format_duration, format_size};

keys! {
    section "inbound.dedupe" of DedupeConfig = Some(DedupeConfig::default);
    methods: "list of methods", model, Applied, "keys on other methods pass through untouched",
        |c| json!(c.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>());
    ttl: "duration", model, Applied, "how long a key is remembered",
        |c| json!(format_duration(c.ttl));
    max_response: "size", model, Applied, "a larger answer is not kept for replay",
        |c| json!(format_size(c.max_response as u64));
    store: "`\"memory\"` or `\"redis://HOST:PORT/DB\"`", model, Applied, "where the keys are kept",
        |c| json!(c.store.describe());
    max_entries: "integer", model, Applied, "the most keys the memory store holds",
        |c| json!(c.max_entries);
    store_timeout: "duration", model, Applied, "one store call's time",
        |c| json!(format_duration(c.store_timeout));
    on_store_error: "`\"closed\"` or `\"open\"`", model, Applied, "a keyed request while the store fails: `503`, or this replica's memory",
        |c| json!(c.on_store_error.as_str());
    header: "header name", model, Applied, "the header a key is read from; every answer names it",
        |c| json!(c.header.as_str());
    identity_headers: "list of header names", model, Applied, "credentials besides `Authorization` and `Cookie` that are part of a key's scope",
        |c| json!(c.identity_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>());
}
