//! tollgate's own answers to the app on the outbound side, written and counted the same
//! way wherever they are made: the handler's refusals and a passed-through request that
//! could not be passed.

use http::Response;

use crate::answer::Local;
pub(super) use crate::answer::announce_close;
use crate::metrics::UpstreamMetrics;
use crate::server::{RequestGuard, ResponseBody};

/// Writes an answer tollgate makes itself ([`crate::answer`]), counted under the
/// upstream's metrics when there is one.
pub(super) fn local_answer(
    metrics: Option<&UpstreamMetrics>,
    local: Local<'_>,
    grpc: bool,
    guard: RequestGuard,
) -> Response<ResponseBody> {
    if let Some(m) = metrics {
        let status = local.status(grpc).as_u16();
        m.request(status, local.outcome, local.attempts.unwrap_or(0));
    }
    local.answer(grpc, guard)
}
