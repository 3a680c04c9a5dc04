//! The Kubernetes API of the harm rows with discovery: etcd and a real kube-apiserver
//! (the binaries scripts/kube.sh builds), started in the client pod's namespace on its
//! loopback, and what the rows ask of it. There are no controllers: the row makes the
//! Service and writes its EndpointSlices itself (one slice per pod, ready), as the tests
//! of discovery do.
//!
//! What the API server needs is made here: a static token of `system:masters` (RBAC
//! allows it everything), a service-account signing key (ECDSA P-256, PKCS#8) and a
//! kubeconfig for the client pod's tollgate. Its serving certificate is its own,
//! self-signed into `--cert-dir` when it starts (a CA and a certificate for 127.0.0.1,
//! one file): the kubeconfig names that file as the CA.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::time::Instant;

use tollgate_core::discovery::base64;

/// The versions scripts/kube.sh builds, which name its cache.
const CACHE: &str = "kube-1.37.2-etcd-3.7.4";
const API_PORT: u16 = 6443;
const ETCD: &str = "http://127.0.0.1:2379";
const ETCD_PEER: &str = "http://127.0.0.1:2380";
/// The Service the rows discover, and its port's name.
pub const SERVICE: &str = "payments";
pub const NAMESPACE: &str = "default";
pub const PORT_NAME: &str = "http";
/// The Service the API server makes for itself once it can allocate ClusterIPs.
const KUBERNETES_SERVICE: &str = "/api/v1/namespaces/default/services/kubernetes";

/// How long the API may take to be ready.
pub const READY_WAIT: Duration = Duration::from_secs(90);

/// Where etcd and kube-apiserver are: `TOLLGATE_KUBE_BIN_DIR`, else scripts/kube.sh's
/// cache (`${TOLLGATE_KUBE_CACHE:-$HOME/.cache/tollgate}/kube-<K8S>-etcd-<ETCD>`).
pub fn bin_dir() -> Result<PathBuf, String> {
    let explicit = std::env::var("TOLLGATE_KUBE_BIN_DIR").unwrap_or_default();
    let dir = if explicit.is_empty() {
        let cache = std::env::var("TOLLGATE_KUBE_CACHE")
            .ok()
            .filter(|c| !c.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var("HOME")
                    .ok()
                    .map(|h| Path::new(&h).join(".cache/tollgate"))
            })
            .unwrap_or_default();
        cache.join(CACHE)
    } else {
        PathBuf::from(explicit)
    };
    if ["etcd", "kube-apiserver"]
        .iter()
        .all(|b| dir.join(b).is_file())
    {
        Ok(dir)
    } else {
        Err(format!(
            "needs etcd and kube-apiserver (scripts/kube.sh builds them; TOLLGATE_KUBE_BIN_DIR): none in {}",
            dir.display()
        ))
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let text = base64::encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The DER prefix of a P-256 public key's SubjectPublicKeyInfo, before its 65-byte point.
const P256_SPKI: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// Writes the token file, the service-account keys and the kubeconfig into `dir`; the
/// token.
pub fn write_files(dir: &Path) -> Result<String, String> {
    use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
        .map_err(|e| format!("a service-account key: {e}"))?;
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
        .map_err(|e| format!("a service-account key: {e}"))?;
    let mut spki = P256_SPKI.to_vec();
    spki.extend_from_slice(pair.public_key().as_ref());
    let token = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    write("sa.key", &pem("PRIVATE KEY", pkcs8.as_ref()))?;
    write("sa.pub", &pem("PUBLIC KEY", &spki))?;
    write(
        "tokens.csv",
        &format!("{token},tollgate-lab,tollgate-lab-uid,\"system:masters\"\n"),
    )?;
    write(
        "kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    \
             server: https://127.0.0.1:{API_PORT}\n    certificate-authority: {}\n\
             users:\n- name: lab\n  user:\n    token: {token}\ncontexts:\n- name: lab\n  \
             context:\n    cluster: lab\n    user: lab\n    namespace: {NAMESPACE}\n\
             current-context: lab\n",
            ca_file(dir).display()
        ),
    )?;
    Ok(token)
}

/// The certificate kube-apiserver makes for itself, with its CA.
pub fn ca_file(dir: &Path) -> PathBuf {
    dir.join("certs").join("apiserver.crt")
}

