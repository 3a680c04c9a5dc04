//! `tollgate inject` on manifests shaped as real ones are (tests/fixtures/inject/): a
//! Deployment with several containers and every kind of probe, a StatefulSet, and a
//! Deployment injected already. What a user relies on: the sidecar, the ConfigMap
//! skeleton (which `tollgate check --strict` passes) with an upstream per Service the
//! app's environment names, the HTTP probes moved to the admin port and nothing else
//! touched; injecting twice changes nothing; `--uninject` gives the manifest back;
//! `--dry-run` shows a diff. deploy/test.sh validates the outputs against the
//! Kubernetes schemas, and deploy/podman/play.sh runs the injected one.

#![allow(clippy::unwrap_used)]

use crate::common::manifests;

use std::path::{Path, PathBuf};

use manifests::{container, docs, inject, kind_named, names};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/inject")
        .join(name)
}

fn inject_ok(args: &[&str], stdin: Option<&str>) -> String {
    let (code, out, err) = inject(args, stdin);
    assert_eq!(code, 0, "tollgate inject {args:?} failed:\n{err}");
    out
}

/// The ConfigMap's tollgate.toml passes `tollgate check --strict` (no warning at all).
fn check_strict(config: &str) -> String {
    let (code, text) = manifests::check_strict(config);
    assert_eq!(code, Some(0), "check --strict:\n{text}\n{config}");
    text
}

#[test]
fn a_pod_with_several_containers_gets_the_sidecar_and_its_http_probes_move() {
    let input = std::fs::read_to_string(fixture("storefront.yaml")).unwrap();
    let (code, out, notes) = inject(&[fixture("storefront.yaml").to_str().unwrap()], None);
    assert_eq!(code, 0, "{notes}");
    let got = docs(&out);
    let kinds: Vec<&str> = got.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Service",
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler"
        ]
    );
    // What is not a pod comes back as it was written, comments and all.
    assert!(
        out.starts_with("# The storefront: a web front end"),
        "{out}"
    );
    let hpa = input.split("---\n").last().unwrap();
    assert!(out.ends_with(hpa), "the HPA is written back byte for byte");

    let pod = &kind_named(&got, "Deployment", "storefront")["spec"]["template"];
    let spec = &pod["spec"];
    // Native sidecar, first of the init containers so the app's own have it too.
    assert_eq!(names(&spec["initContainers"]), ["tollgate", "migrate"]);
    assert_eq!(
        spec["initContainers"][0]["restartPolicy"].as_str(),
        Some("Always")
    );
    assert_eq!(
        names(&spec["containers"]),
        ["web", "recommender", "log-shipper"]
    );
    let web = container(&spec["containers"], "web");
    let ready = &web["readinessProbe"]["httpGet"];
    assert_eq!(ready["path"].as_str(), Some("/probe/8080/ready?deep=false"));
    assert_eq!(ready["port"].as_i64(), Some(15090));
    assert_eq!(
        ready["httpHeaders"][0]["value"].as_str(),
        Some("kubelet"),
        "its headers stay"
    );
    assert_eq!(
        web["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/probe/9901/healthz")
    );
    assert_eq!(
        web["startupProbe"]["tcpSocket"]["port"].as_str(),
        Some("http"),
        "TCP stays"
    );
    let rec = container(&spec["containers"], "recommender");
    assert_eq!(
        rec["readinessProbe"]["grpc"]["port"].as_i64(),
        Some(50051),
        "gRPC stays"
    );
    assert!(rec["livenessProbe"]["exec"].is_hash(), "exec stays");
    // Without capture the app is pointed at the listener, every container of it.
    for name in ["web", "recommender", "log-shipper"] {
        let env = &container(&spec["containers"], name)["env"];
        assert_eq!(
            container(env, "http_proxy")["value"].as_str(),
            Some("http://127.0.0.1:15001"),
            "{name}"
        );
    }
    assert_eq!(
        spec["terminationGracePeriodSeconds"].as_i64(),
        Some(60),
        "long enough already"
    );
    let volumes = names(&spec["volumes"]);
    assert_eq!(volumes, ["config", "varlog", "tollgate-config"]);
    assert_eq!(
        spec["volumes"][0]["configMap"]["defaultMode"].as_i64(),
        Some(0o440)
    );
    let meta = &pod["metadata"];
    assert_eq!(meta["labels"]["tollgate/sidecar"].as_str(), Some("true"));
    assert_eq!(
        meta["annotations"]["prometheus.io/port"].as_str(),
        Some("15090")
    );
    assert_eq!(
        meta["annotations"]["kubectl.kubernetes.io/default-container"].as_str(),
        Some("web")
    );

    let cm = kind_named(&got, "ConfigMap", "storefront-tollgate");
    assert_eq!(cm["metadata"]["namespace"].as_str(), Some("shop"));
    let config = cm["data"]["tollgate.toml"].as_str().unwrap();
    for want in [
        "[upstreams.payments]",
        "endpoints = [\"payments:8080\"]",
        "authorities = [\"payments\"]",
        "[upstreams.inventory]",
        "endpoints = [\"inventory.warehouse.svc.cluster.local:9000\"]",
        "addr = \"0.0.0.0:15090\"",
        "probes = [",
        "  { port = 8080, path = \"/ready?deep=false\", headers = { \"X-Probe\" = \"kubelet\" } },",
        "  { port = 9901, path = \"/healthz\" },",
        "app = \"127.0.0.1:8080\"",
        "probe_paths = [\"/ready\", \"/healthz\", \"/grpc.health.v1.Health/Check\"]",
    ] {
        assert!(config.contains(want), "{want} not in\n{config}");
    }
    for not in ["sessions", "search", "localhost", "upstreams.recommender"] {
        assert!(!config.contains(not), "{not} in\n{config}");
    }
    check_strict(config);
    assert!(notes.contains("injected Deployment/storefront"), "{notes}");
    assert!(
        notes.contains("VAULT_ADDR calls vault.security.svc over https"),
        "{notes}"
    );
}

