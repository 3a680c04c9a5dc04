//! Where a document keeps its pod: a Pod's own `metadata` and `spec`, a workload's
//! `spec.template`. The kinds `inject` changes are those whose pods run for as long as
//! the workload does; a `List` (as `kubectl get -o yaml` writes) is walked item by item.

use yaml_rust2::Yaml;

use super::yaml::{get, get_mut, s, str_at};

/// The kinds whose pod template gets the sidecar.
const WORKLOADS: &[&str] = &[
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
    "CronJob",
];

/// What names a pod: its workload's kind, name and namespace.
#[derive(Debug, Clone)]
pub struct Owner {
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
}

impl Owner {
    pub fn show(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Its pods run to completion (a Job's, a CronJob's): only a native sidecar ends
    /// with them.
    pub fn runs_to_completion(&self) -> bool {
        matches!(self.kind.as_str(), "Job" | "CronJob")
    }
}

/// Whether a pod's own fields say it runs to completion: a pod that is never restarted
/// when it ends (`restartPolicy` `Never` or `OnFailure`, as every Job's pod is), or one
/// a Job owns. A webhook sees only the pod, never the Job that made it.
pub fn runs_to_completion(meta: &Yaml, spec: &Yaml) -> bool {
    let restarts = str_at(spec, "restartPolicy").unwrap_or("Always");
    let owned_by_job = get(meta, "ownerReferences")
        .and_then(Yaml::as_vec)
        .is_some_and(|refs| refs.iter().any(|r| str_at(r, "kind") == Some("Job")));
    restarts != "Always" || owned_by_job
}

/// What a document is to `inject`.
pub enum Found {
    /// A pod (or a workload's pod template): its owner.
    Pod(Owner),
    /// A `List`: its items are looked at one by one.
    List,
    /// Anything else: left alone.
    Other,
}

pub fn classify(doc: &Yaml) -> Found {
    let kind = str_at(doc, "kind").unwrap_or_default();
    let meta = get(doc, "metadata");
    let name = meta.and_then(|m| str_at(m, "name")).unwrap_or_default();
    let owner = || Owner {
        kind: kind.to_string(),
        name: name.to_string(),
        namespace: meta
            .and_then(|m| str_at(m, "namespace"))
            .map(str::to_string),
    };
    match kind {
        "List" => Found::List,
        "Pod" => Found::Pod(owner()),
        k if WORKLOADS.contains(&k) => Found::Pod(owner()),
        _ => Found::Other,
    }
}

/// The map holding the pod's `metadata` and `spec`: the document itself for a Pod,
/// `spec.template` for a workload (made when missing, so that a template without
/// metadata gets some).
pub fn pod_of<'a>(doc: &'a mut Yaml, owner: &Owner) -> Option<&'a mut Yaml> {
    let pod = match owner.kind.as_str() {
        "Pod" => doc,
        "CronJob" => get_mut(
            get_mut(get_mut(get_mut(doc, "spec")?, "jobTemplate")?, "spec")?,
            "template",
        )?,
        _ => get_mut(get_mut(doc, "spec")?, "template")?,
    };
    let h = pod.as_mut_hash()?;
    if !h.contains_key(&s("metadata")) || h.get(&s("metadata")).is_some_and(Yaml::is_null) {
        h.replace(s("metadata"), Yaml::Hash(Default::default()));
    }
    get(pod, "spec")?.as_hash()?;
    Some(pod)
}

/// Runs `f` on the pod's `metadata` and `spec` side by side.
pub fn with_parts<T>(pod: &mut Yaml, f: impl FnOnce(&mut Yaml, &mut Yaml) -> T) -> Option<T> {
    let mut meta = std::mem::replace(get_mut(pod, "metadata")?, Yaml::Null);
    let out = get_mut(pod, "spec").map(|spec| f(&mut meta, spec));
    if let Some(slot) = get_mut(pod, "metadata") {
        *slot = meta;
    }
    out
}

/// The containers of a pod spec named `name`, among `key` (`containers` or
/// `initContainers`).
pub fn position(spec: &Yaml, key: &str, name: &str) -> Option<usize> {
    super::yaml::items(spec, key)
        .iter()
        .position(|c| str_at(c, "name") == Some(name))
}
