//! The app-facing server of both sides, the outbound proxy's and the inbound side's:
//! client connections, HTTP/1.1 on tollgate's own codec and HTTP/2 on hyper's, each
//! request handed to a [`Service`]. Nothing here knows what the service does with it:
//! routes, retries and admission are the service's. [`headers`] is the one pass both
//! services make over a request's headers (the caller's deadline read, hop-by-hop
//! headers dropped).
//!
//! From the bottom: [`watchdog`] (slow heads, idle connections), [`socket`] (an
//! HTTP/1.1 connection's socket and request body), [`body`] (the bodies that cross),
//! [`service`] (the trait), [`h1`] (the HTTP/1.1 codec's loop and writer, and after a
//! `101` a byte tunnel), [`conn`] (one connection: protocol sniff, drain).

pub mod body;
pub mod conn;
#[cfg(test)]
pub mod got;
pub mod h1;
pub mod headers;
pub mod service;
pub mod socket;
mod tunnel;
pub mod watchdog;

pub use body::{AddedFields, Admission, AppBody, Finish, Inside, RequestGuard, ResponseBody};
pub use conn::{serve, serve_after};
pub use service::Service;
pub use watchdog::ConnState;
