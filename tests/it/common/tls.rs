//! TLS test helpers: certificates made in the test (rcgen: a CA, leaves signed by it)
//! and a real rustls HTTP server on loopback that says what it saw.

#![allow(dead_code, clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Response;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Got, full};
use crate::common::config::{Config, Tls};

pub const NAME: &str = "upstream.test";

/// A certificate authority made for one test.
pub struct Ca {
    pub issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(cn: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    pub fn leaf(&self, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> Leaf {
        self.leaf_with(names, purpose, |_| {})
    }

    pub fn leaf_with(
        &self,
        names: &[&str],
        purpose: ExtendedKeyUsagePurpose,
        tweak: impl FnOnce(&mut CertificateParams),
    ) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        params.extended_key_usages = vec![purpose];
        tweak(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            der: cert.der().clone(),
            key_pem: key.serialize_pem(),
            key_der: key.serialize_der(),
        }
    }
}

pub struct Leaf {
    pub cert_pem: String,
    pub der: CertificateDer<'static>,
    pub key_pem: String,
    pub key_der: Vec<u8>,
}

impl Leaf {
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivatePkcs8KeyDer::from(self.key_der.clone()).into()
    }
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls server config for `leaf`, offering `alpn`, and requiring a client
/// certificate signed by `client_ca` when given.
pub fn server_config(leaf: &Leaf, alpn: &[&str], client_ca: Option<&Ca>) -> rustls::ServerConfig {
    server_config_versions(leaf, alpn, client_ca, rustls::DEFAULT_VERSIONS)
}

/// [`server_config`] speaking only the given TLS versions.
pub fn server_config_versions(
    leaf: &Leaf,
    alpn: &[&str],
    client_ca: Option<&Ca>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> rustls::ServerConfig {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.der()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider(),
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder
        .with_single_cert(vec![leaf.der.clone()], leaf.key())
        .unwrap();
    cfg.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    cfg
}

/// A TLS HTTP server on loopback (HTTP/1.1 and HTTP/2, whichever ALPN settled on).
/// Every response says what the server saw: `version alpn=... sni=... client-cert=...`.
pub struct TlsUpstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    pub handshakes_failed: Arc<AtomicUsize>,
    /// The DER of the last client certificate presented.
    pub client_cert: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    pub stop: watch::Sender<bool>,
    pub task: JoinHandle<()>,
}

impl TlsUpstream {
    pub async fn start(config: rustls::ServerConfig) -> Self {
        Self::start_with(config, false).await
    }

    /// With `close_without_client_cert`, a connection whose client presented no
    /// certificate is closed right after the handshake, as servers that check client
    /// certificates above TLS do.
    pub async fn start_with(config: rustls::ServerConfig, close_without_client_cert: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let hits = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let client_cert = Arc::new(std::sync::Mutex::new(None));
        let (stop, mut stopped) = watch::channel(false);
        let task = {
            let (hits, failed, client_cert) = (hits.clone(), failed.clone(), client_cert.clone());
            tokio::spawn(async move {
                let mut conns = tokio::task::JoinSet::new();
                loop {
                    let stream = tokio::select! {
                        _ = stopped.changed() => break,
                        r = listener.accept() => match r {
                            Ok((s, _)) => s,
                            Err(_) => continue,
                        },
                    };
                    let acceptor = acceptor.clone();
                    let (hits, failed, client_cert) =
                        (hits.clone(), failed.clone(), client_cert.clone());
                    conns.spawn(async move {
                        let tls = match acceptor.accept(stream).await {
                            Ok(t) => t,
                            Err(_) => {
                                failed.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                        };
                        let session = tls.get_ref().1;
                        let alpn = session
                            .alpn_protocol()
                            .map(|p| String::from_utf8_lossy(p).into_owned())
                            .unwrap_or_else(|| "none".into());
                        let sni = session.server_name().unwrap_or("none").to_string();
                        let peer = session
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| c.to_vec());
                        let presented = peer.is_some();
                        if close_without_client_cert && !presented {
                            failed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        if let Some(p) = peer {
                            *client_cert.lock().unwrap() = Some(p);
                        }
                        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                            hits.fetch_add(1, Ordering::SeqCst);
                            let body = format!(
                                "{:?} alpn={alpn} sni={sni} client-cert={presented}",
                                req.version()
                            );
                            async move { Ok::<_, Infallible>(Response::new(full(body))) }
                        });
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(tls), svc)
                            .await;
                    });
                }
                conns.abort_all();
            })
        };
        TlsUpstream {
            addr,
            hits,
            handshakes_failed: failed,
            client_cert,
            stop,
            task,
        }
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub fn failed(&self) -> usize {
        self.handshakes_failed.load(Ordering::SeqCst)
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}

pub fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

/// `[upstreams.secure]` speaking TLS to `addr`; `tls_extra` goes into its tls table.
pub fn secure(addr: SocketAddr, protocol: &str, tls: impl FnOnce(Tls) -> Tls) -> String {
    Config::new()
        .upstream("secure", |u| {
            u.authorities(["secure"])
                .endpoint(addr)
                .protocol(protocol)
                .connect_timeout("5s")
                .attempt_timeout("5s")
                .request_timeout("10s")
                .tls(tls)
        })
        .to_toml()
}

/// Expecting `server_name`, trusting the CAs in `ca`.
pub fn trusting<'a>(server_name: &'a str, ca: &'a Path) -> impl Fn(Tls) -> Tls + 'a {
    move |t| t.server_name(server_name).ca_file(ca.display().to_string())
}

pub fn body(r: &Got) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}
