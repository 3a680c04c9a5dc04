//! The metrics of `discovery = "kubernetes"`: the ready endpoints a watched Service has
//! now, the changes of that set published, and the watch's errors by a fixed reason.
//!
//! They are state, not traffic: an upstream with discovery has its series from the
//! moment its watch starts, whether or not it has had a request, and every reason
//! exists at zero so `increase()` sees the first error; a reload that removes the
//! upstream removes them. A watch shared by several upstreams updates each one's
//! handles.

use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::family::{counters, int_gauges};

/// Why a watch failed: the `reason` label of `tollgate_discovery_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The API could not be reached: no connection, no TLS, the connection lost.
    Connect,
    /// The API did not answer in time.
    Timeout,
    /// 401 or 403: the token is not (or no longer) valid, or the RBAC is missing.
    Auth,
    /// Another status than expected (a 5xx, a 404 for the Service).
    Status,
    /// An answer that is not the JSON of the API's objects.
    Decode,
    /// 410 Gone: the watch fell too far behind and listed again.
    Gone,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::Connect,
        Reason::Timeout,
        Reason::Auth,
        Reason::Status,
        Reason::Decode,
        Reason::Gone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Connect => "connect",
            Reason::Timeout => "timeout",
            Reason::Auth => "auth",
            Reason::Status => "status",
            Reason::Decode => "decode",
            Reason::Gone => "gone",
        }
    }
}

/// The three families, registered with the process's registry.
pub(super) struct Families {
    endpoints: IntGaugeVec,
    updates: IntCounterVec,
    errors: IntCounterVec,
}

impl Families {
    pub(super) fn new(r: &Registry) -> Self {
        Families {
            endpoints: int_gauges(
                r,
                "tollgate_discovery_endpoints",
                "Ready endpoints of the upstream's watched Service now.",
                &["upstream"],
            ),
            updates: counters(
                r,
                "tollgate_discovery_updates_total",
                "Changes of the upstream's endpoint set published from the Kubernetes API.",
                &["upstream"],
            ),
            errors: counters(
                r,
                "tollgate_discovery_errors_total",
                "Failures of the watch of the upstream's Service (the last known endpoints \
                 keep serving), by reason: connect, timeout, auth (401/403), status, \
                 decode, gone (410: listed again).",
                &["upstream", "reason"],
            ),
        }
    }

    pub(super) fn upstream(&self, name: &str) -> DiscoveryMetrics {
        DiscoveryMetrics {
            upstream: name.into(),
            endpoints: self.endpoints.with_label_values(&[name]),
            updates: self.updates.with_label_values(&[name]),
            errors: Reason::ALL.map(|r| self.errors.with_label_values(&[name, r.as_str()])),
        }
    }

    /// Removes the series of an upstream a reload removed.
    pub(super) fn forget(&self, name: &str) {
        let _ = self.endpoints.remove_label_values(&[name]);
        let _ = self.updates.remove_label_values(&[name]);
        for r in Reason::ALL {
            let _ = self.errors.remove_label_values(&[name, r.as_str()]);
        }
    }
}

/// One upstream's handles, resolved once.
#[derive(Clone, Debug)]
pub struct DiscoveryMetrics {
    /// The label: two handles of one upstream (its configs before and after a reload,
    /// both alive a moment) count once.
    upstream: Arc<str>,
    endpoints: IntGauge,
    updates: IntCounter,
    errors: [IntCounter; Reason::ALL.len()],
}

impl DiscoveryMetrics {
    /// The upstream these count for.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// A new endpoint set of `ready` addresses was published.
    pub fn published(&self, ready: usize) {
        self.endpoints.set(i64::try_from(ready).unwrap_or(i64::MAX));
        self.updates.inc();
    }

    /// The set as it stands, for a subscriber that joins a running watch.
    pub fn set_endpoints(&self, ready: usize) {
        self.endpoints.set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    pub fn error(&self, why: Reason) {
        self.errors[why as usize].inc();
    }

    pub fn errors(&self, why: Reason) -> u64 {
        self.errors[why as usize].get()
    }

    pub fn updates(&self) -> u64 {
        self.updates.get()
    }

    pub fn endpoints(&self) -> i64 {
        self.endpoints.get()
    }
}