pub fn etcd_args(dir: &Path) -> Vec<String> {
    vec![
        "--name=lab".to_string(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={ETCD}"),
        format!("--advertise-client-urls={ETCD}"),
        format!("--listen-peer-urls={ETCD_PEER}"),
        format!("--initial-advertise-peer-urls={ETCD_PEER}"),
        format!("--initial-cluster=lab={ETCD_PEER}"),
        // The data dies with the row.
        "--unsafe-no-fsync=true".to_string(),
        "--log-level=warn".to_string(),
    ]
}

pub fn apiserver_args(dir: &Path) -> Vec<String> {
    let path = |name: &str| dir.join(name).display().to_string();
    vec![
        "--bind-address=127.0.0.1".to_string(),
        "--advertise-address=127.0.0.1".to_string(),
        format!("--secure-port={API_PORT}"),
        format!("--etcd-servers={ETCD}"),
        format!("--cert-dir={}", path("certs")),
        format!("--token-auth-file={}", path("tokens.csv")),
        "--authorization-mode=RBAC".to_string(),
        "--service-account-issuer=https://kubernetes.default.svc".to_string(),
        format!("--service-account-key-file={}", path("sa.pub")),
        format!("--service-account-signing-key-file={}", path("sa.key")),
        "--service-cluster-ip-range=10.0.0.0/24".to_string(),
        // The `kubernetes` Service's endpoints may not be a loopback address.
        "--endpoint-reconciler-type=none".to_string(),
        // Pods are never created here; nothing makes service accounts.
        "--disable-admission-plugins=ServiceAccount".to_string(),
    ]
}

/// The API, as the row's client pod writes to it.
pub struct Api {
    tls: tokio_rustls::TlsConnector,
    token: String,
}

impl Api {
    /// Once the API server has made its certificate and is ready: the `default` namespace
    /// exists and so does its `kubernetes` Service. Its own controllers make both, the
    /// Service only once the ClusterIP allocator serves; a Service posted before that is
    /// refused with 500 "range is full".
    pub async fn ready(dir: &Path, token: String) -> Result<Api, String> {
        let until = Instant::now() + READY_WAIT;
        let ca = ca_file(dir);
        let tls = loop {
            if let Some(tls) = connector(&ca) {
                break tls;
            }
            if Instant::now() > until {
                return Err(format!("kube-apiserver made no {}", ca.display()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let api = Api { tls, token };
        let ns = format!("/api/v1/namespaces/{NAMESPACE}");
        loop {
            if api.send(Method::GET, &ns, None).await.0 == 200
                && api.send(Method::GET, KUBERNETES_SERVICE, None).await.0 == 200
            {
                return Ok(api);
            }
            if Instant::now() > until {
                return Err(format!("the API was not ready within {READY_WAIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The Service, without a selector: its slices are the row's.
    pub async fn create_service(&self) -> Result<(), String> {
        let body = format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{SERVICE}","namespace":"{NAMESPACE}"}},"spec":{{"ports":[{{"name":"{PORT_NAME}","port":80,"targetPort":8080,"protocol":"TCP"}}]}}}}"#
        );
        let path = format!("/api/v1/namespaces/{NAMESPACE}/services");
        self.expect(Method::POST, &path, Some(body), 201).await
    }

    /// A slice of one ready pod, `SERVICE-N`.
    pub async fn add_pod(&self, n: usize, ip: IpAddr, port: u16) -> Result<(), String> {
        let body = format!(
            r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"{SERVICE}-{n}","namespace":"{NAMESPACE}","labels":{{"kubernetes.io/service-name":"{SERVICE}","endpointslice.kubernetes.io/managed-by":"tollgate-lab"}}}},"addressType":"IPv4","ports":[{{"name":"{PORT_NAME}","port":{port},"protocol":"TCP"}}],"endpoints":[{{"addresses":["{ip}"],"conditions":{{"ready":true,"serving":true,"terminating":false}}}}]}}"#
        );
        self.expect(Method::POST, &slices(), Some(body), 201).await
    }

    /// Deletes pod `n`'s slice: the pod has left the Service.
    pub async fn remove_pod(&self, n: usize) -> Result<(), String> {
        let path = format!("{}/{SERVICE}-{n}", slices());
        self.expect(Method::DELETE, &path, None, 200).await
    }

    async fn expect(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        status: u16,
    ) -> Result<(), String> {
        let what = format!("{method} {path}");
        let (got, text) = self.send(method, path, body).await;
        if got == status {
            Ok(())
        } else {
            Err(format!("{what}: {got} {text}"))
        }
    }

    /// One request on a connection of its own: the status (0: no answer) and the body.
    async fn send(&self, method: Method, path: &str, body: Option<String>) -> (u16, String) {
        let exchange = async {
            let tcp = TcpStream::connect(("127.0.0.1", API_PORT))
                .await
                .map_err(|e| e.to_string())?;
            let name = ServerName::IpAddress(IpAddr::from([127, 0, 0, 1]).into());
            let tls = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| e.to_string())?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            let request = Request::builder()
                .method(method)
                .uri(path)
                .header(http::header::HOST, format!("127.0.0.1:{API_PORT}"))
                .header(
                    http::header::AUTHORIZATION,
                    format!("Bearer {}", self.token),
                )
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body.unwrap_or_default())))
                .map_err(|e| e.to_string())?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, String::from_utf8_lossy(&body).into_owned()))
        };
        match tokio::time::timeout(Duration::from_secs(10), exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => (0, e),
            Err(_) => (0, "no answer within 10 s".to_string()),
        }
    }
}

fn slices() -> String {
    format!("/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices")
}

/// A TLS client trusting what `ca` holds; `None` until the file is there, whole.
fn connector(ca: &Path) -> Option<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).ok()? {
        roots.add(cert.ok()?).ok()?;
    }
    if roots.is_empty() {
        return None;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Some(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_the_api_server_reads_are_written() {
        let dir = std::env::temp_dir().join(format!("tollgate-lab-kube-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let token = write_files(&dir).unwrap_or_else(|e| panic!("{e}"));
        let key = std::fs::read_to_string(dir.join("sa.key")).unwrap_or_default();
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{key}");
        let public = std::fs::read_to_string(dir.join("sa.pub")).unwrap_or_default();
        let der = rustls_pki_types::SubjectPublicKeyInfoDer::from_pem_slice(public.as_bytes())
            .unwrap_or_else(|e| panic!("{e}: {public}"));
        assert_eq!(der.as_ref().len(), P256_SPKI.len() + 65);
        let kubeconfig = std::fs::read_to_string(dir.join("kubeconfig")).unwrap_or_default();
        assert!(
            kubeconfig.contains(&format!("token: {token}")),
            "{kubeconfig}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
