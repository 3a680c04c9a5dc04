//! A `CONNECT` to an authority an upstream lists: not refused and not tunnelled blind.
//! Node's undici (`EnvHttpProxyAgent`) and gRPC's C core send `CONNECT` even for
//! plain `http://` when `http_proxy` is set; a refusal there fails every call, and a
//! blind tunnel would carry the upstream's traffic past its retries, budget and
//! metrics.
//!
//! So tollgate answers `200` and serves the connection itself, as it serves the app's
//! own: HTTP/1.1, or HTTP/2 when the first bytes are the HTTP/2 preface, with every
//! request in it routed to that upstream (as on a dedicated `listen` port, whatever its
//! `Host`). When the first bytes are not HTTP (a TLS ClientHello to `:443`: the app
//! speaks TLS to the upstream itself), the bytes pass as they are, to the authority
//! the `CONNECT` named, as a tunnel to an unknown authority would.
//!
//! Only HTTP/1.1 `CONNECT`s are served so; an HTTP/2 `CONNECT` stream to such an
//! authority keeps its `405`.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, Uri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::Shared;
use super::unrouted;
use crate::server::service::AppResponse;
use crate::server::{AppBody, Inside, RequestGuard, ResponseBody, Service, serve_after};

/// Whether the first byte of a tunnel starts HTTP: a request line (a method, letters)
/// or the HTTP/2 preface (`PRI`). A TLS record starts with a content type byte (`0x16`
/// for a handshake), never a letter.
fn starts_http(first: u8) -> bool {
    first.is_ascii_alphabetic()
}

/// The `200` to a `CONNECT` for an upstream's authority from `peer`: the connection is
/// served from here on ([`Inside`]) by `service`, which routes all to that upstream.
pub(super) fn serve_connect<S: Service>(
    shared: Arc<Shared>,
    service: S,
    req: &Request<AppBody>,
    peer: std::net::IpAddr,
    guard: RequestGuard,
) -> AppResponse {
    let named = req.uri().clone();
    let host = req.headers().get(http::header::HOST).cloned();
    let inside: Inside = Box::new(move |stream, ahead| {
        Box::pin(async move {
            let (stream, ahead) = match first_bytes(stream, ahead, &shared).await {
                Some(read) => read,
                None => return,
            };
            if ahead.first().copied().is_some_and(starts_http) {
                let listener = shared.snapshot.load().config.listener;
                let shutdown = shared.listeners.draining();
                let peer = SocketAddr::new(peer, 0);
                serve_after(stream, ahead, peer, service, listener, shutdown).await;
            } else {
                pass_bytes(&shared, stream, ahead, named, host).await;
            }
        })
    });
    Box::new(Response::new(ResponseBody::inside(inside, guard)))
}

/// The first bytes the app sends in the tunnel (`ahead`, when it sent them with its
/// `CONNECT`), waited for at most the listener's `idle_timeout`.
async fn first_bytes(
    mut stream: TcpStream,
    ahead: Bytes,
    shared: &Shared,
) -> Option<(TcpStream, Bytes)> {
    if !ahead.is_empty() {
        return Some((stream, ahead));
    }
    let idle = shared.snapshot.load().config.listener.idle_timeout;
    let mut buf = vec![0u8; 4096];
    let n = match tokio::time::timeout(idle, stream.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => n,
        _ => return None,
    };
    buf.truncate(n);
    Some((stream, Bytes::from(buf)))
}

/// Carries the tunnel's bytes, as they are, to the authority the `CONNECT` named.
async fn pass_bytes(
    shared: &Shared,
    mut stream: TcpStream,
    ahead: Bytes,
    named: Uri,
    host: Option<http::HeaderValue>,
) {
    let mut req = Request::new(());
    *req.method_mut() = Method::CONNECT;
    *req.uri_mut() = named;
    if let Some(h) = host {
        req.headers_mut().insert(http::header::HOST, h);
    }
    let Some(mut dst) = unrouted::connect_named(shared, &req).await else {
        tracing::debug!(target = %req.uri(), "cannot connect a CONNECT tunnel");
        return;
    };
    if dst.write_all(&ahead).await.is_err() {
        return;
    }
    // As any tunnel: until either side ends, or the drain timeout after a drain began.
    let mut shutdown = shared.listeners.draining();
    let drain = shared.snapshot.load().config.listener.drain_timeout;
    unrouted::relay(&mut stream, &mut dst, &mut shutdown, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_starts_with_a_letter_and_tls_does_not() {
        assert!(starts_http(b'G'));
        assert!(starts_http(b'P'));
        assert!(!starts_http(0x16));
        assert!(!starts_http(0));
    }
}
