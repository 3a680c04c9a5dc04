//! `[upstreams.NAME.tls]`: TLS to the endpoints. Paths are shown, never what the files
//! hold.

use serde_json::json;

use crate::config::model::TlsConfig;

keys! {
    section "upstreams.NAME.tls" of TlsConfig = None;
    server_name: "DNS name or IP", required, Applied, "SNI, and the name the certificate must carry",
        |c| json!(c.server_name);
    ca_file: "path", "the webpki roots", Applied, "PEM bundle of the CAs to trust",
        |c| json!(c.ca_file.as_ref().map(|f| f.path.display().to_string()));
    client_cert: "path", "none", Applied, "PEM certificate chain for mTLS (with `client_key`)",
        |c| json!(c.client_cert.as_ref().map(|f| f.path.display().to_string()));
    client_key: "path", "none", Applied, "PEM key for mTLS (with `client_cert`)",
        |c| json!(c.client_key.as_ref().map(|f| f.path.display().to_string()));
}
