//! tollgate: a sidecar proxy that owns every retry between a service and its upstreams.
//!
//! The app sends its outbound HTTP through tollgate on localhost and turns its own
//! retries off. tollgate retries on its behalf inside a per-upstream retry budget, with
//! full-jitter backoff, inside the caller's deadline, honouring Retry-After, and marks
//! every failure it gave up on so that no other layer retries it again.
//!
//! Layers import downwards only (docs/architecture.md). From the bottom: [`config`],
//! [`metrics`], [`deadline`], [`descriptors`], [`fault`] (why a request failed, and
//! what that means to each layer), [`worker`], [`trace`] (the spans and their export)
//! and the wire, [`http`]; [`discovery`] (a Service's pods, watched in the Kubernetes
//! API); [`upstream`] (the endpoints, generic over the
//! body it sends); [`retry`] (deciding and looping, generic
//! over the app's body); [`server`] (the app-facing connections and their codecs) and
//! [`listen`] (the listeners both sides are served on, and their drain); the two sides,
//! peers that never name each other: [`proxy`] (the outbound service, the app's calls
//! to its upstreams) and [`inbound`] (the service in front of the app); [`sides`] (both
//! on their listeners, wired together); [`run`], [`reload`], [`admin`];
//! and the tools on top: [`check`], [`calc`], [`lab`] and [`capture`] (`tollgate
//! iptables`), which print through [`print`].

#![forbid(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod answer;
pub mod calc;
pub mod capture;
pub mod check;
pub mod config;
pub mod deadline;
pub mod descriptors;
pub mod discovery;
pub mod fault;
pub mod http;
pub mod inbound;
pub mod inject;
pub mod lab;
pub mod listen;
pub mod loops;
pub mod metrics;
pub mod print;
pub mod proxy;
pub mod reload;
pub mod retry;
pub mod run;
pub mod server;
pub mod sides;
pub mod trace;
pub mod upstream;
pub mod worker;
