//! What a request is judged by beyond its own attempts: the failures tollgate owned
//! lately, by which it sees the app retrying behind its back ([`recent`]), and the
//! idempotency keys it mints and what each callee's answers say of them, which decide
//! whether a request that may have run is sent again ([`keys`]).

pub mod keys;
pub mod recent;
