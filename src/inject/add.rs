//! Injecting one pod: the sidecar (and the capture init container), the ConfigMap's
//! volume, the scrape annotations and the label Prometheus's job keeps, the app's HTTP
//! probes moved to the admin port, the proxy variables (without capture), a grace
//! period long enough for tollgate's drain; and the ConfigMap skeleton to go with it.
//! A pod that already has a container named `tollgate` is left as it is.

use yaml_rust2::Yaml;

use super::configmap::{self, Called};
use super::pod::{Owner, position, with_parts};
use super::probes::{self, ADMIN_PORT, Probes};
use super::record::{ANNOTATION, Record};
use super::sidecar::{self, CONTAINER, DRAIN_SECONDS, Mode, PLAIN_PRE_STOP_SECONDS, UID};
use super::yaml::{get, get_mut, items, list_at, map_at, s, str_at};

/// How to inject.
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: Mode,
    pub capture: bool,
    pub image: String,
    pub iptables_image: String,
}

/// What injecting a pod did.
pub enum Injected {
    /// The pod has tollgate already: nothing changed.
    Already,
    Done {
        /// The ConfigMap to write before the workload, unless one of its name is there.
        config_map: Yaml,
        summary: String,
        warnings: Vec<String>,
    },
}

/// The grace period tollgate's shutdown needs: more than its drain (and a plain
/// sidecar's preStop sleep before it), with room for the app's own stop.
fn grace_needed(mode: Mode) -> i64 {
    match mode {
        Mode::Native => DRAIN_SECONDS + 10,
        Mode::Plain => PLAIN_PRE_STOP_SECONDS + DRAIN_SECONDS + 10,
    }
}

/// Injects the pod held by `pod` (a Pod, or a workload's template).
pub fn inject(pod: &mut Yaml, owner: &Owner, opts: &Options) -> Result<Injected, String> {
    with_parts(pod, |meta, spec| inject_parts(meta, spec, owner, opts))
        .ok_or_else(|| format!("{}: no pod spec", owner.show()))?
}

fn inject_parts(
    meta: &mut Yaml,
    spec: &mut Yaml,
    owner: &Owner,
    opts: &Options,
) -> Result<Injected, String> {
    let has = |key| position(spec, key, CONTAINER).is_some();
    let marked = get(meta, "annotations").is_some_and(|a| get(a, ANNOTATION).is_some());
    if has("initContainers") || has("containers") || marked {
        return Ok(Injected::Already);
    }
    if items(spec, "containers").is_empty() {
        return Err(format!("{}: the pod has no containers", owner.show()));
    }
    let mut record = Record::new();
    let mut warnings = Vec::new();
    let found = probes::move_to_admin(spec, &mut record);
    warnings.extend(found.kept.iter().cloned());
    let namespace = owner.namespace.as_deref().unwrap_or("default");
    let (called, notes) = configmap::services(spec, namespace);
    warnings.extend(notes);
    let app_port = configmap::app_port(spec, &found);

    label_and_annotate(meta, &mut record, &mut warnings)?;
    add_containers(spec, opts, &found)?;
    if opts.capture {
        check_capture_uid(spec, &mut warnings);
    } else {
        add_proxy_env(spec, &mut record, &mut warnings);
    }
    list_at(spec, "volumes")
        .ok_or("volumes is not a list")?
        .push(sidecar::volume(&configmap::name_for(owner))?);
    let needed = grace_needed(opts.mode);
    let grace = get(spec, "terminationGracePeriodSeconds").cloned();
    if grace.as_ref().and_then(Yaml::as_i64).unwrap_or(30) < needed {
        let before = grace
            .as_ref()
            .map_or(serde_json::Value::Null, super::yaml::to_json);
        record
            .spec
            .insert("terminationGracePeriodSeconds".into(), before);
        super::yaml::set(spec, "terminationGracePeriodSeconds", Yaml::Integer(needed));
    }
    map_at(meta, "annotations")
        .ok_or("metadata.annotations is not a map")?
        .insert(s(ANNOTATION), s(&record.to_annotation()));

    let config = configmap::config_text(owner, &called, &found, app_port, opts.capture);
    let config_map = configmap::document(owner, &config)?;
    Ok(Injected::Done {
        config_map,
        summary: summary(owner, opts, &found, &called),
        warnings,
    })
}

fn summary(owner: &Owner, opts: &Options, found: &Probes, called: &[Called]) -> String {
    let mut parts = vec![match opts.mode {
        Mode::Native => "native sidecar".to_string(),
        Mode::Plain => "plain sidecar".to_string(),
    }];
    if opts.capture {
        parts.push("capture".into());
    }
    if !found.moved.is_empty() {
        parts.push(format!(
            "probes moved to the admin port: {}",
            found.moved.join(", ")
        ));
    }
    let upstreams: Vec<&str> = called.iter().map(|c| c.service.as_str()).collect();
    parts.push(format!(
        "ConfigMap {} with {}",
        configmap::name_for(owner),
        if upstreams.is_empty() {
            "no upstream (none named in the app's environment)".to_string()
        } else {
            format!("upstreams {}", upstreams.join(", "))
        }
    ));
    format!("injected {}: {}", owner.show(), parts.join("; "))
}

