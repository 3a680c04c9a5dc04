//! Reading the files a config names: the CA bundle, the client certificate and its
//! key of each `[upstreams.NAME.tls]`.
//!
//! This is the one step of loading that touches the disk besides reading the config
//! itself. It runs after parsing, on every load and every reload, so a rotated
//! certificate is picked up by a reload, and an unreadable or invalid file is a
//! config error at the line that names it, with the path it resolved to. Every file is
//! read and every problem reported, not only the first.
//!
//! Only regular files (or symlinks to one, as Kubernetes mounts Secrets) of at most
//! [`MAX_FILE`] bytes are read: a path to a device or a pipe could block a load forever
//! or never end.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::diagnostic::{ConfigErrors, Diagnostic, Severity};
use super::model::*;

/// The largest certificate or key file read. A CA bundle of every public root is a few
/// hundred KiB; anything far bigger is the wrong file.
pub const MAX_FILE: u64 = 16 * 1024 * 1024;

/// A problem with one file: what is wrong (naming the path) and the fix.
struct Problem {
    message: String,
    fix: &'static str,
}

/// Reads every file `config` names and keeps what they hold in it; every problem of
/// every file is reported at the line that names the file.
pub fn read_files(mut config: Config) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    for up in &mut config.upstreams {
        let Some(tls) = up.tls.as_mut() else {
            continue;
        };
        let read = read_tls(tls);
        for (key, file, problem) in read.problems {
            let (line, column) = file.named_at;
            errors.push(Diagnostic {
                severity: Severity::Error,
                file: config.file.clone(),
                line,
                column,
                key: format!("upstreams.{}.tls.{key}", up.name),
                message: problem.message,
                fix: problem.fix.to_string(),
            });
        }
        tls.material = read.material;
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        errors.sort_by_key(|d| (d.line, d.column));
        Err(ConfigErrors(errors))
    }
}

/// Whether every file `config` names still holds what the config was built from; a
/// file that cannot be read any more has changed.
pub fn files_unchanged(config: &Config) -> bool {
    config
        .upstreams
        .iter()
        .filter_map(|u| u.tls.as_ref())
        .all(|tls| {
            let now = read_tls(tls);
            now.problems.is_empty() && now.material == tls.material
        })
}

/// What the files of one `[tls]` section hold, and what is wrong with them.
struct TlsRead<'t> {
    /// `None` when any file has a problem.
    material: Option<TlsMaterial>,
    problems: Vec<(&'static str, &'t TlsFile, Problem)>,
}

fn read_tls(tls: &TlsConfig) -> TlsRead<'_> {
    let mut problems = Vec::new();
    let ca = tls
        .ca_file
        .as_ref()
        .map(|f| keep(&mut problems, "ca_file", f, ca_bundle(&f.path)));
    let chain = tls
        .client_cert
        .as_ref()
        .and_then(|f| keep(&mut problems, "client_cert", f, cert_chain(&f.path)));
    let key = tls
        .client_key
        .as_ref()
        .and_then(|f| keep(&mut problems, "client_key", f, private_key(&f.path)));
    let identity = match (chain, key, &tls.client_key) {
        (Some(chain), Some(key), Some(f)) => {
            keep(&mut problems, "client_key", f, identity(chain, key))
        }
        _ => None,
    };
    let material = problems.is_empty().then(|| TlsMaterial {
        ca: ca.flatten(),
        identity,
    });
    TlsRead { material, problems }
}

/// The value, or the problem noted against the key that names `file`.
fn keep<'t, T>(
    problems: &mut Vec<(&'static str, &'t TlsFile, Problem)>,
    key: &'static str,
    file: &'t TlsFile,
    read: Result<T, Problem>,
) -> Option<T> {
    read.map_err(|p| problems.push((key, file, p))).ok()
}

/// A PEM bundle of CA certificates, each one rustls accepts as a trust anchor.
fn ca_bundle(path: &Path) -> Result<Vec<CertificateDer<'static>>, Problem> {
    const FIX: &str = "point ca_file at a PEM bundle of CA certificates";
    let certs = certificates(path, FIX)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in &certs {
        roots.add(cert.clone()).map_err(|e| Problem {
            message: format!("{} holds a certificate rustls rejects: {e}", path.display()),
            fix: FIX,
        })?;
    }
    Ok(certs)
}

fn cert_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, Problem> {
    certificates(path, "point client_cert at a PEM certificate chain")
}

/// The certificates of a PEM file: at least one; `fix` says what the file should be.
fn certificates(path: &Path, fix: &'static str) -> Result<Vec<CertificateDer<'static>>, Problem> {
    let pem = read(path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Problem {
            message: format!("{} is not valid PEM: {e}", path.display()),
            fix,
        })?;
    if certs.is_empty() {
        return Err(Problem {
            message: format!("{} holds no certificate", path.display()),
            fix,
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, Problem> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| Problem {
        message: format!("{} holds no usable private key: {e}", path.display()),
        fix: "point client_key at a PEM private key (PKCS#8, PKCS#1 or SEC1)",
    })
}

/// The pair, once the key is known to fit the chain's first certificate. rustls checks
/// that only when it builds a client; doing it here makes a mismatched pair a config
/// error at load time instead of a handshake that fails on every request.
fn identity(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<ClientIdentity, Problem> {
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider).map_err(
        |e| Problem {
            message: format!("the client key does not fit the certificate: {e}"),
            fix: "use the key that belongs to client_cert",
        },
    )?;
    Ok(ClientIdentity {
        chain,
        key: Arc::new(key),
    })
}

/// Reads one certificate or key file; see the module doc for what is refused.
fn read(path: &Path) -> Result<Vec<u8>, Problem> {
    let unreadable = |why: String| Problem {
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
        return Err(Problem {
            message: format!(
                "{} is larger than {} MiB: not a certificate or key file",
                path.display(),
                MAX_FILE / (1024 * 1024)
            ),
            fix: "point the key at a PEM file",
        });
    }
    Ok(bytes)
}
