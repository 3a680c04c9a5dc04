//! Injecting one pod: the sidecar (and the capture init container), the ConfigMap's
//! volume, the scrape annotations and the label Prometheus's job keeps, the app's HTTP
//! probes moved to the admin port, the proxy variables (without capture), a grace
//! period long enough for tollgate's drain; and the ConfigMap skeleton to go with it.
//! A pod that already has a container named `tollgate` is left as it is.

use yaml_rust2::Yaml;

use super::configmap::{self, Called};
use super::pod::{self, Owner, position, with_parts};
use super::probes::{self, ADMIN_PORT, Probes};
use super::rbac::Watchers;
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
    pub delivery: Delivery,
    /// Who the input's RBAC lets watch EndpointSlices: their pods' upstreams in the
    /// namespaces they may watch get `discovery = "kubernetes"`.
    pub watchers: std::sync::Arc<Watchers>,
}

/// How the config reaches the sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// A ConfigMap document written before the workload, mounted as a directory.
    ConfigMap,
    /// The admission webhook, which can change only the pod under review: the config in
    /// the pod's annotation `tollgate.io/config`, mounted as a file through the downward
    /// API, unless `tollgate.io/config-map` names a ConfigMap to mount instead.
    Annotation,
}

/// The pod annotation that holds the config under [`Delivery::Annotation`].
pub const CONFIG: &str = "tollgate.io/config";
/// The pod annotation naming a ConfigMap of the user's own to mount instead.
pub const CONFIG_MAP: &str = "tollgate.io/config-map";
/// The pod annotation choosing the upstreams' discovery (`kubernetes`; default DNS).
pub const DISCOVERY: &str = "tollgate.io/discovery";

