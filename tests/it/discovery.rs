//! `discovery = "kubernetes"` end to end: tollgate sends an app's calls to the pods a
//! real Kubernetes API (etcd and kube-apiserver started by tests/it/kube/mod.rs) says are
//! ready, each pod an endpoint of its own. The pods are real servers, each answering
//! with its own address, on addresses of a link of this test's own (a veth pair,
//! one end with six /30s of 10.213.79.0/27, the API refusing loopback addresses in a slice);
//! so the test needs root, skips loudly without it and fails under CI. Steps as a cluster
//! goes through them: three ready pods, scale to five, one not ready, one gone, a ready
//! pod whose app is dead put aside (its calls retried on the others), the API server down for 10 s (the last known pods keep
//! serving) and back (the watch resumes); each step is seen in the traffic within 1 s
//! of the API storing it (after the restart, within the watch's longest backoff).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::kube;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use common::{Tollgate, Upstream, get, metric, respond};
use kube::Cluster;
use tokio::time::Instant;

const NS: &str = "shop";
/// How soon a change stored in the API must show in the traffic.
const CHANGE: Duration = Duration::from_secs(1);
/// The watch's longest backoff, plus that second: after the API server is back.
const AFTER_RESTART: Duration = Duration::from_secs(6);

const LINK: &str = "tg-disc0";
const PEER: &str = "tg-disc1";

/// Pod `i` (2 to 7; 7 is the dead one): the first address of its /30 on the test's link.
fn pod(i: u8) -> IpAddr {
    IpAddr::from([10, 213, 79, 4 * (i - 2) + 1])
}

/// The test's link and its addresses: removed when dropped, whatever happened.
struct Link;

impl Link {
    fn create() -> Option<Link> {
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        if !root {
            let msg = "SKIP tests/it/discovery.rs: needs root (a link of its own for the pods' \
                       addresses, as the API refuses loopback ones)";
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{msg}: under CI this fails"
            );
            eprintln!("{msg}");
            return None;
        }
        remove_link();
        ip(&["link", "add", LINK, "type", "veth", "peer", "name", PEER]);
        for i in 2..=7 {
            ip(&["addr", "add", &format!("{}/30", pod(i)), "dev", LINK]);
        }
        ip(&["link", "set", LINK, "up"]);
        ip(&["link", "set", PEER, "up"]);
        Some(Link)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        remove_link();
    }
}

