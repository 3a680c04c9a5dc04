//! The containers and the volume `inject` adds, as deploy/kubernetes/ ships them: the
//! tollgate sidecar (native: an init container that runs for the pod's life, started
//! and ready before the app, stopped after it; plain: the first container, with the
//! hooks that approximate that order), the `tollgate iptables` init container of
//! transparent capture, and the ConfigMap mounted as a directory (never with
//! `subPath`, so hot reload sees an edit).

use yaml_rust2::Yaml;

use super::configmap::json;
use super::yaml::one;

/// The sidecar's UID; the capture rules spare its own connections by it (the default of
/// `tollgate iptables --uid`).
pub const UID: u32 = tollgate_capture::SIDECAR_UID;
pub const CONTAINER: &str = "tollgate";
pub const IPTABLES: &str = "tollgate-iptables";
pub const VOLUME: &str = "tollgate-config";
/// tollgate's share of the grace period: its drain (`drain_timeout` in the ConfigMap).
pub const DRAIN_SECONDS: i64 = 20;
/// A plain sidecar's preStop sleep: the app's time to stop while tollgate still serves.
pub const PLAIN_PRE_STOP_SECONDS: i64 = 15;

/// Native sidecar (Kubernetes 1.29+) or plain container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Native,
    Plain,
}

/// The sidecar's resources, when a pod's annotations set them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Its CPU request (default 100m).
    pub cpu: Option<String>,
    /// Its memory request and limit (default: 32Mi requested, 128Mi limit).
    pub memory: Option<String>,
}

/// A Kubernetes quantity as people write one: digits (a decimal point allowed) and an
/// optional suffix.
pub fn is_quantity(q: &str) -> bool {
    const SUFFIXES: [&str; 13] = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi",
    ];
    let number_end = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(number_end);
    !number.is_empty()
        && number.bytes().any(|b| b.is_ascii_digit())
        && number.matches('.').count() <= 1
        && SUFFIXES.contains(&suffix)
}

/// The tollgate container.
pub fn tollgate(image: &str, mode: Mode, resources: &Resources) -> Result<Yaml, String> {
    let order = match mode {
        Mode::Native => "restartPolicy: Always\n".to_string(),
        Mode::Plain => format!(
            "lifecycle:\n  postStart:\n    exec:\n      command: [\"sleep\", \"2\"]\n  \
             preStop:\n    exec:\n      command: [\"sleep\", \"{PLAIN_PRE_STOP_SECONDS}\"]\n"
        ),
    };
    one(&format!(
        "name: {CONTAINER}
image: {image}
imagePullPolicy: IfNotPresent
{order}args: [\"--log-format\", \"json\"]
env:
  - name: TOLLGATE_CONFIG
    value: /etc/tollgate/tollgate.toml
  - name: RUST_LOG
    value: info
  - name: POD_IP
    valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}
  - name: POD_NAMESPACE
    valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
ports:
  - name: tollgate-in
    containerPort: 15006
    protocol: TCP
  - name: tollgate-admin
    containerPort: 15090
    protocol: TCP
startupProbe:
  httpGet: {{path: /readyz, port: tollgate-admin}}
  periodSeconds: 1
  timeoutSeconds: 1
  failureThreshold: 30
readinessProbe:
  httpGet: {{path: /readyz, port: tollgate-admin}}
  periodSeconds: 5
  timeoutSeconds: 1
  failureThreshold: 2
livenessProbe:
  httpGet: {{path: /healthz, port: tollgate-admin}}
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
resources:
  requests: {{cpu: {cpu}, memory: {memory}}}
  limits: {{memory: {limit}}}
securityContext:
  runAsNonRoot: true
  runAsUser: {UID}
  runAsGroup: {UID}
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities: {{drop: [ALL]}}
  seccompProfile: {{type: RuntimeDefault}}
volumeMounts:
  - name: {VOLUME}
    mountPath: /etc/tollgate
    readOnly: true
",
        image = json(image),
        cpu = json(resources.cpu.as_deref().unwrap_or("100m")),
        memory = json(resources.memory.as_deref().unwrap_or("32Mi")),
        limit = json(resources.memory.as_deref().unwrap_or("128Mi")),
    ))
}

