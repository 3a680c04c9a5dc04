//! TLS failures in words an operator can act on, and how often they are told.
//!
//! A TLS failure is a configuration problem far more often than a passing fault (a
//! certificate for another name, an expired one, a CA bundle that lacks the issuer, a
//! client certificate the server refuses), so it is said at WARN with its reason, but
//! at most once per endpoint every [`WARN_EVERY_MS`]: a busy upstream must not fill the
//! log with one line per request.
//!
//! A refused client certificate shows in three ways, by TLS version and server: an
//! alert during the handshake (TLS 1.2), an alert on the first read after a handshake
//! that seemed to succeed (TLS 1.3, where the server checks the client's certificate
//! after the client has finished), or the server closing the new connection without a
//! word. All three are one failure here: [`rejection`] recognises the last two on a
//! connection's first exchange.

use std::error::Error;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use rustls::CertificateError;

/// At most one warning per endpoint in this many milliseconds.
pub const WARN_EVERY_MS: u64 = 5_000;

/// Why a TLS connection failed, for the log and the answer to the app.
pub fn describe(err: &(dyn Error + 'static)) -> String {
    match find_rustls(err) {
        Some(e) => rustls_reason(e),
        None => err.to_string(),
    }
}

/// Whether a failure on a TLS connection's first exchange is the server refusing the
/// connection after the handshake (see the module doc), and why. `client_cert`: a
/// client certificate was presented, so a silent close is most likely its refusal.
pub fn rejection(err: &(dyn Error + 'static), client_cert: bool) -> Option<String> {
    if let Some(e) = find_rustls(err) {
        return Some(rustls_reason(e));
    }
    if let Some(alert) = alert_in_words(err) {
        return Some(alert_reason(
            &alert,
            CLIENT_CERT_ALERTS.contains(&alert.as_str()),
        ));
    }
    if client_cert && closed_early(err) {
        return Some(
            "the server closed the connection right after the TLS handshake: it most likely \
             refused tollgate's client certificate (check client_cert against the CAs the \
             server trusts)"
                .to_string(),
        );
    }
    None
}

fn find_rustls<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(inner) = e
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(inner);
        }
        cur = e.source();
    }
    None
}

/// The connection ended before any answer: reset, closed, or cut short.
fn closed_early(err: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
            );
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && (h.is_closed() || h.is_incomplete_message() || h.is_canceled())
        {
            return true;
        }
        cur = e.source();
    }
    false
}

fn rustls_reason(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) => certificate_reason(c),
        rustls::Error::AlertReceived(a) => {
            let name = format!("{a:?}");
            let client = CLIENT_CERT_ALERTS.contains(&name.as_str());
            alert_reason(&name, client)
        }
        other => other.to_string(),
    }
}

fn certificate_reason(c: &CertificateError) -> String {
    match c {
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            format!("{c} (server_name must be a name the certificate carries)")
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            format!("{c} (the server's certificate must be renewed)")
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            format!("{c} (check the clocks, or wait for the certificate to start)")
        }
        CertificateError::UnknownIssuer => "certificate signed by an unknown authority \
             (ca_file does not hold the CA that issued the server's certificate)"
            .to_string(),
        other => format!("invalid certificate: {other}"),
    }
}

/// The alerts a server sends when it refuses (or wanted) the client's certificate, by
/// their names in rustls.
const CLIENT_CERT_ALERTS: [&str; 8] = [
    "BadCertificate",
    "CertificateRequired",
    "UnknownCA",
    "CertificateUnknown",
    "CertificateExpired",
    "CertificateRevoked",
    "UnsupportedCertificate",
    "AccessDenied",
];

fn alert_reason(name: &str, client_cert: bool) -> String {
    if client_cert {
        format!(
            "the server refused tollgate's client certificate (TLS alert {name}); check \
             client_cert and client_key against the CAs the server trusts"
        )
    } else {
        format!("the server sent the TLS alert {name}")
    }
}

/// An alert that reached the request only in words: HTTP/2 hands each stream of a
/// connection that failed a copy of the connection's I/O error, as text.
fn alert_in_words(err: &(dyn Error + 'static)) -> Option<String> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::InvalidData
        {
            let text = io.to_string();
            if let Some(name) = text.strip_prefix("received fatal alert: ") {
                return Some(name.trim().to_string());
            }
        }
        cur = e.source();
    }
    None
}

/// Lets one warning through per [`WARN_EVERY_MS`], counting the ones held back.
#[derive(Debug, Default)]
pub struct WarnEvery {
    /// When the last warning went out (ms on [`super::pool::clock_ms`], plus one so
    /// that 0 means never).
    last: AtomicU64,
    suppressed: AtomicU32,
}

impl WarnEvery {
    /// `Some(held back since the last one)` when a warning may go out now.
    pub fn allow(&self, now_ms: u64) -> Option<u32> {
        let last = self.last.load(Relaxed);
        let due = last == 0 || now_ms + 1 >= last + WARN_EVERY_MS;
        if due
            && self
                .last
                .compare_exchange(last, now_ms + 1, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Relaxed));
        }
        self.suppressed.fetch_add(1, Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_interval_with_the_count_held_back() {
        let w = WarnEvery::default();
        assert_eq!(w.allow(0), Some(0));
        assert_eq!(w.allow(10), None);
        assert_eq!(w.allow(4_000), None);
        assert_eq!(w.allow(WARN_EVERY_MS), Some(2));
        assert_eq!(w.allow(WARN_EVERY_MS + 1), None);
    }

    #[test]
    fn reasons_name_what_to_fix() {
        let io = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        assert!(describe(&io).contains("ca_file"), "{}", describe(&io));
        let alert = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        let words = io::Error::new(
            io::ErrorKind::InvalidData,
            "received fatal alert: UnknownCA",
        );
        assert!(
            rejection(&words, false)
                .unwrap()
                .contains("client certificate")
        );
        let why = rejection(&alert, false).unwrap();
        assert!(why.contains("client certificate"), "{why}");
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert!(rejection(&reset, true).is_some());
        assert!(
            rejection(&reset, false).is_none(),
            "no client cert: a reset"
        );
        let other = io::Error::other("no");
        assert!(rejection(&other, true).is_none());
    }
}
