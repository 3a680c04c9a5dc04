//! The inbound side over its life: a reload changes what can change live (the app, the
//! limit, the timeout, the fleet budget) and reports an address change as waiting for
//! a restart; SIGTERM drains it like the outbound listener (new connections refused,
//! the request in flight finished, exit 0). An app bound to its pod's address is reached
//! there.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::config::{Config, Inbound};
use common::*;

async fn config_json(tg: &Tollgate) -> serde_json::Value {
    let r = get(tg.admin, "/config", "admin").await;
    assert_eq!(r.status, 200);
    serde_json::from_slice(&r.body).unwrap()
}

/// tollgate's inbound side in front of `app`, set by `f`.
fn in_front_of(app: std::net::SocketAddr, f: impl FnOnce(Inbound) -> Inbound) -> String {
    Config::new().inbound(app, f).to_toml()
}

fn retry() -> http::Request<BoxBody> {
    request("GET", "/", "app")
        .header("x-tollgate-attempt", "2")
        .body(empty())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_inbound_settings_and_waits_for_a_restart_to_move_it() {
    let one = Upstream::start(|_req| async { respond(200, "one") }).await;
    let two = Upstream::start(|_req| async { respond(200, "two") }).await;
    let dir = tempdir::TempDir::new("inbound-reload");
    let path = dir.path().join("tollgate.toml");
    let strict = |i: Inbound| i.max_inflight(1).retries(|r| r.ratio(0.0).min_per_sec(0));
    std::fs::write(&path, in_front_of(one.addr, strict)).unwrap();
    let tg = Tollgate::start_file(&path).await;
    let addr = tg.inbound();
    assert_eq!(send(addr, retry()).await.outcome(), Some("retry-rejected"));

    // Another app, a larger limit, and retries admitted as they come.
    std::fs::write(
        &path,
        in_front_of(two.addr, |i| i.max_inflight(50).request_timeout("7s")),
    )
    .unwrap();
    tg.wait_reloads("ok", 1.0).await;
    let r = send(addr, retry()).await;
    assert_eq!((r.status.as_u16(), r.body.as_ref()), (200, &b"two"[..]));
    let c = config_json(&tg).await;
    assert_eq!(c["inbound"]["max_inflight"], 50, "{c}");
    assert_eq!(c["inbound"]["request_timeout"], "7s");
    assert_eq!(c["inbound"]["retries"], serde_json::Value::Null);
    let m = tg.metrics().await;
    assert_eq!(metric(&m, "tollgate_inbound_concurrency_limit"), Some(50.0));

    // A new address waits for a restart: the old one keeps serving.
    let port = free_port();
    std::fs::write(
        &path,
        in_front_of(two.addr, |i| {
            i.addr(format!("127.0.0.1:{port}")).max_inflight(50)
        }),
    )
    .unwrap();
    tg.wait_reloads("ok", 2.0).await;
    let c = config_json(&tg).await;
    assert_eq!(
        c["pending_restart"],
        serde_json::json!([format!(
            "inbound.addr: 127.0.0.1:0 in effect, 127.0.0.1:{port} in the file"
        )])
    );
    assert_eq!(c["inbound"]["addr"], "127.0.0.1:0");
    assert_eq!(get(addr, "/", "app").await.status, 200);
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
    );
    tg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_inbound_side_and_exits_0() {
    let app = Upstream::start(|_req| async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        respond(200, "finished")
    })
    .await;
    let port = free_port();
    let mut p = Process::start(
        &Config::new()
            .inbound(app.addr, |i| {
                i.addr(format!("127.0.0.1:{port}"))
                    .max_inflight(10)
                    .retries(|r| r.ratio(0.1))
            })
            .to_toml_for_process(),
    )
    .await;
    let inbound = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let in_flight = tokio::spawn(async move { get(inbound, "/", "app").await });
    assert!(wait_until(Duration::from_secs(5), || app.hits() == 1).await);

    p.signal("TERM");
    let refused = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if tokio::net::TcpStream::connect(inbound).await.is_err() {
                break true;
            }
            if tokio::time::Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    assert!(refused, "the inbound port still accepted after SIGTERM");
    let r = in_flight.await.unwrap();
    assert_eq!(
        (r.status.as_u16(), r.body.as_ref()),
        (200, &b"finished"[..])
    );
    assert_eq!(p.wait_exit(Duration::from_secs(10)).await, Some(0));
}

/// An app bound to its pod's address rather than loopback: `[inbound] app =
/// "127.0.0.1:P"` is refused, and the inbound side reaches the app at the same port of
/// `POD_IP` (as inject sets it), where its callers' Service and the kubelet's probes reach
/// it. The pod's address here is 127.0.0.2. Side by side, the same tollgate without
/// `POD_IP` answers `502 app-unreachable`: the fallback is what serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_bound_to_its_pod_address_is_reached_there_when_loopback_refuses() {
    // A port the app has on 127.0.0.2 while nothing has it on 127.0.0.1 (bounded tries).
    let mut tries = 0;
    let listener = loop {
        let l = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            break l;
        }
        tries += 1;
        assert!(tries < 20, "no port free on both addresses");
    };
    let pod = listener.local_addr().unwrap();
    let app = Upstream::serve(listener, |_req| async { respond(200, "the app") });
    let configured = std::net::SocketAddr::from(([127, 0, 0, 1], pod.port()));

    // Direct, as the Service routes a caller: the pod's address answers.
    assert_eq!(get(pod, "/", "app").await.status, 200);

    for (env, status) in [(&[][..], 502), (&[("POD_IP", "127.0.0.2")][..], 200)] {
        let port = free_port();
        let p = Process::start_with_env(
            &Config::new()
                .inbound(configured, |i| i.addr(format!("127.0.0.1:{port}")))
                .to_toml_for_process(),
            env,
        )
        .await;
        let inbound = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        for _ in 0..3 {
            let r = get(inbound, "/", "app").await;
            assert_eq!(
                r.status,
                status,
                "POD_IP {env:?}: {:?}",
                r.header("x-tollgate-outcome")
            );
            if status == 502 {
                assert_eq!(r.outcome(), Some("app-unreachable; ran=no"));
            } else {
                assert_eq!(&r.body[..], b"the app");
            }
        }
        drop(p);
    }
    assert_eq!(
        app.hits(),
        1 + 3,
        "the direct call and the three through POD_IP"
    );
}
