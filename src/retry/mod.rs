//! Retrying on the app's behalf: what may be retried ([`policy`]), how many retries the
//! upstream can afford ([`budget`]), how long to wait ([`backoff`], [`retry_after`]),
//! how the app's body is sent again ([`replay`]), when a slow attempt gets a hedge
//! beside it ([`hedge`], with the latency percentile of [`quantile`]), and the attempt
//! loop that puts them together ([`forward`], one [`attempt`] at a time, or two with a
//! hedge).
//!
//! Generic over the app's body `A`: this layer records and replays it, and does not
//! care which protocol brought it.

mod attempt;
pub mod backoff;
pub mod budget;
mod forward;
pub mod headers;
pub mod hedge;
pub mod median;
pub mod policy;
pub mod quantile;
pub mod replay;
pub mod retry_after;
mod upstream;

pub use forward::{Answer, Exchange, Reply, Trail, forward};
pub use replay::{AppBody, ReplayBody};
pub use upstream::Upstream;
