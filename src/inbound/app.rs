//! One request to the app, on one of the pooled connections to it: the head goes out
//! with the deadline rewritten to the time left, the body as the caller sends it
//! (streaming, never kept: the inbound side never sends a request twice), and the
//! response head is awaited until the deadline. A pooled connection the app had closed
//! is passed over for another without resending anything (the request never left).

use std::time::Duration;

use http::HeaderName;
use prometheus::IntCounter;
use tokio::time::{Instant, timeout_at};

use crate::deadline::{self, Deadline};
use crate::server::AppBody;
use crate::upstream::pool::{Endpoint, SendError, Want};
use crate::upstream::request::{AttemptFields, RequestHead};
use crate::upstream::response::UpstreamResponse;

/// The app is local: a connection that takes longer than this is not coming.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Closed pooled connections passed over before the app counts as unreachable.
const MAX_STALE: u32 = 3;
/// How long a body behind `Expect: 100-continue` waits for `100 Continue` at most.
const CONTINUE_WAIT: Duration = Duration::from_secs(1);

/// Why the app gave no response head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failed {
    /// No connection to it.
    Unreachable,
    /// The deadline passed first.
    Timeout,
    /// It broke the connection after the request went out.
    Reset,
    /// This process was out of file descriptors.
    NoDescriptors,
}

/// How the deadline travels to the app.
pub struct DeadlineFields<'a> {
    pub deadline: Deadline,
    /// The configured deadline header, written with the time left.
    pub header: &'a HeaderName,
    /// A gRPC call: `grpc-timeout` carries the time left of the caller's own deadline.
    pub grpc: bool,
}

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
            None,
            None,
        ])
    }
}

/// Sends the request to `app` and waits for its response head until the deadline.
pub async fn send<'a>(
    app: &Endpoint<AppBody>,
    want: Want,
    head: &mut RequestHead<'a>,
    mut body: AppBody,
    fields: &DeadlineFields<'a>,
    exhausted: &IntCounter,
) -> Result<UpstreamResponse, Failed> {
    let by = fields.deadline.at();
    for _ in 0..=MAX_STALE {
        let conn = match app.pooled(want, Instant::now()) {
            Some(c) => c,
            None => {
                let connect_by = by.map_or(Instant::now() + CONNECT_TIMEOUT, |by| {
                    (Instant::now() + CONNECT_TIMEOUT).min(by)
                });
                // Boxed: a connect is a large future, and inline it would make every
                // request's future that large.
                let connecting = Box::pin(app.checkout(want, None, CONNECT_TIMEOUT));
                match timeout_at(connect_by, connecting).await {
                    Ok(Ok((c, _))) => c,
                    Ok(Err(e)) if e.out_of_descriptors() => {
                        exhausted.inc();
                        return Err(Failed::NoDescriptors);
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(app = %app.addr, error = %e, "connect to the app failed");
                        return Err(Failed::Unreachable);
                    }
                    Err(_) if fields.deadline.expired(Instant::now()) => {
                        return Err(Failed::Timeout);
                    }
                    Err(_) => return Err(Failed::Unreachable),
                }
            }
        };
        let now = Instant::now();
        head.fields = fields.at(now);
        head.continue_wait = fields
            .deadline
            .remaining(now)
            .map_or(CONTINUE_WAIT, |left| CONTINUE_WAIT.min(left / 4));
        match deadline::within(by, conn.send(head, body)).await {
            None => return Err(Failed::Timeout),
            Some(Ok(resp)) => return Ok(resp),
            Some(Err(SendError::NotSent(unsent, _))) => body = unsent,
            Some(Err(SendError::Failed(e))) => {
                tracing::debug!(app = %app.addr, error = %e, "the app broke the connection");
                return Err(Failed::Reset);
            }
        }
    }
    Err(Failed::Unreachable)
}
