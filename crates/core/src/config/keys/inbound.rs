//! `[inbound]`: tollgate in front of its own app. Only the address waits for a
//! restart.

use serde_json::json;

use crate::config::model::{InboundConfig, InflightLimit};
use crate::config::units::format_duration;

keys! {
    section "inbound" of InboundConfig = Some(InboundConfig::default);
    addr: "address", model, Restart, "where callers reach the app",
        |c| json!(c.addr.to_string());
    app: "host:port", required, Applied, "the app's address, normally on loopback (`POD_IP`'s when loopback is refused)",
        |c| json!(c.app.to_string());
    max_inflight: "integer or `\"adaptive\"`", model, Applied, "requests the app is given at once; more get `503 overloaded`",
        |c| match c.max_inflight {
            InflightLimit::Fixed(n) => json!(n),
            InflightLimit::Adaptive => json!("adaptive"),
        };
    request_timeout: "duration", model, Applied, "bounds the wait for the app's head when the caller sent no deadline",
        |c| json!(c.request_timeout.map(format_duration));
    retries: "section", "absent: retries admitted as they come", Applied, "one retry budget for every caller",
        |c| super::inbound_retries::SECTION
            .json_of(c.retries.as_ref().map(|b| (b.clone(), c.per_caller)).as_ref()),
        apart per_caller: |c| json!(c.per_caller.as_str());
    probe_paths: "list of paths", "none (any path)", Applied, "the only paths a kubelet probe may ask for",
        |c| json!(c.probe_paths);
    dedupe: "section", "absent: keys pass through", Applied, "keyed requests run once",
        |c| super::dedupe::SECTION.json_of(c.dedupe.as_ref()),
        same: |a, b| a.dedupe == b.dedupe;
    owned_failures: "`\"mark\"` or `\"off\"`", model, Applied, "the app's failure after its own call was given up on is marked `downstream-owned`",
        |c| json!(c.owned_failures.as_str());
}
