//! TLS origination: the app speaks plain HTTP to localhost, tollgate speaks TLS (rustls)
//! to the upstream, verifying its certificate against a CA bundle (or the webpki roots)
//! and presenting a client certificate for mTLS when one is configured.
//!
//! Certificates are read when the config is loaded, so a reload picks up rotated files
//! and an unreadable or invalid file is a config error that names the key.

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::Protocol;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFile {
    Ca,
    Cert,
    Key,
}

#[derive(Clone, Debug)]
pub struct TlsError {
    pub file: TlsFile,
    pub message: String,
    pub fix: &'static str,
}

fn read(path: &Path, file: TlsFile, hasher: &mut impl Hasher) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| TlsError {
        file,
        message: format!("cannot read {}: {e}", path.display()),
        fix: "check the path and that the file is mounted and readable",
    })?;
    bytes.hash(hasher);
    Ok(bytes)
}

/// ALPN offers for the configured protocol.
pub fn alpn(protocol: Protocol) -> Vec<Vec<u8>> {
    match protocol {
        Protocol::Http1 => vec![b"http/1.1".to_vec()],
        Protocol::H2 => vec![b"h2".to_vec()],
        Protocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    }
}

/// Builds the client config; the `u64` is a digest of the files read, so a reload can
/// tell a rotated certificate from an unchanged one.
pub fn client_config(
    ca_file: Option<&Path>,
    client_pair: Option<(&Path, &Path)>,
    protocol: Protocol,
) -> Result<(rustls::ClientConfig, u64), TlsError> {
    let mut digest = std::collections::hash_map::DefaultHasher::new();
    let mut roots = RootCertStore::empty();
    match ca_file {
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(path) => {
            let pem = read(path, TlsFile::Ca, &mut digest)?;
            let mut found = 0;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| TlsError {
                    file: TlsFile::Ca,
                    message: format!("{} is not valid PEM: {e}", path.display()),
                    fix: "point ca_file at a PEM bundle of CA certificates",
                })?;
                roots.add(cert).map_err(|e| TlsError {
                    file: TlsFile::Ca,
                    message: format!("{} holds a certificate rustls rejects: {e}", path.display()),
                    fix: "point ca_file at a PEM bundle of CA certificates",
                })?;
                found += 1;
            }
            if found == 0 {
                return Err(TlsError {
                    file: TlsFile::Ca,
                    message: format!("{} holds no certificate", path.display()),
                    fix: "point ca_file at a PEM bundle with at least one CERTIFICATE block",
                });
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError {
            file: TlsFile::Ca,
            message: format!("TLS setup failed: {e}"),
            fix: "report this as a bug",
        })?
        .with_root_certificates(roots);
    let mut config = match client_pair {
        None => builder.with_no_client_auth(),
        Some((cert_path, key_path)) => {
            let cert_pem = read(cert_path, TlsFile::Cert, &mut digest)?;
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError {
                    file: TlsFile::Cert,
                    message: format!("{} is not valid PEM: {e}", cert_path.display()),
                    fix: "point client_cert at a PEM certificate chain",
                })?;
            if chain.is_empty() {
                return Err(TlsError {
                    file: TlsFile::Cert,
                    message: format!("{} holds no certificate", cert_path.display()),
                    fix: "point client_cert at a PEM certificate chain",
                });
            }
            let key_pem = read(key_path, TlsFile::Key, &mut digest)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError {
                file: TlsFile::Key,
                message: format!("{} holds no usable private key: {e}", key_path.display()),
                fix: "point client_key at a PEM private key (PKCS#8, PKCS#1 or SEC1)",
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsError {
                    file: TlsFile::Key,
                    message: format!("the client key does not fit the certificate: {e}"),
                    fix: "use the key that belongs to client_cert",
                })?
        }
    };
    config.alpn_protocols = alpn(protocol);
    Ok((config, digest.finish()))
}
