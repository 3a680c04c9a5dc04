//! The admin endpoint's safety: loopback by default, no key material in `/config`,
//! read-only (GET and HEAD), nothing proxied through it, and its endpoints answering
//! as documented; `/metrics` of a real `tollgate run` process carries the build and
//! process metrics with its own values, and no series for an upstream without traffic.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::config::{self, Config};
use common::tempdir::TempDir;
use common::*;
use http::Response;

#[test]
fn admin_and_listener_default_to_loopback() {
    let cfg = tollgate_core::config::parse(
        "min.toml",
        "[upstreams.a]\nauthorities = [\"a\"]\nendpoints = [\"127.0.0.1:1\"]\n",
        Path::new("."),
    )
    .unwrap();
    assert_eq!(cfg.admin.addr, "127.0.0.1:15090".parse().unwrap());
    assert!(cfg.admin.addr.ip().is_loopback());
    assert_eq!(cfg.listener.addr, "127.0.0.1:15001".parse().unwrap());
    assert!(cfg.listener.addr.ip().is_loopback());
}

fn key_material() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["client".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_shows_certificate_paths_never_their_contents() {
    let dir = TempDir::new("admin-keys");
    let (cert_pem, key_pem) = key_material();
    let cert = dir.path().join("client.crt");
    let key = dir.path().join("client.key");
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, &key_pem).unwrap();
    // The client certificate doubles as the CA bundle: only the files matter here.
    let tg = Tollgate::start(
        &Config::new()
            .upstream("secure", |u| {
                u.authorities(["secure"]).endpoint("127.0.0.1:1").tls(|t| {
                    t.server_name("upstream.test")
                        .ca_file(cert.display().to_string())
                        .client_cert(cert.display().to_string())
                        .client_key(key.display().to_string())
                })
            })
            .to_toml(),
    )
    .await;
    let r = get(tg.admin, "/config", "admin").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let text = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    assert!(!text.contains("BEGIN"), "{text}");
    // Not a single line of the key's or the certificate's base64 either.
    for line in key_pem.lines().chain(cert_pem.lines()) {
        if !line.starts_with("-----") && line.len() > 16 {
            assert!(!text.contains(line), "key material in /config: {line}");
        }
    }
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let tls = &json["upstreams"]["secure"]["tls"];
    assert_eq!(tls["client_key"], key.display().to_string());
    assert_eq!(tls["client_cert"], cert.display().to_string());
    assert_eq!(tls["server_name"], "upstream.test");
    assert_eq!(
        tls.as_object().unwrap().len(),
        4,
        "only the four documented keys: {tls}"
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_answer_and_anything_else_is_refused() {
    let up = Upstream::start(|_req| async { Response::new(full("upstream")) }).await;
    let tg = Tollgate::start(
        &Config::new()
            .listener(|l| l.unknown_authorities("refuse"))
            .upstream("a", |u| u.authorities(["a", "admin"]).endpoint(up.addr))
            .to_toml(),
    )
    .await;
    // One proxied request so the metrics have a series.
    assert_eq!(get(tg.addr, "/", "a").await.status, 200);

    let r = get(tg.admin, "/healthz", "admin").await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"ok\n"[..]));
    let r = get(tg.admin, "/readyz", "admin").await;
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"ready\n"[..]));
    let r = get(tg.admin, "/metrics", "admin").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let m = String::from_utf8(r.body.to_vec()).unwrap();
    assert!(m.contains("# TYPE tollgate_requests_total counter"), "{m}");
    assert_eq!(
        metric(
            &m,
            "tollgate_requests_total{code=\"200\",outcome=\"ok\",upstream=\"a\"}"
        ),
        Some(1.0)
    );
    let r = send(
        tg.admin,
        request("HEAD", "/healthz", "admin").body(empty()).unwrap(),
    )
    .await;
    assert_eq!(r.status, 200, "HEAD is a read");
    assert!(r.body.is_empty());

    // Unknown paths, and nothing is proxied through the admin port, whatever the Host.
    for path in ["/", "/nope", "/metrics/x", "/config.json", "http://a/"] {
        let r = send(tg.admin, request("GET", path, "a").body(empty()).unwrap()).await;
        assert_eq!(r.status, 404, "{path}");
        assert_eq!(r.outcome(), None, "{path}: the admin port is no proxy");
    }
    // Read-only.
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        for path in ["/metrics", "/config", "/readyz", "/nope"] {
            let r = send(
                tg.admin,
                request(method, path, "admin").body(full("x")).unwrap(),
            )
            .await;
            assert_eq!(r.status, 405, "{method} {path}");
        }
    }
    assert_eq!(
        up.hits(),
        1,
        "only the one proxied request reached the upstream"
    );

    // And the proxy port serves no admin paths: they are routed like any request.
    let r = get(tg.addr, "/metrics", "unknown").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.outcome(), Some("no-route"));
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_while_draining() {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let up = Upstream::start(move |_req| {
        let g = g.clone();
        async move {
            let _ = g.acquire().await.unwrap();
            Response::new(full("late"))
        }
    })
    .await;
    let tg = Tollgate::start(
        &Config::new()
            .upstream("a", |u| {
                u.authorities(["a"])
                    .endpoint(up.addr)
                    .request_timeout("10s")
                    .attempt_timeout("10s")
            })
            .to_toml(),
    )
    .await;
    let addr = tg.addr;
    let admin = tg.admin;
    let held = tokio::spawn(async move { get(addr, "/", "a").await });
    assert!(wait_until(Duration::from_secs(5), || up.hits() == 1).await);
    let running = {
        let mut tg = tg;
        tg.running.take().unwrap()
    };
    let drain = tokio::spawn(async move { running.shutdown(Duration::from_secs(10)).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = get(admin, "/readyz", "admin").await;
        if r.status == 503 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz never said 503"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        get(admin, "/healthz", "admin").await.status,
        200,
        "alive while draining"
    );
    gate.add_permits(1);
    assert_eq!(
        held.await.unwrap().status,
        200,
        "the request in flight finished"
    );
    assert_eq!(drain.await.unwrap(), 0);
}

/// The value of the one sample of `name` (a metric without labels).
fn sample(text: &str, name: &str) -> f64 {
    metric(text, &format!("{name} ")).unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_of_a_running_process_carry_build_and_process_series() {
    let before = unix_now();
    let up = Upstream::start(|_req| async { Response::new(full("upstream")) }).await;
    let p = Process::start(
        &Config::new()
            .upstream("busy", |u| u.authorities(["busy"]).endpoint(up.addr))
            .upstream("quiet", |u| u.authorities(["quiet"]).endpoint(up.addr))
            .to_toml_for_process(),
    )
    .await;
    assert_eq!(get(p.addr, "/", "busy").await.status, 200);

    let r = get(p.admin, "/metrics", "admin").await;
    assert_eq!(r.status, 200);
    let m = String::from_utf8(r.body.to_vec()).unwrap();

    assert_eq!(
        metric(
            &m,
            &format!(
                "tollgate_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        ),
        Some(1.0),
        "{m}"
    );

    // No traffic, no series: none for the quiet upstream (not even a ratio), and
    // attempts/requests for the other.
    assert!(
        !m.contains("upstream=\"quiet\""),
        "an upstream without a request has no series:\n{m}"
    );
    assert_eq!(
        metric(&m, "tollgate_amplification{upstream=\"busy\"}"),
        Some(1.0)
    );

    // The process metrics are the tollgate process's own, not this test's.
    let start = sample(&m, "process_start_time_seconds");
    assert!(
        start >= before - 2.0 && start <= unix_now() + 1.0,
        "started at {start}, the test began at {before}"
    );
    assert!(unix_now() - start < 60.0, "started within the last minute");

    let open = sample(&m, "process_open_fds");
    let listed = std::fs::read_dir(format!("/proc/{}/fd", p.pid()))
        .unwrap()
        .count() as f64;
    // Listeners, the epoll instance, the upstream connection: a handful, give or take
    // the descriptor that reading the directory itself opens.
    assert!(open >= 3.0, "open fds {open}");
    assert!(
        (open - listed).abs() <= 4.0,
        "open fds {open}, /proc lists {listed}"
    );

    let limits = std::fs::read_to_string(format!("/proc/{}/limits", p.pid())).unwrap();
    let soft: Option<f64> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok());
    if let Some(soft) = soft {
        assert_eq!(sample(&m, "process_max_fds"), soft);
    }

    let rss = sample(&m, "process_resident_memory_bytes");
    let vm_rss = p.status_kib("VmRSS") as f64 * 1024.0;
    assert!(
        rss > vm_rss / 2.0 && rss < vm_rss * 2.0,
        "resident {rss} bytes, /proc/PID/status says {vm_rss}"
    );
    let virt = sample(&m, "process_virtual_memory_bytes");
    assert!(virt >= rss, "virtual {virt} < resident {rss}");
    assert!(sample(&m, "process_threads") >= 1.0);

    // CPU time is a counter: never negative, never going back.
    let cpu = sample(&m, "process_cpu_seconds_total");
    assert!(cpu >= 0.0);
    for i in 0..20 {
        assert_eq!(get(p.addr, &format!("/{i}"), "busy").await.status, 200);
    }
    let m2 = String::from_utf8(get(p.admin, "/metrics", "admin").await.body.to_vec()).unwrap();
    assert!(sample(&m2, "process_cpu_seconds_total") >= cpu);
    assert!(m2.contains("# TYPE process_cpu_seconds_total counter\n"));
}

/// `tollgate inject` moves the app's HTTP probes to the admin port: `GET
/// /probe/PORT/PATH` is a GET to the app at 127.0.0.1:PORT/PATH, answered with the
/// app's status, for the probes `[admin] probes` declares only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_reach_the_listed_app_ports_and_answer_with_the_apps_status() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let app = Upstream::start(move |req| {
        let h = |n: &str| {
            let v = req.headers().get(n).and_then(|v| v.to_str().ok());
            v.unwrap_or("-").to_string()
        };
        let line = format!(
            "{} {} host={} ua={} x-probe={}",
            req.method(),
            req.uri(),
            h("host"),
            h("user-agent"),
            h("x-probe")
        );
        log.lock().unwrap().push(line);
        let status = if req.uri().path() == "/healthz" {
            200
        } else {
            503
        };
        async move { respond(status, "app") }
    })
    .await;
    let other = Upstream::start(|_req| async { respond(200, "other") }).await;
    let dead = dead_port().await;
    let port = app.addr.port();
    let tg = Tollgate::start(
        &Config::new()
            .listener(|l| l.unknown_authorities("pass"))
            .admin(|a| {
                a.probes(config::RawOwned(format!(
                    "[{{ port = {port}, path = \"/healthz\", headers = {{ \"X-Probe\" = \"custom\" }} }}, \
                     {{ port = {port}, path = \"/ready?full=1\" }}, \
                     {{ port = {}, path = \"/healthz\" }}]",
                    dead.port()
                )))
            })
            .to_toml(),
    )
    .await;

    let probe = |path: String| {
        request("GET", &path, "10.1.2.3:15090")
            .header("user-agent", "kube-probe/1.31")
            .header("x-probe", "from-the-asker")
            .body(empty())
            .unwrap()
    };
    let r = send(tg.admin, probe(format!("/probe/{port}/healthz"))).await;
    assert_eq!(r.status, 200);
    let r = send(tg.admin, probe(format!("/probe/{port}/ready?full=1"))).await;
    assert_eq!(r.status, 503, "the app's own status comes back");
    assert_eq!(
        *seen.lock().unwrap(),
        [
            format!("GET /healthz host=127.0.0.1:{port} ua=kube-probe/1.31 x-probe=custom"),
            format!("GET /ready?full=1 host=127.0.0.1:{port} ua=kube-probe/1.31 x-probe=-"),
        ],
        "the probe's path, query and declared fields reach the app (and the asker's \
         User-Agent, no other field of its own); Host names the app"
    );

    // A port not listed is not reached: the admin port is no way to any local port.
    let r = send(
        tg.admin,
        probe(format!("/probe/{}/healthz", other.addr.port())),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(other.hits(), 0);
    // A listed port where nothing listens: the probe fails, as it would on the app's port.
    let r = send(tg.admin, probe(format!("/probe/{}/healthz", dead.port()))).await;
    assert_eq!(r.status, 503);
    // Read-only, as the rest of the admin endpoint.
    let r = send(
        tg.admin,
        request("POST", &format!("/probe/{port}/healthz"), "admin")
            .body(full("x"))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 405);
    assert_eq!(app.hits(), 2);

    let r = get(tg.admin, "/config", "admin").await;
    let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        json["admin"]["probes"][0],
        serde_json::json!({"port": port, "path": "/healthz", "headers": {"x-probe": "custom"}})
    );
    tg.stop().await;
}