/// What injecting a pod did.
pub enum Injected {
    /// The pod has tollgate already: nothing changed.
    Already,
    /// A pod tollgate must not touch (why, for the note): nothing changed.
    LeftAlone(String),
    /// Injected already, with other options: the sidecar is as these options make it;
    /// the config is kept.
    Updated {
        summary: String,
        warnings: Vec<String>,
    },
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

/// Injects the pod held by `pod` (a Pod, or a workload's template). A pod injected
/// already is injected anew as these options would inject it (another image, mode or
/// capture): [`Injected::Updated`] when that changes it, its config (the ConfigMap, or
/// the annotation the webhook wrote, edits and all) kept as it is.
pub fn inject(pod: &mut Yaml, owner: &Owner, opts: &Options) -> Result<Injected, String> {
    let first = with_parts(pod, |meta, spec| inject_parts(meta, spec, owner, opts))
        .ok_or_else(|| format!("{}: no pod spec", owner.show()))??;
    if !matches!(first, Injected::Already) {
        return Ok(first);
    }
    let kept = get(pod, "metadata")
        .and_then(|m| get(m, "annotations"))
        .and_then(|a| get(a, CONFIG))
        .cloned();
    let mut fresh = pod.clone();
    if !super::remove::uninject(&mut fresh, owner)? {
        return Ok(Injected::Already);
    }
    if get(&fresh, "metadata").is_none() {
        super::yaml::set(&mut fresh, "metadata", Yaml::Hash(Default::default()));
    }
    let again = with_parts(&mut fresh, |meta, spec| {
        inject_parts(meta, spec, owner, opts)
    })
    .ok_or_else(|| format!("{}: no pod spec", owner.show()))??;
    let Injected::Done {
        summary, warnings, ..
    } = again
    else {
        return Ok(Injected::Already);
    };
    if let (Some(config), Some(meta)) = (kept, get_mut(&mut fresh, "metadata"))
        && let Some(annotations) = map_at(meta, "annotations")
        && annotations.contains_key(&s(CONFIG))
    {
        annotations.insert(s(CONFIG), config);
    }
    // Compared as Kubernetes stores objects: the order of a map's keys, and an empty
    // list or map against none, are no change (`--uninject` cannot always put a key back
    // where it was, nor tell an `env: []` written from one it emptied).
    if stored(super::yaml::to_json(&fresh)) == stored(super::yaml::to_json(pod)) {
        return Ok(Injected::Already);
    }
    *pod = fresh;
    Ok(Injected::Updated { summary, warnings })
}

fn inject_parts(
    meta: &mut Yaml,
    spec: &mut Yaml,
    owner: &Owner,
    opts: &Options,
) -> Result<Injected, String> {
    if let Some(why) = must_not_touch(meta, spec) {
        return Ok(Injected::LeftAlone(why));
    }
    let has = |key| position(spec, key, CONTAINER).is_some();
    let marked = get(meta, "annotations").is_some_and(|a| get(a, ANNOTATION).is_some());
    if has("initContainers") || has("containers") || marked {
        return Ok(Injected::Already);
    }
    if items(spec, "containers").is_empty() {
        return Err(format!("{}: the pod has no containers", owner.show()));
    }
    check_ports(spec).map_err(|e| format!("{}: {e}", owner.show()))?;
    let ann = Annotations::read(meta).map_err(|e| format!("{}: {e}", owner.show()))?;
    let opts = &Options {
        mode: ann.mode.unwrap_or(opts.mode),
        ..opts.clone()
    };
    if (owner.runs_to_completion() || pod::runs_to_completion(meta, spec))
        && opts.mode == Mode::Plain
    {
        return Ok(Injected::LeftAlone(
            "its pods run to completion and a plain sidecar would keep them running: \
             skipped (the native sidecar, without --plain, ends with them)"
                .to_string(),
        ));
    }
    let mut record = Record::new();
    let mut warnings = Vec::new();
    let found = probes::move_to_admin(spec, &mut record);
    warnings.extend(found.kept.iter().cloned());
    let (called, notes) = configmap::services(spec, &ann.opaque);
    warnings.extend(notes);
    let app_port = configmap::app_port(spec, &found, &ann.opaque);

    label_and_annotate(meta, &mut record, &mut warnings)?;
    // `kubectl logs` and `exec` pick the app, not tollgate, when no container is named.
    if let Some(first) = items(spec, "containers")
        .first()
        .and_then(|c| str_at(c, "name"))
        .map(str::to_string)
    {
        let annotations = map_at(meta, "annotations").ok_or("metadata.annotations is not a map")?;
        if !annotations.contains_key(&s(DEFAULT_CONTAINER)) {
            annotations.insert(s(DEFAULT_CONTAINER), s(&first));
            record.annotations.insert(DEFAULT_CONTAINER.into(), None);
        }
    }
    // Inbound, capture spares the ports the kubelet checks with TCP (captured, tollgate
    // would accept for an app that is down) and the app's ports that are not HTTP.
    let mut exclude_inbound = found.tcp_ports.clone();
    for c in items(spec, "containers") {
        for p in configmap::tcp_ports(c) {
            if ann.opaque.contains(&p) && !exclude_inbound.contains(&p) {
                exclude_inbound.push(p);
            }
        }
    }
    // Without an app port there is no inbound side to capture callers for: they reach
    // the app directly, as they would without tollgate.
    let inbound = app_port.map(|_| exclude_inbound.as_slice());
    if opts.capture && app_port.is_none() {
        warnings.push(
            "no HTTP port of the app found (no containerPort, no HTTP probe): capture leaves \
             inbound connections alone; declare the app's containerPort to put tollgate's \
             inbound side in front of it"
                .to_string(),
        );
    }
    add_containers(spec, opts, &ann, inbound)?;
    if opts.capture {
        check_capture_uid(spec, &mut warnings);
    } else {
        add_proxy_env(spec, &mut record, &mut warnings);
    }
    let account = spec_account(spec).map(str::to_string);
    let discovery = |c: &Called| match ann.discovery {
        Some(d) => d,
        None if may_watch(account.as_deref(), owner, &opts.watchers, c) => {
            configmap::Discovery::Kubernetes
        }
        None => configmap::Discovery::Dns,
    };
    let config = configmap::config_text(owner, &called, &found, app_port, opts.capture, &discovery);
    let volume = match (opts.delivery, &ann.config_map) {
        (Delivery::ConfigMap, _) => sidecar::volume(&configmap::name_for(owner))?,
        (Delivery::Annotation, Some(name)) => sidecar::volume(name)?,
        (Delivery::Annotation, None) => {
            let annotations =
                map_at(meta, "annotations").ok_or("metadata.annotations is not a map")?;
            let before = annotations.replace(s(CONFIG), s(&config));
            record.annotations.insert(
                CONFIG.into(),
                before.and_then(|v| v.as_str().map(str::to_string)),
            );
            sidecar::downward_volume(CONFIG)?
        }
    };
    list_at(spec, "volumes")
        .ok_or("volumes is not a list")?
        .push(volume);
    let needed = grace_needed(opts.mode);
    let grace = get(spec, "terminationGracePeriodSeconds").cloned();
    if grace.as_ref().and_then(Yaml::as_i64).unwrap_or(30) < needed {
        let before = grace
            .as_ref()
            .map_or(serde_json::Value::Null, super::yaml::to_json);
        warnings.push(format!(
            "terminationGracePeriodSeconds raised from {} to {needed}: tollgate's drain \
             ({DRAIN_SECONDS} s) must fit in it",
            match &before {
                serde_json::Value::Null => "30 (the default)".to_string(),
                v => v.to_string(),
            }
        ));
        record
            .spec
            .insert("terminationGracePeriodSeconds".into(), before);
        super::yaml::set(spec, "terminationGracePeriodSeconds", Yaml::Integer(needed));
    }
    map_at(meta, "annotations")
        .ok_or("metadata.annotations is not a map")?
        .insert(s(ANNOTATION), s(&record.to_annotation()));

    let config_map = configmap::document(owner, &config)?;
    Ok(Injected::Done {
        config_map,
        summary: summary(owner, opts, &found, &called, &discovery),
        warnings,
    })
}

/// `v` without its empty lists, maps and nulls, as the API server would keep it.
fn stored(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    match v {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, stored(v)))
                .filter(|(_, v)| !empty(v))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(stored).collect()),
        other => other,
    }
}

