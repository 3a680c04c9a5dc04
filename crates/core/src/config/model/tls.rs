//! What an upstream's `[tls]` section says, and what the files it names hold.
//!
//! The files are named by the text and read by a separate step
//! ([`crate::config::read_files`]), so that parsing stays a function of the text alone.
//! What they hold is kept here as DER: the upstream layer builds its rustls client from
//! it without opening a file, and two configs are equal only when the certificates
//! and keys are, so a reload notices a rotated certificate even when the config text
//! did not change.

use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Clone, Debug, PartialEq)]
pub struct TlsConfig {
    /// SNI and the name the upstream's certificate must carry.
    pub server_name: String,
    /// CA certificates to trust instead of the webpki roots.
    pub ca_file: Option<TlsFile>,
    /// The client certificate chain and its key, for mTLS: both or neither.
    pub client_cert: Option<TlsFile>,
    pub client_key: Option<TlsFile>,
    /// What the files hold. `None` while a named file has not been read: only
    /// [`crate::config::parse`] on its own leaves it so; `load` and `load_text` read
    /// every file before they hand out a config.
    pub material: Option<TlsMaterial>,
}

impl TlsConfig {
    /// The files this section names, with the key that names each.
    pub fn files(&self) -> impl Iterator<Item = (&'static str, &TlsFile)> {
        [
            ("ca_file", self.ca_file.as_ref()),
            ("client_cert", self.client_cert.as_ref()),
            ("client_key", self.client_key.as_ref()),
        ]
        .into_iter()
        .filter_map(|(key, file)| file.map(|f| (key, f)))
    }
}

/// A file named in the config: where it resolves, and where it was named.
#[derive(Clone, Debug)]
pub struct TlsFile {
    /// Relative paths are resolved against the config file's directory.
    pub path: PathBuf,
    /// Line and column of the value that names it, for diagnostics about its content.
    pub named_at: (usize, usize),
}

/// The same file, wherever the config names it: moving a line does not make a new
/// TLS setup (and does not drop the upstream's pooled connections on reload).
impl PartialEq for TlsFile {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

/// The certificates and key read from the files of a `[tls]` section.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TlsMaterial {
    /// `None`: trust the webpki roots.
    pub ca: Option<Vec<CertificateDer<'static>>>,
    pub identity: Option<ClientIdentity>,
}

/// A client certificate chain and the private key that fits its first certificate
/// (checked when the files were read).
#[derive(Clone, Debug, PartialEq)]
pub struct ClientIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    /// Shared: a private key is not `Clone` (its `Debug` never shows it).
    pub key: Arc<PrivateKeyDer<'static>>,
}
