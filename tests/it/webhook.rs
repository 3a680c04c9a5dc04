//! `tollgate inject --serve` as the admission webhook of a real kube-apiserver (started by
//! the tests, tests/it/kube/mod.rs; skipped loudly without its binaries). Registered exactly
//! as deploy/kubernetes/webhook.yaml writes it: its Namespace, its Service, and its
//! MutatingWebhookConfiguration naming that Service, caBundle the test's own CA. The
//! Service resolves to the webhook as it would in a cluster without kube-proxy: the API
//! server (`--enable-aggregator-routing`) dials the Service's endpoint, which the test
//! writes in an EndpointSlice, on an address of a link of the test's own (a
//! veth pair, 10.213.81.0/30, one end in a network namespace of its own; the API refuses
//! a loopback address as an endpoint); so the test needs root, skips loudly without it
//! and fails under CI. The webhook's certificate names the Service
//! (`tollgate-webhook.tollgate.svc`), as the API server checks it:
//! - a pod created in a namespace labelled `tollgate.io/inject=enabled` comes back with
//!   the sidecar and its config in the annotation `tollgate.io/config`, mounted through
//!   the downward API;
//! - a pod in an unlabelled namespace, a hostNetwork pod, and a pod annotated
//!   `tollgate.io/inject: "false"` come back untouched; a pod whose port clashes with
//!   tollgate's is admitted unchanged, the webhook's warning in the answer's `Warning`
//!   header (counted `refused` in the webhook's metrics);
//! - with the webhook down, or hung past `timeoutSeconds`, pods are still created
//!   (failurePolicy Ignore).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::kube;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use kube::{Answer, Cluster};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;

use common::tempdir::TempDir;

/// The network namespace holding the far end of the test's veth pair.
const NETNS: &str = "tg-hook";
/// The pair's end in the test's namespace (it holds [`WEBHOOK_IP`]) and its peer.
const LINK: &str = "tg-hook0";
const PEER: &str = "tg-hook1";
/// The webhook's address: the Service's endpoint. The peer has 10.213.81.2.
const WEBHOOK_IP: Ipv4Addr = Ipv4Addr::new(10, 213, 81, 1);
const PEER_CIDR: &str = "10.213.81.2/30";

/// The test's link and namespace: removed when dropped, whatever happened.
struct Link;

impl Link {
    /// None, after a SKIP line, when not root; under CI=true that fails instead.
    fn create() -> Option<Link> {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        if !root {
            let msg = "SKIP tests/it/webhook.rs: needs root (a link of its own for the webhook's \
                       address, as the API refuses a loopback one as a Service's endpoint)";
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{msg}: under CI this fails"
            );
            // Straight to stderr, past the test harness's capture: a skip is never silent.
            let _ = writeln!(std::io::stderr(), "\n!!! {msg}\n");
            return None;
        }
        // What a killed run left behind.
        remove_link();
        let link = Link;
        ip(&["netns", "add", NETNS]);
        ip(&[
            "link", "add", LINK, "type", "veth", "peer", "name", PEER, "netns", NETNS,
        ]);
        ip(&["addr", "add", &format!("{WEBHOOK_IP}/30"), "dev", LINK]);
        ip(&["-n", NETNS, "addr", "add", PEER_CIDR, "dev", PEER]);
        ip(&["-n", NETNS, "link", "set", PEER, "up"]);
        ip(&["link", "set", LINK, "up"]);
        Some(link)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        remove_link();
    }
}

