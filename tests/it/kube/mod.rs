//! A real Kubernetes API server for the tests: etcd and kube-apiserver started on loopback,
//! as controller-runtime's envtest starts them, from the binaries scripts/kube.sh builds.
//! Tests that use it say `use crate::kube;`.
//!
//! The test makes everything the server needs: a CA and a serving certificate for
//! 127.0.0.1 (rcgen), a service-account signing key (ECDSA P-256, PKCS#8), a static token
//! for a user in `system:masters` (allowed everything under RBAC), and a kubeconfig a
//! client reads. Requests go over a fresh TLS connection each, so they keep working across
//! [`Cluster::stop_apiserver`] and [`Cluster::start_apiserver`]; a request that got no HTTP
//! answer reports status 0. [`Cluster::post_answer`] also returns the `Warning` headers the
//! API sent (an admission webhook's warnings reach the client that way). The waits are
//! real time: do not use them under paused time.
//!
//! The binaries are found in `TOLLGATE_KUBE_BIN_DIR`, else where scripts/kube.sh caches
//! them (`${TOLLGATE_KUBE_CACHE:-$HOME/.cache/tollgate}/kube-<K8S>-etcd-<ETCD>`, the
//! versions read from the script). Without them the test is skipped loudly, unless
//! `CI=true`: there it fails. Every process started here is killed, and the temp dir
//! removed, when the [`Cluster`] is dropped, also when the test panics.
//!
//! ```sh
//! TOLLGATE_KUBE_BIN_DIR=$(scripts/kube.sh | tail -1) cargo test --test it kube_api::
//! ```

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// How long the API server (or etcd) may take to become ready.
const READY_WAIT: Duration = Duration::from_secs(90);
/// One request to the API, connect to the last byte.
const REQUEST_WAIT: Duration = Duration::from_secs(15);

/// One answer of the API.
#[derive(Debug)]
pub struct Answer {
    /// 0: no HTTP answer.
    pub status: u16,
    /// JSON; a string when it is not JSON (or what went wrong, with status 0).
    pub body: Value,
    /// The text of each `Warning: 299 - "text"` header, in order.
    pub warnings: Vec<String>,
}

/// etcd and kube-apiserver on 127.0.0.1, on free ports, with their files in a temp dir.
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    etcd: Child,
    apiserver: Option<Child>,
    apiserver_args: Vec<String>,
    port: u16,
    token: String,
    ca_pem: String,
    kubeconfig: PathBuf,
    tls: tokio_rustls::TlsConnector,
    /// The logs were shown with a failure already.
    reported: bool,
}

impl Cluster {
    /// Starts etcd and kube-apiserver and waits until the API is ready and the `default`
    /// namespace exists. None, after a SKIP line on stderr, when the binaries are not there
    /// and CI is not set; under CI=true that panics instead.
    pub async fn start() -> Option<Cluster> {
        let bin = bin_dir()?;
        // The ports are free when picked, and may be taken before etcd or the API server
        // binds them: then again, with others.
        for attempt in 1.. {
            match Cluster::launch(&bin).await {
                Ok(cluster) => return Some(cluster),
                Err(e) if attempt < 3 && e.contains("address already in use") => {
                    eprintln!("kube cluster: a port was taken, again with new ports");
                }
                Err(e) => panic!("{e}"),
            }
        }
        unreachable!()
    }