fn remove_link() {
    let _ = std::process::Command::new("ip")
        .args(["link", "del", LINK])
        .stderr(std::process::Stdio::null())
        .status();
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Five pods' servers on 127.0.0.2-6, one port for all (a slice's port is every
/// endpoint's), each answering with its own address.
async fn pods() -> (u16, Vec<Upstream>) {
    for _ in 0..20 {
        let first = tokio::net::TcpListener::bind((pod(2), 0)).await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for i in 3..=6 {
            match tokio::net::TcpListener::bind((pod(i), port)).await {
                Ok(l) => listeners.push(l),
                Err(_) => break,
            }
        }
        if listeners.len() < 5 {
            continue;
        }
        let servers = listeners
            .into_iter()
            .map(|l| {
                let me = l.local_addr().unwrap().ip().to_string();
                Upstream::serve(l, move |_req| {
                    let me = me.clone();
                    async move { respond(200, me) }
                })
            })
            .collect();
        return (port, servers);
    }
    panic!("no port free on all five pod addresses");
}

/// Which pods answer `n` calls through tollgate, and how many calls failed.
async fn answering(tg: &Tollgate, n: usize) -> (BTreeSet<String>, usize) {
    let mut seen = BTreeSet::new();
    let mut failed = 0;
    for _ in 0..n {
        let r = get(tg.addr, "/pay", "payments").await;
        if r.status == 200 {
            seen.insert(String::from_utf8_lossy(&r.body).into_owned());
        } else {
            failed += 1;
        }
    }
    (seen, failed)
}

/// Waits until the pods answering are exactly `want`, at most `within`; how long it
/// took.
async fn until_answering(tg: &Tollgate, want: &[u8], within: Duration, what: &str) -> Duration {
    let want: BTreeSet<String> = want.iter().map(|i| pod(*i).to_string()).collect();
    let started = Instant::now();
    let mut last = BTreeSet::new();
    while started.elapsed() < within {
        // Enough calls for round robin to reach every pod twice.
        let (seen, _) = answering(tg, 2 * want.len().max(1)).await;
        if seen == want {
            return started.elapsed();
        }
        last = seen;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not within {within:?}; answering {last:?}, want {want:?}");
}

/// The Service's one slice (`payments-a`, port `http` = `port`) set to `endpoints`.
async fn set_pods(cluster: &Cluster, port: u16, endpoints: &[(IpAddr, bool, bool)]) {
    cluster
        .put_endpoint_slice(NS, "payments-a", "payments", "http", port, endpoints)
        .await;
}

fn ready(pods: &[u8]) -> Vec<(IpAddr, bool, bool)> {
    pods.iter().map(|i| (pod(*i), true, false)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_a_service_has_is_an_endpoint_as_the_api_says() {
    let Some(_link) = Link::create() else {
        return;
    };
    let Some(mut cluster) = Cluster::start().await else {
        return;
    };
    let (port, _servers) = pods().await;
    cluster.create_namespace(NS).await;
    let service = cluster
        .create_service(NS, "payments", "http", 80, false)
        .await;
    let cluster_ip: std::net::IpAddr = service["spec"]["clusterIP"]
        .as_str()
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("no cluster IP: {service}"));
    set_pods(&cluster, port, &ready(&[2, 3, 4])).await;
    let config = format!(
        "[kubernetes]\nkubeconfig = \"{}\"\n\n\
         [upstreams.payments]\nauthorities = [\"payments\"]\ndiscovery = \"kubernetes\"\n\
         service = \"payments.{NS}\"\nport = \"http\"\n\
         [upstreams.payments.retry]\nmax_attempts = 3\n\
         on = [\"connect-failure\", \"reset\", \"502\", \"503\"]\n\
         [upstreams.payments.budget]\nratio = 0.2\n",
        cluster.kubeconfig().display()
    );
    let tg = Tollgate::start(&common::config(&config)).await;

    // Three ready pods: every one takes calls (the first list may still be on its way).
    until_answering(&tg, &[2, 3, 4], Duration::from_secs(10), "three pods").await;
    // Under capture the app dials the Service's cluster IP: that `clusterIP:port` is
    // the upstream's, so the connection is served as HTTP to it, not passed through.
    let snap = tg.server().shared().snapshot();
    let dialled = |port| {
        snap.destinations
            .upstream_of(&snap.upstreams, std::net::SocketAddr::new(cluster_ip, port))
    };
    assert_eq!(
        dialled(80).await,
        Some(0),
        "the cluster IP is the upstream's"
    );
    assert_eq!(dialled(81).await, None, "another port of it is not");
    let m = tg.metrics().await;
    assert_eq!(
        metric(&m, "tollgate_discovery_endpoints{upstream=\"payments\"}"),
        Some(3.0)
    );

    // Scale to five.
    set_pods(&cluster, port, &ready(&[2, 3, 4, 5, 6])).await;
    until_answering(&tg, &[2, 3, 4, 5, 6], CHANGE, "scaled to five").await;

    // One not ready, one terminating: neither takes a new call.
    let mut five = ready(&[2, 3, 4, 5, 6]);
    five[1].1 = false;
    five[4] = (pod(6), false, true);
    set_pods(&cluster, port, &five).await;
    until_answering(&tg, &[2, 4, 5], CHANGE, "one not ready, one terminating").await;

    // One deleted.
    set_pods(&cluster, port, &ready(&[2, 4])).await;
    until_answering(&tg, &[2, 4], CHANGE, "one deleted").await;
    let (_, failed) = answering(&tg, 20).await;
    assert_eq!(failed, 0, "pods going took no call down with them");

    // A ready pod whose app is dead (its sidecar answers `502 app-unreachable`): the
    // calls it fails are retried on the others, and it is put aside after its first
    // failures, where one call in three would reach it otherwise.
    let dead = Upstream::serve(
        tokio::net::TcpListener::bind((pod(7), port)).await.unwrap(),
        |_req| async {
            http::Response::builder()
                .status(502)
                .header("x-tollgate-outcome", "app-unreachable")
                .body(common::full("app-unreachable"))
                .unwrap()
        },
    );
    set_pods(&cluster, port, &ready(&[2, 4, 7])).await;
    let started = Instant::now();
    while dead.hits() == 0 {
        assert!(started.elapsed() < CHANGE, "the dead pod never took a call");
        let (_, failed) = answering(&tg, 3).await;
        assert_eq!(
            failed, 0,
            "a call the dead pod failed was retried elsewhere"
        );
    }
    let (seen, failed) = answering(&tg, 90).await;
    assert_eq!(
        failed, 0,
        "a call the dead pod failed was retried elsewhere"
    );
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        dead.hits() <= 10,
        "the dead pod was not put aside: {} of about 90 calls reached it",
        dead.hits()
    );
    set_pods(&cluster, port, &ready(&[2, 4])).await;
    drop(dead);

    // The API server down for 10 s: the last known pods keep serving.
    cluster.stop_apiserver();
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(10) {
        let (seen, failed) = answering(&tg, 10).await;
        assert_eq!(failed, 0, "served while the API is down");
        assert_eq!(seen.len(), 2, "the last known pods: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.start_apiserver().await;

    // Back: the watch resumes, and the next change comes through.
    set_pods(&cluster, port, &ready(&[3, 5, 6])).await;
    until_answering(&tg, &[3, 5, 6], AFTER_RESTART, "after the restart").await;
    let m = tg.metrics().await;
    assert!(
        metric(
            &m,
            "tollgate_discovery_updates_total{upstream=\"payments\"}"
        )
        .unwrap()
            >= 5.0,
        "{m}"
    );

    // No ready pod: a 502, as a direct call to a Service without endpoints fails.
    set_pods(&cluster, port, &[]).await;
    let started = Instant::now();
    loop {
        let r = get(tg.addr, "/pay", "payments").await;
        if r.status == 502 {
            assert_eq!(r.outcome(), Some("upstream-unreachable"));
            break;
        }
        assert!(started.elapsed() < CHANGE, "still served with no ready pod");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(tg);
}

/// `/readyz` waits for each watched Service's first list, so a pod takes its app's
/// traffic with its endpoints known: a tollgate started while the API server is down is
/// not ready (503, saying why) and is once the API answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_a_watched_services_first_list() {
    let Some(mut cluster) = Cluster::start().await else {
        return;
    };
    cluster.create_namespace(NS).await;
    cluster
        .create_service(NS, "payments", "http", 80, false)
        .await;
    cluster.stop_apiserver();
    let config = format!(
        "[kubernetes]\nkubeconfig = \"{}\"\n\n\
         [upstreams.payments]\nauthorities = [\"payments\"]\ndiscovery = \"kubernetes\"\n\
         service = \"payments.{NS}\"\nport = \"http\"\n",
        cluster.kubeconfig().display()
    );
    let tg = Tollgate::start(&common::config(&config)).await;
    let r = get(tg.admin, "/readyz", "admin").await;
    assert_eq!(r.status, 503, "ready before the first list");
    let body = String::from_utf8_lossy(&r.body).into_owned();
    assert!(body.contains("first list"), "{body}");

    cluster.start_apiserver().await;
    let started = Instant::now();
    while get(tg.admin, "/readyz", "admin").await.status != 200 {
        assert!(
            started.elapsed() < AFTER_RESTART,
            "not ready {AFTER_RESTART:?} after the API server came up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
