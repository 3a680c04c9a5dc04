//! The real [`Transport`] under the retry loop: the upstream's own endpoints (pooled
//! connections, HTTP/1.1 on tollgate's own codec and HTTP/2 on hyper's, TLS), shared
//! with the inbound side through [`crate::upstream::exchange`], and what each way an
//! exchange fails means for the loop (a failure it may retry, a TLS failure of one
//! endpoint, or nobody's fault at the endpoint).

use super::attempt::{Attempt, AttemptError, NotUpstream, Transport};
use super::policy::Failure;
use super::replay::{AppBody, ReplayBody};
use super::upstream::Upstream;
use crate::descriptors::Throttled;
use crate::upstream::exchange::{self, Failed, Reach};
use crate::upstream::pool::clock_ms;
use crate::upstream::response::UpstreamResponse;
use crate::upstream::tls_failure;

/// Connects that failed for want of a descriptor, logged at most once per period.
static OUT_OF_DESCRIPTORS: Throttled = Throttled::new();

/// The real transport: the upstream's own endpoints.
impl<A: AppBody> Transport<A> for Upstream<A> {
    async fn exchange(
        &self,
        a: &Attempt<'_, A>,
        body: &mut Option<ReplayBody<A>>,
        detail: &mut Option<String>,
    ) -> Result<UpstreamResponse, AttemptError> {
        let cfg = &self.config;
        let endpoint = self.endpoints.get(a.endpoint);
        let reach = Reach {
            want: a.want,
            tls: self.tls.as_deref(),
            connect_timeout: cfg.connect_timeout,
            started: a.started,
            by: a.by,
        };
        let failed = match exchange::send(endpoint, reach, |now| a.head_at(now), body).await {
            Ok(resp) => return Ok(resp),
            Err(f) => f,
        };
        let client_cert = cfg.tls.as_ref().is_some_and(|t| t.client_cert.is_some());
        Err(match failed {
            Failed::Connect(e) if e.out_of_descriptors() => {
                self.metrics.exhausted.inc();
                if let Some(n) = OUT_OF_DESCRIPTORS.due() {
                    tracing::warn!(upstream = %cfg.name, count = n, error = %e, "out of file descriptors: requests answered 503 overloaded (raise the open-file limit)");
                }
                AttemptError::NotUpstream(NotUpstream::NoDescriptors)
            }
            Failed::Connect(e) => match e.tls_reason(client_cert) {
                Some(reason) => self.tls_failed(a.endpoint, reason, detail).into(),
                None => {
                    tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %e, "connect failed");
                    Failure::ConnectFailure.into()
                }
            },
            Failed::ConnectTimeout => {
                tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, "connect timed out");
                Failure::ConnectFailure.into()
            }
            Failed::Timeout => Failure::Timeout.into(),
            Failed::Stale { closed } => {
                // The request never left. New TLS connections closed at once, with a
                // client certificate presented: most likely the server refusing it.
                let refused = cfg
                    .tls
                    .as_ref()
                    .zip(closed.as_ref())
                    .and_then(|(_, e)| tls_failure::rejection(e, client_cert));
                match refused {
                    Some(reason) => self.tls_failed(a.endpoint, reason, detail).into(),
                    None => Failure::ConnectFailure.into(),
                }
            }
            Failed::Broken { error, fresh } => {
                // A server that refuses tollgate's client certificate may say so only
                // once the handshake seemed done: on a new connection's first
                // exchange, that is a TLS failure too.
                let refused = cfg
                    .tls
                    .as_ref()
                    .filter(|_| fresh)
                    .and_then(|_| tls_failure::rejection(&*error, client_cert));
                match refused {
                    Some(reason) => self.tls_failed(a.endpoint, reason, detail).into(),
                    None => {
                        tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %error, "attempt failed");
                        Failure::Reset.into()
                    }
                }
            }
        })
    }
}

impl<A> Upstream<A> {
    /// A TLS failure on endpoint `i`: warned about (at most once every few seconds per
    /// endpoint) and named for the app.
    fn tls_failed(&self, i: usize, reason: String, detail: &mut Option<String>) -> Failure {
        let endpoint = self.endpoints.get(i);
        let text = format!("TLS handshake with {} failed: {reason}", endpoint.addr);
        if let Some(suppressed) = endpoint.tls_warn.allow(clock_ms()) {
            tracing::warn!(
                upstream = %self.config.name,
                endpoint = %endpoint.addr,
                suppressed,
                "{text}"
            );
        }
        *detail = Some(text);
        Failure::Tls
    }
}
