//! TLS failures as an operator meets them: each is named in the answer and warned
//! about (at most once per endpoint every few seconds), counted as attempt result
//! `tls`, and never retried on the endpoint that failed; a refused client certificate
//! is one failure however the server shows it. Certificates are made in the test.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::tls as tls_stack;

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::config::{Config, Tls};
use common::tempdir::TempDir;
use common::*;
use rcgen::ExtendedKeyUsagePurpose;
use tls_stack::*;

/// `[upstreams.secure]` over TLS to `endpoints`, three attempts for any method.
fn retrying(endpoints: &[SocketAddr], tls: impl FnOnce(Tls) -> Tls) -> Config {
    Config::new().upstream("secure", |u| {
        endpoints
            .iter()
            .fold(u.authorities(["secure"]), |u, e| u.endpoint(e))
            .connect_timeout("5s")
            .attempt_timeout("5s")
            .request_timeout("10s")
            .retry(|r| {
                r.max_attempts(3)
                    .methods(["GET", "POST"])
                    .backoff_base("1ms")
                    .backoff_max("2ms")
            })
            .tls(tls)
    })
}

async fn series(tg: &Tollgate, name: &str) -> f64 {
    let m = tg.metrics().await;
    metric(&m, name).unwrap_or_else(|| panic!("{name} missing"))
}

