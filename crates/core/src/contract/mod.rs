//! The tollgate-to-tollgate contract: what the hops of a chain say to each other on the
//! wire, with no dependence on the retry engine, so that both sides and the server read
//! it from here. tollgate's own `x-tollgate-*` headers and the values written in them
//! ([`headers`]), what another tollgate's outcome on a response means to this one
//! ([`outcome`]: the ownership rule and its exceptions), what a callee's dedupe says of
//! itself and the store a retry goes back to ([`dedupe`]), and the counts other HTTP
//! clients put on their own retries ([`markers`]).
//!
//! The words of an outcome are the metrics' own ([`crate::metrics::Outcome`]): what a
//! tollgate answers with is what it counts.

pub mod dedupe;
pub mod headers;
pub mod markers;
pub mod outcome;
