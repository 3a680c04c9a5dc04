//! tollgate: a sidecar proxy that owns every retry between a service and its upstreams.
//!
//! The app sends its outbound HTTP through tollgate on localhost and turns its own
//! retries off. tollgate retries on its behalf inside a per-upstream retry budget, with
//! full-jitter backoff, inside the caller's deadline, honouring Retry-After, and marks
//! every failure it gave up on so that no other layer retries it again.
//!
//! The layout follows the request: [`config`] (the file), [`proxy`] (listeners,
//! routing, header hygiene), [`retry`] (policy, budget, backoff, replay, the attempt
//! loop), [`upstream`] (pools, endpoints, TLS), [`deadline`], [`metrics`], [`admin`],
//! [`reload`]; and the tools around it: [`calc`], [`check`] and [`lab`], which print
//! through [`print`].

#![forbid(unsafe_code)]

pub mod admin;
pub mod calc;
pub mod check;
pub mod config;
pub mod deadline;
pub mod lab;
pub mod metrics;
pub mod print;
pub mod proxy;
pub mod reload;
pub mod retry;
pub mod run;
pub mod upstream;