/// The request fails as a TLS failure of `addr`, named with `words`, in one attempt.
async fn assert_tls_failure(tg: &Tollgate, method: &str, addr: SocketAddr, words: &str) {
    // Absent before the upstream's first request: none counted yet.
    let tls = "tollgate_attempts_total{result=\"tls\",upstream=\"secure\"}";
    let before = metric(&tg.metrics().await, tls).unwrap_or(0.0);
    let r = send(
        tg.addr,
        request(method, "/", "secure").body(empty()).unwrap(),
    )
    .await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert_eq!(r.status, 502, "{text}");
    assert_eq!(r.outcome(), Some("upstream-unreachable"));
    assert_eq!(r.attempts(), 1, "not retried on the same endpoint: {text}");
    assert!(
        text.starts_with(&format!("TLS handshake with {addr} failed: ")),
        "{text}"
    );
    assert!(text.contains(words), "`{words}` missing from: {text}");
    let after = series(tg, tls).await;
    assert_eq!(after - before, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_certificate_problem_is_named_counted_as_tls_and_not_retried() {
    let ca = Ca::new("test CA");
    let other = Ca::new("some other CA");
    let dir = TempDir::new("tls-failures");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let other_file = write(dir.path(), "other.pem", &other.pem());
    let good = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let expired = ca.leaf_with(&[NAME], ExtendedKeyUsagePurpose::ServerAuth, |p| {
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(2001, 1, 1);
    });
    let up = TlsUpstream::start(server_config(&good, &["http/1.1"], None)).await;
    let old = TlsUpstream::start(server_config(&expired, &["h2", "http/1.1"], None)).await;

    for (addr, tls, words) in [
        (
            up.addr,
            trusting("other.test", &ca_file),
            "certificate not valid for name \"other.test\"",
        ),
        (up.addr, trusting(NAME, &other_file), "unknown authority"),
        (old.addr, trusting(NAME, &ca_file), "certificate expired"),
    ] {
        let tg = Tollgate::start(&retrying(&[addr], tls).to_toml()).await;
        assert_tls_failure(&tg, "GET", addr, words).await;
        let m = tg.metrics().await;
        for quiet in [
            "tollgate_attempts_total{result=\"connect-failure\",upstream=\"secure\"}",
            "tollgate_retries_total{reason=\"connect-failure\",upstream=\"secure\"}",
        ] {
            assert_eq!(metric(&m, quiet), Some(0.0), "{quiet} for {words}");
        }
        tg.stop().await;
    }
    assert_eq!(up.hits() + old.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_failure_moves_on_to_another_endpoint() {
    let ca = Ca::new("test CA");
    let dir = TempDir::new("tls-other-endpoint");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let good = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let wrong = ca.leaf(&["someone-else.test"], ExtendedKeyUsagePurpose::ServerAuth);
    let bad = TlsUpstream::start(server_config(&wrong, &["http/1.1"], None)).await;
    let fine = TlsUpstream::start(server_config(&good, &["http/1.1"], None)).await;
    let tg = Tollgate::start(&retrying(&[bad.addr, fine.addr], trusting(NAME, &ca_file)).to_toml())
        .await;
    for _ in 0..4 {
        let r = send(
            tg.addr,
            request("POST", "/", "secure").body(empty()).unwrap(),
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert_eq!(fine.hits(), 4);
    assert!(
        series(
            &tg,
            "tollgate_attempts_total{result=\"tls\",upstream=\"secure\"}"
        )
        .await
            >= 1.0
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_certificate_is_one_failure_however_the_server_shows_it() {
    let ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let stranger_ca = Ca::new("a CA the server does not trust");
    let leaf = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let stranger = stranger_ca.leaf(&["tollgate"], ExtendedKeyUsagePurpose::ClientAuth);
    let dir = TempDir::new("tls-client-cert");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let cert = write(dir.path(), "client.crt", &stranger.cert_pem);
    let key = write(dir.path(), "client.key", &stranger.key_pem);
    let tls = |t: Tls| {
        trusting(NAME, &ca_file)(t)
            .client_cert(cert.display().to_string())
            .client_key(key.display().to_string())
    };
    let tls12 = [&rustls::version::TLS12];
    let tls13 = [&rustls::version::TLS13];
    // TLS 1.2: an alert in the handshake. TLS 1.3: the handshake seems done, the alert
    // comes on the first read. A server checking above TLS: it just closes.
    let servers = [
        (
            "TLS 1.2 alert",
            TlsUpstream::start(server_config_versions(
                &leaf,
                &["http/1.1"],
                Some(&client_ca),
                &tls12,
            ))
            .await,
        ),
        (
            "TLS 1.3 alert after the handshake",
            TlsUpstream::start(server_config_versions(
                &leaf,
                &["h2", "http/1.1"],
                Some(&client_ca),
                &tls13,
            ))
            .await,
        ),
        (
            "closed after the handshake",
            TlsUpstream::start_with(server_config(&leaf, &["http/1.1"], None), true).await,
        ),
    ];
    for (how, up) in &servers {
        let tg = Tollgate::start(&retrying(&[up.addr], tls).to_toml()).await;
        for method in ["GET", "POST"] {
            let r = send(
                tg.addr,
                request(method, "/", "secure").body(empty()).unwrap(),
            )
            .await;
            let text = String::from_utf8_lossy(&r.body).into_owned();
            assert_eq!(r.status, 502, "{how}: {text}");
            assert_eq!(r.outcome(), Some("upstream-unreachable"), "{how}");
            assert_eq!(r.attempts(), 1, "{how}: {text}");
            assert!(text.contains("client certificate"), "{how}: {text}");
        }
        let m = tg.metrics().await;
        assert_eq!(
            metric(
                &m,
                "tollgate_attempts_total{result=\"tls\",upstream=\"secure\"}"
            ),
            Some(2.0),
            "{how}"
        );
        assert_eq!(
            metric(
                &m,
                "tollgate_attempts_total{result=\"reset\",upstream=\"secure\"}"
            ),
            Some(0.0),
            "{how}"
        );
        assert_eq!(up.hits(), 0, "{how}");
        tg.stop().await;
    }
}

/// The real binary at its default log level: one warning for a burst of failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_failure_is_warned_about_once_per_endpoint_not_per_request() {
    let ca = Ca::new("test CA");
    let dir = TempDir::new("tls-warn");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let leaf = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let up = TlsUpstream::start(server_config(&leaf, &["http/1.1"], None)).await;
    let (port, admin) = (free_port(), free_port());
    let text = retrying(&[up.addr], trusting("other.test", &ca_file))
        .listener(|l| l.addr(SocketAddr::from(([127, 0, 0, 1], port))))
        .admin(|a| a.addr(SocketAddr::from(([127, 0, 0, 1], admin))))
        .to_toml();
    let path = write(dir.path(), "tollgate.toml", &text);
    let mut child = Command::new(binary())
        .args(["run", "--config"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let admin = SocketAddr::from(([127, 0, 0, 1], admin));
    let ready = async {
        for _ in 0..400 {
            if tokio::net::TcpStream::connect(admin).await.is_ok()
                && get(admin, "/readyz", "admin").await.status == 200
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        false
    };
    assert!(ready.await, "tollgate did not become ready");
    for _ in 0..5 {
        assert_eq!(get(addr, "/", "secure").await.status, 502);
    }
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    let _ = child.wait();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("TLS handshake with"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning for five failures:\n{log}");
    let w = warnings[0];
    for words in [
        &format!(
            "TLS handshake with {} failed: certificate not valid for name \"other.test\"",
            up.addr
        )[..],
        "upstream=secure",
        &format!("endpoint={}", up.addr),
    ] {
        assert!(w.contains(words), "`{words}` missing from: {w}");
    }
}