    async fn launch(bin: &Path) -> Result<Cluster, String> {
        let bin = bin.to_path_buf();
        let dir = temp_dir();
        let etcd_port = free_port();
        let peer_port = free_port();
        let port = free_port();

        // Certificates and keys, made for this cluster only.
        let ca = ca();
        let mut params = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "kubernetes.default.svc".to_string(),
            "10.0.0.1".to_string(),
        ])
        .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate().unwrap();
        let serving = params.signed_by(&serving_key, &ca).unwrap();
        let sa_key = KeyPair::generate().unwrap();
        let token = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let ca_pem = ca.pem();
        write(&dir.join("ca.crt"), &ca_pem);
        write(&dir.join("apiserver.crt"), &serving.pem());
        write(&dir.join("apiserver.key"), &serving_key.serialize_pem());
        write(&dir.join("sa.key"), &sa_key.serialize_pem());
        write(&dir.join("sa.pub"), &sa_key.public_key_pem());
        write(
            &dir.join("tokens.csv"),
            &format!("{token},tollgate-test,tollgate-test-uid,\"system:masters\"\n"),
        );
        let url = format!("https://127.0.0.1:{port}");
        let kubeconfig = dir.join("kubeconfig");
        write(&kubeconfig, &kubeconfig_yaml(&url, &ca_pem, &token));

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args: Vec<String> = [
            "--name=tollgate-test".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=tollgate-test={peer_url}"),
            // 256 MiB is plenty for a test's objects; no fsync: the data dies with the test.
            "--quota-backend-bytes=268435456".to_string(),
            "--unsafe-no-fsync=true".to_string(),
            "--log-level=warn".to_string(),
        ]
        .into();
        let etcd = spawn(&bin.join("etcd"), &etcd_args, &dir.join("etcd.log"));

        let path = |name: &str| dir.join(name).display().to_string();
        let apiserver_args: Vec<String> = [
            "--bind-address=127.0.0.1".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            format!("--etcd-servers={etcd_url}"),
            format!("--tls-cert-file={}", path("apiserver.crt")),
            format!("--tls-private-key-file={}", path("apiserver.key")),
            format!("--client-ca-file={}", path("ca.crt")),
            format!("--token-auth-file={}", path("tokens.csv")),
            "--authorization-mode=RBAC".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            format!("--service-account-key-file={}", path("sa.pub")),
            format!("--service-account-signing-key-file={}", path("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".to_string(),
            "--enable-aggregator-routing=true".to_string(),
            // The `kubernetes` Service's endpoints may not be a loopback address.
            "--endpoint-reconciler-type=none".to_string(),
            "--allow-privileged=true".to_string(),
            // Pods are created without the controllers that make their service accounts.
            "--disable-admission-plugins=ServiceAccount".to_string(),
            format!("--cert-dir={}", path("certs")),
        ]
        .into();

        let tls = tls_connector(ca.der().clone());
        let mut cluster = Cluster {
            dir,
            bin,
            etcd,
            apiserver: None,
            apiserver_args,
            port,
            token,
            ca_pem,
            kubeconfig,
            tls,
            reported: false,
        };
        cluster.wait_etcd(&etcd_url).await?;
        cluster.run_apiserver().await?;
        // The namespace the API server's own controller makes after it is up, and the
        // `kubernetes` Service it makes once its ClusterIP allocator serves: a Service
        // posted before that is refused with 500 "range is full".
        let deadline = Instant::now() + READY_WAIT;
        loop {
            if cluster.get("/api/v1/namespaces/default").await.0 == 200
                && cluster
                    .get("/api/v1/namespaces/default/services/kubernetes")
                    .await
                    .0
                    == 200
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(cluster
                    .failure("the default namespace and its kubernetes Service did not appear"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(cluster)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig for the API: server, CA (inline), a bearer token, one context.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The bearer token of a user allowed everything.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The CA the API server's certificate is signed by.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The temp dir holding the certificates, the logs and etcd's data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// GET `path`: the status (0: no HTTP answer) and the body as JSON (a string when it
    /// is not JSON).
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.request(Method::GET, path, None, "application/json")
            .await
            .pair()
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_answer(path, body).await.pair()
    }

    /// POST `path`, the warnings with the answer.
    pub async fn post_answer(&self, path: &str, body: Value) -> Answer {
        self.request(Method::POST, path, Some(body), "application/json")
            .await
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.request(Method::PUT, path, Some(body), "application/json")
            .await
            .pair()
    }

    pub async fn merge_patch(&self, path: &str, body: Value) -> (u16, Value) {
        self.request(
            Method::PATCH,
            path,
            Some(body),
            "application/merge-patch+json",
        )
        .await
        .pair()
    }

    pub async fn delete(&self, path: &str) -> u16 {
        self.request(Method::DELETE, path, None, "application/json")
            .await
            .status
    }

    /// Kills kube-apiserver (etcd keeps running, and so does what is stored in it).
    pub fn stop_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts kube-apiserver again, on the same port with the same flags, and waits for
    /// `/readyz`.
    pub async fn start_apiserver(&mut self) {
        if let Err(e) = self.run_apiserver().await {
            self.reported = true;
            panic!("{e}");
        }
    }

    async fn run_apiserver(&mut self) -> Result<(), String> {
        assert!(
            self.apiserver.is_none(),
            "kube-apiserver is running already"
        );
        self.apiserver = Some(spawn(
            &self.bin.join("kube-apiserver"),
            &self.apiserver_args,
            &self.dir.join("kube-apiserver.log"),
        ));
        let deadline = Instant::now() + READY_WAIT;
        loop {
            if let Some(status) = self.apiserver.as_mut().unwrap().try_wait().unwrap() {
                return Err(self.failure(&format!("kube-apiserver exited: {status}")));
            }
            if self.get("/readyz").await.0 == 200 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.failure(&format!("kube-apiserver not ready after {READY_WAIT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn create_namespace(&self, ns: &str) {
        let (status, body) = self
            .post(
                "/api/v1/namespaces",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .await;
        assert!(
            status == 201 || status == 409,
            "create namespace {ns}: {status} {body}"
        );
    }

    /// A Service without a selector (no controller manages its slices: the test does,
    /// with [`Cluster::put_endpoint_slice`]). Headless: `clusterIP: None`; else the API
    /// server allocates a cluster IP from 10.0.0.0/24. Returns the object created.
    pub async fn create_service(
        &self,
        ns: &str,
        name: &str,
        port_name: &str,
        port: u16,
        headless: bool,
    ) -> Value {
        let mut spec = json!({
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
        });
        if headless {
            spec["clusterIP"] = json!("None");
        }
        let (status, body) = self
            .post(
                &format!("/api/v1/namespaces/{ns}/services"),
                json!({
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": spec,
                }),
            )
            .await;
        assert_eq!(status, 201, "create service {ns}/{name}: {body}");
        body
    }

    /// Creates or replaces the EndpointSlice `slice` of `service`, labelled
    /// `kubernetes.io/service-name` as kube-proxy finds them, one port, one endpoint per
    /// `(address, ready, terminating)` (`serving` is set as `ready`). The address type is
    /// IPv6 when the first address is, else IPv4.
    pub async fn put_endpoint_slice(
        &self,
        ns: &str,
        slice: &str,
        service: &str,
        port_name: &str,
        port: u16,
        endpoints: &[(IpAddr, bool, bool)],
    ) {
        let v6 = endpoints.first().is_some_and(|(ip, _, _)| ip.is_ipv6());
        assert!(
            endpoints.iter().all(|(ip, _, _)| ip.is_ipv6() == v6),
            "one slice holds one address family: {endpoints:?}"
        );
        let path = format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices");
        let mut object = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice,
                "namespace": ns,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "tollgate-tests",
                },
            },
            "addressType": if v6 { "IPv6" } else { "IPv4" },
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
            "endpoints": endpoints.iter().map(|(ip, ready, terminating)| json!({
                "addresses": [ip.to_string()],
                "conditions": {"ready": ready, "serving": ready, "terminating": terminating},
            })).collect::<Vec<_>>(),
        });
        let (status, existing) = self.get(&format!("{path}/{slice}")).await;
        let (status, body) = match status {
            404 => self.post(&path, object).await,
            200 => {
                object["metadata"]["resourceVersion"] =
                    existing["metadata"]["resourceVersion"].clone();
                self.put(&format!("{path}/{slice}"), object).await
            }
            _ => panic!("get endpointslice {ns}/{slice}: {status} {existing}"),
        };
        assert!(
            status == 200 || status == 201,
            "put endpointslice {ns}/{slice}: {status} {body}"
        );
    }

    pub async fn delete_endpoint_slice(&self, ns: &str, slice: &str) {
        let status = self
            .delete(&format!(
                "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{slice}"
            ))
            .await;
        assert!(
            status == 200 || status == 202,
            "delete endpointslice {ns}/{slice}: {status}"
        );
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        content_type: &str,
    ) -> Answer {
        let send = async {
            let tcp = TcpStream::connect(("127.0.0.1", self.port))
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let name = ServerName::IpAddress(IpAddr::from([127, 0, 0, 1]).into());
            let tls = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(conn);
            let body = body.map(|b| b.to_string()).unwrap_or_default();
            let request = Request::builder()
                .method(method)
                .uri(path)
                .header("host", format!("127.0.0.1:{}", self.port))
                .header("authorization", format!("Bearer {}", self.token))
                .header("accept", "application/json")
                .header("content-type", content_type)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| format!("request: {e}"))?;
            let status = response.status().as_u16();
            let warnings = response
                .headers()
                .get_all("warning")
                .iter()
                .map(|v| warning_text(&String::from_utf8_lossy(v.as_bytes())))
                .collect();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("body: {e}"))?
                .to_bytes();
            let value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            Ok::<_, String>(Answer {
                status,
                body: value,
                warnings,
            })
        };
        let failed = |why: String| Answer {
            status: 0,
            body: Value::String(why),
            warnings: Vec::new(),
        };
        match tokio::time::timeout(REQUEST_WAIT, send).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => failed(e),
            Err(_) => failed(format!("no answer in {REQUEST_WAIT:?}")),
        }
    }

    async fn wait_etcd(&mut self, url: &str) -> Result<(), String> {
        let addr = url.trim_start_matches("http://").to_string();
        let deadline = Instant::now() + READY_WAIT;
        loop {
            if let Some(status) = self.etcd.try_wait().unwrap() {
                return Err(self.failure(&format!("etcd exited: {status}")));
            }
            if etcd_healthy(&addr).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.failure(&format!("etcd not healthy after {READY_WAIT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What failed, with the tails of both logs.
    fn failure(&self, what: &str) -> String {
        format!("kube cluster: {what}\n{}", log_tails(&self.dir))
    }
}

impl Answer {
    fn pair(self) -> (u16, Value) {
        (self.status, self.body)
    }
}

/// The text of a `Warning` header value, `CODE AGENT "TEXT"` (RFC 7234 5.5, as the API
/// server writes it: `299 - "text"`), its quoted-pair escapes undone; the value whole
/// when it is not of that shape.
fn warning_text(value: &str) -> String {
    let quoted = value
        .splitn(3, ' ')
        .nth(2)
        .and_then(|rest| rest.strip_prefix('"'))
        .and_then(|rest| rest.strip_suffix('"'));
    let Some(quoted) = quoted else {
        return value.to_string();
    };
    let mut text = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => text.extend(chars.next()),
            c => text.push(c),
        }
    }
    text
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.reported {
            eprintln!("{}", log_tails(&self.dir));
        }
        self.stop_apiserver();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Where the binaries are; None (skip) or a panic (CI) when they are not there.
fn bin_dir() -> Option<PathBuf> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let explicit = std::env::var("TOLLGATE_KUBE_BIN_DIR").unwrap_or_default();
    let dir = if explicit.is_empty() {
        default_bin_dir()
    } else {
        PathBuf::from(&explicit)
    };
    let missing: Vec<_> = ["etcd", "kube-apiserver"]
        .into_iter()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if missing.is_empty() {
        return Some(dir);
    }
    let why = format!(
        "{missing:?} not in {} (TOLLGATE_KUBE_BIN_DIR {}); build them with scripts/kube.sh \
         (scripts/test.sh does) and set TOLLGATE_KUBE_BIN_DIR=$(scripts/kube.sh | tail -1)",
        dir.display(),
        if explicit.is_empty() { "unset" } else { "set" },
    );
    if ci || !explicit.is_empty() {
        panic!("no Kubernetes API server to test against: {why}");
    }
    // Straight to stderr, past the test harness's capture: a skip is never silent.
    let _ = writeln!(
        std::io::stderr(),
        "\n!!! SKIP: a test against a real Kubernetes API server did NOT run: {why}\n"
    );
    None
}

/// scripts/kube.sh's cache dir for the versions the script builds.
fn default_bin_dir() -> PathBuf {
    let script = include_str!("../../../scripts/kube.sh");
    let version = |var: &str| {
        script
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{var}=")))
            .and_then(|v| v.rsplit(":-").next())
            .map(|v| v.trim_end_matches('}').to_string())
            .unwrap_or_else(|| panic!("{var} not found in scripts/kube.sh"))
    };
    let k8s = std::env::var("TOLLGATE_K8S_VERSION").unwrap_or_else(|_| version("K8S_VERSION"));
    let etcd = std::env::var("TOLLGATE_ETCD_VERSION").unwrap_or_else(|_| version("ETCD_VERSION"));
    let cache = match std::env::var("TOLLGATE_KUBE_CACHE") {
        Ok(c) if !c.is_empty() => PathBuf::from(c),
        _ => PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/tollgate"),
    };
    cache.join(format!("kube-{k8s}-etcd-{etcd}"))
}

fn temp_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let dir = std::env::temp_dir().join(format!(
        "tollgate-kube-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Starts `program` with its output appended to `log`. Under `setpriv --pdeathsig`, when
/// there, so a test process killed outright takes its servers with it.
fn spawn(program: &Path, args: &[String], log: &Path) -> Child {
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    writeln!(out, "--- {} {}", program.display(), args.join(" ")).unwrap();
    let err = out.try_clone().unwrap();
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut command = if setpriv {
        let mut c = Command::new("setpriv");
        c.args(["--pdeathsig", "KILL", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
}

fn log_tails(dir: &Path) -> String {
    let mut out = String::new();
    for name in ["etcd.log", "kube-apiserver.log"] {
        let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        out += &format!("----- last lines of {name} -----\n");
        for line in &lines[lines.len().saturating_sub(40)..] {
            out += line;
            out.push('\n');
        }
    }
    out
}

fn ca() -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "tollgate-test-kube-ca");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn tls_connector(ca: CertificateDer<'static>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn etcd_healthy(addr: &str) -> bool {
    let check = async {
        let tcp = TcpStream::connect(addr).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .ok()?;
        tokio::spawn(conn);
        let request = Request::get("/health")
            .header("host", addr)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(request).await.ok()?;
        let ok = response.status() == 200;
        let body = response.into_body().collect().await.ok()?.to_bytes();
        let body: Value = serde_json::from_slice(&body).ok()?;
        Some(ok && body["health"] == "true")
    };
    tokio::time::timeout(Duration::from_secs(2), check)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

fn kubeconfig_yaml(url: &str, ca_pem: &str, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: tollgate-test
  cluster:
    server: {url}
    certificate-authority-data: {ca}
users:
- name: tollgate-test
  user:
    token: {token}
contexts:
- name: tollgate-test
  context:
    cluster: tollgate-test
    user: tollgate-test
    namespace: default
current-context: tollgate-test
",
        ca = base64(ca_pem.as_bytes()),
    )
}

/// Standard base64 with padding, for the kubeconfig's `*-data` fields.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn a_warning_header_gives_its_text() {
    assert_eq!(
        warning_text(r#"299 - "tollgate: port 15090 (\"metrics\") collides""#),
        r#"tollgate: port 15090 ("metrics") collides"#
    );
    assert_eq!(warning_text("299 - \"a b\""), "a b");
    assert_eq!(warning_text("not a warning"), "not a warning");
}

#[test]
fn base64_matches_the_rfc_4648_vectors() {
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64(plain.as_bytes()), encoded);
    }
}