#[test]
fn injecting_twice_changes_nothing_and_uninject_gives_the_manifest_back() {
    for (file, flags) in [
        ("storefront.yaml", vec![]),
        ("storefront.yaml", vec!["--plain", "--capture"]),
        ("ledger.yaml", vec![]),
        ("ledger.yaml", vec!["--capture"]),
    ] {
        let path = fixture(file);
        let mut args: Vec<&str> = flags.clone();
        args.push(path.to_str().unwrap());
        let once = inject_ok(&args, None);
        let mut again: Vec<&str> = flags.clone();
        again.push("-");
        let twice = inject_ok(&again, Some(&once));
        assert_eq!(twice, once, "{file} {flags:?}: a second inject changed it");
        let back = inject_ok(&["--uninject", "-"], Some(&once));
        let input = std::fs::read_to_string(&path).unwrap();
        assert_eq!(docs(&back), docs(&input), "{file} {flags:?}: uninject");
    }
}

#[test]
fn a_statefulset_with_capture_gets_the_capture_init_container_and_no_proxy_variables() {
    let out = inject_ok(
        &["--capture", fixture("ledger.yaml").to_str().unwrap()],
        None,
    );
    let got = docs(&out);
    let spec = &kind_named(&got, "StatefulSet", "ledger")["spec"]["template"]["spec"];
    assert_eq!(
        names(&spec["initContainers"]),
        ["tollgate-iptables", "tollgate"]
    );
    let iptables = &spec["initContainers"][0];
    assert_eq!(
        iptables["securityContext"]["capabilities"]["add"][0].as_str(),
        Some("NET_ADMIN")
    );
    assert_eq!(iptables["args"][0].as_str(), Some("--uid=15000"));
    let ledger = container(&spec["containers"], "ledger");
    assert!(
        names(&ledger["env"])
            .iter()
            .all(|n| !n.eq_ignore_ascii_case("http_proxy"))
    );
    assert_eq!(
        ledger["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/probe/8081/health/ready")
    );
    let sts = kind_named(&got, "StatefulSet", "ledger");
    assert!(
        sts["spec"]["volumeClaimTemplates"].is_array(),
        "the claims stay"
    );
    let cm = kind_named(&got, "ConfigMap", "ledger-tollgate");
    let config = cm["data"]["tollgate.toml"].as_str().unwrap();
    for want in [
        "[upstreams.accounts]",
        "endpoints = [\"accounts.finance.svc.cluster.local:80\"]",
        "[upstreams.audit]",
        "endpoints = [\"audit.compliance.svc:8080\"]",
        "Capture sends every caller here.",
    ] {
        assert!(config.contains(want), "{want} not in\n{config}");
    }
    check_strict(config);
}

