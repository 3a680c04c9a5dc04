//! The Kubernetes API the discovery tests run against is a real one: etcd and
//! kube-apiserver (built by scripts/kube.sh) started by tests/it/kube/mod.rs. This proves the
//! harness: objects are stored and read back, the cluster IP is allocated by the API
//! server, and the API server can be stopped and started again with etcd keeping its data.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube;

use std::net::IpAddr;

use kube::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_api_server_stores_services_and_endpoint_slices_across_a_restart() {
    let Some(mut cluster) = Cluster::start().await else {
        return;
    };
    assert!(cluster.url().starts_with("https://127.0.0.1:"));
    let kubeconfig = std::fs::read_to_string(cluster.kubeconfig()).unwrap();
    assert!(kubeconfig.contains(&cluster.url()), "{kubeconfig}");
    assert!(kubeconfig.contains(cluster.token()), "{kubeconfig}");
    assert!(cluster.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));

    cluster.create_namespace("payments-ns").await;
    let service = cluster
        .create_service("payments-ns", "payments", "http", 8080, false)
        .await;
    let cluster_ip: IpAddr = service["spec"]["clusterIP"]
        .as_str()
        .expect("a cluster IP")
        .parse()
        .unwrap();
    match cluster_ip {
        IpAddr::V4(v4) => assert_eq!(v4.octets()[..3], [10, 0, 0], "{service}"),
        IpAddr::V6(_) => panic!("an IPv4 cluster IP from 10.0.0.0/24: {service}"),
    }
    let headless = cluster
        .create_service("payments-ns", "payments-pods", "http", 8080, true)
        .await;
    assert_eq!(headless["spec"]["clusterIP"], "None", "{headless}");

    let pods: Vec<(IpAddr, bool, bool)> = (1..=3)
        .map(|i| (IpAddr::from([10, 1, 0, i]), true, false))
        .collect();
    cluster
        .put_endpoint_slice("payments-ns", "payments-a", "payments", "http", 8080, &pods)
        .await;
    let slice_path = "/apis/discovery.k8s.io/v1/namespaces/payments-ns/endpointslices/payments-a";
    let check_slice = |status: u16, slice: serde_json::Value| {
        assert_eq!(status, 200, "{slice}");
        assert_eq!(
            slice["metadata"]["labels"]["kubernetes.io/service-name"],
            "payments"
        );
        assert_eq!(slice["addressType"], "IPv4");
        assert_eq!(slice["ports"][0]["name"], "http");
        assert_eq!(slice["ports"][0]["port"], 8080);
        let endpoints = slice["endpoints"].as_array().unwrap();
        let addresses: Vec<&str> = endpoints
            .iter()
            .map(|e| e["addresses"][0].as_str().unwrap())
            .collect();
        assert_eq!(addresses, ["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
        assert!(
            endpoints.iter().all(
                |e| e["conditions"]["ready"] == true && e["conditions"]["terminating"] == false
            ),
            "{slice}"
        );
    };
    let (status, slice) = cluster.get(slice_path).await;
    check_slice(status, slice);
    // Found by its label, as a watch of the Service's slices finds it.
    let (status, list) = cluster
        .get("/apis/discovery.k8s.io/v1/namespaces/payments-ns/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dpayments")
        .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");

    cluster.stop_apiserver();
    let (status, body) = cluster.get(slice_path).await;
    assert_eq!(status, 0, "no answer while the API server is down: {body}");

    cluster.start_apiserver().await;
    let (status, slice) = cluster.get(slice_path).await;
    check_slice(status, slice);

    // Replaced in place, then deleted.
    cluster
        .put_endpoint_slice(
            "payments-ns",
            "payments-a",
            "payments",
            "http",
            8080,
            &[(IpAddr::from([10, 1, 0, 9]), false, true)],
        )
        .await;
    let (status, slice) = cluster.get(slice_path).await;
    assert_eq!(status, 200, "{slice}");
    assert_eq!(slice["endpoints"][0]["addresses"][0], "10.1.0.9");
    assert_eq!(slice["endpoints"][0]["conditions"]["terminating"], true);
    cluster
        .delete_endpoint_slice("payments-ns", "payments-a")
        .await;
    assert_eq!(cluster.get(slice_path).await.0, 404);
}
