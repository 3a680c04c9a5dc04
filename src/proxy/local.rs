//! tollgate's own answers to the app on the outbound side, written and counted the same
//! way wherever they are made: the handler's refusals, a captured connection's loop, a
//! passed-through request that could not be passed.

use http::header::CONNECTION;
use http::{HeaderValue, Response};

use crate::answer::Local;
use crate::metrics::UpstreamMetrics;
use crate::server::{RequestGuard, ResponseBody};

/// Adds `Connection: close` when the app's HTTP/1.x body was left unread.
pub(super) fn announce_close(resp: &mut Response<ResponseBody>) {
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

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
