//! TLS origination: the app speaks plain HTTP to localhost, tollgate speaks TLS (rustls)
//! to the upstream, verifying its certificate against a CA bundle (or the webpki roots)
//! and presenting a client certificate for mTLS when one is configured.
//!
//! Certificates are read when the config is loaded, so a reload picks up rotated files
//! and an unreadable or invalid file is a config error that names the key.

use std::hash::{Hash, Hasher};
use std::io::Read;
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

/// The largest certificate or key file read. A CA bundle of every public root is a few
/// hundred KiB; anything far bigger is the wrong file.
const MAX_FILE: u64 = 16 * 1024 * 1024;

/// Reads one certificate or key file. Only regular files (or symlinks to one, as
/// Kubernetes mounts Secrets) of at most [`MAX_FILE`] bytes: a path to a device or a
/// pipe could block a reload forever or never end.
fn read(path: &Path, file: TlsFile, hasher: &mut impl Hasher) -> Result<Vec<u8>, TlsError> {
    let unreadable = |why: String| TlsError {
        file,
        message: format!("cannot read {}: {why}", path.display()),
        fix: "check the path and that the file is mounted and readable",
    };
    // Looked at before opening: opening a pipe blocks until someone writes to it.
    let meta = std::fs::metadata(path).map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    let f = std::fs::File::open(path).map_err(|e| unreadable(e.to_string()))?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(e.to_string()))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(TlsError {
            file,
            message: format!(
                "{} is larger than {} MiB: not a certificate or key file",
                path.display(),
                MAX_FILE / (1024 * 1024)
            ),
            fix: "point the key at a PEM file",
        });
    }
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

/// The digest [`client_config`] would compute from the files as they are now; `None`
/// when one cannot be read.
pub fn fingerprint(ca_file: Option<&Path>, client_pair: Option<(&Path, &Path)>) -> Option<u64> {
    let mut digest = std::collections::hash_map::DefaultHasher::new();
    if let Some(path) = ca_file {
        read(path, TlsFile::Ca, &mut digest).ok()?;
    }
    if let Some((cert, key)) = client_pair {
        read(cert, TlsFile::Cert, &mut digest).ok()?;
        read(key, TlsFile::Key, &mut digest).ok()?;
    }
    Some(digest.finish())
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