/// Deleting the namespace deletes its end of the pair, and with it the pair.
fn remove_link() {
    for args in [&["netns", "del", NETNS][..], &["link", "del", LINK]] {
        let _ = Command::new("ip")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The webhook process; killed when dropped.
struct Webhook {
    child: Child,
    addr: SocketAddr,
    /// The name its certificate is for: the Service's.
    name: String,
    tls: tokio_rustls::TlsConnector,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Webhook {
    /// Starts the webhook on [`WEBHOOK_IP`] with a certificate for `name` (the Service's)
    /// signed by a CA of its own; waits (bounded) until `/healthz` answers. Returns it and
    /// the CA (PEM).
    async fn start(dir: &TempDir, name: &str) -> (Webhook, String) {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "tollgate-webhook-test-ca");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let leaf = CertificateParams::new(vec![name.to_string()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let ca_der: CertificateDer<'static> = issuer.der().clone();
        let ca_pem = issuer.pem();
        let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();

        let addr = std::net::TcpListener::bind((WEBHOOK_IP, 0))
            .unwrap()
            .local_addr()
            .unwrap();
        let child = Command::new(common::binary())
            .args(["inject", "--serve", "--addr"])
            .arg(addr.to_string())
            .arg("--tls-cert")
            .arg(&cert_path)
            .arg("--tls-key")
            .arg(&key_path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("webhook.log")).unwrap())
            .spawn()
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_der).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let webhook = Webhook {
            child,
            addr,
            name: name.to_string(),
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some((200, _)) = webhook.get("/healthz").await {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the webhook did not answer /healthz"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (webhook, ca_pem)
    }

    /// GET `path` over TLS: status and body, or None when nothing answered.
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let tcp = TcpStream::connect(self.addr).await.ok()?;
        let name = ServerName::try_from(self.name.clone()).ok()?;
        let tls = self.tls.connect(name, tcp).await.ok()?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .ok()?;
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header("host", "tollgate-webhook")
            .body(Empty::<Bytes>::new())
            .ok()?;
        let resp = send.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some((status, String::from_utf8_lossy(&body).to_string()))
    }

    fn log(dir: &TempDir) -> String {
        std::fs::read_to_string(dir.path().join("webhook.log")).unwrap_or_default()
    }
}

/// deploy/kubernetes/webhook.yaml's documents, as JSON.
fn deployed() -> Vec<Value> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/webhook.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    tollgate_inject::yaml::load(&text)
        .unwrap()
        .iter()
        .map(tollgate_inject::yaml::to_json)
        .collect()
}

fn of_kind(docs: &[Value], kind: &str) -> Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/kubernetes/webhook.yaml"))
        .clone()
}

fn pod(name: &str, extra_spec: Value, annotations: Value) -> Value {
    let mut spec = json!({
        "containers": [{
            "name": "app",
            "image": "registry.example/app:1",
            "ports": [{"name": "http", "containerPort": 8080}],
            "env": [{"name": "PAYMENTS_URL", "value": "http://payments:8080"}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
        }],
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    })
}

fn container_names(pod: &Value, key: &str) -> Vec<String> {
    pod["spec"][key]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn has_tollgate(pod: &Value) -> bool {
    container_names(pod, "initContainers")
        .iter()
        .chain(container_names(pod, "containers").iter())
        .any(|n| n == "tollgate")
}

/// The pod as created, and the warnings the API answered with.
async fn create_pod(
    cluster: &Cluster,
    ns: &str,
    pod: Value,
    dry_run: bool,
) -> (Value, Vec<String>) {
    let query = if dry_run { "?dryRun=All" } else { "" };
    let Answer {
        status,
        body,
        warnings,
    } = cluster
        .post_answer(&format!("/api/v1/namespaces/{ns}/pods{query}"), pod)
        .await;
    assert_eq!(status, 201, "create pod in {ns}: {body}");
    (body, warnings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_injects_pods_through_the_webhook_and_never_waits_on_it() {
    let Some(_link) = Link::create() else {
        return;
    };
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let docs = deployed();
    let mut config = of_kind(&docs, "MutatingWebhookConfiguration");
    let hook = &config["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["timeoutSeconds"], 5);
    assert_eq!(hook["reinvocationPolicy"], "IfNeeded");
    let named = &hook["clientConfig"]["service"];
    let (svc_ns, svc_name) = (
        named["namespace"].as_str().unwrap().to_string(),
        named["name"].as_str().unwrap().to_string(),
    );
    let service = of_kind(&docs, "Service");
    assert_eq!(service["metadata"]["name"], svc_name.as_str());
    assert_eq!(service["metadata"]["namespace"], svc_ns.as_str());
    assert_eq!(named["port"], service["spec"]["ports"][0]["port"]);
    let port_name = service["spec"]["ports"][0]["name"].as_str().unwrap();

    let dir = TempDir::new("webhook");
    let (webhook, ca) = Webhook::start(&dir, &format!("{svc_name}.{svc_ns}.svc")).await;

    // The webhook's namespace and Service as deployed; its endpoint: the webhook here, in
    // the slice the EndpointSlice controller would write for the Deployment's pod (no
    // controller runs here to write another; the API server resolves a Service through
    // its slices).
    let (status, body) = cluster
        .post("/api/v1/namespaces", of_kind(&docs, "Namespace"))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = cluster
        .post(
            &format!("/api/v1/namespaces/{svc_ns}/services"),
            service.clone(),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    cluster
        .put_endpoint_slice(
            &svc_ns,
            &format!("{svc_name}-test"),
            &svc_name,
            port_name,
            webhook.addr.port(),
            &[(IpAddr::V4(WEBHOOK_IP), true, false)],
        )
        .await;
    // The configuration as deployed, with the test's CA.
    config["webhooks"][0]["clientConfig"]["caBundle"] =
        json!(tollgate_core::discovery::base64::encode(ca.as_bytes()));
    let (status, body) = cluster
        .post(
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            config,
        )
        .await;
    assert_eq!(status, 201, "{body}");

    for (name, labels) in [
        ("shop", json!({"tollgate.io/inject": "enabled"})),
        ("plain", json!({})),
    ] {
        let (status, body) = cluster
            .post(
                "/api/v1/namespaces",
                json!({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": name, "labels": labels}}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }

    // The API server picks the configuration up on its own time: dry runs (which call
    // the webhook, `sideEffects: None`) until one comes back injected.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (got, _) = create_pod(&cluster, "shop", pod("probe", json!({}), json!({})), true).await;
        if has_tollgate(&got) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the webhook was never called:\n{}\n{got}",
            Webhook::log(&dir)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Injected: the sidecar once, the config in the annotation, mounted by the downward API.
    let (got, warnings) =
        create_pod(&cluster, "shop", pod("web", json!({}), json!({})), false).await;
    assert_eq!(warnings, Vec::<String>::new());
    let (status, stored) = cluster.get("/api/v1/namespaces/shop/pods/web").await;
    assert_eq!(status, 200);
    assert_eq!(stored, got);
    assert_eq!(container_names(&stored, "initContainers"), ["tollgate"]);
    assert_eq!(container_names(&stored, "containers"), ["app"]);
    let config = stored["metadata"]["annotations"]["tollgate.io/config"]
        .as_str()
        .unwrap_or_else(|| panic!("no config annotation: {stored}"));
    assert!(config.contains("[upstreams.payments]"), "{config}");
    assert!(
        config.contains("endpoints = [\"payments:8080\"]"),
        "{config}"
    );
    let volume = stored["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tollgate-config")
        .unwrap();
    assert_eq!(
        volume["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
        "metadata.annotations['tollgate.io/config']"
    );
    assert_eq!(
        stored["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"],
        "/probe/8080/ready"
    );
    let env = &stored["spec"]["initContainers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "POD_NAMESPACE"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"),
        "{env}"
    );

    // A ConfigMap named by the pod wins over the annotation.
    let (got, _) = create_pod(
        &cluster,
        "shop",
        pod(
            "own-config",
            json!({}),
            json!({"tollgate.io/config-map": "mine"}),
        ),
        false,
    )
    .await;
    assert!(has_tollgate(&got));
    assert!(got["metadata"]["annotations"]["tollgate.io/config"].is_null());
    let volume = got["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tollgate-config")
        .unwrap();
    assert_eq!(volume["configMap"]["name"], "mine");

    // Untouched: another namespace, the node's network, an opt-out, a port clash.
    let untouched = [
        ("plain", pod("elsewhere", json!({}), json!({}))),
        ("shop", pod("node", json!({"hostNetwork": true}), json!({}))),
        (
            "shop",
            pod("no", json!({}), json!({"tollgate.io/inject": "false"})),
        ),
        (
            "shop",
            pod(
                "clash",
                json!({"containers": [{"name": "app", "image": "app:1",
                        "ports": [{"name": "metrics", "containerPort": 15090}]}]}),
                json!({}),
            ),
        ),
    ];
    for (ns, p) in untouched {
        let name = p["metadata"]["name"].as_str().unwrap().to_string();
        let (got, warnings) = create_pod(&cluster, ns, p.clone(), false).await;
        assert!(!has_tollgate(&got), "{ns}/{name} was injected: {got}");
        assert_eq!(got["spec"]["containers"][0]["name"], "app");
        // The webhook's warning reaches the client that created the pod.
        let warned: Vec<_> = warnings
            .iter()
            .filter(|w| w.starts_with("tollgate:"))
            .collect();
        if name == "clash" {
            assert!(
                warned.len() == 1
                    && warned[0].starts_with("tollgate: not injected:")
                    && warned[0].contains("port 15090 (metrics) collides"),
                "{warnings:?}"
            );
        } else {
            assert!(warned.is_empty(), "{ns}/{name}: {warnings:?}");
        }
    }
    let (_, metrics) = webhook.get("/metrics").await.unwrap();
    for want in [
        "tollgate_webhook_reviews_total{outcome=\"left-alone\"} 2",
        "tollgate_webhook_reviews_total{outcome=\"refused\"} 1",
    ] {
        assert!(metrics.contains(want), "{want} not in\n{metrics}");
    }
    let log = Webhook::log(&dir);
    assert!(log.contains("admission review"), "{log}");
    assert!(log.contains("port 15090 (metrics) collides"), "{log}");

    // The webhook down: pods are created all the same, without tollgate.
    let addr = webhook.addr;
    drop(webhook);
    let (got, _) = create_pod(
        &cluster,
        "shop",
        pod("while-down", json!({}), json!({})),
        false,
    )
    .await;
    assert!(!has_tollgate(&got), "{got}");
    // Hung (its port takes connections and never answers): the API server gives up at
    // timeoutSeconds and creates the pod without tollgate.
    let silent = std::net::TcpListener::bind(addr).unwrap();
    let (got, _) = create_pod(
        &cluster,
        "shop",
        pod("while-hung", json!({}), json!({})),
        false,
    )
    .await;
    assert!(!has_tollgate(&got), "{got}");
    drop(silent);
}
