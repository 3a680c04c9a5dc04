//! `[admin]`: metrics, health, `/config` and kubelet probes.

use serde_json::json;

use crate::config::model::AdminConfig;

keys! {
    section "admin" of AdminConfig = Some(AdminConfig::default);
    addr: "address", model, Restart, "`/metrics`, `/healthz`, `/readyz`, `/config`, `/probe/PORT/PATH`",
        |c| json!(c.addr.to_string());
    probes: "list of { port, path, headers }", model, Applied, "the kubelet probes `GET /probe/PORT/PATH` forwards to the app: exact port and path pairs",
        |c| json!(c.probes.iter().map(|p| json!({
            "port": p.port,
            "path": p.path,
            "headers": p.headers.iter().map(|(n, v)| (n.as_str().to_string(), json!(String::from_utf8_lossy(v.as_bytes())))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>());
}
