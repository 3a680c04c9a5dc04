//! The task behind one watched Service: list, watch from the list's version, apply
//! each event as it arrives and publish the ready set, and on any failure keep what
//! is known, say so (at most once a minute), count it, back off and go on.
//!
//! The loop, as client-go's reflector runs it: list the Service's EndpointSlices (and
//! get the Service, for its port, family and cluster IP), then watch from the list's
//! `resourceVersion` with bookmarks, for [`WATCH_SECONDS`] at a time; a watch that
//! ends is started again from the last version seen, and only a 410 (that version is
//! gone) lists again. Every event is applied and published at once: nothing is
//! batched, so a change reaches subscribers as fast as the API sends it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http_body_util::BodyExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Found;
use super::client::{self, Failure};
use super::credentials::Credentials;
use super::events::{AfterError, Event, Lines, after_error};
use super::objects::{self, List, Service, Slice};
use crate::config::ServicePort;
use crate::metrics::discovery::DiscoveryMetrics;

/// How long one watch request runs before the API ends it (and it is started again).
pub const WATCH_SECONDS: u64 = 240;
/// No byte for this long on a watch (not even a bookmark) and it is taken as lost.
const WATCH_IDLE: Duration = Duration::from_secs(WATCH_SECONDS + 30);
/// The same failure is logged at most this often per Service.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What the watch shares with its handles: what is known of the Service, the ports
/// named (each with its channel and its subscribers' metrics), and what readiness reads.
pub struct State {
    /// The Service and its slices as last seen: read to publish each port's set, also
    /// for a port named once the watch is running.
    known: Mutex<Known>,
    ports: Mutex<Vec<Arc<Port>>>,
    /// The first list has arrived.
    pub listed: AtomicBool,
    pub started: Instant,
}

/// The Service and its slices, as the watch last saw them.
#[derive(Default)]
struct Known {
    service: Option<Service>,
    slices: HashMap<String, Slice>,
}

/// One port of the Service that upstreams name: its ready set on a channel, and the
/// metrics of the upstreams that name it.
pub struct Port {
    pub port: ServicePort,
    pub tx: watch::Sender<Found>,
    subscribers: Mutex<Vec<(u64, DiscoveryMetrics)>>,
    /// The port's number once known (0: not yet).
    pub number: AtomicU32,
}

/// The lock's value: a panic while it was held leaves a value that is still whole.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Port {
    fn new(port: &ServicePort) -> Self {
        let number = match port {
            ServicePort::Number(n) => u32::from(*n),
            ServicePort::Name(_) => 0,
        };
        Port {
            port: port.clone(),
            tx: watch::channel(Found::default()).0,
            subscribers: Mutex::new(Vec::new()),
            number: AtomicU32::new(number),
        }
    }

    /// The set `known` makes for this port now, sent when it differs from what
    /// subscribers have. The metrics move first, so whoever sees the change on the
    /// channel sees them too.
    fn publish(&self, known: &Known, service_label: &dyn Fn() -> String) {
        let Some(service) = &known.service else {
            return;
        };
        if let Some(n) = service.port_number(&self.port) {
            self.number.store(u32::from(n), Ordering::Relaxed);
        }
        let ready = objects::ready(&known.slices, service, &self.port);
        let cluster_ip = service.cluster_addr(&self.port);
        let (set_changed, ip_changed) = {
            let now = self.tx.borrow();
            (
                now.ready.as_deref() != Some(ready.as_slice()),
                now.cluster_ip != cluster_ip,
            )
        };
        if set_changed {
            let n = ready.len();
            for (_, m) in locked(&self.subscribers).iter() {
                m.published(n);
            }
            tracing::debug!(service = %service_label(), port = %self.port, endpoints = n, "discovery: endpoints changed");
        }
        if set_changed || ip_changed {
            self.tx.send_modify(|found| {
                if set_changed {
                    found.ready = Some(ready.as_slice().into());
                }
                found.cluster_ip = cluster_ip;
            });
        }
    }
}

impl State {
    pub fn new() -> Self {
        State {
            known: Mutex::default(),
            ports: Mutex::default(),
            listed: AtomicBool::new(false),
            started: Instant::now(),
        }
    }

    /// Port `port`, with an upstream's handles subscribed (its gauge set to the set as
    /// it stands): the one the watch already publishes, or a new one, published at once
    /// from what is known.
    pub fn subscribe(&self, port: &ServicePort, id: u64, metrics: DiscoveryMetrics) -> Arc<Port> {
        let known = locked(&self.known);
        let mut ports = locked(&self.ports);
        let found = ports.iter().find(|p| p.port == *port).cloned();
        let port = found.unwrap_or_else(|| {
            let p = Arc::new(Port::new(port));
            p.publish(&known, &String::new);
            ports.push(p.clone());
            p
        });
        let ready = port.tx.borrow().ready.as_ref().map_or(0, |r| r.len());
        metrics.set_endpoints(ready);
        locked(&port.subscribers).push((id, metrics));
        port
    }

