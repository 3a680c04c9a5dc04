//! After `101 Switching Protocols`: the app's connection and the upstream's become one
//! byte tunnel, both ways, until either side closes (its close passed on as a
//! half-close, the other side given a moment to finish), and at the latest
//! `drain_timeout` after a drain began. What the app sent right after its request head, already read, goes
//! first.

use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::socket::{Io, lock};
use super::watchdog::ConnState;
use crate::http::read::hand_on_ahead;
use crate::upstream::upgraded::Upgraded;

/// The app's side of the tunnel: its socket, and what was read ahead of it.
struct AppSide<'a>(&'a Mutex<Io>);

impl AsyncRead for AppSide<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut io = lock(self.0);
        if hand_on_ahead(&mut io.rbuf, buf) {
            return Poll::Ready(Ok(()));
        }
        if io.eof {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut io.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for AppSide<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut lock(self.0).stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(self.0).stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(self.0).stream).poll_shutdown(cx)
    }
}

/// When one side has closed, how long the other may still send (its close was passed
/// on as a half-close) before the tunnel closes.
const LINGER: Duration = Duration::from_secs(1);

/// Carries bytes both ways until one side closes (and the other has had [`LINGER`] to
/// finish), or `drain_timeout` after `closing` was set.
pub(super) async fn run(
    io: &Mutex<Io>,
    upstream: Upgraded,
    closing: &ConnState,
    drain_timeout: Duration,
) {
    let (mut app_read, mut app_write) = tokio::io::split(AppSide(io));
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let mut to_upstream = std::pin::pin!(async {
        let r = tokio::io::copy(&mut app_read, &mut up_write).await;
        let _ = up_write.shutdown().await;
        r
    });
    let mut to_app = std::pin::pin!(async {
        let r = tokio::io::copy(&mut up_read, &mut app_write).await;
        let _ = app_write.shutdown().await;
        r
    });
    let both = async {
        tokio::select! {
            _ = &mut to_upstream => { let _ = tokio::time::timeout(LINGER, &mut to_app).await; }
            _ = &mut to_app => { let _ = tokio::time::timeout(LINGER, &mut to_upstream).await; }
        }
    };
    // Polled again when the connection is asked to finish.
    let mut drain: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let draining = std::future::poll_fn(|cx| {
        if drain.is_none() && closing.closing() {
            drain = Some(Box::pin(tokio::time::sleep(drain_timeout)));
        }
        match drain.as_mut() {
            Some(d) => d.as_mut().poll(cx),
            None => Poll::Pending,
        }
    });
    tokio::select! {
        _ = both => {}
        _ = draining => tracing::debug!("tunnel closed at the drain timeout"),
    }
}
