//! A connection to an endpoint after it answered `101 Switching Protocols`: no longer
//! HTTP, a byte stream both ways (a WebSocket, say) that the app's side tunnels to the
//! app. The bytes the endpoint sent right after the `101` head, already read with it,
//! come first. A connection opened for an app's `CONNECT` is one from the start.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::connect::{EndpointStream, OpenGuard};
use crate::http::read::hand_on_ahead;

/// The endpoint's side of a tunnel.
pub struct Upgraded {
    io: EndpointStream,
    /// Read with the `101` head, not yet handed on.
    ahead: BytesMut,
    /// Still an open connection to the upstream, counted as one.
    _open: OpenGuard,
}

impl Upgraded {
    pub(super) fn new(io: EndpointStream, ahead: BytesMut, open: OpenGuard) -> Self {
        Upgraded {
            io,
            ahead,
            _open: open,
        }
    }

    /// A plain TCP connection to tunnel from the start (after a `CONNECT`), counted in
    /// `open`.
    pub fn plain(tcp: TcpStream, open: &Arc<AtomicUsize>) -> Self {
        Upgraded::new(
            EndpointStream::Plain(tcp),
            BytesMut::new(),
            OpenGuard::new(open),
        )
    }
}

impl AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if hand_on_ahead(&mut self.ahead, buf) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
