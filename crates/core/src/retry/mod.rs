//! Retrying on the app's behalf, in four parts, one concern each:
//!
//! - [`decide`]: whether and when a failed attempt is retried ([`decide::policy`]), how
//!   many retries the upstream can afford ([`decide::budget`]), how long to wait
//!   ([`decide::backoff`], [`decide::retry_after`]), and when a slow attempt gets a hedge
//!   beside it ([`decide::hedge`]).
//! - [`forward`](mod@forward): the attempt loop that puts them together, one attempt at a time
//!   ([`forward::attempt`]), or two with a hedge, sending the app's body again
//!   ([`forward::replay`]) and writing what each attempt did into a traced request's
//!   spans.
//! - [`learn`]: what the caller learns from its upstream's answers: the budget's share
//!   adapts ([`learn::adaptive`]), first attempts are throttled when most are rejected
//!   ([`learn::throttle`]), and the recent attempt latency ([`learn::quantile`]).
//! - [`evidence`]: what a request is judged by beyond its own attempts: the failures
//!   owned lately, to see the app's own retries ([`evidence::recent`]; the counts its
//!   client puts on them are the contract's, [`crate::contract::markers`]), and the
//!   idempotency keys and what callees say of them ([`evidence::keys`]).
//!
//! An upstream as the engine drives all four is [`Upstream`]. Generic over the app's
//! body `A`: this layer records and replays it, and does not care which protocol
//! brought it.

pub mod decide;
pub mod evidence;
pub mod forward;
pub mod learn;
mod upstream;

pub use forward::attempt::{Attempt, Head, Transport};
pub use forward::handoff::{Answer, BodyRead, Exchange, HedgeState, Reply, Trail};
pub use forward::replay::{ReplayBody, RetriedBody};
pub use forward::{forward, forward_on};
pub use upstream::Upstream;
