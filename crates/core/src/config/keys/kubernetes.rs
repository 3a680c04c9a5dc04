//! `[kubernetes]`: where the Kubernetes API is, for upstreams with `discovery =
//! "kubernetes"`. Read when a watch starts: a change waits for a restart.

use serde_json::json;

use crate::config::model::KubernetesConfig;

keys! {
    section "kubernetes" of KubernetesConfig = Some(KubernetesConfig::default);
    kubeconfig: "path", "the pod's service account", Restart, "a kubeconfig file (its current context) for running outside a pod",
        |c| json!(c.kubeconfig.as_ref().map(|p| p.display().to_string()));
}
