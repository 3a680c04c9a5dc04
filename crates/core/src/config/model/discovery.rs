//! Where an upstream's endpoints come from: its `endpoints` names, re-resolved
//! (`discovery = "dns"`), or the ready pods of a Kubernetes Service, watched from the API
//! (`discovery = "kubernetes"` with `service` and `port`), and `[kubernetes]`, where that
//! API is when tollgate does not run in a pod.
//!
//! Plain data: the watch itself is `crate::discovery`'s, built from these values. A
//! `ServiceRef` without its port is what the process shares one watch by, and with it
//! one channel of that watch, so it is `Hash + Eq`; its namespace is `None` when the file
//! names none (the pod's own, known only at run time).

use std::fmt;
use std::path::PathBuf;

/// `discovery`: how an upstream's endpoints are found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Discovery {
    /// Each address its `endpoints` names resolve to, re-resolved.
    #[default]
    Dns,
    /// The ready addresses of a Service's EndpointSlices.
    Kubernetes(ServiceRef),
}

impl Discovery {
    /// The word the file writes.
    pub fn as_str(&self) -> &'static str {
        match self {
            Discovery::Dns => "dns",
            Discovery::Kubernetes(_) => "kubernetes",
        }
    }

    /// The Service watched, with `discovery = "kubernetes"`.
    pub fn service(&self) -> Option<&ServiceRef> {
        match self {
            Discovery::Dns => None,
            Discovery::Kubernetes(s) => Some(s),
        }
    }
}

/// A Service and one of its ports: `service = "NAME" | "NAME.NAMESPACE"`, `port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceRef {
    pub name: String,
    /// `None`: the pod's own namespace (or the kubeconfig context's).
    pub namespace: Option<String>,
    pub port: ServicePort,
}

impl ServiceRef {
    /// `service` as the file writes it: `NAME` or `NAME.NAMESPACE`.
    pub fn written(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}.{ns}", self.name),
            None => self.name.clone(),
        }
    }
}

/// `port`: the Service port by its name, or by its number.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ServicePort {
    Name(String),
    Number(u16),
}

impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServicePort::Name(n) => f.write_str(n),
            ServicePort::Number(n) => write!(f, "{n}"),
        }
    }
}

/// `[kubernetes]`: where the API is when tollgate does not run in a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// A kubeconfig file, resolved against the config file's directory. `None`: the
    /// pod's service account.
    pub kubeconfig: Option<PathBuf>,
}