    /// An upstream's handles let go of `port`; a port no upstream names any more is no
    /// longer published.
    pub fn unsubscribe(&self, port: &Arc<Port>, id: u64) {
        let mut ports = locked(&self.ports);
        let mut subscribers = locked(&port.subscribers);
        subscribers.retain(|(i, _)| *i != id);
        if subscribers.is_empty() {
            ports.retain(|p| !Arc::ptr_eq(p, port));
        }
    }

    /// `f` on each upstream's handles once, whatever ports it names and however many of
    /// its handles subscribe (a reload's old and new configs of one upstream, both
    /// alive for a moment).
    fn each(&self, f: impl Fn(&DiscoveryMetrics)) {
        let ports = locked(&self.ports);
        let mut seen: Vec<DiscoveryMetrics> = Vec::new();
        for port in ports.iter() {
            for (_, m) in locked(&port.subscribers).iter() {
                if !seen
                    .iter()
                    .any(|earlier| earlier.upstream() == m.upstream())
                {
                    f(m);
                    seen.push(m.clone());
                }
            }
        }
    }

    /// Every port's set, published from what is known now.
    fn publish(&self, service_label: &dyn Fn() -> String) {
        let known = locked(&self.known);
        for port in locked(&self.ports).iter() {
            port.publish(&known, service_label);
        }
    }

    /// How many ports the watch publishes.
    #[cfg(test)]
    pub fn port_count(&self) -> usize {
        locked(&self.ports).len()
    }

    /// The ready endpoints of the first port named, when a list has arrived: what a
    /// warning says is kept.
    fn kept(&self) -> Option<usize> {
        let ports = locked(&self.ports);
        let first = ports.first()?;
        first.tx.borrow().ready.as_ref().map(|r| r.len())
    }
}

/// The Service a task watches.
pub struct Target {
    pub namespace: String,
    pub name: String,
}

impl Target {
    fn service_path(&self) -> String {
        format!(
            "/api/v1/namespaces/{}/services/{}",
            self.namespace, self.name
        )
    }

    fn slices_path(&self) -> String {
        format!(
            "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{}",
            self.namespace, self.name
        )
    }

    fn watch_path(&self, version: &str) -> String {
        format!(
            "{}&watch=1&resourceVersion={version}&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}",
            self.slices_path()
        )
    }
}

/// The watch's own state, kept across its requests.
struct Watcher {
    state: Arc<State>,
    creds: Credentials,
    target: Target,
    /// The version to watch from; `None`: list first.
    version: Option<String>,
    last_warning: Option<Instant>,
}