/// The admin port is no relay, whoever asks: no target but a declared probe's exact
/// port and path reaches the app, no credential or forwarding field passes, identical
/// probes in flight are one, and a crowd of idle connections cannot take the kubelet's
/// place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_is_no_relay_and_a_crowd_cannot_starve_the_probes() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let app = Upstream::start(move |req| {
        let mut line = format!("{}", req.uri());
        for (name, value) in req.headers() {
            line.push_str(&format!(" {name}={}", value.to_str().unwrap_or("?")));
        }
        log.lock().unwrap().push(line);
        let slow = req.uri().path() == "/slow";
        async move {
            if slow {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            respond(200, "app")
        }
    })
    .await;
    let port = app.addr.port();
    let tg = Tollgate::start(
        &Config::new()
            .listener(|l| l.unknown_authorities("pass"))
            .admin(|a| {
                a.probes(config::RawOwned(format!(
                    "[{{ port = {port}, path = \"/healthz\" }}, {{ port = {port}, path = \"/slow\" }}]"
                )))
            })
            .to_toml(),
    )
    .await;

    // Nothing but the declared targets, written exactly so.
    for target in [
        format!("/probe/{port}/healthz/../admin"),
        format!("/probe/{port}/%2e%2e/admin"),
        format!("/probe/{port}/healthz%2F..%2Fadmin"),
        format!("/probe/{port}//healthz"),
        format!("/probe/{port}/healthz?x=1"),
        format!("/probe/{port}/HEALTHZ"),
        format!("/probe/{port}/./healthz"),
        format!("http://127.0.0.1:{port}/probe/{port}/healthz"),
        format!("/probe/{}/healthz", port + 1),
    ] {
        let raw = raw_exchange(
            tg.admin,
            format!("GET {target} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(raw.starts_with("HTTP/1.1 404"), "{target}: {raw}");
    }
    let raw = raw_exchange(
        tg.admin,
        format!("POST /probe/{port}/healthz HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 405"), "{raw}");
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );

    // No credential or forwarding field passes; User-Agent and Accept do.
    let r = send(
        tg.admin,
        request("GET", &format!("/probe/{port}/healthz"), "admin")
            .header("user-agent", "kube-probe/1.31")
            .header("accept", "*/*")
            .header("authorization", "Bearer secret")
            .header("cookie", "session=secret")
            .header("x-forwarded-for", "10.9.9.9")
            .header("forwarded", "for=10.9.9.9")
            .header("x-anything", "secret")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    let line = seen.lock().unwrap().pop().unwrap();
    assert!(
        line.contains("user-agent=kube-probe/1.31") && line.contains("accept=*/*"),
        "{line}"
    );
    assert!(
        !line.contains("secret") && !line.contains("10.9.9.9"),
        "{line}"
    );

    // Identical probes in flight are one: five ask, the app is asked once.
    let asks: Vec<_> = (0..5)
        .map(|_| {
            let admin = tg.admin;
            tokio::spawn(async move {
                get(admin, &format!("/probe/{port}/slow"), "admin")
                    .await
                    .status
            })
        })
        .collect();
    for a in asks {
        assert_eq!(a.await.unwrap(), 200);
    }
    let slow = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("/slow"))
        .count();
    assert_eq!(slow, 1, "identical probes were not coalesced");

    // 300 idle connections, some with half a head: a probe still answers.
    let mut crowd = Vec::new();
    for i in 0..300 {
        let Ok(mut s) = tokio::net::TcpStream::connect(tg.admin).await else {
            continue;
        };
        if i % 3 == 0 {
            use tokio::io::AsyncWriteExt;
            let _ = s.write_all(b"GET /probe/").await;
        }
        crowd.push(s);
    }
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        get(tg.admin, &format!("/probe/{port}/healthz"), "admin"),
    )
    .await
    .expect("the probe did not answer beside 300 idle connections");
    assert_eq!(r.status, 200);
    drop(crowd);
    tg.stop().await;
}
