//! `[upstreams.NAME.tls]`: the name to verify and the files to read. The files are only
//! named here, resolved against the config's directory; reading them is
//! [`crate::config::read_files`]'s job.

use std::ops::Range;
use std::path::Path;

use super::schema::Section;
use super::walker::{Table, Walker};
use crate::config::keys::tls as key;
use crate::config::model::*;

/// `[upstreams.NAME.tls]`, its files resolved against `base`; `span` is the table's.
pub(super) fn tls(
    w: &mut Walker<'_>,
    upstream: &str,
    t: &Table,
    span: Range<usize>,
    base: &Path,
) -> Option<TlsConfig> {
    w.check_keys(Section::Tls, upstream, t);
    let server_name = server_name(w, t, span);
    let mut file = |key: &str| {
        let (text, span) = w.string(t, key)?;
        let named = Path::new(&text);
        Some(TlsFile {
            path: if named.is_absolute() {
                named.to_path_buf()
            } else {
                base.join(named)
            },
            named_at: w.src.position(span.start),
        })
    };
    let ca_file = file(key::ca_file);
    let client_cert = file(key::client_cert);
    let client_key = file(key::client_key);
    if !client_pair_complete(w, t, client_cert.is_some(), client_key.is_some()) {
        return None;
    }
    let named_none = ca_file.is_none() && client_cert.is_none();
    Some(TlsConfig {
        server_name: server_name?,
        ca_file,
        client_cert,
        client_key,
        material: named_none.then(TlsMaterial::default),
    })
}

fn server_name(w: &mut Walker<'_>, t: &Table, table_span: Range<usize>) -> Option<String> {
    let full = t.key(key::server_name);
    let Some((name, span)) = w.string(t, key::server_name) else {
        if t.get(key::server_name).is_none() {
            w.error(
                table_span,
                &full,
                "missing: TLS needs the name the upstream's certificate carries",
                "add server_name = \"api.example.com\"",
            );
        }
        return None;
    };
    if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
        w.reject(
            span,
            &full,
            format!("`{name}` is not a DNS name or IP address"),
            "write the host name the certificate is issued for",
        );
        return None;
    }
    Some(name)
}

/// mTLS needs both halves of the pair. Not judged when either was written wrongly: it
/// was given, and its own error says what is wrong with it.
fn client_pair_complete(w: &mut Walker<'_>, t: &Table, cert: bool, pem_key: bool) -> bool {
    if cert == pem_key {
        return true;
    }
    if w.is_invalid(&t.key(key::client_cert)) || w.is_invalid(&t.key(key::client_key)) {
        return false;
    }
    let (given, missing) = if cert {
        (key::client_cert, key::client_key)
    } else {
        (key::client_key, key::client_cert)
    };
    w.error(
        t.span_of(given, &(0..0)),
        &t.key(missing),
        "mTLS needs both client_cert and client_key",
        &format!("add {missing}, or remove {given}"),
    );
    false
}
