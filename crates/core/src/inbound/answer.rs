//! The answers the inbound side makes itself, before or instead of the app's: a
//! refused retry, an overload, a deadline, an app that could not be reached. Each
//! carries `x-tollgate-outcome`. Most are owned, so a caller's tollgate does not retry
//! them; `app-unreachable` and `app-timeout` are not: the inbound side never retries,
//! so its app's failures are its endpoint's failures, for the caller to retry on
//! another endpoint. A gRPC call gets them in gRPC's words (a trailers-only answer,
//! HTTP 200, with `grpc-retry-pushback-ms: -1` on the owned ones), made as the outbound
//! side's answers to its app are ([`crate::answer`]), from the one table of refusals
//! there.

use crate::answer::{APP_RESET, APP_TIMED_OUT, APP_UNREACHABLE, NO_DESCRIPTORS, Refusal};
use crate::fault::Fault;
use crate::metrics::Outcome;

/// The answer for a [`Fault`] of the exchange with the app: the fault's own status
/// ([`Fault::status`]) and gRPC code, with the app's outcome (`app-timeout`,
/// `app-unreachable`: its endpoint's failures, for the caller to retry elsewhere), or
/// `overloaded` for a descriptor shortage of this process. The exchange with the app
/// meets no other fault (a caller's body that breaks breaks the exchange: a reset);
/// any other is answered as the reset it would be.
pub fn refusal(fault: Fault) -> &'static Refusal {
    match fault {
        Fault::Timeout => &APP_TIMED_OUT,
        Fault::ConnectFailure | Fault::Tls => &APP_UNREACHABLE,
        Fault::NoDescriptors => &NO_DESCRIPTORS,
        Fault::Reset
        | Fault::HeadTooLarge
        | Fault::Status(_)
        | Fault::Unavailable
        | Fault::CallerBody => &APP_RESET,
    }
}

/// Whether `r` says the app failed: the app's failure is this endpoint's, and a caller
/// behind a Service's virtual IP that keeps this connection comes back to the same pod;
/// on a new one, kube-proxy picks again. Its answer closes the connection.
pub fn about_the_app(r: &Refusal) -> bool {
    matches!(r.outcome, Outcome::AppUnreachable | Outcome::AppTimeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_of_the_app_is_answered_with_its_own_status_and_code() {
        for fault in [
            Fault::ConnectFailure,
            Fault::Timeout,
            Fault::Reset,
            Fault::NoDescriptors,
        ] {
            let r = refusal(fault);
            assert_eq!(r.status, fault.status(), "{fault:?}");
            let code = crate::answer::code(r.outcome, None, r.status);
            assert_eq!(code, fault.grpc_code(), "{fault:?}");
        }
        assert_eq!(refusal(Fault::Timeout).outcome, Outcome::AppTimeout);
        assert_eq!(refusal(Fault::Reset).outcome, Outcome::AppUnreachable);
        assert_eq!(refusal(Fault::NoDescriptors).outcome, Outcome::Overloaded);
    }
}
