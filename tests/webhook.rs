//! `tollgate inject --serve` as the admission webhook of a real kube-apiserver (started by
//! the tests, tests/kube/mod.rs; skipped loudly without its binaries). Registered with
//! deploy/kubernetes/webhook.yaml's MutatingWebhookConfiguration as written (its Service
//! created too), except that the webhook on loopback is named by its URL: the API server
//! refuses a loopback address as a Service's endpoint. caBundle is the test's own CA:
//! - a pod created in a namespace labelled `tollgate.io/inject=enabled` comes back with
//!   the sidecar and its config in the annotation `tollgate.io/config`, mounted through
//!   the downward API;
//! - a pod in an unlabelled namespace, a hostNetwork pod, and a pod annotated
//!   `tollgate.io/inject: "false"` come back untouched; a pod whose port clashes with
//!   tollgate's is admitted unchanged (counted `refused` in the webhook's metrics);
//! - with the webhook down, or hung past `timeoutSeconds`, pods are still created
//!   (failurePolicy Ignore).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod kube;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use kube::Cluster;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;

use common::tempdir::TempDir;

/// The webhook process; killed when dropped.
struct Webhook {
    child: Child,
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Webhook {
    /// Starts the webhook with a certificate for the Service's name signed by a CA of
    /// its own; waits (bounded) until `/healthz` answers. Returns it and the CA (PEM).
    async fn start(dir: &TempDir) -> (Webhook, String) {
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
        let leaf = CertificateParams::new(vec![
            "tollgate-webhook.tollgate.svc".to_string(),
            "127.0.0.1".to_string(),
        ])
        .unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let ca_der: CertificateDer<'static> = issuer.der().clone();
        let ca_pem = issuer.pem();
        let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();

        let port = common::free_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
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
        let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
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
    tollgate::inject::yaml::load(&text)
        .unwrap()
        .iter()
        .map(tollgate::inject::yaml::to_json)
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

async fn create_pod(cluster: &Cluster, ns: &str, pod: Value, dry_run: bool) -> Value {
    let query = if dry_run { "?dryRun=All" } else { "" };
    let (status, body) = cluster
        .post(&format!("/api/v1/namespaces/{ns}/pods{query}"), pod)
        .await;
    assert_eq!(status, 201, "create pod in {ns}: {body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_injects_pods_through_the_webhook_and_never_waits_on_it() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let dir = TempDir::new("webhook");
    let (webhook, ca) = Webhook::start(&dir).await;
    let docs = deployed();

    // The webhook's namespace and Service as deployed; its endpoint: the webhook here.
    let ns = of_kind(&docs, "Namespace");
    let (status, body) = cluster.post("/api/v1/namespaces", ns).await;
    assert_eq!(status, 201, "{body}");
    let mut service = of_kind(&docs, "Service");
    service["spec"]["ports"][0]["targetPort"] = json!(webhook.addr.port());
    let (status, body) = cluster
        .post("/api/v1/namespaces/tollgate/services", service)
        .await;
    assert_eq!(status, 201, "{body}");
    // The API server refuses a loopback address as a Service's endpoint (EndpointSlice
    // and Endpoints alike), so the webhook on loopback is named by its URL here; the rest
    // of the configuration is deploy/'s as written.
    let mut config = of_kind(&docs, "MutatingWebhookConfiguration");
    let hook = &config["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["timeoutSeconds"], 5);
    assert_eq!(hook["reinvocationPolicy"], "IfNeeded");
    let client = &mut config["webhooks"][0]["clientConfig"];
    assert_eq!(client["service"]["name"], "tollgate-webhook");
    let path = client["service"]["path"].as_str().unwrap().to_string();
    *client = json!({
        "url": format!("https://{}{path}", webhook.addr),
        "caBundle": tollgate::discovery::base64::encode(ca.as_bytes()),
    });
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
        let got = create_pod(&cluster, "shop", pod("probe", json!({}), json!({})), true).await;
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
    let got = create_pod(&cluster, "shop", pod("web", json!({}), json!({})), false).await;
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
    let got = create_pod(
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
        let got = create_pod(&cluster, ns, p.clone(), false).await;
        assert!(!has_tollgate(&got), "{ns}/{name} was injected: {got}");
        assert_eq!(got["spec"]["containers"][0]["name"], "app");
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
    let got = create_pod(
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
    let got = create_pod(
        &cluster,
        "shop",
        pod("while-hung", json!({}), json!({})),
        false,
    )
    .await;
    assert!(!has_tollgate(&got), "{got}");
    drop(silent);
}
