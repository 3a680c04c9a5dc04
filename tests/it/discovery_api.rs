//! `discovery = "kubernetes"` against a real Kubernetes API: etcd and kube-apiserver
//! started by tests/it/kube/mod.rs, never a stand-in. A Service's ready endpoints reach the
//! watch's channel within a second of each change the API stores; the last known set
//! survives the API server being down; after it is back the watch resumes and changes
//! flow again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kube::Cluster;
use tokio::sync::watch::Receiver;
use tokio::time::Instant;
use tollgate_core::config::{KubernetesConfig, ServicePort, ServiceRef};
use tollgate_core::discovery::{self, Found};
use tollgate_core::metrics::Metrics;
use tollgate_core::metrics::discovery::Reason;

/// How soon a change stored in the API must be published.
const CHANGE: Duration = Duration::from_secs(1);
/// The watch's longest backoff: after the API server is back, it may take this long to
/// connect again.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

const NS: &str = "shop";

/// Waits until the published value satisfies `ok`, at most `within`.
async fn until(
    rx: &mut Receiver<Found>,
    within: Duration,
    what: &str,
    ok: impl Fn(&Found) -> bool,
) -> Found {
    let deadline = Instant::now() + within;
    loop {
        {
            let now = rx.borrow_and_update();
            if ok(&now) {
                return now.clone();
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("the watch's channel closed while waiting for {what}"),
            Err(_) => panic!(
                "{what}: not published within {within:?}; now {:?}",
                *rx.borrow()
            ),
        }
    }
}

fn count(f: &Found) -> Option<usize> {
    f.ready.as_ref().map(|r| r.len())
}

/// `n` pods from 10.1.0.`first`, each `(address, ready, terminating)`.
fn pods(first: u8, n: u8) -> Vec<(IpAddr, bool, bool)> {
    (first..first + n)
        .map(|i| (IpAddr::from([10, 1, 0, i]), true, false))
        .collect()
}

fn addrs(f: &Found) -> Vec<String> {
    f.ready
        .as_ref()
        .map(|r| r.iter().map(|a| a.to_string()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_ready_pods_follow_the_api_through_changes_and_a_restart() {
    let Some(mut cluster) = Cluster::start().await else {
        return;
    };
    cluster.create_namespace(NS).await;
    let created = cluster
        .create_service(NS, "payments", "http", 80, false)
        .await;
    let cluster_ip: IpAddr = created["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let kube = KubernetesConfig {
        kubeconfig: Some(cluster.kubeconfig().to_path_buf()),
    };
    let metrics = Metrics::new();
    let by_name = ServiceRef {
        name: "payments".into(),
        namespace: Some(NS.into()),
        port: ServicePort::Name("http".into()),
    };
    let w = discovery::watch(&by_name, &kube, metrics.discovery("payments")).unwrap();
    let mut rx = w.subscribe();

    // The first list: the Service has no slice yet, so no endpoint; its cluster IP
    // and port number are known.
    let first = until(&mut rx, Duration::from_secs(10), "the first list", |f| {
        count(f) == Some(0)
    })
    .await;
    assert_eq!(first.cluster_ip, Some(SocketAddr::new(cluster_ip, 80)));
    let (host, port) = w.dns_name().expect("the port's number, from the Service");
    assert!(host.starts_with("payments.shop.svc."), "{host}");
    assert_eq!(port, 80);

    // Three endpoints, then five: each change within a second of the API storing it.
    cluster
        .put_endpoint_slice(NS, "payments-a", "payments", "http", 8080, &pods(1, 3))
        .await;
    let three = until(&mut rx, CHANGE, "three endpoints", |f| count(f) == Some(3)).await;
    assert_eq!(
        addrs(&three),
        ["10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"]
    );
    cluster
        .put_endpoint_slice(NS, "payments-a", "payments", "http", 8080, &pods(1, 5))
        .await;
    until(&mut rx, CHANGE, "five endpoints", |f| count(f) == Some(5)).await;

    // One not ready: four. One terminating (ready stays true as it drains): three.
    let mut some = pods(1, 5);
    some[4].1 = false;
    cluster
        .put_endpoint_slice(NS, "payments-a", "payments", "http", 8080, &some)
        .await;
    let four = until(&mut rx, CHANGE, "four ready", |f| count(f) == Some(4)).await;
    assert!(!addrs(&four).contains(&"10.1.0.5:8080".to_string()));
    some[3].2 = true;
    cluster
        .put_endpoint_slice(NS, "payments-a", "payments", "http", 8080, &some)
        .await;
    until(&mut rx, CHANGE, "a terminating endpoint out", |f| {
        count(f) == Some(3)
    })
    .await;

    // An IPv6 slice is not of the Service's family: a second IPv4 slice, written
    // after it, is what changes the set.
    let v6 = [("fd00::1".parse().unwrap(), true, false)];
    cluster
        .put_endpoint_slice(NS, "payments-v6", "payments", "http", 8080, &v6)
        .await;
    cluster
        .put_endpoint_slice(NS, "payments-b", "payments", "http", 8080, &pods(20, 2))
        .await;
    let both = until(&mut rx, CHANGE, "a second slice", |f| count(f) == Some(5)).await;
    assert!(
        addrs(&both).iter().all(|a| a.starts_with("10.1.0.")),
        "{both:?}"
    );

    // The same Service by its port's number: the slices' port of that name.
    let by_number = ServiceRef {
        port: ServicePort::Number(80),
        ..by_name.clone()
    };
    let n = discovery::watch(&by_number, &kube, metrics.discovery("payments-80")).unwrap();
    let mut rx_n = n.subscribe();
    let numbered = until(
        &mut rx_n,
        Duration::from_secs(10),
        "the list by number",
        |f| count(f) == Some(5),
    )
    .await;
    assert_eq!(numbered.ready, both.ready);
    drop((n, rx_n));

    // A slice deleted, and an entry taken out of the other: fewer.
    cluster.delete_endpoint_slice(NS, "payments-b").await;
    until(&mut rx, CHANGE, "a slice deleted", |f| count(f) == Some(3)).await;
    cluster
        .put_endpoint_slice(NS, "payments-a", "payments", "http", 8080, &pods(1, 2))
        .await;
    let known = until(&mut rx, CHANGE, "an entry taken out", |f| {
        count(f) == Some(2)
    })
    .await;

    let d = metrics.discovery("payments");
    assert_eq!(d.endpoints(), 2);
    assert!(d.updates() >= 8, "{} updates published", d.updates());

    // The API server down for 10 s: the last known endpoints stay, the failures count.
    let errors_before = d.errors(Reason::Connect) + d.errors(Reason::Timeout);
    cluster.stop_apiserver();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(*rx.borrow(), known, "the last known endpoints are kept");
    assert_eq!(d.endpoints(), 2);
    assert!(
        d.errors(Reason::Connect) + d.errors(Reason::Timeout) > errors_before,
        "the failures are counted"
    );

    // Back up: the watch resumes (within its longest backoff) from the version it had,
    // and the change made meanwhile reaches it; after that, changes flow within a
    // second again.
    cluster.start_apiserver().await;
    cluster
        .put_endpoint_slice(NS, "payments-a", "payments", "http", 8080, &pods(1, 4))
        .await;
    until(
        &mut rx,
        BACKOFF_MAX + CHANGE,
        "a change after the restart",
        |f| count(f) == Some(4),
    )
    .await;
    cluster
        .put_endpoint_slice(NS, "payments-a", "payments", "http", 8080, &pods(1, 1))
        .await;
    until(&mut rx, CHANGE, "the next change", |f| count(f) == Some(1)).await;
    assert_eq!(d.endpoints(), 1);
}

/// Credentials the API refuses: nothing is published (the DNS name keeps serving), and
/// the refusal is counted as `auth`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_counted_and_publishes_nothing() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    cluster.create_namespace(NS).await;
    cluster
        .create_service(NS, "refused", "http", 80, true)
        .await;
    let text = std::fs::read_to_string(cluster.kubeconfig()).unwrap();
    let wrong = cluster.dir().join("kubeconfig-wrong-token");
    std::fs::write(&wrong, text.replace(cluster.token(), "not-the-token")).unwrap();
    let kube = KubernetesConfig {
        kubeconfig: Some(wrong),
    };
    let metrics = Metrics::new();
    let service = ServiceRef {
        name: "refused".into(),
        namespace: Some(NS.into()),
        port: ServicePort::Name("http".into()),
    };
    let w = discovery::watch(&service, &kube, metrics.discovery("refused")).unwrap();
    let d = metrics.discovery("refused");
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.errors(Reason::Auth) == 0 {
        assert!(Instant::now() < deadline, "no auth failure counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*w.subscribe().borrow(), Found::default());
    assert_eq!(w.dns_name(), None, "the port's number was never read");
}

/// The API server's watches of EndpointSlices running now, from its own metrics.
async fn slice_watches(cluster: &Cluster) -> f64 {
    let (status, text) = cluster.get("/metrics").await;
    assert_eq!(status, 200, "the API server's metrics");
    let text = text.as_str().unwrap_or_default();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .collect();
    assert!(!series.is_empty(), "no apiserver_longrunning_requests");
    series
        .iter()
        .filter(|l| l.contains("resource=\"endpointslices\"") && l.contains("verb=\"WATCH\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Two upstreams naming two ports of one Service: one watch of its slices in the API,
/// each upstream with its own port's endpoints, both following a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watch_serves_every_port_of_a_service() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    cluster.create_namespace(NS).await;
    let (status, body) = cluster
        .post(
            &format!("/api/v1/namespaces/{NS}/services"),
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "orders", "namespace": NS},
                "spec": {"ports": [
                    {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                    {"name": "grpc", "port": 9090, "targetPort": 9091, "protocol": "TCP"},
                ]},
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let slice = |n: u8| {
        serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "orders-a",
                "namespace": NS,
                "labels": {"kubernetes.io/service-name": "orders"},
            },
            "addressType": "IPv4",
            "ports": [
                {"name": "http", "port": 8080, "protocol": "TCP"},
                {"name": "grpc", "port": 9091, "protocol": "TCP"},
            ],
            "endpoints": (1..=n).map(|i| serde_json::json!({
                "addresses": [format!("10.1.0.{i}")],
                "conditions": {"ready": true},
            })).collect::<Vec<_>>(),
        })
    };
    let slices = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices");
    let (status, body) = cluster.post(&slices, slice(2)).await;
    assert_eq!(status, 201, "{body}");
    let before = slice_watches(&cluster).await;

    let kube = KubernetesConfig {
        kubeconfig: Some(cluster.kubeconfig().to_path_buf()),
    };
    let metrics = Metrics::new();
    let port = |name: &str| ServiceRef {
        name: "orders".into(),
        namespace: Some(NS.into()),
        port: ServicePort::Name(name.into()),
    };
    let http = discovery::watch(&port("http"), &kube, metrics.discovery("orders-http")).unwrap();
    let grpc = discovery::watch(&port("grpc"), &kube, metrics.discovery("orders-grpc")).unwrap();
    let (mut rx_http, mut rx_grpc) = (http.subscribe(), grpc.subscribe());
    let listed = until(&mut rx_http, Duration::from_secs(10), "http's list", |f| {
        count(f) == Some(2)
    })
    .await;
    assert_eq!(addrs(&listed), ["10.1.0.1:8080", "10.1.0.2:8080"]);
    let listed = until(&mut rx_grpc, CHANGE, "grpc's list", |f| count(f) == Some(2)).await;
    assert_eq!(addrs(&listed), ["10.1.0.1:9091", "10.1.0.2:9091"]);
    assert_eq!(http.dns_name().map(|(_, p)| p), Some(80));
    assert_eq!(grpc.dns_name().map(|(_, p)| p), Some(9090));

    // Both follow a change: one slice event, published on both ports.
    let (status, current) = cluster.get(&format!("{slices}/orders-a")).await;
    assert_eq!(status, 200, "{current}");
    let mut three = slice(3);
    three["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    let (status, body) = cluster.put(&format!("{slices}/orders-a"), three).await;
    assert_eq!(status, 200, "{body}");
    until(&mut rx_http, CHANGE, "http's three", |f| {
        count(f) == Some(3)
    })
    .await;
    until(&mut rx_grpc, CHANGE, "grpc's three", |f| {
        count(f) == Some(3)
    })
    .await;
    assert_eq!(metrics.discovery("orders-grpc").endpoints(), 3);

    // One watch in the API for the two ports (the watch runs from the list on; waited
    // for, bounded, as the API server counts it once its request is in).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut running = slice_watches(&cluster).await - before;
    while running < 1.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        running = slice_watches(&cluster).await - before;
    }
    assert_eq!(
        running, 1.0,
        "one watch of the Service's slices, not one per port"
    );
}
