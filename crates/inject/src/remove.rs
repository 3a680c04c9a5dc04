//! `--uninject`: the pod as it was before `inject`. With the record `inject` kept on the
//! pod (`tollgate/injected`) every label, annotation, probe, variable and field comes
//! back as it was; a pod injected by hand (no record) loses tollgate's containers,
//! volume, label and scrape annotations for the admin port, the proxy variables that
//! point at the listener, and gets its probes back from their `/probe/PORT/PATH`.

use yaml_rust2::Yaml;

use super::pod::{Owner, with_parts};
use super::probes::{self, ADMIN_PORT};
use super::record::{ANNOTATION, Record};
use super::sidecar::{CONTAINER, IPTABLES, PROXY_ENV, VOLUME};
use super::yaml::{drop_if_empty, from_json, get, get_mut, remove, s, set, str_at};

/// Takes tollgate out of the pod held by `pod`; whether anything changed.
pub fn uninject(pod: &mut Yaml, owner: &Owner) -> Result<bool, String> {
    let changed = with_parts(pod, uninject_parts)
        .ok_or_else(|| format!("{}: no pod spec", owner.show()))??;
    drop_if_empty(pod, "metadata");
    Ok(changed)
}

fn uninject_parts(meta: &mut Yaml, spec: &mut Yaml) -> Result<bool, String> {
    let record = match get(meta, "annotations").and_then(|a| str_at(a, ANNOTATION)) {
        Some(text) => Some(Record::from_annotation(text)?),
        None => None,
    };
    let mut changed = record.is_some();
    for key in ["initContainers", "containers"] {
        if let Some(list) = get_mut(spec, key).and_then(Yaml::as_mut_vec) {
            let before = list.len();
            list.retain(|c| !matches!(str_at(c, "name"), Some(CONTAINER | IPTABLES)));
            changed |= list.len() != before;
        }
    }
    if !changed {
        return Ok(false);
    }
    drop_if_empty(spec, "initContainers");
    if let Some(list) = get_mut(spec, "volumes").and_then(Yaml::as_mut_vec) {
        list.retain(|v| str_at(v, "name") != Some(VOLUME));
    }
    drop_if_empty(spec, "volumes");
    if let Some(containers) = get_mut(spec, "containers").and_then(Yaml::as_mut_vec) {
        for c in containers.iter_mut() {
            give_back_container(c, record.as_ref());
        }
    }
    match &record {
        Some(r) => restore(meta, spec, r),
        None => forget_by_hand(meta),
    }
    if let Some(annotations) = get_mut(meta, "annotations") {
        remove(annotations, ANNOTATION);
    }
    drop_if_empty(meta, "annotations");
    drop_if_empty(meta, "labels");
    Ok(true)
}

/// One app container's probes and proxy variables.
fn give_back_container(c: &mut Yaml, record: Option<&Record>) {
    let name = str_at(c, "name").unwrap_or_default().to_string();
    for kind in probes::kinds() {
        match record {
            Some(r) => {
                if let Some(original) = r.probes.get(&format!("{name}/{kind}")) {
                    probes::give_back(c, kind, Some(from_json(original)));
                }
            }
            None => probes::give_back(c, kind, None),
        }
    }
    let added: Vec<String> = match record {
        Some(r) => r.env.get(&name).cloned().unwrap_or_default(),
        None => Vec::new(),
    };
    if let Some(env) = get_mut(c, "env").and_then(Yaml::as_mut_vec) {
        env.retain(|e| {
            let var = str_at(e, "name").unwrap_or_default();
            if record.is_some() {
                return !added.iter().any(|a| a == var);
            }
            // By hand: only the variables that point at the listener, as written here.
            !PROXY_ENV
                .iter()
                .any(|(v, value)| *v == var && str_at(e, "value") == Some(value))
        });
    }
    drop_if_empty(c, "env");
}

fn put_back(map: &mut Yaml, key: &str, before: &Option<String>) {
    match before {
        Some(v) => {
            set(map, key, s(v));
        }
        None => {
            remove(map, key);
        }
    }
}

fn restore(meta: &mut Yaml, spec: &mut Yaml, r: &Record) {
    if let Some(labels) = get_mut(meta, "labels") {
        for (k, before) in &r.labels {
            put_back(labels, k, before);
        }
    }
    if let Some(annotations) = get_mut(meta, "annotations") {
        for (k, before) in &r.annotations {
            put_back(annotations, k, before);
        }
    }
    for (k, before) in &r.spec {
        if before.is_null() {
            remove(spec, k);
        } else {
            set(spec, k, from_json(before));
        }
    }
}

/// A pod injected by hand: what `inject` would have added.
fn forget_by_hand(meta: &mut Yaml) {
    if let Some(labels) = get_mut(meta, "labels") {
        remove(labels, "tollgate/sidecar");
    }
    if let Some(annotations) = get_mut(meta, "annotations")
        && str_at(annotations, "prometheus.io/port") == Some(&ADMIN_PORT.to_string())
    {
        for k in [
            "prometheus.io/scrape",
            "prometheus.io/port",
            "prometheus.io/path",
        ] {
            remove(annotations, k);
        }
    }
}
