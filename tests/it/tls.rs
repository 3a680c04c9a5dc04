//! TLS origination: the app speaks plain HTTP to tollgate, tollgate speaks TLS to the
//! upstream. Certificates are made in the test (a CA, a server certificate for
//! `upstream.test`, a client certificate for mTLS) and the upstream is a real rustls
//! server on loopback (`common/tls.rs`).

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::common::tls as tls_stack;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::config::Config;
use common::tempdir::TempDir;
use common::*;
use rcgen::ExtendedKeyUsagePurpose;
use tls_stack::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_picks_h2_or_http1_by_alpn_and_http1_offers_only_http1() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let dir = TempDir::new("tls-alpn");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());

    // The upstream offers both: auto lands on h2.
    let both = TlsUpstream::start(server_config(&leaf, &["h2", "http/1.1"], None)).await;
    let tg = Tollgate::start(&secure(both.addr, "auto", trusting(NAME, &ca_file))).await;
    for _ in 0..3 {
        let r = get(tg.addr, "/", "secure").await;
        assert_eq!(r.status, 200, "{}", body(&r));
        assert_eq!(
            body(&r),
            format!("HTTP/2.0 alpn=h2 sni={NAME} client-cert=false")
        );
    }
    // The app speaking h2c to tollgate changes nothing: TLS upstreams go by ALPN.
    let r = send_h2(
        tg.addr,
        request("GET", "/", "secure").body(empty()).unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(body(&r).starts_with("HTTP/2.0 alpn=h2"), "{}", body(&r));
    tg.stop().await;

    // protocol = "http1" offers only http/1.1, so the same server answers in HTTP/1.1.
    let tg = Tollgate::start(&secure(both.addr, "http1", trusting(NAME, &ca_file))).await;
    let r = get(tg.addr, "/", "secure").await;
    assert_eq!(r.status, 200, "{}", body(&r));
    assert_eq!(
        body(&r),
        format!("HTTP/1.1 alpn=http/1.1 sni={NAME} client-cert=false")
    );
    let r = send_h2(
        tg.addr,
        request("GET", "/", "secure").body(empty()).unwrap(),
    )
    .await;
    assert!(
        body(&r).starts_with("HTTP/1.1 alpn=http/1.1"),
        "{}",
        body(&r)
    );
    tg.stop().await;

    // An upstream that only speaks http/1.1: auto follows it.
    let h1 = TlsUpstream::start(server_config(&leaf, &["http/1.1"], None)).await;
    let tg = Tollgate::start(&secure(h1.addr, "auto", trusting(NAME, &ca_file))).await;
    for _ in 0..3 {
        let r = get(tg.addr, "/", "secure").await;
        assert_eq!(r.status, 200, "{}", body(&r));
        assert_eq!(
            body(&r),
            format!("HTTP/1.1 alpn=http/1.1 sni={NAME} client-cert=false")
        );
    }
    tg.stop().await;

    // protocol = "h2c" with TLS means HTTP/2 by ALPN.
    let tg = Tollgate::start(&secure(both.addr, "h2c", trusting(NAME, &ca_file))).await;
    let r = get(tg.addr, "/", "secure").await;
    assert_eq!(r.status, 200, "{}", body(&r));
    assert!(body(&r).starts_with("HTTP/2.0 alpn=h2"), "{}", body(&r));
    tg.stop().await;
    assert_eq!(both.failed() + h1.failed(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_an_untrusted_ca_is_refused() {
    let ca = Ca::new("real CA");
    let other = Ca::new("some other CA");
    let leaf = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let dir = TempDir::new("tls-wrong-ca");
    let wrong = write(dir.path(), "other.pem", &other.pem());
    let up = TlsUpstream::start(server_config(&leaf, &["h2", "http/1.1"], None)).await;
    let tg = Tollgate::start(&secure(up.addr, "auto", trusting(NAME, &wrong))).await;

    let r = get(tg.addr, "/", "secure").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("upstream-unreachable"));
    assert_eq!(
        up.hits(),
        0,
        "no request is sent over an unverified connection"
    );
    assert!(wait_until(Duration::from_secs(5), || up.failed() >= 1).await);
    let m = tg.metrics().await;
    assert_eq!(
        metric(
            &m,
            "tollgate_attempts_total{result=\"tls\",upstream=\"secure\"}"
        ),
        Some(1.0),
        "a TLS failure, not retried on the same endpoint"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_must_carry_the_server_name() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let dir = TempDir::new("tls-name");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let up = TlsUpstream::start(server_config(&leaf, &["h2", "http/1.1"], None)).await;

    let tg = Tollgate::start(&secure(up.addr, "auto", trusting("other.test", &ca_file))).await;
    let r = get(tg.addr, "/", "secure").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("upstream-unreachable"));
    assert_eq!(up.hits(), 0);
    tg.stop().await;

    // An IP address as server_name is checked against the certificate's IP SANs.
    let tg = Tollgate::start(&secure(up.addr, "auto", trusting("127.0.0.1", &ca_file))).await;
    let r = get(tg.addr, "/", "secure").await;
    assert_eq!(r.status, 502, "the certificate names no IP address");
    assert_eq!(up.hits(), 0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_refused() {
    let ca = Ca::new("test CA");
    let leaf = ca.leaf_with(&[NAME], ExtendedKeyUsagePurpose::ServerAuth, |p| {
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(2001, 1, 1);
    });
    let dir = TempDir::new("tls-expired");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let up = TlsUpstream::start(server_config(&leaf, &["http/1.1"], None)).await;
    let tg = Tollgate::start(&secure(up.addr, "auto", trusting(NAME, &ca_file))).await;
    let r = get(tg.addr, "/", "secure").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.outcome(), Some("upstream-unreachable"));
    assert_eq!(up.hits(), 0);
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_presents_the_client_certificate() {
    let ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let leaf = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let client = client_ca.leaf(&["tollgate-client"], ExtendedKeyUsagePurpose::ClientAuth);
    let dir = TempDir::new("tls-mtls");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let cert_file = write(dir.path(), "client.crt", &client.cert_pem);
    let key_file = write(dir.path(), "client.key", &client.key_pem);

    for alpn in [&["h2", "http/1.1"][..], &["http/1.1"][..]] {
        let up = TlsUpstream::start(server_config(&leaf, alpn, Some(&client_ca))).await;
        let tg = Tollgate::start(&secure(up.addr, "auto", |t| {
            trusting(NAME, &ca_file)(t)
                .client_cert(cert_file.display().to_string())
                .client_key(key_file.display().to_string())
        }))
        .await;
        let r = get(tg.addr, "/", "secure").await;
        assert_eq!(r.status, 200, "{alpn:?}: {}", body(&r));
        assert!(body(&r).ends_with("client-cert=true"), "{}", body(&r));
        assert_eq!(
            up.client_cert.lock().unwrap().as_deref(),
            Some(client.der.as_ref()),
            "the server verified the configured client certificate"
        );
        tg.stop().await;

        // Without a client certificate the server refuses the handshake. Under TLS 1.3
        // the client learns it only on its first read, so the attempt may count as a
        // reset rather than a connect failure; either way nothing is served.
        let tg = Tollgate::start(&secure(up.addr, "auto", trusting(NAME, &ca_file))).await;
        let r = get(tg.addr, "/", "secure").await;
        assert_eq!(r.status, 502, "{alpn:?}");
        assert!(r.outcome().is_some());
        assert_eq!(up.hits(), 1, "only the authenticated request was served");
        assert!(wait_until(Duration::from_secs(5), || up.failed() >= 1).await);
        tg.stop().await;
    }
}

#[test]
fn unreadable_or_invalid_certificate_files_are_config_errors() {
    let ca = Ca::new("test CA");
    let client = ca.leaf(&["client"], ExtendedKeyUsagePurpose::ClientAuth);
    let stranger = ca.leaf(&["stranger"], ExtendedKeyUsagePurpose::ClientAuth);
    let dir = TempDir::new("tls-config");
    let d = dir.path();
    let ca_file = write(d, "ca.pem", &ca.pem());
    let cert = write(d, "client.crt", &client.cert_pem);
    let key = write(d, "client.key", &client.key_pem);
    let other_key = write(d, "other.key", &stranger.key_pem);
    let garbage = write(d, "garbage.pem", "this is not a certificate\n");
    let broken = write(
        d,
        "broken.pem",
        "-----BEGIN CERTIFICATE-----\n!!!! not base64 !!!!\n-----END CERTIFICATE-----\n",
    );
    let key_only = write(d, "key-as-ca.pem", &client.key_pem);
    let missing = d.join("missing.pem");
    // A pipe would block a reader forever; a huge file is no certificate.
    let fifo = d.join("fifo.pem");
    let made_fifo = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    let huge = d.join("huge.pem");
    std::fs::write(
        &huge,
        ca.pem().repeat(17 * 1024 * 1024 / ca.pem().len() + 1),
    )
    .unwrap();

    fn check(tls: &str) -> String {
        let text = format!(
            "[upstreams.secure]\nauthorities = [\"secure\"]\nendpoints = [\"127.0.0.1:1\"]\n\
             [upstreams.secure.tls]\n{tls}"
        );
        match tollgate_core::config::load_text("tls.toml", &text, Path::new("/nonexistent")) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }
    let p = |p: &Path| p.display().to_string();
    let mut cases: Vec<(String, &str, String)> = vec![
        // (the tls table, the key the error must name, words the message must carry)
        (
            format!("server_name = \"{NAME}\"\nca_file = \"{}\"\n", p(&missing)),
            "tls.toml:6:11: upstreams.secure.tls.ca_file",
            format!("cannot read {}", p(&missing)),
        ),
        (
            format!("server_name = \"{NAME}\"\nca_file = \"{}\"\n", p(d)),
            "tls.toml:6:11: upstreams.secure.tls.ca_file",
            "not a regular file".into(),
        ),
        (
            format!("server_name = \"{NAME}\"\nca_file = \"{}\"\n", p(&huge)),
            "tls.toml:6:11: upstreams.secure.tls.ca_file",
            "larger than 16 MiB".into(),
        ),
        (
            format!("server_name = \"{NAME}\"\nca_file = \"{}\"\n", p(&garbage)),
            "tls.toml:6:11: upstreams.secure.tls.ca_file",
            "holds no certificate".into(),
        ),
        (
            format!("server_name = \"{NAME}\"\nca_file = \"{}\"\n", p(&key_only)),
            "tls.toml:6:11: upstreams.secure.tls.ca_file",
            "holds no certificate".into(),
        ),
        (
            format!("server_name = \"{NAME}\"\nca_file = \"{}\"\n", p(&broken)),
            "tls.toml:6:11: upstreams.secure.tls.ca_file",
            "not valid PEM".into(),
        ),
        (
            format!(
                "server_name = \"{NAME}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
                p(&garbage),
                p(&key)
            ),
            "tls.toml:6:15: upstreams.secure.tls.client_cert",
            "holds no certificate".into(),
        ),
        (
            format!(
                "server_name = \"{NAME}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
                p(&cert),
                p(&cert)
            ),
            "tls.toml:7:14: upstreams.secure.tls.client_key",
            "no usable private key".into(),
        ),
        (
            format!(
                "server_name = \"{NAME}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
                p(&cert),
                p(&missing)
            ),
            "tls.toml:7:14: upstreams.secure.tls.client_key",
            format!("cannot read {}", p(&missing)),
        ),
        (
            format!(
                "server_name = \"{NAME}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"\n",
                p(&cert),
                p(&other_key)
            ),
            "tls.toml:7:14: upstreams.secure.tls.client_key",
            "does not fit the certificate".into(),
        ),
        (
            format!("server_name = \"{NAME}\"\nclient_cert = \"{}\"\n", p(&cert)),
            "tls.toml:6:15: upstreams.secure.tls.client_key",
            "mTLS needs both".into(),
        ),
        (
            format!(
                "server_name = \"not a name\"\nca_file = \"{}\"\n",
                p(&ca_file)
            ),
            "tls.toml:5:15: upstreams.secure.tls.server_name",
            "not a DNS name".into(),
        ),
        (
            format!("ca_file = \"{}\"\n", p(&ca_file)),
            "upstreams.secure.tls.server_name",
            "missing".into(),
        ),
    ];
    if made_fifo {
        cases.push((
            format!("server_name = \"{NAME}\"\nca_file = \"{}\"\n", p(&fifo)),
            "tls.toml:6:11: upstreams.secure.tls.ca_file",
            "not a regular file".into(),
        ));
    }
    for (tls, at, words) in cases {
        let err = check(&tls);
        assert!(err.contains(at), "expected {at} in:\n{err}\nfor:\n{tls}");
        assert!(
            err.contains(&words),
            "expected `{words}` in:\n{err}\nfor:\n{tls}"
        );
    }
    // The same files, correct, are accepted; relative paths are found next to the file.
    let text = format!(
        "[upstreams.secure]\nauthorities = [\"secure\"]\nendpoints = [\"127.0.0.1:1\"]\n\
         [upstreams.secure.tls]\n\
         server_name = \"{NAME}\"\nca_file = \"ca.pem\"\nclient_cert = \"client.crt\"\nclient_key = \"client.key\"\n"
    );
    let cfg = tollgate_core::config::load_text("tls.toml", &text, d).unwrap();
    let tls = cfg.upstreams[0].tls.as_ref().unwrap();
    assert_eq!(
        tls.ca_file.as_ref().map(|f| f.path.as_path()),
        Some(ca_file.as_path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_ca_file_is_picked_up_on_reload() {
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let old_leaf = old_ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let new_leaf = new_ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let old_server = TlsUpstream::start(server_config(&old_leaf, &["http/1.1"], None)).await;
    let new_server = TlsUpstream::start(server_config(&new_leaf, &["http/1.1"], None)).await;

    let dir = TempDir::new("tls-rotate");
    let ca_file = write(dir.path(), "ca.pem", &old_ca.pem());
    let section = |name: &'static str, addr: SocketAddr| {
        move |u: common::config::Upstream| {
            u.authorities([name])
                .endpoint(addr)
                .connect_timeout("5s")
                .attempt_timeout("5s")
                .tls(|t| t.server_name(NAME).ca_file("ca.pem"))
        }
    };
    let path = write(
        dir.path(),
        "tollgate.toml",
        &Config::new()
            .upstream("old", section("old", old_server.addr))
            .upstream("new", section("new", new_server.addr))
            .to_toml(),
    );
    let tg = Tollgate::start_file(&path).await;

    // The old CA is trusted: the old server is reachable (and its connection pooled),
    // the new one is not.
    assert_eq!(get(tg.addr, "/", "old").await.status, 200);
    assert_eq!(get(tg.addr, "/", "new").await.status, 502);

    // A first reload (an edited comment) makes sure the watcher has taken its first
    // look; see `a_ca_rotated_before_the_first_look_is_picked_up` for why.
    let text = std::fs::read_to_string(&path).unwrap();
    write(dir.path(), "tollgate.toml", &format!("{text}# edited\n"));
    tg.wait_reloads("ok", 1.0).await;

    // Rotate: the CA file is replaced (as a Secret update does); the config text is
    // not touched.
    let tmp = write(dir.path(), "ca.pem.tmp", &new_ca.pem());
    std::fs::rename(&tmp, &ca_file).unwrap();
    tg.wait_reloads("ok", 2.0).await;
    let r = get(tg.addr, "/", "new").await;
    assert_eq!(r.status, 200, "the new CA is trusted after the reload");
    let r = get(tg.addr, "/", "old").await;
    assert_eq!(
        r.status, 502,
        "the old CA is no longer trusted, pooled connections included"
    );
    tg.stop().await;
}

/// A certificate rotated between the config being loaded and the watcher's first look
/// (within about 100 ms of start) is never reloaded: on its first look the watcher
/// only compares the config text with the config in force, takes the certificate
/// files' current stamps as the baseline, and so never sees them change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotated_before_the_first_look_is_picked_up() {
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let new_leaf = new_ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let server = TlsUpstream::start(server_config(&new_leaf, &["http/1.1"], None)).await;
    let dir = TempDir::new("tls-rotate-early");
    let ca_file = write(dir.path(), "ca.pem", &old_ca.pem());
    let path = write(
        dir.path(),
        "tollgate.toml",
        &secure(server.addr, "auto", |t| {
            t.server_name(NAME).ca_file("ca.pem")
        }),
    );
    let tg = Tollgate::start_file(&path).await;
    let tmp = write(dir.path(), "ca.pem.tmp", &new_ca.pem());
    std::fs::rename(&tmp, &ca_file).unwrap();
    tg.wait_reloads("ok", 1.0).await;
    assert_eq!(get(tg.addr, "/", "secure").await.status, 200);
    tg.stop().await;
}

/// A ConfigMap that names a certificate its Secret has not delivered yet: the reload is
/// refused, and once the certificate lands (the config file untouched) it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_refused_for_a_missing_certificate_is_applied_when_it_lands() {
    let ca = Ca::new("late CA");
    let leaf = ca.leaf(&[NAME], ExtendedKeyUsagePurpose::ServerAuth);
    let server = TlsUpstream::start(server_config(&leaf, &["http/1.1"], None)).await;
    let plain = Upstream::start(|_req| async { respond(200, "plain") }).await;
    let dir = TempDir::new("tls-late-secret");
    let first = || {
        Config::new()
            .listener(|l| l.unknown_authorities("refuse"))
            .upstream("plain", |u| u.authorities(["plain"]).endpoint(plain.addr))
    };
    let path = write(dir.path(), "tollgate.toml", &first().to_toml());
    let tg = Tollgate::start_file(&path).await;

    // The ConfigMap lands first: its CA file does not exist yet.
    let second = first()
        .upstream("secure", |u| {
            u.authorities(["secure"])
                .endpoint(server.addr)
                .connect_timeout("5s")
                .attempt_timeout("5s")
                .tls(|t| t.server_name(NAME).ca_file("secret/ca.pem"))
        })
        .to_toml();
    write(dir.path(), "tollgate.toml", &second);
    tg.wait_reloads("error", 1.0).await;
    assert_eq!(get(tg.addr, "/", "secure").await.status, 404);
    assert_eq!(get(tg.addr, "/", "plain").await.status, 200);

    // Then the Secret: only the certificate file appears.
    std::fs::create_dir_all(dir.path().join("secret")).unwrap();
    write(&dir.path().join("secret"), "ca.pem", &ca.pem());
    tg.wait_reloads("ok", 1.0).await;
    assert_eq!(get(tg.addr, "/", "secure").await.status, 200);
    tg.stop().await;
}
