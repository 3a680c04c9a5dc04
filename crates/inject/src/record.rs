//! What `inject` added to a pod or replaced in it, kept on the pod as the annotation
//! `tollgate/injected` (compact JSON), so `--uninject` gives back exactly what was there:
//! a label's or annotation's old value or its absence, the app's probes as written
//! (a named port included), the proxy variables it added to each container, the pod
//! fields it raised. The containers, volume and ConfigMap it adds are known by name.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The annotation that marks an injected pod and holds its [`Record`].
pub const ANNOTATION: &str = "tollgate/injected";

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// tollgate's version that injected.
    #[serde(default)]
    pub version: String,
    /// Pod labels set: the value before (`None`: there was none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, Option<String>>,
    /// Pod annotations set, likewise.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, Option<String>>,
    /// Environment variables added, by container.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, Vec<String>>,
    /// Probes moved to the admin port, as `CONTAINER/PROBE` -> the `httpGet` before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probes: BTreeMap<String, serde_json::Value>,
    /// Pod spec fields set: the value before (null: there was none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub spec: BTreeMap<String, serde_json::Value>,
}

impl Record {
    pub fn new() -> Self {
        Record {
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Record::default()
        }
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn from_annotation(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("annotation {ANNOTATION}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let mut r = Record::new();
        r.labels.insert("tollgate/sidecar".into(), None);
        r.annotations
            .insert("prometheus.io/port".into(), Some("9100".into()));
        r.probes.insert(
            "app/livenessProbe".into(),
            serde_json::json!({"path": "/healthz", "port": "http"}),
        );
        let text = r.to_annotation();
        assert_eq!(Record::from_annotation(&text), Ok(r));
        assert!(Record::from_annotation("{\"what\": 1}").is_err());
    }
}
