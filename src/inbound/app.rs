//! One request to the app, on one of the pooled connections to it: the head goes out
//! with the deadline rewritten to the time left, the body as the caller sends it
//! (streaming, never kept: the inbound side never sends a request twice), and the
//! response head is awaited until the deadline. A pooled connection the app had closed
//! is passed over for another without resending anything (the request never left).
//! When no head comes, the [`Fault`] says why, as the outbound side's attempts say it
//! (the inbound side's refusal for it: [`super::answer::refusal`]).

use std::time::Duration;

use http::HeaderName;
use prometheus::IntCounter;
use tokio::time::Instant;

use crate::deadline::{self, Deadline};
use crate::fault::Fault;
use crate::upstream::OutgoingBody;
use crate::upstream::exchange::{self, Failed, Reach, Wire};
use crate::upstream::pool::{Endpoint, Want};
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::UpstreamResponse;

/// The app is local: a connection that takes longer than this is not coming.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How the deadline travels to the app.
pub struct DeadlineFields<'a> {
    pub deadline: Deadline,
    /// The configured deadline header, written with the time left.
    pub header: &'a HeaderName,
    /// A gRPC call: `grpc-timeout` carries the time left of the caller's own deadline.
    pub grpc: bool,
    /// The request's `traceparent` for the app, when it is traced: the inbound side's
    /// SERVER span as the parent.
    pub traceparent: Option<http::HeaderValue>,
}

static TRACEPARENT_NAME: HeaderName = crate::trace::TRACEPARENT;

impl<'a> DeadlineFields<'a> {
    /// The fields for a request sent now: the deadline header only when there is a
    /// deadline.
    fn at(&self, now: Instant) -> AttemptFields<'a> {
        let left = self.deadline.remaining(now);
        AttemptFields([
            left.map(|left| (self.header, deadline::format_millis(left))),
            self.deadline.caller_at().filter(|_| self.grpc).map(|at| {
                let left = at.saturating_duration_since(now);
                (
                    &deadline::GRPC_TIMEOUT_NAME,
                    deadline::format_grpc_timeout(left),
                )
            }),
            self.traceparent.clone().map(|v| (&TRACEPARENT_NAME, v)),
            None,
        ])
    }
}

/// Sends the request to `app` and waits for its response head until the deadline. No
/// head is a [`Fault::ConnectFailure`] (no connection to it), a [`Fault::Timeout`]
/// (the deadline passed first), a [`Fault::Reset`] (it broke the connection after the
/// request went out) or [`Fault::NoDescriptors`].
pub async fn send<'a, B: OutgoingBody>(
    app: &Endpoint<B>,
    want: Want,
    head: &RequestHead<'a>,
    body: B,
    fields: &DeadlineFields<'a>,
    exhausted: &IntCounter,
) -> Result<UpstreamResponse, Fault> {
    let reach = Reach {
        want,
        tls: None,
        connect_timeout: CONNECT_TIMEOUT,
        started: Instant::now(),
        by: fields.deadline.at(),
        own_connection: false,
        alone: None,
    };
    let at = |now| RequestHead {
        fields: fields.at(now),
        rare: None,
        continue_wait: exchange::continue_wait(fields.deadline.remaining(now)),
        ..*head
    };
    let failed = match exchange::send(app, reach, at, &mut Some(body)).await {
        Ok(resp) => return Ok(resp),
        Err(failed) => failed,
    };
    // The app is reached without TLS: no reason to tell. A stream it refused never
    // left tollgate as far as the app is concerned (RFC 9113 section 8.7: nothing of
    // it was processed): as a refused connection, it did not run.
    let fault = match &failed {
        Failed::Broken { error, .. } if refused_stream(&**error) => Fault::ConnectFailure,
        _ => failed.fault(Wire::Plain, &mut None),
    };
    match fault {
        Fault::NoDescriptors => exhausted.inc(),
        Fault::Timeout => {}
        _ => tracing::debug!(app = %app.addr, error = %failed, "the app gave no answer"),
    }
    Err(fault)
}

/// Whether an HTTP/2 stream was refused by the app (`REFUSED_STREAM` from its side).
fn refused_stream(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_remote() && h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        cause = e.source();
    }
    false
}
