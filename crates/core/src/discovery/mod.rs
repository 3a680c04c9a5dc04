//! `discovery = "kubernetes"`: an upstream's endpoints are the ready pods of a Service,
//! watched in the Kubernetes API as kube-proxy watches them (its EndpointSlices,
//! labelled `kubernetes.io/service-name`), and published on a `tokio::sync::watch`
//! channel for the upstream layer to build its endpoints from.
//!
//! Why a client of our own: a watch needs three requests of the API, list and watch of
//! EndpointSlices in one namespace and get of one Service, over HTTPS with a bearer
//! token or a client certificate. `kube` (client and runtime) with `k8s-openapi` does
//! that and much more: 69 crates beyond the sidecar's own tree (tower, tower-http,
//! pest, regex, jiff, jsonpath, a second YAML parser, ...), about a minute of CPU more
//! for a clean debug build here (docs/benchmarks.md). This is hyper's HTTP/1.1 client
//! and tokio-rustls, both already here, and serde for the three objects.
//!
//! The files: [`credentials`] (the service account or a kubeconfig, read by
//! [`kubeconfig`] with the [`base64`] its `*-data` fields are in), [`client`] (one
//! request, its failures classified), [`objects`] (the JSON of the objects and the
//! ready set they make), [`events`] (the watch's stream of events) and [`task`] (the
//! loop of list, watch, publish and back off). This file holds the process's registry:
//! one watch per Service (and credentials), shared by every upstream that names it,
//! whatever its port, through a [`ServiceWatch`] each, and stopped when the last is
//! dropped.
//!
//! Nothing here runs for an upstream without discovery: no task, no registry entry,
//! nothing on the request path (subscribers read the channel when it changes).

pub mod base64;
mod client;
pub mod credentials;
pub mod events;
pub mod kubeconfig;
pub mod objects;
mod task;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::task::AbortHandle;

use crate::config::{KubernetesConfig, ServicePort, ServiceRef};
pub use crate::metrics::discovery::DiscoveryMetrics;
use task::{Port, State, Target};

/// How long `/readyz` waits for a watch's first list before it stops waiting.
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// What a watch publishes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// The ready endpoints, sorted. `None` until the first list has arrived (the
    /// upstream then calls the Service's DNS name); empty when the Service has no ready
    /// pod.
    pub ready: Option<Arc<[SocketAddr]>>,
    /// `clusterIP:port` of the Service (none when headless): what a captured
    /// connection to the Service dials, so it identifies the upstream.
    pub cluster_ip: Option<SocketAddr>,
}

/// Why a watch cannot be started.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// Neither a pod's service account nor a readable kubeconfig.
    #[error("{0}")]
    Credentials(String),
    /// Called outside a tokio runtime: the watch's task has nowhere to run.
    #[error("discovery needs a tokio runtime to run its watch on")]
    NoRuntime,
}

/// One watch, shared: the channel's state, and its task, stopped when the last handle
/// goes.
struct Shared {
    state: Arc<State>,
    task: AbortHandle,
    namespace: String,
    name: String,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watches of the process: one per (kubeconfig, namespace, name).
type Key = (Option<PathBuf>, String, String);

/// The live watches, each by its key; the dead ones are pruned at every look.
type Live = Vec<(Key, Weak<Shared>)>;

fn registry() -> MutexGuard<'static, Live> {
    static LIVE: OnceLock<Mutex<Live>> = OnceLock::new();
    let live = LIVE.get_or_init(Default::default);
    // A panic while holding it leaves a list that is still whole.
    let mut guard = live.lock().unwrap_or_else(|e| e.into_inner());
    guard.retain(|(_, w)| w.strong_count() > 0);
    guard
}

/// An upstream's hold on a port of a watched Service: dropping it stops its metrics
/// being updated, the port being published once no upstream names it, and the watch
/// itself once no upstream holds it.
pub struct ServiceWatch {
    shared: Arc<Shared>,
    port: Arc<Port>,
    id: u64,
}

impl Drop for ServiceWatch {
    fn drop(&mut self) {
        self.shared.state.unsubscribe(&self.port, self.id);
    }
}

