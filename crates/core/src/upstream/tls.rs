//! TLS origination: the app speaks plain HTTP to localhost, tollgate speaks TLS (rustls)
//! to the upstream, verifying its certificate against a CA bundle (or the webpki roots)
//! and presenting a client certificate for mTLS when one is configured.
//!
//! Certificates are read by the config loader (`config::read_files`), on every load and
//! reload, so a reload picks up rotated files and an unreadable or invalid file is a
//! config error that names the key. This builds the rustls client from what it read,
//! once per upstream build, and opens no file.

use std::io;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::config::{Protocol, TlsConfig};

/// ALPN offers for the configured protocol.
pub fn alpn(protocol: Protocol) -> Vec<Vec<u8>> {
    match protocol {
        Protocol::Http1 => vec![b"http/1.1".to_vec()],
        Protocol::H2 => vec![b"h2".to_vec()],
        Protocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    }
}

/// What a TLS connect to one upstream needs: the name to verify and the rustls client,
/// built once per upstream build. A setup that failed fails every handshake with the
/// reason; the config loader has checked the material, so that is not expected.
#[derive(Debug)]
pub struct TlsClient {
    setup: Result<(ServerName<'static>, Arc<rustls::ClientConfig>), String>,
}

impl TlsClient {
    pub fn new(tls: &TlsConfig, protocol: Protocol) -> Self {
        let setup = ServerName::try_from(tls.server_name.clone())
            .map_err(|e| format!("server_name `{}`: {e}", tls.server_name))
            .and_then(|name| Ok((name, Arc::new(client_config(tls, protocol)?))));
        if let Err(e) = &setup {
            tracing::error!(problem = %e, "TLS setup failed; every handshake will fail");
        }
        TlsClient { setup }
    }

    /// The TLS handshake over `tcp`.
    pub async fn connect(&self, tcp: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        let (name, client) = self
            .setup
            .as_ref()
            .map_err(|e| io::Error::other(e.clone()))?;
        tokio_rustls::TlsConnector::from(client.clone())
            .connect(name.clone(), tcp)
            .await
    }
}

/// The rustls client for `tls`, from the certificates and key the config loader read.
pub fn client_config(tls: &TlsConfig, protocol: Protocol) -> Result<rustls::ClientConfig, String> {
    let material = tls
        .material
        .as_ref()
        .ok_or("the certificate files were never read (the config was parsed, not loaded)")?;
    let mut roots = RootCertStore::empty();
    match &material.ca {
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(certs) => {
            for cert in certs {
                roots
                    .add(cert.clone())
                    .map_err(|e| format!("CA certificate: {e}"))?;
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match &material.identity {
        None => builder.with_no_client_auth(),
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| format!("client certificate: {e}"))?,
    };
    config.alpn_protocols = alpn(protocol);
    Ok(config)
}
