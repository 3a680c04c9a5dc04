//! tollgate's request path: a sidecar proxy that owns every retry between a service and
//! its upstreams. The tools (`tollgate check`, `calc`, `lab`, `inject`, `iptables`) are
//! crates above this one; the `tollgate` command wires them.
//!
//! The app sends its outbound HTTP through tollgate on localhost and turns its own
//! retries off. tollgate retries on its behalf inside a per-upstream retry budget, with
//! full-jitter backoff, inside the caller's deadline, honouring Retry-After, and marks
//! every failure it gave up on so that no other layer retries it again.
//!
//! Layers import downwards only. Which module sits on which floor is one table,
//! `FLOORS` in build/layering.rs, which the build enforces; docs/architecture.md shows
//! it (generated from it, and its paragraph per floor checked against it by
//! tests/it/layering.rs), from the wire ([`http`]) at the bottom, through [`upstream`],
//! [`retry`] and [`server`], to the two sides ([`proxy`], [`inbound`]) and the process
//! on top ([`run`]).

#![forbid(unsafe_code)]

pub mod access_log;
pub mod admin;
pub mod answer;
pub mod config;
pub mod contract;
pub mod deadline;
pub mod descriptors;
pub mod discovery;
pub mod fault;
pub mod http;
pub mod inbound;
pub mod listen;
pub mod loops;
pub mod metrics;
pub mod print;
pub mod proxy;
pub mod reload;
pub mod retry;
pub mod run;
pub mod served;
pub mod server;
pub mod sides;
pub mod trace;
pub mod upstream;
pub mod worker;
