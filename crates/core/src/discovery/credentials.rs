//! Where the Kubernetes API is and who tollgate is to it: the pod's service account, or
//! a kubeconfig named by `[kubernetes] kubeconfig`; and where the pod is: its namespace
//! and its cluster's DNS domain.
//!
//! In a pod (as client-go's in-cluster config): `KUBERNETES_SERVICE_HOST` and
//! `KUBERNETES_SERVICE_PORT`, and beside the token in
//! `/var/run/secrets/kubernetes.io/serviceaccount/` the cluster's `ca.crt` and the pod's
//! `namespace` (`POD_NAMESPACE` wins over it). The token is a file that the kubelet
//! rotates, so it is read again for every connection (and so after a 401), never kept.
//! A kubeconfig, when named, wins: it was asked for. Anything missing or unreadable is
//! an error that says what was looked for.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::kubeconfig::{self, Pem, UserAuth};
use crate::config::KubernetesConfig;

/// Where a pod's service account is mounted.
pub const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The API server: what to connect to, the name its certificate carries, the path its
/// API is under.
#[derive(Clone, Debug)]
pub struct Server {
    /// A name or an IP literal (without brackets).
    pub host: String,
    pub port: u16,
    /// `""`, or a path the API is served under (`/k8s`), without a trailing `/`.
    pub prefix: String,
    /// The `Host` header: `host:port`, an IPv6 literal in brackets.
    pub authority: String,
}

impl Server {
    /// `https://host[:port][/prefix]`.
    pub fn parse(url: &str) -> Result<Server, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("server `{url}` is not a URL: {e}"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!("server `{url}` is not https://"));
        }
        let auth = uri
            .authority()
            .ok_or_else(|| format!("server `{url}` names no host"))?;
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        let port = auth.port_u16().unwrap_or(443);
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(Server {
            host: host.to_string(),
            port,
            prefix: uri.path().trim_end_matches('/').to_string(),
            authority,
        })
    }
}

/// How requests say who they are.
#[derive(Clone, Debug)]
pub enum Token {
    None,
    Static(String),
    /// Read for every connection: rotated tokens are picked up.
    File(PathBuf),
}

impl Token {
    /// The bearer token now.
    pub fn current(&self) -> Result<Option<String>, String> {
        match self {
            Token::None => Ok(None),
            Token::Static(t) => Ok(Some(t.clone())),
            Token::File(path) => std::fs::read_to_string(path)
                .map(|t| Some(t.trim().to_string()))
                .map_err(|e| format!("cannot read the token {}: {e}", path.display())),
        }
    }
}

/// Everything a watch needs to talk to the API, and the namespace a Service without
/// one is in.
#[derive(Clone)]
pub struct Credentials {
    pub server: Server,
    pub server_name: ServerName<'static>,
    pub tls: Arc<rustls::ClientConfig>,
    pub token: Token,
    pub namespace: String,
    /// Where these came from, for messages: "the pod's service account", a kubeconfig.
    pub from: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("server", &self.server.authority)
            .field("namespace", &self.namespace)
            .field("from", &self.from)
            .finish()
    }
}

/// The credentials `kube` points to: its kubeconfig, else the pod's service account.
pub fn load(kube: &KubernetesConfig) -> Result<Credentials, String> {
    if let Some(path) = &kube.kubeconfig {
        return from_kubeconfig(path);
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    in_pod(&env, Path::new(SERVICE_ACCOUNT))?.ok_or_else(|| {
        format!(
            "no Kubernetes credentials: not in a pod (KUBERNETES_SERVICE_HOST is not set, or \
             {SERVICE_ACCOUNT}/token is missing) and [kubernetes] kubeconfig is not set"
        )
    })
}

/// The service account mounted at `dir`, when `env` says this is a pod; `None` when
/// it does not.
pub fn in_pod(
    env: &dyn Fn(&str) -> Option<String>,
    dir: &Path,
) -> Result<Option<Credentials>, String> {
    let token = dir.join("token");
    let Some(host) = env("KUBERNETES_SERVICE_HOST") else {
        return Ok(None);
    };
    if !token.exists() {
        return Ok(None);
    }
    let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".to_string());
    let url = match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("https://[{host}]:{port}"),
        _ => format!("https://{host}:{port}"),
    };
    let server = Server::parse(&url)?;
    let ca_path = dir.join("ca.crt");
    let ca = std::fs::read(&ca_path)
        .map_err(|e| format!("cannot read the cluster CA {}: {e}", ca_path.display()))?;
    let namespace = env("POD_NAMESPACE")
        .or_else(|| {
            std::fs::read_to_string(dir.join("namespace"))
                .ok()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| "default".to_string());
    let server_name = server_name(&server.host)?;
    Ok(Some(Credentials {
        server,
        server_name,
        tls: Arc::new(tls(Some(&ca), None)?),
        token: Token::File(token),
        namespace,
        from: "the pod's service account".to_string(),
    }))
}

/// The current context of the kubeconfig at `path`.
pub fn from_kubeconfig(path: &Path) -> Result<Credentials, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the kubeconfig {}: {e}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let k = kubeconfig::parse(&text, dir)
        .map_err(|e| format!("the kubeconfig {}: {e}", path.display()))?;
    let read = |pem: &Pem| match pem {
        Pem::Data(bytes) => Ok(bytes.clone()),
        Pem::File(p) => std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display())),
    };
    let in_file = |e: String| format!("the kubeconfig {}: {e}", path.display());
    let server = Server::parse(&k.server).map_err(in_file)?;
    let ca = k.ca.as_ref().map(read).transpose().map_err(in_file)?;
    let (token, identity) = match &k.user {
        UserAuth::Token(t) => (Token::Static(t.clone()), None),
        UserAuth::TokenFile(p) => (Token::File(p.clone()), None),
        UserAuth::Certificate { cert, key } => {
            let pair = (read(cert).map_err(in_file)?, read(key).map_err(in_file)?);
            (Token::None, Some(pair))
        }
        UserAuth::None => (Token::None, None),
    };
    let name = k.tls_server_name.as_deref().unwrap_or(&server.host);
    let server_name = server_name(name).map_err(in_file)?;
    let tls = tls(
        ca.as_deref(),
        identity.as_ref().map(|(c, k)| (&c[..], &k[..])),
    )
    .map_err(in_file)?;
    Ok(Credentials {
        server,
        server_name,
        tls: Arc::new(tls),
        token,
        namespace: k.namespace.unwrap_or_else(|| "default".to_string()),
        from: format!("the kubeconfig {}", path.display()),
    })
}

fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("`{host}` is not a name a certificate can carry: {e}"))
}

/// The rustls client: the CA in `ca` (PEM), else the webpki roots; a client
/// certificate when `identity` (PEM chain, PEM key) is given. HTTP/1.1 only.
pub fn tls(
    ca: Option<&[u8]>,
    identity: Option<(&[u8], &[u8])>,
) -> Result<rustls::ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    match ca {
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(pem) => {
            let certs = certificates(pem, "the CA")?;
            for cert in certs {
                roots.add(cert).map_err(|e| format!("the CA: {e}"))?;
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => {
            let chain = certificates(chain, "the client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("the client key is not a PEM private key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the client certificate: {e}"))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what} holds no certificate"));
    }
    Ok(certs)
}

pub use crate::config::cluster::cluster_domain;

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-credentials-{name}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_pod_is_found_by_its_environment_and_service_account() {
        let dir = temp_dir("pod");
        std::fs::write(dir.join("token"), "tok-1\n").unwrap();
        std::fs::write(dir.join("ca.crt"), ca_pem()).unwrap();
        std::fs::write(dir.join("namespace"), "shop").unwrap();
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("6443".to_string()),
            _ => None,
        };
        let c = in_pod(&env, &dir).unwrap().unwrap();
        assert_eq!(c.server.authority, "10.96.0.1:6443");
        assert_eq!(c.namespace, "shop");
        assert_eq!(c.token.current().unwrap().as_deref(), Some("tok-1"));
        std::fs::write(dir.join("token"), "tok-2\n").unwrap();
        assert_eq!(
            c.token.current().unwrap().as_deref(),
            Some("tok-2"),
            "a rotated token is read again"
        );

        let with_ns = |k: &str| match k {
            "POD_NAMESPACE" => Some("from-env".to_string()),
            _ => env(k),
        };
        assert_eq!(
            in_pod(&with_ns, &dir).unwrap().unwrap().namespace,
            "from-env"
        );

        let v6 = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_string()),
            _ => None,
        };
        let c = in_pod(&v6, &dir).unwrap().unwrap();
        assert_eq!(
            (c.server.host.as_str(), c.server.authority.as_str()),
            ("fd00::1", "[fd00::1]:443")
        );

        assert!(in_pod(&|_| None, &dir).unwrap().is_none(), "not a pod");
        std::fs::remove_file(dir.join("token")).unwrap();
        assert!(in_pod(&env, &dir).unwrap().is_none(), "no service account");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_kubeconfig_gives_server_ca_token_and_namespace() {
        let dir = temp_dir("kubeconfig");
        std::fs::write(dir.join("ca.crt"), ca_pem()).unwrap();
        let path = dir.join("config");
        std::fs::write(
            &path,
            "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443/prefix/\n    \
             certificate-authority: ca.crt\nusers:\n- name: u\n  user:\n    token: t0k\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
             current-context: x\n",
        )
        .unwrap();
        let c = from_kubeconfig(&path).unwrap();
        assert_eq!(c.server.authority, "127.0.0.1:6443");
        assert_eq!(c.server.prefix, "/prefix");
        assert_eq!(c.namespace, "default");
        assert_eq!(c.token.current().unwrap().as_deref(), Some("t0k"));
        assert!(c.from.contains("kubeconfig"));

        let e = from_kubeconfig(&dir.join("missing")).unwrap_err();
        assert!(e.contains("cannot read the kubeconfig"), "{e}");
        std::fs::write(&path, "current-context: x\n").unwrap();
        let e = from_kubeconfig(&path).unwrap_err();
        assert!(e.contains("no context named `x`"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_kubeconfig_names_the_file() {
        let kube = KubernetesConfig {
            kubeconfig: Some("/nonexistent/kubeconfig".into()),
        };
        let e = load(&kube).unwrap_err();
        assert!(e.contains("/nonexistent/kubeconfig"), "{e}");
    }

    #[test]
    fn servers_are_https_urls() {
        let s = Server::parse("https://[fd00::1]:6443").unwrap();
        assert_eq!((s.host.as_str(), s.port), ("fd00::1", 6443));
        assert_eq!(Server::parse("https://api.example").unwrap().port, 443);
        assert!(Server::parse("http://api.example").is_err());
        assert!(Server::parse("not a url").is_err());
    }

    #[test]
    fn the_cluster_domain_comes_from_the_search_list() {
        let pod = "nameserver 10.96.0.10\nsearch shop.svc.cluster.example svc.cluster.example cluster.example\noptions ndots:5\n";
        assert_eq!(cluster_domain(pod).as_deref(), Some("cluster.example"));
        assert_eq!(
            cluster_domain("search svc.corp.local\n").as_deref(),
            Some("corp.local")
        );
        assert_eq!(
            cluster_domain("search example.com\nnameserver 1.1.1.1\n"),
            None
        );
        assert_eq!(cluster_domain(""), None);
    }
}
