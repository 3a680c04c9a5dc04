//! A retry the callee refused: `503` with `x-tollgate-outcome: retry-rejected`, from a
//! callee's inbound side whose fleet-wide budget has no room for it.
//!
//! The ownership rule passes any response carrying an outcome straight back; this is
//! its one exception. The callee refused the retry, not the request: what the app must
//! hear is why the request failed, which is the previous attempt's failure. So while a
//! retry runs, the failure it retries is kept: the response as it came, or, when there
//! was none (a reset, a timeout), what tollgate would have answered for it (502, 504).
//! No further attempt follows a refusal: the callee said its fleet can take no more.
//!
//! Keeping a failed response is cheap: its head is already in memory, and an HTTP/1.1
//! body (a failure's is small) is read ahead into memory during the backoff, so its
//! connection goes back to the pool at once instead of waiting with the response. An
//! HTTP/2 response holds a stream, not a connection.

use std::time::Duration;

use crate::fault::Fault;
use crate::http::ByProtocol;
use crate::upstream::response::UpstreamResponse;

/// The most of a failed response's body read into memory to keep it.
const KEEP_BODY: usize = 64 * 1024;
/// How long reading a kept body may extend a backoff shorter than this.
const KEEP_WAIT: Duration = Duration::from_millis(50);

/// The failure a retry is retrying, kept in case the callee refuses the retry.
pub(super) enum Previous {
    /// The upstream's failed response, as it came (boxed: kept only while a retry
    /// runs, it should not make every request's state larger).
    Response(UpstreamResponse, Fault),
    /// A fault with no response (reset, timeout, connect failure): tollgate answers
    /// it itself ([`Fault::status`]).
    Fault(Fault),
}

/// Sleeps the backoff before a retry, keeping the failure it retries; a small HTTP/1.1
/// body is read into memory meanwhile, so its connection is released.
pub(super) async fn keep_while_sleeping(
    response: Option<UpstreamResponse>,
    failure: Fault,
    sleep: Duration,
) -> Previous {
    let Some(mut resp) = response else {
        if !sleep.is_zero() {
            tokio::time::sleep(sleep).await;
        }
        return Previous::Fault(failure);
    };
    if let ByProtocol::Http1(body) = resp.body_mut() {
        let read = tokio::time::timeout(sleep.max(KEEP_WAIT), body.read_ahead(KEEP_BODY));
        let _ = tokio::join!(read, tokio::time::sleep(sleep));
    } else if !sleep.is_zero() {
        tokio::time::sleep(sleep).await;
    }
    Previous::Response(resp, failure)
}

impl Previous {
    pub(super) fn failure(&self) -> Fault {
        match self {
            Previous::Response(_, f) | Previous::Fault(f) => *f,
        }
    }
}
