//! `[admin]`: metrics, health, `/config` and kubelet probes.

use serde_json::json;

use crate::config::model::AdminConfig;

keys! {
    section "admin" of AdminConfig = Some(AdminConfig::default);
    addr: "address", model, Restart, "`/metrics`, `/healthz`, `/readyz`, `/config`, `/probe/PORT/PATH`",
        |c| json!(c.addr.to_string());
    probe_ports: "list of ports", model, Applied, "the app's ports `GET /probe/PORT/PATH` may reach",
        |c| json!(c.probe_ports);
}
