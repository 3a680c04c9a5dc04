//! `tollgate inject` on real-world manifests (the shared test data beside the
//! repository, `../shared/fixtures/kubernetes/`, read in place and skipped loudly when
//! absent): what a platform engineer injecting a real shop relies on. No timeout of
//! tollgate's own; only HTTP becomes an upstream (Redis stays Redis, and capture leaves
//! its port alone); names stay as the app wrote them; pods that must not be touched
//! (the node's network, an opt-out, another mesh) come back byte for byte; a port
//! clash is an error naming both; every output passes `kubernetes-validate --strict`
//! when that tool is installed.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::manifests;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::tempdir::TempDir;
use manifests::{container, docs, inject, kind_named, names};
use yaml_rust2::Yaml;

/// A real-world manifest, or None (after a SKIP line) when the shared data is absent.
fn real(path: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/kubernetes")
        .join(path);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: {} is absent", p.display());
        None
    }
}

fn inject_ok(args: &[&str], stdin: Option<&str>) -> (String, String) {
    let (code, out, err) = inject(args, stdin);
    assert_eq!(code, 0, "tollgate inject {args:?} failed:\n{err}");
    (out, err)
}

/// Every ConfigMap tollgate wrote: (its name, its tollgate.toml).
fn configs(docs: &[Yaml]) -> Vec<(String, String)> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some("ConfigMap"))
        .filter_map(|d| {
            Some((
                d["metadata"]["name"].as_str()?.to_string(),
                d["data"]["tollgate.toml"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The lines of a config that are not comments.
fn settings(config: &str) -> Vec<&str> {
    config
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect()
}

/// The config passes `tollgate check --strict`.
fn check_strict(name: &str, config: &str) {
    let (code, text) = manifests::check_strict(config);
    assert_eq!(code, Some(0), "{name}: check --strict:\n{text}\n{config}");
}

/// `kubernetes-validate --strict` against Kubernetes 1.29 (the first with native
/// sidecars) and 1.37, when it is installed; said once when it is not.
fn validate(name: &str, text: &str) {
    let Ok(status) = Command::new("kubernetes-validate")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    else {
        let msg = format!("SKIP: kubernetes-validate is not installed: {name} not validated");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{msg} (scripts/deps.sh installs it; under CI this fails)"
        );
        eprintln!("{msg}");
        return;
    };
    if !status.success() {
        return;
    }
    let dir = TempDir::new("inject-real-validate");
    let path = dir.path().join("out.yaml");
    std::fs::write(&path, text).unwrap();
    // The first release with native sidecars, and the newest.
    for version in ["1.29.0", "1.37.0"] {
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "--no-warn", "-k", version])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: kubernetes-validate --strict -k {version}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_shop_gets_no_timeout_of_tollgates_own_and_its_names_as_written() {
    let Some(path) = real("microservices-demo/kubernetes-manifests.yaml") else {
        return;
    };
    for flags in [vec![], vec!["--capture"], vec!["--plain"]] {
        let mut args = flags.clone();
        args.push(path.to_str().unwrap());
        let (out, _) = inject_ok(&args, None);
        let got = docs(&out);
        let configs = configs(&got);
        assert_eq!(configs.len(), 12, "{flags:?}: one per Deployment");
        for (name, config) in &configs {
            for line in settings(config) {
                assert!(
                    !line.starts_with("request_timeout") && !line.starts_with("attempt_timeout"),
                    "{name}: a timeout of tollgate's own: {line}"
                );
                assert!(
                    !line.contains("cluster.local") && !line.contains(".default"),
                    "{name}: a name pinned at inject time: {line}"
                );
            }
            assert!(
                !config.contains("[upstreams.") || config.contains("request_timeout = "),
                "{name}: the comments say how to add a timeout"
            );
            check_strict(name, config);
        }
        let frontend = &configs
            .iter()
            .find(|(n, _)| n == "frontend-tollgate")
            .unwrap()
            .1;
        for want in [
            "[upstreams.productcatalogservice]",
            "authorities = [\"productcatalogservice\"]",
            "endpoints = [\"productcatalogservice:3550\"]",
        ] {
            assert!(frontend.contains(want), "{want} not in\n{frontend}");
        }
        // Comments in the workloads survive, each where it was.
        let input = std::fs::read_to_string(&path).unwrap();
        for comment in input.lines().filter(|l| l.trim_start().starts_with('#')) {
            assert!(
                out.lines().any(|l| l.trim() == comment.trim()),
                "{flags:?}: lost {comment}"
            );
        }
        assert!(
            out.contains("            # - name: ENV_PLATFORM\n            #   value: \"aws\"\n            - name: ENABLE_PROFILER\n"),
            "{out}"
        );
        validate(&format!("microservices-demo {flags:?}"), &out);
    }
}

#[test]
fn redis_is_never_an_upstream_and_capture_leaves_its_port_alone() {
    let Some(path) = real("microservices-demo/kubernetes-manifests.yaml") else {
        return;
    };
    let (out, notes) = inject_ok(&["--capture", path.to_str().unwrap()], None);
    let got = docs(&out);
    let cart = kind_named(&got, "ConfigMap", "cartservice-tollgate")["data"]["tollgate.toml"]
        .as_str()
        .unwrap();
    assert!(!cart.contains("redis"), "Redis became an upstream:\n{cart}");
    assert!(
        notes.contains("REDIS_ADDR=redis-cart:6379: port 6379 is not HTTP"),
        "{notes}"
    );
    let spec = &kind_named(&got, "Deployment", "cartservice")["spec"]["template"]["spec"];
    let iptables = container(&spec["initContainers"], "tollgate-iptables");
    let args: Vec<&str> = iptables["args"]
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    let outbound = args
        .iter()
        .find_map(|a| a.strip_prefix("--exclude-outbound-ports="))
        .unwrap_or_else(|| panic!("no --exclude-outbound-ports in {args:?}"));
    let ports: Vec<&str> = outbound.split(',').collect();
    for p in [
        "25", "587", "3306", "4222", "5432", "6379", "9042", "9092", "9300", "11211", "27017",
    ] {
        assert!(ports.contains(&p), "{p} not in {outbound}");
    }
    // Redis's own pod: no inbound side in front of it, and capture leaves its callers
    // alone (its port too).
    let redis = kind_named(&got, "ConfigMap", "redis-cart-tollgate")["data"]["tollgate.toml"]
        .as_str()
        .unwrap();
    assert!(!redis.contains("[inbound]"), "{redis}");
    let spec = &kind_named(&got, "Deployment", "redis-cart")["spec"]["template"]["spec"];
    let iptables = container(&spec["initContainers"], "tollgate-iptables");
    assert!(
        iptables["args"]
            .as_vec()
            .unwrap()
            .iter()
            .any(|a| a.as_str() == Some("--inbound-port=0")),
        "{:?}",
        iptables["args"]
    );
}

#[test]
fn capture_leaves_the_callers_of_a_pod_without_an_http_port_alone() {
    // No containerPort, no HTTP probe: no inbound side is written, so the callers must
    // reach the app as they would without tollgate, not a port nothing listens on.
    let manifest = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: worker\nspec:\n  \
                    selector: {matchLabels: {app: worker}}\n  template:\n    metadata:\n      \
                    labels: {app: worker}\n    spec:\n      containers:\n      - name: worker\n        \
                    image: worker:1\n        env:\n        - {name: API, value: \"http://api:8080\"}\n";
    let (out, notes) = inject_ok(&["--capture", "-"], Some(manifest));
    let got = docs(&out);
    let config = kind_named(&got, "ConfigMap", "worker-tollgate")["data"]["tollgate.toml"]
        .as_str()
        .unwrap();
    assert!(!config.contains("[inbound]"), "{config}");
    assert!(config.contains("[upstreams.api]"), "{config}");
    let spec = &kind_named(&got, "Deployment", "worker")["spec"]["template"]["spec"];
    let args: Vec<&str> = container(&spec["initContainers"], "tollgate-iptables")["args"]
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert!(args.contains(&"--inbound-port=0"), "{args:?}");
    assert!(
        notes.contains("capture leaves inbound connections alone"),
        "{notes}"
    );
    validate("worker", &out);
}

#[test]
fn the_opaque_ports_annotation_adds_to_the_well_known_ones() {
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: app\n  annotations:\n    \
                    tollgate.io/opaque-ports: \"7000, 8000\"\n    \
                    tollgate.io/exclude-outbound-ports: \"4443\"\nspec:\n  containers:\n  \
                    - name: app\n    image: app:1\n    env:\n    \
                    - {name: A, value: \"legacy:7000\"}\n    \
                    - {name: B, value: \"http://api:8000\"}\n    \
                    - {name: C, value: \"http://web:8080\"}\n";
    let (out, _) = inject_ok(&["--capture", "-"], Some(manifest));
    let got = docs(&out);
    let config = kind_named(&got, "ConfigMap", "app-tollgate")["data"]["tollgate.toml"]
        .as_str()
        .unwrap();
    assert!(config.contains("[upstreams.web]"), "{config}");
    assert!(!config.contains("legacy") || !config.contains("[upstreams.legacy]"));
    assert!(!config.contains("[upstreams.api]"), "{config}");
    let pod = kind_named(&got, "Pod", "app");
    let args = &container(&pod["spec"]["initContainers"], "tollgate-iptables")["args"];
    let outbound = args
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(Yaml::as_str)
        .find_map(|a| a.strip_prefix("--exclude-outbound-ports="))
        .unwrap();
    assert!(outbound.ends_with(",7000,8000,4443"), "{outbound}");

    let bad = manifest.replace("\"7000, 8000\"", "\"7000,http\"");
    let (code, out, err) = inject(&["-"], Some(&bad));
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(
        err.contains("tollgate.io/opaque-ports: `http` is not a port"),
        "{err}"
    );
}

#[test]
fn a_host_network_daemonset_is_left_alone_even_with_capture() {
    let Some(path) = real("kube-prometheus/nodeExporter-daemonset.yaml") else {
        return;
    };
    let input = std::fs::read_to_string(&path).unwrap();
    for flags in [vec!["--capture"], vec![], vec!["--plain", "--capture"]] {
        let mut args = flags.clone();
        args.push(path.to_str().unwrap());
        let (out, notes) = inject_ok(&args, None);
        assert_eq!(out, input, "{flags:?}: byte for byte");
        assert!(
            notes.contains("DaemonSet/node-exporter: left alone: hostNetwork: true"),
            "{notes}"
        );
        assert!(!out.contains("NET_ADMIN"));
    }
}

#[test]
fn opted_out_pods_and_other_meshes_are_left_alone() {
    let base = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  \
                selector: {matchLabels: {app: web}}\n  template:\n    metadata:\n      \
                labels: {app: web}\nANNOTATIONS    spec:\n      containers:\n      \
                - name: web\n        image: web:1\nMORE";
    for (what, annotations, more) in [
        (
            "annotated tollgate.io/inject: \"false\"",
            "      annotations:\n        tollgate.io/inject: \"false\"\n",
            "",
        ),
        (
            "it has another mesh's proxy (istio-proxy)",
            "",
            "      - name: istio-proxy\n        image: proxyv2:1\n",
        ),
        (
            "it has another mesh's proxy (linkerd-proxy)",
            "",
            "      - name: linkerd-proxy\n        image: proxy:1\n",
        ),
    ] {
        let manifest = base
            .replace("ANNOTATIONS", annotations)
            .replace("MORE", more);
        let (out, notes) = inject_ok(&["--capture", "-"], Some(&manifest));
        assert_eq!(out, manifest, "{what}");
        assert!(
            notes.contains(&format!("Deployment/web: left alone: {what}")),
            "{notes}"
        );
    }
}

#[test]
fn a_port_of_tollgates_own_in_the_app_is_an_error_naming_both() {
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: app\nspec:\n  containers:\n  \
                    - name: app\n    image: app:1\n    ports:\n    \
                    - {name: metrics, containerPort: 15090}\n";
    let (code, out, err) = inject(&["-"], Some(manifest));
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("Pod/app: container app's port 15090 (metrics) collides with tollgate's admin port 15090"),
        "{err}"
    );
}

#[test]
fn every_real_manifest_injects_twice_to_the_same_and_validates() {
    for file in [
        "microservices-demo/kubernetes-manifests.yaml",
        "kubernetes-examples/cassandra-statefulset.yaml",
        "kubernetes-examples/cockroachdb-statefulset.yaml",
        "kube-prometheus/grafana-deployment.yaml",
        "kube-prometheus/nodeExporter-daemonset.yaml",
        "argo-cd/install.yaml",
    ] {
        let Some(path) = real(file) else {
            return;
        };
        for flags in [vec![], vec!["--capture"]] {
            let mut args = flags.clone();
            args.push(path.to_str().unwrap());
            let (once, _) = inject_ok(&args, None);
            let mut again = flags.clone();
            again.push("-");
            let (twice, _) = inject_ok(&again, Some(&once));
            assert_eq!(twice, once, "{file} {flags:?}: a second inject changed it");
            for (name, config) in configs(&docs(&once)) {
                check_strict(&format!("{file}: {name}"), &config);
            }
            validate(&format!("{file} {flags:?}"), &once);
        }
    }
}

#[test]
fn re_injecting_with_other_options_updates_the_sidecar_and_keeps_the_config() {
    let Some(path) = real("microservices-demo/kubernetes-manifests.yaml") else {
        return;
    };
    let (once, _) = inject_ok(&[path.to_str().unwrap()], None);
    // The platform engineer edits a ConfigMap, as they are told to.
    let edited = once.replacen("min_per_sec = 5", "min_per_sec = 7 # edited by hand", 1);
    assert_ne!(edited, once);
    let (same, notes) = inject_ok(&["-"], Some(&edited));
    assert_eq!(same, edited, "the same options: byte for byte");
    assert!(!notes.contains("re-injected"), "{notes}");

    let (updated, notes) = inject_ok(
        &["--capture", "--image", "registry.example/tollgate:2", "-"],
        Some(&edited),
    );
    assert!(
        notes.contains("re-injected Deployment/frontend: native sidecar; capture"),
        "{notes}"
    );
    assert!(
        updated.contains("min_per_sec = 7 # edited by hand"),
        "the edit is kept"
    );
    let got = docs(&updated);
    assert_eq!(configs(&got).len(), 12, "no ConfigMap written twice");
    let spec = &kind_named(&got, "Deployment", "frontend")["spec"]["template"]["spec"];
    assert_eq!(
        names(&spec["initContainers"]),
        ["tollgate-iptables", "tollgate"]
    );
    assert_eq!(
        container(&spec["initContainers"], "tollgate")["image"].as_str(),
        Some("registry.example/tollgate:2")
    );
    let server = container(&spec["containers"], "server");
    assert!(
        server["env"]
            .as_vec()
            .unwrap()
            .iter()
            .all(|e| e["name"].as_str() != Some("http_proxy")),
        "capture: no proxy variables left"
    );
    // And back: the first options give the first output again.
    let (back, _) = inject_ok(&["-"], Some(&updated));
    assert_eq!(back, edited);

    // A workload whose ConfigMap was applied apart from it gets none written anew.
    let deployment = once
        .split("\n---\n")
        .find(|d| d.contains("kind: Deployment") && d.contains("name: cartservice\n"))
        .unwrap();
    let (alone, _) = inject_ok(&["--plain", "-"], Some(deployment));
    assert!(!alone.contains("kind: ConfigMap"), "{alone}");
    assert!(alone.contains("preStop"), "{alone}");
}

#[test]
fn merge_keys_are_resolved_and_an_alias_bomb_is_an_error_naming_the_file() {
    let dir = TempDir::new("inject-yaml");
    let merged = dir.path().join("merged.yaml");
    std::fs::write(
        &merged,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: app\nspec:\n  containers:\n  \
         - name: app\n    image: app:1\n    ports: [{name: http, containerPort: 8080}]\n    \
         readinessProbe: &probe\n      httpGet: {path: /healthz, port: http}\n      periodSeconds: 5\n    \
         livenessProbe:\n      <<: *probe\n      periodSeconds: 10\n",
    )
    .unwrap();
    let (out, _) = inject_ok(&[merged.to_str().unwrap()], None);
    assert!(!out.contains("<<"), "{out}");
    let got = docs(&out);
    let app = container(&kind_named(&got, "Pod", "app")["spec"]["containers"], "app");
    assert_eq!(
        app["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/probe/8080/healthz")
    );
    assert_eq!(app["livenessProbe"]["periodSeconds"].as_i64(), Some(10));
    validate("merge keys", &out);

    // 478 bytes that expand to a billion nodes.
    let bomb = dir.path().join("bomb.yaml");
    let mut text = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let mut prev = 'a';
    for name in ['b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'] {
        let list = vec![format!("*{prev}"); 9].join(",");
        text.push_str(&format!("{name}: &{name} [{list}]\n"));
        prev = name;
    }
    std::fs::write(&bomb, &text).unwrap();
    let (code, out, err) = inject(&[bomb.to_str().unwrap()], None);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains(&format!("{}: document 1:", bomb.display())) && err.contains("alias"),
        "{err}"
    );
}

#[test]
fn jobs_get_the_native_sidecar_and_are_skipped_with_a_plain_one() {
    let jobs = "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: report\nspec:\n  template:\n    \
                spec:\n      restartPolicy: Never\n      containers:\n      - name: report\n        \
                image: report:1\n---\napiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: nightly\n\
                spec:\n  schedule: \"0 3 * * *\"\n  jobTemplate:\n    spec:\n      template:\n        \
                spec:\n          restartPolicy: OnFailure\n          containers:\n          - name: sweep\n            \
                image: sweep:1\n";
    let (out, _) = inject_ok(&["-"], Some(jobs));
    let got = docs(&out);
    let job = &kind_named(&got, "Job", "report")["spec"]["template"]["spec"];
    assert_eq!(names(&job["initContainers"]), ["tollgate"]);
    assert_eq!(
        job["initContainers"][0]["restartPolicy"].as_str(),
        Some("Always")
    );
    let cron =
        &kind_named(&got, "CronJob", "nightly")["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(names(&cron["initContainers"]), ["tollgate"]);
    validate("jobs", &out);

    let (out, notes) = inject_ok(&["--plain", "-"], Some(jobs));
    assert_eq!(out, jobs, "skipped under --plain");
    for what in ["Job/report", "CronJob/nightly"] {
        assert!(
            notes.contains(&format!("{what}: left alone: its pods run to completion")),
            "{notes}"
        );
    }
}

#[test]
fn the_pod_annotations_steer_the_sidecar_and_the_app_stays_the_default_container() {
    let manifest = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  \
                    selector: {matchLabels: {app: web}}\n  template:\n    metadata:\n      \
                    labels: {app: web}\n      annotations:\n        tollgate.io/mode: plain\n        \
                    tollgate.io/proxy-cpu: 250m\n        tollgate.io/proxy-memory: 64Mi\n    spec:\n      \
                    containers:\n      - name: web\n        image: web:1\n      - name: agent\n        image: agent:1\n";
    let (out, notes) = inject_ok(&["--capture", "-"], Some(manifest));
    let got = docs(&out);
    let pod = &kind_named(&got, "Deployment", "web")["spec"]["template"];
    let spec = &pod["spec"];
    assert_eq!(
        names(&spec["containers"]),
        ["tollgate", "web", "agent"],
        "plain, by the annotation"
    );
    assert_eq!(
        pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"].as_str(),
        Some("web")
    );
    let tollgate = &spec["containers"][0];
    assert_eq!(
        tollgate["resources"]["requests"]["cpu"].as_str(),
        Some("250m")
    );
    assert_eq!(
        tollgate["resources"]["requests"]["memory"].as_str(),
        Some("64Mi")
    );
    assert_eq!(
        tollgate["resources"]["limits"]["memory"].as_str(),
        Some("64Mi")
    );
    // Capture spares the sidecar's own UID, never distroless's 65532.
    assert_eq!(
        tollgate["securityContext"]["runAsUser"].as_i64(),
        Some(15000)
    );
    let iptables = container(&spec["initContainers"], "tollgate-iptables");
    assert_eq!(iptables["args"][0].as_str(), Some("--uid=15000"));
    assert!(!out.contains("65532"), "{out}");
    assert!(
        notes.contains("terminationGracePeriodSeconds raised from 30 (the default) to 45"),
        "{notes}"
    );
    validate("annotations", &out);
    // Uninjected, the annotations are the workload's own again.
    let (back, _) = inject_ok(&["--uninject", "-"], Some(&out));
    assert_eq!(docs(&back), docs(manifest));

    let bad = manifest.replace("64Mi", "64 megs");
    let (code, _, err) = inject(&["-"], Some(&bad));
    assert_eq!(code, 1);
    assert!(
        err.contains("tollgate.io/proxy-memory: `64 megs` is not a Kubernetes quantity"),
        "{err}"
    );
}

#[test]
fn a_pod_that_says_its_namespace_carries_the_rbac_gets_kubernetes_discovery() {
    let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: app\n  namespace: shop\n  \
                    annotations:\n    tollgate.io/discovery: kubernetes\nspec:\n  containers:\n  \
                    - name: app\n    image: app:1\n    env:\n    \
                    - {name: A, value: \"http://payments:8080\"}\n    \
                    - {name: B, value: \"http://ledger.finance.svc:9000\"}\n";
    let (out, _) = inject_ok(&["-"], Some(manifest));
    let got = docs(&out);
    let config = kind_named(&got, "ConfigMap", "app-tollgate")["data"]["tollgate.toml"]
        .as_str()
        .unwrap();
    for want in [
        "discovery = \"kubernetes\"\nservice = \"payments\"\nport = \"8080\"",
        "discovery = \"kubernetes\"\nservice = \"ledger.finance\"\nport = \"9000\"",
    ] {
        assert!(config.contains(want), "{want} not in\n{config}");
    }
    assert!(!config.contains("endpoints = "), "{config}");
    check_strict("discovery", config);
    let bad = manifest.replace("discovery: kubernetes", "discovery: consul");
    let (code, _, err) = inject(&["-"], Some(&bad));
    assert_eq!(code, 1);
    assert!(
        err.contains("tollgate.io/discovery: `consul` is neither dns nor kubernetes"),
        "{err}"
    );
}

/// A workload shipped with the RBAC discovery needs (deploy/kubernetes/rbac.yaml: a
/// Role that lists and watches EndpointSlices and gets Services, bound to the
/// `checkout` service account) gets `discovery = "kubernetes"` for the upstreams in the
/// namespace the RBAC covers, and DNS for the others; without that RBAC in the input
/// (another account, no token, or `tollgate.io/discovery: dns`) it keeps DNS, which
/// needs none: an upstream never waits on a watch the API would refuse.
#[test]
fn the_inputs_rbac_chooses_kubernetes_discovery_where_it_lets_the_pod_watch() {
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/rbac.yaml");
    let rbac = rbac.to_str().unwrap();
    let workload = |extra_spec: &str, annotations: &str| {
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: checkout\nspec:\n  \
             selector:\n    matchLabels: {{app: checkout}}\n  template:\n    metadata:\n      \
             labels: {{app: checkout}}\n      annotations: {{{annotations}}}\n    spec:\n      \
             {extra_spec}containers:\n      - name: app\n        image: checkout:1\n        env:\n        \
             - {{name: PAYMENTS, value: \"http://payments:8080\"}}\n        \
             - {{name: LEDGER, value: \"http://ledger.finance.svc:9000\"}}\n"
        )
    };
    let config_of = |manifest: &str| {
        let (out, err) = inject_ok(&[rbac, "-"], Some(manifest));
        let got = docs(&out);
        let config = kind_named(&got, "ConfigMap", "checkout-tollgate")["data"]["tollgate.toml"]
            .as_str()
            .unwrap()
            .to_string();
        (config, err)
    };
    let watched = "discovery = \"kubernetes\"\nservice = \"payments\"\nport = \"8080\"";
    let dns_payments = "endpoints = [\"payments:8080\"]";
    let dns_ledger = "endpoints = [\"ledger.finance.svc:9000\"]";

    let (config, err) = config_of(&workload("serviceAccountName: checkout\n      ", ""));
    assert!(config.contains(watched), "{config}");
    // The Role is in the pod's namespace only: the ledger's is not watched.
    assert!(config.contains(dns_ledger), "{config}");
    assert!(
        err.contains("discovery from the Kubernetes API for payments"),
        "{err}"
    );
    check_strict("rbac", &config);

    for (spec, annotations, why) in [
        ("", "", "the default service account is not bound"),
        (
            "serviceAccountName: checkout\n      automountServiceAccountToken: false\n      ",
            "",
            "no token to call the API with",
        ),
        (
            "serviceAccountName: checkout\n      ",
            "tollgate.io/discovery: dns",
            "the annotation says dns",
        ),
    ] {
        let (config, err) = config_of(&workload(spec, annotations));
        assert!(
            config.contains(dns_payments) && config.contains(dns_ledger),
            "{why}:\n{config}"
        );
        assert!(!config.contains("discovery = "), "{why}:\n{config}");
        assert!(!err.contains("discovery from"), "{why}: {err}");
    }
    // Without the RBAC in the input, the same workload keeps DNS.
    let (out, _) = inject_ok(
        &["-"],
        Some(&workload("serviceAccountName: checkout\n      ", "")),
    );
    assert!(
        out.contains(dns_payments) && !out.contains("discovery = "),
        "{out}"
    );
}

/// The frontend's generated config made runnable here: on loopback ports of its own,
/// without the pod's inbound side and admin port, `productcatalogservice` at `at`.
fn on_loopback(config: &str, at: std::net::SocketAddr) -> String {
    let mut out = String::new();
    let mut section = String::new();
    for line in config.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            section = t.to_string();
        }
        if section.starts_with("[inbound") || section.starts_with("[admin") {
            continue;
        }
        if section == "[listener]" && t.starts_with("addr") {
            out.push_str("addr = \"127.0.0.1:0\"\n");
            continue;
        }
        out.push_str(&line.replace("\"productcatalogservice:3550\"", &format!("\"{at}\"")));
        out.push('\n');
    }
    out + "[admin]\naddr = \"127.0.0.1:0\"\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_injected_frontends_slow_call_is_served_as_it_is_directly() {
    // A 3 s answer with the caller's 10 s deadline: served directly, so served through
    // the config inject wrote (it used to say `request_timeout = "2s"`: a 504).
    let Some(path) = real("microservices-demo/kubernetes-manifests.yaml") else {
        return;
    };
    let (out, _) = inject_ok(&[path.to_str().unwrap()], None);
    let configs = configs(&docs(&out));
    let frontend = &configs
        .iter()
        .find(|(n, _)| n == "frontend-tollgate")
        .unwrap()
        .1;
    let slow = common::Upstream::start(|_req| async {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        common::respond(200, "slow but fine")
    })
    .await;
    let tg = common::Tollgate::start(&on_loopback(frontend, slow.addr)).await;
    let call = || {
        common::request("GET", "/products", "productcatalogservice")
            .header("x-timeout-ms", "10000")
            .body(common::empty())
            .unwrap()
    };
    let (direct, through) = tokio::join!(
        common::send(slow.addr, call()),
        common::send(tg.addr, call())
    );
    assert_eq!(
        (direct.status.as_u16(), &direct.body[..]),
        (200, &b"slow but fine"[..])
    );
    assert_eq!(
        (through.status.as_u16(), &through.body[..]),
        (200, &b"slow but fine"[..]),
        "through the injected frontend's sidecar, as directly ({:?})",
        through.outcome()
    );
    tg.stop().await;
}
