//! The top level of the file: its sections.

use serde_json::Value;

use crate::config::model::Config;

keys! {
    section "" of Config = None;
    runtime: "section", "its defaults", Restart, "the process: worker threads",
        |c| super::runtime::SECTION.json(&c.runtime);
    listener: "section", "its defaults", Restart, "where the app sends its outbound HTTP, and the limits of a client connection",
        |c| super::listener::SECTION.json(&c.listener);
    admin: "section", "its defaults", Applied, "metrics, health, `/config` and kubelet probes",
        |c| super::admin::SECTION.json(&c.admin);
    deadline: "section", "its defaults", Applied, "the deadline headers read and written",
        |c| super::deadline::SECTION.json(&c.deadline);
    access_log: "section", "off", Applied, "one line per request",
        |c| super::access_log::SECTION.json(&c.access_log);
    upstreams: "sections", "none", Applied, "one section per dependency, by name",
        |c| Value::Object(
            c.upstreams
                .iter()
                .map(|u| (u.name.clone(), super::upstream::SECTION.json(u)))
                .collect(),
        );
    inbound: "section", "absent: no inbound side", Restart, "tollgate in front of its own app too",
        |c| super::inbound::SECTION.json_of(c.inbound.as_ref());
    tracing: "section", "absent: nothing traced", Applied, "spans exported over OTLP",
        |c| super::tracing::SECTION.json_of(c.tracing.as_ref());
    kubernetes: "section", "absent: the pod's service account", Restart, "where the Kubernetes API is, for `discovery = \"kubernetes\"`",
        |c| super::kubernetes::SECTION.json(&c.kubernetes);
}