/// Another mesh's proxies, by their containers' names.
const OTHER_MESHES: [&str; 2] = ["istio-proxy", "linkerd-proxy"];
/// The ports tollgate's sidecar listens on, and what each is.
pub const TOLLGATE_PORTS: [(u16, &str); 3] = [
    (15001, "listener"),
    (15006, "inbound listener"),
    (ADMIN_PORT, "admin port"),
];
/// Pod annotations that steer `inject`.
pub const INJECT: &str = "tollgate.io/inject";
pub const OPAQUE: &str = "tollgate.io/opaque-ports";
pub const EXCLUDE_OUTBOUND: &str = "tollgate.io/exclude-outbound-ports";
pub const MODE: &str = "tollgate.io/mode";
pub const PROXY_CPU: &str = "tollgate.io/proxy-cpu";
pub const PROXY_MEMORY: &str = "tollgate.io/proxy-memory";
/// The container `kubectl logs` and `exec` pick when none is named.
const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";

/// Why a pod must be left as it is, if it must: it shares the node's network
/// (capture would rewrite the node's rules, and a sidecar's ports are the node's), it
/// says no, or another mesh's proxy is in it already.
pub fn must_not_touch(meta: &Yaml, spec: &Yaml) -> Option<String> {
    if get(spec, "hostNetwork").and_then(Yaml::as_bool) == Some(true) {
        return Some("hostNetwork: true (its network is the node's)".to_string());
    }
    let says = get(meta, "annotations").and_then(|a| get(a, INJECT));
    let no = match says {
        Some(Yaml::String(v)) => v.eq_ignore_ascii_case("false") || v == "disabled",
        Some(Yaml::Boolean(b)) => !b,
        _ => false,
    };
    if no {
        return Some(format!("annotated {INJECT}: \"false\""));
    }
    for key in ["containers", "initContainers"] {
        for c in items(spec, key) {
            if let Some(name) = str_at(c, "name").filter(|n| OTHER_MESHES.contains(n)) {
                return Some(format!("it has another mesh's proxy ({name})"));
            }
        }
    }
    None
}