impl std::fmt::Debug for ServiceWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceWatch")
            .field("namespace", &self.shared.namespace)
            .field("name", &self.shared.name)
            .field("port", &self.port.port)
            .finish()
    }
}

/// The watch of `service`, started on the current tokio runtime unless one is running
/// already; `metrics` are the calling upstream's, updated from now on. An error only
/// when there are no credentials to watch with (not in a pod, no kubeconfig, or one
/// that cannot be read) or no runtime.
pub fn watch(
    service: &ServiceRef,
    kube: &KubernetesConfig,
    metrics: DiscoveryMetrics,
) -> Result<Arc<ServiceWatch>, DiscoveryError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| DiscoveryError::NoRuntime)?;
    let creds = credentials::load(kube).map_err(DiscoveryError::Credentials)?;
    let namespace = service
        .namespace
        .clone()
        .unwrap_or_else(|| creds.namespace.clone());
    let key: Key = (
        kube.kubeconfig.clone(),
        namespace.clone(),
        service.name.clone(),
    );
    let shared = {
        let mut live = registry();
        let running = live
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade());
        match running {
            Some(shared) => shared,
            None => {
                let state = Arc::new(State::new());
                let target = Target {
                    namespace: namespace.clone(),
                    name: service.name.clone(),
                };
                let task = runtime.spawn(task::run(state.clone(), creds, target));
                let shared = Arc::new(Shared {
                    state,
                    task: task.abort_handle(),
                    namespace,
                    name: service.name.clone(),
                });
                live.push((key, Arc::downgrade(&shared)));
                shared
            }
        }
    };
    static IDS: AtomicU64 = AtomicU64::new(0);
    let id = IDS.fetch_add(1, Ordering::Relaxed);
    let port = shared.state.subscribe(&service.port, id, metrics);
    Ok(Arc::new(ServiceWatch { shared, port, id }))
}

impl ServiceWatch {
    /// The endpoints as they change; the current value at once.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Found> {
        self.port.tx.subscribe()
    }

    /// The Service's `clusterIP:port`, once it has been read (none when headless).
    pub fn cluster_ip(&self) -> Option<SocketAddr> {
        self.port.tx.borrow().cluster_ip
    }

    /// The Service's DNS name, `NAME.NAMESPACE.svc.<cluster domain>`, and its port's
    /// number, for the upstream to call until the first list (as a direct call would).
    /// `None` while the port is named and the Service has not been read yet.
    pub fn dns_name(&self) -> Option<(String, u16)> {
        let port = match &self.port.port {
            ServicePort::Number(n) => *n,
            ServicePort::Name(_) => {
                let n = self.port.number.load(Ordering::Relaxed);
                u16::try_from(n).ok().filter(|n| *n != 0)?
            }
        };
        let host = format!(
            "{}.{}.svc.{}",
            self.shared.name,
            self.shared.namespace,
            cluster_domain()
        );
        Some((host, port))
    }
}

/// The cluster's DNS domain, read once from `/etc/resolv.conf`; `cluster.local` when it
/// says none.
fn cluster_domain() -> &'static str {
    static DOMAIN: OnceLock<String> = OnceLock::new();
    DOMAIN.get_or_init(|| {
        std::fs::read_to_string("/etc/resolv.conf")
            .ok()
            .and_then(|text| credentials::cluster_domain(&text))
            .unwrap_or_else(|| "cluster.local".to_string())
    })
}

