//! Retrying on the app's behalf: what may be retried ([`policy`]), how many retries the
//! upstream can afford ([`budget`]), how long to wait ([`backoff`], [`retry_after`]),
//! how the app's body is sent again ([`replay`]), when a slow attempt gets a hedge
//! beside it ([`hedge`], with the latency percentile of [`quantile`]), and the attempt
//! loop that puts them together ([`forward`], one [`attempt`] at a time, or two with a
//! hedge), with what each attempt did written into a traced request's spans
//! ([`traced`]).
//!
//! The caller also learns from its upstream: the budget's share adapts ([`adaptive`]),
//! first attempts are throttled when most are rejected ([`throttle`]), both fed by
//! what each attempt showed ([`learn`]); and it sees the app's own retries, by the
//! counts its client puts on them ([`crate::contract::markers`]) and by the failures it owned lately
//! ([`recent`]).
//!
//! Generic over the app's body `A`: this layer records and replays it, and does not
//! care which protocol brought it.

pub mod adaptive;
pub mod attempt;
pub mod backoff;
pub mod budget;
mod exchange;
mod forward;
#[cfg(test)]
mod forward_tests;
pub mod hedge;
pub mod keys;
pub mod learn;
pub mod policy;
pub mod quantile;
mod race;
pub mod recent;
mod rejected;
pub mod replay;
pub mod retry_after;
#[cfg(test)]
mod script;
mod slots;
pub mod throttle;
mod traced;
pub mod transport;
mod upstream;

pub use attempt::Transport;
pub use attempt::{Attempt, Head};
pub use exchange::{Answer, BodyRead, Exchange, HedgeState, Reply, Trail};
pub use forward::{forward, forward_on};
pub use replay::{AppBody, ReplayBody};
pub use upstream::Upstream;