/// A container port that is also one of tollgate's: an error naming both.
pub fn check_ports(spec: &Yaml) -> Result<(), String> {
    for key in ["containers", "initContainers"] {
        for c in items(spec, key) {
            let name = str_at(c, "name").unwrap_or_default();
            if name == CONTAINER {
                continue;
            }
            for p in items(c, "ports") {
                let Some(port) = get(p, "containerPort").and_then(Yaml::as_i64) else {
                    continue;
                };
                if let Some((_, what)) = TOLLGATE_PORTS.iter().find(|(t, _)| i64::from(*t) == port)
                {
                    let named = str_at(p, "name").map_or(String::new(), |n| format!(" ({n})"));
                    return Err(format!(
                        "container {name}'s port {port}{named} collides with tollgate's {what} \
                         {port}: move the app to another port"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// What the pod's annotations ask of `inject`.
#[derive(Debug, Default)]
pub struct Annotations {
    /// `tollgate.io/config-map`: the ConfigMap to mount (the webhook).
    pub config_map: Option<String>,
    /// `tollgate.io/discovery`: `kubernetes` (the namespace carries the RBAC to watch
    /// EndpointSlices) or `dns`, for every upstream; unset, the input's RBAC decides.
    pub discovery: Option<configmap::Discovery>,
    /// `tollgate.io/mode: native|plain`, over `--plain`.
    pub mode: Option<Mode>,
    /// `tollgate.io/proxy-cpu` and `tollgate.io/proxy-memory`: the sidecar's requests
    /// (memory: its limit too).
    pub resources: sidecar::Resources,
    /// Ports that are not HTTP: the well-known ones and `tollgate.io/opaque-ports`.
    pub opaque: Vec<u16>,
    /// Ports capture leaves alone: the opaque ones and
    /// `tollgate.io/exclude-outbound-ports`.
    pub exclude_outbound: Vec<u16>,
}

impl Annotations {
    pub fn read(meta: &Yaml) -> Result<Annotations, String> {
        let ann = get(meta, "annotations");
        let ports = |key: &str| -> Result<Vec<u16>, String> {
            let Some(v) = ann.and_then(|a| get(a, key)) else {
                return Ok(Vec::new());
            };
            let text = match v {
                Yaml::String(t) => t.clone(),
                Yaml::Integer(i) => i.to_string(),
                _ => {
                    return Err(format!(
                        "annotation {key}: a list of ports, as \"5432,6379\""
                    ));
                }
            };
            text.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                        format!("annotation {key}: `{p}` is not a port (as \"5432,6379\")")
                    })
                })
                .collect()
        };
        let mut opaque = configmap::OPAQUE_PORTS.to_vec();
        for p in ports(OPAQUE)? {
            if !opaque.contains(&p) {
                opaque.push(p);
            }
        }
        let mut exclude_outbound = opaque.clone();
        for p in ports(EXCLUDE_OUTBOUND)? {
            if !exclude_outbound.contains(&p) {
                exclude_outbound.push(p);
            }
        }
        let text = |key: &str| ann.and_then(|a| str_at(a, key)).map(str::trim);
        let discovery = match text(DISCOVERY) {
            None => None,
            Some("dns") => Some(configmap::Discovery::Dns),
            Some("kubernetes") => Some(configmap::Discovery::Kubernetes),
            Some(other) => {
                return Err(format!(
                    "annotation {DISCOVERY}: `{other}` is neither dns nor kubernetes"
                ));
            }
        };
        let mode = match text(MODE) {
            None => None,
            Some("native") => Some(Mode::Native),
            Some("plain") => Some(Mode::Plain),
            Some(other) => {
                return Err(format!(
                    "annotation {MODE}: `{other}` is neither native nor plain"
                ));
            }
        };
        let quantity = |key: &str| -> Result<Option<String>, String> {
            let Some(q) = ann.and_then(|a| get(a, key)) else {
                return Ok(None);
            };
            let q = match q {
                Yaml::String(t) => t.trim().to_string(),
                Yaml::Integer(i) => i.to_string(),
                Yaml::Real(r) => r.clone(),
                _ => String::new(),
            };
            if sidecar::is_quantity(&q) {
                Ok(Some(q))
            } else {
                Err(format!(
                    "annotation {key}: `{q}` is not a Kubernetes quantity (as \"250m\" or \"64Mi\")"
                ))
            }
        };
        let resources = sidecar::Resources {
            cpu: quantity(PROXY_CPU)?,
            memory: quantity(PROXY_MEMORY)?,
        };
        Ok(Annotations {
            mode,
            resources,
            config_map: text(CONFIG_MAP)
                .filter(|n| !n.is_empty())
                .map(str::to_string),
            discovery,
            opaque,
            exclude_outbound,
        })
    }
}

/// The pod's service account, when it has a token to call the API with: none when
/// `automountServiceAccountToken: false`.
fn spec_account(spec: &Yaml) -> Option<&str> {
    if get(spec, "automountServiceAccountToken").and_then(Yaml::as_bool) == Some(false) {
        return None;
    }
    Some(
        str_at(spec, "serviceAccountName")
            .or_else(|| str_at(spec, "serviceAccount"))
            .unwrap_or("default"),
    )
}

/// Whether the input's RBAC lets the pod's service account watch the EndpointSlices of
/// the namespace `c` is called in.
fn may_watch(account: Option<&str>, owner: &Owner, watchers: &Watchers, c: &Called) -> bool {
    account.is_some_and(|account| {
        watchers.may_watch(
            owner.namespace.as_deref(),
            account,
            configmap::namespace_named(&c.host),
        )
    })
}

fn summary(
    owner: &Owner,
    opts: &Options,
    found: &Probes,
    called: &[Called],
    discovery: &dyn Fn(&Called) -> configmap::Discovery,
) -> String {
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
    let watched: Vec<&str> = called
        .iter()
        .filter(|c| discovery(c) == configmap::Discovery::Kubernetes)
        .map(|c| c.service.as_str())
        .collect();
    if !watched.is_empty() {
        parts.push(format!(
            "discovery from the Kubernetes API for {}",
            watched.join(", ")
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

fn add_containers(
    spec: &mut Yaml,
    opts: &Options,
    ann: &Annotations,
    inbound: Option<&[u16]>,
) -> Result<(), String> {
    let tollgate = sidecar::tollgate(&opts.image, opts.mode, &ann.resources)?;
    let iptables = sidecar::iptables(&opts.iptables_image, inbound, &ann.exclude_outbound)?;
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
