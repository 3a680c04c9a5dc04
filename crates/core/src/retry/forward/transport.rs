//! The real [`Transport`] under the retry loop: the upstream's own endpoints (pooled
//! connections, HTTP/1.1 on tollgate's own codec and HTTP/2 on hyper's, TLS), shared
//! with the inbound side through [`crate::upstream::exchange`], which reads each way an
//! exchange fails as its [`Fault`]; here, what the outbound side does besides (a
//! descriptor shortage counted, a TLS failure of one endpoint warned about and named
//! for the app).

use std::sync::Arc;

use super::attempt::NoHead;
use crate::descriptors::Throttled;
use crate::fault::Fault;
use crate::http::response::is_head_too_large;
use crate::retry::forward::attempt::{Attempt, Transport};
use crate::retry::forward::replay::{ReplayBody, RetriedBody};
use crate::retry::upstream::Upstream;
use crate::upstream::exchange::{self, Race, Reach, Wire};
use crate::upstream::pool::{Endpoint, clock_ms};
use crate::upstream::response::UpstreamResponse;

/// Connects that failed for want of a descriptor, logged at most once per period.
static OUT_OF_DESCRIPTORS: Throttled = Throttled::new();

/// The real transport: the upstream's own endpoints.
impl<A: RetriedBody> Transport<A> for Upstream<A> {
    async fn exchange(
        &self,
        a: &Attempt<'_, A>,
        body: &mut Option<ReplayBody<A>>,
        carried: &mut Option<Arc<Endpoint<ReplayBody<A>>>>,
    ) -> Result<UpstreamResponse, NoHead> {
        let cfg = &self.config;
        let endpoint = &*a.peer;
        // A slow connect races one to another endpoint, unless the request is held to
        // this one (its key is known only there).
        let other = || match a.held {
            true => None,
            false => self.endpoints.pick(Some(endpoint.id)),
        };
        let race = Race {
            endpoint: &a.peer,
            tls: self.tls.as_ref(),
            other: &other,
        };
        let reach = Reach {
            want: a.want,
            tls: self.tls.as_deref(),
            connect_timeout: cfg.connect_timeout,
            started: a.started,
            by: a.by,
            own_connection: a.own_connection,
            race: Some(&race),
        };
        let head = |now| a.head_at(now);
        let failed = match exchange::send(endpoint, reach, head, body, carried).await {
            Ok(resp) => return Ok(resp),
            Err(f) => f,
        };
        let endpoint = carried.as_deref().unwrap_or(endpoint);
        let wire = match &cfg.tls {
            Some(t) => Wire::Tls {
                client_cert: t.client_cert.is_some(),
            },
            None => Wire::Plain,
        };
        let fault = match &failed {
            // An answer too large to pass on: the same request would get it again.
            exchange::Failed::Broken { error, .. } if is_head_too_large(&**error) => {
                Fault::HeadTooLarge
            }
            _ => failed.fault(wire),
        };
        match fault {
            Fault::NoDescriptors => {
                self.metrics().exhausted.inc();
                if let Some(n) = OUT_OF_DESCRIPTORS.due() {
                    tracing::warn!(upstream = %cfg.name, count = n, error = %failed, "out of file descriptors: requests answered 503 overloaded (raise the open-file limit)");
                }
            }
            Fault::Tls => {
                let reason = failed.tls_refusal(wire).unwrap_or_default();
                let detail = self.tls_failed(endpoint, &reason);
                return Err(NoHead {
                    fault,
                    detail: Some(detail),
                });
            }
            Fault::Timeout => {}
            _ => {
                tracing::debug!(upstream = %cfg.name, endpoint = %endpoint.addr, error = %failed, "attempt failed");
            }
        }
        Err(fault.into())
    }
}

impl<A> Upstream<A> {
    /// A TLS failure on `endpoint`: warned about (at most once every few seconds per
    /// endpoint), and what the app is told of it.
    fn tls_failed(&self, endpoint: &Endpoint<ReplayBody<A>>, reason: &str) -> String {
        let text = format!("TLS handshake with {} failed: {reason}", endpoint.addr);
        if let Some(suppressed) = endpoint.tls_warn.allow(clock_ms()) {
            tracing::warn!(
                upstream = %self.config.name,
                endpoint = %endpoint.addr,
                suppressed,
                "{text}"
            );
        }
        text
    }
}