/// The label Prometheus's job keeps and the scrape annotations: set, each original kept
/// in the record. Annotations for another port are the app's own: kept, and said.
fn label_and_annotate(
    meta: &mut Yaml,
    record: &mut Record,
    warnings: &mut Vec<String>,
) -> Result<(), String> {
    let labels = map_at(meta, "labels").ok_or("metadata.labels is not a map")?;
    let before = labels.replace(s("tollgate/sidecar"), s("true"));
    record.labels.insert(
        "tollgate/sidecar".into(),
        before.and_then(|v| v.as_str().map(str::to_string)),
    );
    let annotations = map_at(meta, "annotations").ok_or("metadata.annotations is not a map")?;
    let scraped = annotations
        .get(&s("prometheus.io/port"))
        .and_then(Yaml::as_str);
    if let Some(port) = scraped.filter(|p| *p != ADMIN_PORT.to_string()) {
        warnings.push(format!(
            "the pod is scraped on port {port} by its prometheus.io annotations, which allow \
             one port: scrape tollgate with deploy/kubernetes/podmonitor.yaml"
        ));
        return Ok(());
    }
    for (key, value) in [
        ("prometheus.io/scrape", "true".to_string()),
        ("prometheus.io/port", ADMIN_PORT.to_string()),
        ("prometheus.io/path", "/metrics".to_string()),
    ] {
        let before = annotations.replace(s(key), s(&value));
        record.annotations.insert(
            key.into(),
            before.and_then(|v| v.as_str().map(str::to_string)),
        );
    }
    Ok(())
}

fn add_containers(spec: &mut Yaml, opts: &Options, found: &Probes) -> Result<(), String> {
    let tollgate = sidecar::tollgate(&opts.image, opts.mode)?;
    // The kubelet checks these ports itself with TCP: captured, tollgate would accept
    // for an app that is down.
    let iptables = sidecar::iptables(&opts.iptables_image, &found.tcp_ports)?;
    let inits = "initContainers";
    if opts.mode == Mode::Native || opts.capture {
        super::yaml::make_list_before(spec, inits, "containers");
    }
    match opts.mode {
        Mode::Native => {
            // First of all, so the app's own init containers already have it.
            let list = list_at(spec, inits).ok_or("initContainers is not a list")?;
            list.insert(0, tollgate);
            if opts.capture {
                list.insert(0, iptables);
            }
        }
        Mode::Plain => {
            list_at(spec, "containers")
                .ok_or("containers is not a list")?
                .insert(0, tollgate);
            if opts.capture {
                // Last: the app's init containers run before capture, since no tollgate
                // runs yet to take their connections.
                list_at(spec, inits)
                    .ok_or("initContainers is not a list")?
                    .push(iptables);
            }
        }
    }
    Ok(())
}

/// Without capture the app is pointed at the listener by the proxy variables; a
/// container that sets any of them already is left alone.
fn add_proxy_env(spec: &mut Yaml, record: &mut Record, warnings: &mut Vec<String>) {
    let Some(containers) = get_mut(spec, "containers").and_then(Yaml::as_mut_vec) else {
        return;
    };
    for c in containers.iter_mut() {
        let name = str_at(c, "name").unwrap_or_default().to_string();
        if name == CONTAINER {
            continue;
        }
        let set_already: Vec<&str> = items(c, "env")
            .iter()
            .filter_map(|e| str_at(e, "name"))
            .filter(|n| {
                sidecar::PROXY_ENV.iter().any(|(p, _)| p == n)
                    || n.eq_ignore_ascii_case("https_proxy")
            })
            .collect();
        if !set_already.is_empty() {
            warnings.push(format!(
                "{name}: sets {} already: its proxy settings are left as they are",
                set_already.join(", ")
            ));
            continue;
        }
        let Some(env) = list_at(c, "env") else {
            warnings.push(format!("{name}: env is not a list"));
            continue;
        };
        for (var, value) in sidecar::PROXY_ENV {
            let mut entry = yaml_rust2::yaml::Hash::new();
            entry.insert(s("name"), s(var));
            entry.insert(s("value"), s(value));
            env.push(Yaml::Hash(entry));
        }
        record.env.insert(
            name,
            sidecar::PROXY_ENV
                .iter()
                .map(|(v, _)| v.to_string())
                .collect(),
        );
    }
}

/// Capture spares tollgate's UID: an app running as that UID would not be captured.
fn check_capture_uid(spec: &Yaml, warnings: &mut Vec<String>) {
    let pod_uid = get(spec, "securityContext").and_then(|s| get(s, "runAsUser")?.as_i64());
    for c in items(spec, "containers") {
        let name = str_at(c, "name").unwrap_or_default();
        if name == CONTAINER {
            continue;
        }
        let uid = get(c, "securityContext")
            .and_then(|s| get(s, "runAsUser")?.as_i64())
            .or(pod_uid);
        if uid == Some(i64::from(UID)) {
            warnings.push(format!(
                "{name} runs as UID {UID}, tollgate's: capture spares that UID, so its calls \
                 would not be captured; give it another runAsUser"
            ));
        }
        if items(c, "env")
            .iter()
            .any(|e| str_at(e, "name").is_some_and(|n| n.eq_ignore_ascii_case("http_proxy")))
        {
            warnings.push(format!("{name}: with capture the app needs no http_proxy"));
        }
    }
}