/// Runs the watch until the task is aborted (its last handle dropped).
pub async fn run(state: Arc<State>, creds: Credentials, target: Target) {
    let mut w = Watcher {
        state,
        creds,
        target,
        version: None,
        last_warning: None,
    };
    let mut backoff = Backoff::new(fastrand::u64(..));
    loop {
        let result = match w.version {
            None => w.list().await,
            Some(_) => w.watch().await,
        };
        match result {
            Ok(()) => backoff.reset(),
            Err(failure) => {
                w.failed(&failure);
                // 410: the version is gone, nothing is wrong with the API; list at once.
                if !matches!(failure, Failure::Gone(_)) {
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        }
    }
}

impl Watcher {
    fn label(&self) -> String {
        format!("{}/{}", self.target.namespace, self.target.name)
    }

    /// Gets the Service and lists its slices, and publishes what they make.
    async fn list(&mut self) -> Result<(), Failure> {
        self.get_service().await?;
        let body = client::get(&self.creds, &self.target.slices_path()).await?;
        let list = List::from_slice(&body).map_err(Failure::Decode)?;
        locked(&self.state.known).slices = list
            .slices
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        self.version = Some(list.resource_version);
        self.publish();
        self.state.listed.store(true, Ordering::Release);
        if self.last_warning.take().is_some() {
            tracing::info!(service = %self.label(), "discovery: the Kubernetes API answers again");
        }
        Ok(())
    }

    async fn get_service(&mut self) -> Result<(), Failure> {
        let body = client::get(&self.creds, &self.target.service_path()).await?;
        let service = Service::from_slice(&body).map_err(Failure::Decode)?;
        for port in locked(&self.state.ports).iter() {
            if service.port_name(&port.port).is_none() {
                tracing::warn!(
                    service = %self.label(),
                    port = %port.port,
                    "discovery: the Service has no such port; the upstream has no endpoints"
                );
            }
        }
        locked(&self.state.known).service = Some(service);
        Ok(())
    }

    /// One watch request, from the version last seen, to its end.
    async fn watch(&mut self) -> Result<(), Failure> {
        // The Service again, as often as a watch starts: its ports or cluster IP may
        // have changed.
        self.get_service().await?;
        self.publish();
        let version = self.version.clone().unwrap_or_default();
        let mut s = match client::stream(&self.creds, &self.target.watch_path(&version)).await {
            Err(Failure::Gone(why)) => {
                self.version = None;
                return Err(Failure::Gone(why));
            }
            other => other?,
        };
        if self.last_warning.take().is_some() {
            tracing::info!(service = %self.label(), "discovery: the Kubernetes API answers again");
        }
        let mut lines = Lines::default();
        loop {
            let frame = match tokio::time::timeout(WATCH_IDLE, s.body.frame()).await {
                Err(_) => return Err(Failure::Timeout(WATCH_IDLE)),
                Ok(None) => return Ok(()),
                Ok(Some(Err(e))) => return Err(Failure::Connect(format!("the watch broke: {e}"))),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for line in lines.push(&data).map_err(Failure::Decode)? {
                let event = Event::parse(&line).map_err(Failure::Decode)?;
                self.apply(event)?;
            }
        }
    }

    /// One event applied, and published when it changed the set.
    fn apply(&mut self, event: Event) -> Result<(), Failure> {
        match event {
            Event::Put(slice) => {
                if let Some(v) = &slice.resource_version {
                    self.version = Some(v.clone());
                }
                locked(&self.state.known)
                    .slices
                    .insert(slice.name.clone(), slice);
            }
            Event::Deleted {
                name,
                resource_version,
            } => {
                self.version = resource_version.or(self.version.take());
                locked(&self.state.known).slices.remove(&name);
            }
            Event::Bookmark(version) => {
                self.version = version.or(self.version.take());
                return Ok(());
            }
            Event::Error { code, message } => {
                return Err(match after_error(code) {
                    AfterError::Relist => {
                        self.version = None;
                        Failure::Gone(message)
                    }
                    AfterError::Retry => Failure::Status(
                        http::StatusCode::from_u16(code)
                            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR),
                        message,
                    ),
                });
            }
        }
        self.publish();
        Ok(())
    }

    /// Every port's set as the slices make it now, sent where it differs from what
    /// subscribers have.
    fn publish(&self) {
        self.state.publish(&|| self.label());
    }

    /// Counts `failure` for every subscriber, and logs it unless a warning went out in
    /// the last minute.
    fn failed(&mut self, failure: &Failure) {
        let reason = failure.reason();
        self.state.each(|m| m.error(reason));
        let now = Instant::now();
        if self.last_warning.is_some_and(|at| now - at < WARN_EVERY) {
            return;
        }
        self.last_warning = Some(now);
        let kept = match self.state.kept() {
            Some(n) => format!("the last known {n} endpoints keep serving"),
            None => "the Service's DNS name serves until the first list".to_string(),
        };
        let service = self.label();
        match failure {
            Failure::Auth(status, _) if status.as_u16() == 403 => tracing::warn!(
                %service,
                error = %failure,
                rbac = %format!(
                    "the identity of {} needs get, list and watch on endpointslices \
                     (discovery.k8s.io) and get and watch on services in namespace {} \
                     (deploy/kubernetes/rbac.yaml)",
                    self.creds.from, self.target.namespace
                ),
                "discovery: forbidden; {kept}"
            ),
            Failure::Gone(_) => {
                tracing::info!(%service, "discovery: the watch fell behind; listing again")
            }
            _ => tracing::warn!(
                %service,
                error = %failure,
                credentials = %self.creds.from,
                "discovery: the Kubernetes API failed; {kept}, and the watch is retried"
            ),
        }
    }
}

/// 250 ms doubling to 5 s, each wait drawn between half of it and all of it.
pub struct Backoff {
    next: Duration,
    rng: fastrand::Rng,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(5);

    pub fn new(seed: u64) -> Self {
        Backoff {
            next: Self::FIRST,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    pub fn next(&mut self) -> Duration {
        let cap = self.next;
        self.next = (cap * 2).min(Self::MAX);
        let half = cap / 2;
        let ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
        half + Duration::from_millis(self.rng.u64(0..=ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_seconds_with_jitter_and_resets() {
        let mut b = Backoff::new(7);
        let caps = [250, 500, 1000, 2000, 4000, 5000, 5000];
        for cap in caps {
            let d = b.next().as_millis() as u64;
            assert!(
                (cap / 2..=cap).contains(&d),
                "{d} ms within [{}, {cap}]",
                cap / 2
            );
        }
        b.reset();
        assert!(b.next() <= Duration::from_millis(250));
    }

    #[test]
    fn paths_select_the_services_slices_and_watch_from_a_version() {
        let t = Target {
            namespace: "shop".into(),
            name: "payments".into(),
        };
        assert_eq!(
            t.service_path(),
            "/api/v1/namespaces/shop/services/payments"
        );
        assert_eq!(
            t.watch_path("42"),
            "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices?labelSelector=\
             kubernetes.io%2Fservice-name%3Dpayments&watch=1&resourceVersion=42&\
             allowWatchBookmarks=true&timeoutSeconds=240"
        );
    }
}