#[test]
fn a_plain_sidecar_comes_first_with_a_grace_period_for_its_drain() {
    let out = inject_ok(&["--plain", fixture("ledger.yaml").to_str().unwrap()], None);
    let got = docs(&out);
    let spec = &kind_named(&got, "StatefulSet", "ledger")["spec"]["template"]["spec"];
    assert_eq!(names(&spec["containers"]), ["tollgate", "ledger"]);
    assert!(spec["initContainers"].is_badvalue());
    let tollgate = &spec["containers"][0];
    assert_eq!(
        tollgate["lifecycle"]["preStop"]["exec"]["command"][1].as_str(),
        Some("15")
    );
    // 15 s preStop + 20 s drain: the default 30 s would cut the drain short.
    assert_eq!(spec["terminationGracePeriodSeconds"].as_i64(), Some(45));
    let back = inject_ok(&["--uninject", "-"], Some(&out));
    let back = docs(&back);
    let spec = &kind_named(&back, "StatefulSet", "ledger")["spec"]["template"]["spec"];
    assert!(
        spec["terminationGracePeriodSeconds"].is_badvalue(),
        "given back as it was: unset"
    );
}

/// The third manifest was injected already (it is what `inject --plain --capture` wrote
/// for the payments Deployment, and deploy/podman/play.sh runs it): with the same
/// options left byte for byte, with others updated, and `--uninject` then `inject`
/// again writes exactly it.
#[test]
fn an_injected_manifest_is_left_as_it_is() {
    let path = fixture("payments-injected.yaml");
    let input = std::fs::read_to_string(&path).unwrap();
    let (code, out, notes) = inject(&["--plain", "--capture", path.to_str().unwrap()], None);
    assert_eq!(code, 0, "{notes}");
    assert_eq!(out, input);
    assert!(
        notes.contains("Deployment/payments: has tollgate already"),
        "{notes}"
    );
    let (_, diff, _) = inject(
        &["--plain", "--capture", "--dry-run", path.to_str().unwrap()],
        None,
    );
    assert_eq!(diff, "", "nothing would change");
    // Other options: the sidecar becomes what they make it.
    let (_, diff, notes) = inject(&["--dry-run", path.to_str().unwrap()], None);
    assert!(
        diff.contains("+          restartPolicy: Always\n"),
        "{diff}"
    );
    assert!(
        notes.contains("re-injected Deployment/payments: native sidecar"),
        "{notes}"
    );

    let bare = inject_ok(&["--uninject", path.to_str().unwrap()], None);
    for gone in [
        "kind: ConfigMap",
        "name: tollgate",
        "tollgate/injected",
        "/probe/",
    ] {
        assert!(!bare.contains(gone), "{gone} left in\n{bare}");
    }
    let again = inject_ok(&["--plain", "--capture", "-"], Some(&bare));
    assert_eq!(
        docs(&again),
        docs(&input),
        "the fixture is inject's own output"
    );
    let cm = kind_named(&docs(&input), "ConfigMap", "payments-tollgate")["data"]["tollgate.toml"]
        .as_str()
        .unwrap()
        .to_string();
    check_strict(&cm);
}

#[test]
fn dry_run_shows_the_change_as_a_diff() {
    let path = fixture("ledger.yaml");
    let out = inject_ok(&["--dry-run", path.to_str().unwrap()], None);
    let path = path.display();
    assert!(
        out.contains(&format!("--- {path} ConfigMap/ledger-tollgate\n")),
        "{out}"
    );
    assert!(
        out.contains(&format!("--- {path} StatefulSet/ledger\n")),
        "{out}"
    );
    assert!(out.contains("\n+        - name: tollgate\n"), "{out}");
    assert!(
        out.contains("\n-              path: /health/ready\n"),
        "{out}"
    );
    assert!(
        out.contains("\n+              path: /probe/8081/health/ready\n"),
        "{out}"
    );
    assert!(
        !out.contains("Service/ledger"),
        "the Service does not change:\n{out}"
    );
}

#[test]
fn unreadable_input_writes_nothing() {
    let (code, out, err) = inject(&["-"], Some("kind: Pod\nmetadata: {name: [\n"));
    assert_eq!(code, 1);
    assert_eq!(out, "");
    assert!(err.contains("-: document 1"), "{err}");
    let (code, out, err) = inject(&["/nonexistent/app.yaml"], None);
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.contains("/nonexistent/app.yaml"), "{err}");
}
