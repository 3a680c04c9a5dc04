//! Deciding: after a failed attempt, whether the request is retried and by what reason
//! it is not ([`policy`], in one function), with what it consults: the upstream's
//! retry budget ([`budget`], its window's clock in `slots.rs`), the backoff
//! ([`backoff`]) and the upstream's own word on when to come back ([`retry_after`]);
//! and, before any failure, whether a slow attempt gets a hedge beside it ([`hedge`]).

pub mod backoff;
pub mod budget;
pub mod hedge;
pub mod policy;
pub mod retry_after;
pub(in crate::retry) mod slots;
