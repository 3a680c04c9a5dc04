//! `[runtime]`: the process.

use serde_json::json;

use crate::config::model::RuntimeConfig;

keys! {
    section "runtime" of RuntimeConfig = Some(RuntimeConfig::default);
    worker_threads: "integer", "the CPUs this process may use (cgroup quota included)", Restart,
        "tokio worker threads; size a sidecar like a container",
        |c| json!(c.worker_threads);
}