/// Whether every watch running has had its first list, or has tried for longer than
/// [`FIRST_LIST_WAIT`]: what `/readyz` waits for, so a pod takes traffic with its
/// endpoints known, and a cluster whose API is down does not keep it unready.
pub fn all_listed() -> bool {
    let now = tokio::time::Instant::now();
    registry()
        .iter()
        .filter_map(|(_, w)| w.upgrade())
        .all(|s| s.state.listed.load(Ordering::Acquire) || now - s.state.started > FIRST_LIST_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::metrics::discovery::Reason;

    /// A kubeconfig for an API server that is not there (nothing listens on port 1).
    fn unreachable_kubeconfig() -> KubernetesConfig {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-discovery-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
             users:\n- name: u\n  user:\n    token: t\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: shop\n\
             current-context: x\n",
        )
        .unwrap();
        KubernetesConfig {
            kubeconfig: Some(path),
        }
    }

    fn service(name: &str, port: ServicePort) -> ServiceRef {
        ServiceRef {
            name: name.into(),
            namespace: None,
            port,
        }
    }

    #[test]
    fn without_a_runtime_or_credentials_no_watch_starts() {
        let m = Metrics::new();
        let kube = unreachable_kubeconfig();
        let s = service("nowhere", ServicePort::Number(80));
        assert!(matches!(
            watch(&s, &kube, m.discovery("a")),
            Err(DiscoveryError::NoRuntime)
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in = rt.enter();
        let missing = KubernetesConfig {
            kubeconfig: Some("/nonexistent/kubeconfig".into()),
        };
        let Err(e) = watch(&s, &missing, m.discovery("a")) else {
            panic!("no credentials")
        };
        assert!(e.to_string().contains("/nonexistent/kubeconfig"), "{e}");
    }

    #[tokio::test]
    async fn one_watch_serves_every_upstream_naming_the_service_until_the_last_goes() {
        let m = Metrics::new();
        let kube = unreachable_kubeconfig();
        let name = format!("shared-{}", fastrand::u32(..));
        let s = service(&name, ServicePort::Name("http".into()));
        let a = watch(&s, &kube, m.discovery("a")).unwrap();
        let b = watch(&s, &kube, m.discovery("b")).unwrap();
        assert!(Arc::ptr_eq(&a.shared, &b.shared), "one watch for both");
        let in_ns = ServiceRef {
            namespace: Some("shop".into()),
            ..s.clone()
        };
        let c = watch(&in_ns, &kube, m.discovery("c")).unwrap();
        assert!(
            Arc::ptr_eq(&a.shared, &c.shared),
            "the context's namespace is the one written"
        );
        let other_port = watch(
            &service(&name, ServicePort::Number(80)),
            &kube,
            m.discovery("d"),
        )
        .unwrap();
        assert!(
            Arc::ptr_eq(&a.shared, &other_port.shared),
            "one watch for every port of the Service"
        );
        assert!(
            !Arc::ptr_eq(&a.port, &other_port.port),
            "a channel per port"
        );
        assert_eq!(
            other_port.dns_name(),
            Some((format!("{name}.shop.svc.{}", cluster_domain()), 80))
        );
        assert_eq!(a.dns_name(), None, "the port's number is not known yet");
        assert_eq!(*a.subscribe().borrow(), Found::default(), "nothing listed");

        // A second handle of upstream `a` (its next config, after a reload): the
        // failures are still counted once for `a`.
        let a2 = watch(&s, &kube, m.discovery("a")).unwrap();
        // The API is unreachable: every subscriber counts the failures.
        let (da, db) = (m.discovery("a"), m.discovery("b"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while da.errors(Reason::Connect) == 0 || db.errors(Reason::Connect) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no failure counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!a.shared.state.listed.load(Ordering::Acquire));
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(a2);

        let task = a.shared.task.clone();
        drop((a, c));
        assert!(!task.is_finished(), "b still holds it");
        drop(b);
        assert_eq!(
            ports_published(&other_port),
            1,
            "the named port no upstream names any more is not published"
        );
        tokio::task::yield_now().await;
        assert!(
            !task.is_finished(),
            "the other port's upstream still holds it"
        );
        drop(other_port);
        tokio::task::yield_now().await;
        assert!(
            task.is_finished(),
            "the last holder gone, the task is stopped"
        );
        assert_eq!(
            da.errors(Reason::Connect),
            db.errors(Reason::Connect),
            "each upstream counts each failure once, however many handles it has"
        );
        let live = registry().iter().filter(|(k, _)| k.2 == name).count();
        assert_eq!(live, 0, "no watch of the Service is left");
    }

    /// The ports the watch behind `w` publishes.
    fn ports_published(w: &ServiceWatch) -> usize {
        w.shared.state.port_count()
    }
}