/// The capture init container: `tollgate iptables` once, as root with `NET_ADMIN` only.
/// `inbound`: the pod's ports reached directly from outside, when its inbound connections
/// are captured at all (`None`: the pod has no inbound side, and they are left alone).
pub fn iptables(
    image: &str,
    inbound: Option<&[u16]>,
    exclude_outbound: &[u16],
) -> Result<Yaml, String> {
    let mut args = vec![
        format!("--uid={UID}"),
        "--outbound-port=15001".to_string(),
        match inbound {
            Some(_) => "--inbound-port=15006",
            None => "--inbound-port=0",
        }
        .to_string(),
        "--admin-port=15090".to_string(),
    ];
    let exclude_inbound = inbound.unwrap_or_default();
    if !exclude_outbound.is_empty() {
        let ports: Vec<String> = exclude_outbound.iter().map(u16::to_string).collect();
        args.push(format!("--exclude-outbound-ports={}", ports.join(",")));
    }
    if !exclude_inbound.is_empty() {
        let ports: Vec<String> = exclude_inbound.iter().map(u16::to_string).collect();
        args.push(format!("--exclude-inbound-ports={}", ports.join(",")));
    }
    let args: Vec<String> = args.iter().map(|a| json(a)).collect();
    one(&format!(
        "name: {IPTABLES}
image: {image}
imagePullPolicy: IfNotPresent
args: [{args}]
resources:
  requests: {{cpu: 10m, memory: 16Mi}}
  limits: {{memory: 64Mi}}
securityContext:
  runAsUser: 0
  runAsGroup: 0
  runAsNonRoot: false
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities: {{drop: [ALL], add: [NET_ADMIN]}}
  seccompProfile: {{type: RuntimeDefault}}
",
        image = json(image),
        args = args.join(", "),
    ))
}

/// The ConfigMap, mounted as a directory.
pub fn volume(config_map: &str) -> Result<Yaml, String> {
    one(&format!(
        "name: {VOLUME}\nconfigMap:\n  name: {}\n",
        json(config_map)
    ))
}

/// The config in the pod's annotation `annotation`, mounted as `tollgate.toml` in a
/// directory (the kubelet rewrites the file when the annotation changes).
pub fn downward_volume(annotation: &str) -> Result<Yaml, String> {
    one(&format!(
        "name: {VOLUME}\ndownwardAPI:\n  items:\n  - path: tollgate.toml\n    fieldRef:\n      \
         fieldPath: {}\n",
        json(&format!("metadata.annotations['{annotation}']"))
    ))
}

/// The proxy variables that send the app's `http://` calls to the listener.
pub const PROXY_ENV: [(&str, &str); 4] = [
    ("HTTP_PROXY", "http://127.0.0.1:15001"),
    ("http_proxy", "http://127.0.0.1:15001"),
    ("NO_PROXY", "localhost,127.0.0.1,::1"),
    ("no_proxy", "localhost,127.0.0.1,::1"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::{get, str_at};

    #[test]
    fn the_templates_read() {
        for mode in [Mode::Native, Mode::Plain] {
            let c = tollgate("registry.example/tollgate:1", mode, &Resources::default())
                .unwrap_or(Yaml::Null);
            assert_eq!(str_at(&c, "image"), Some("registry.example/tollgate:1"));
            assert_eq!(get(&c, "restartPolicy").is_some(), mode == Mode::Native);
        }
        let c = iptables("i:1", Some(&[9000, 9001]), &[6379]).unwrap_or(Yaml::Null);
        let args = crate::yaml::items(&c, "args");
        assert_eq!(
            args.last().and_then(Yaml::as_str),
            Some("--exclude-inbound-ports=9000,9001")
        );
        let c = iptables("i:1", None, &[]).unwrap_or(Yaml::Null);
        let args: Vec<_> = crate::yaml::items(&c, "args")
            .iter()
            .filter_map(Yaml::as_str)
            .map(str::to_string)
            .collect();
        assert!(args.contains(&"--inbound-port=0".to_string()), "{args:?}");
        assert!(volume("x-tollgate").is_ok());
        for ok in ["100m", "0.5", "64Mi", "1Gi", "2"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "m", "64MB", "1..5", "-1", "64 Mi"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}
