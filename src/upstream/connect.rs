//! Opening a connection to one endpoint, its name resolved by [`super::dns`]: TCP
//! connect with `TCP_NODELAY`, TLS when configured, then for HTTP/2 the handshake. An HTTP/2 connection's I/O task is
//! spawned and held by an abort handle, so dropping a connection really closes it; an
//! HTTP/1.1 connection has no task (see [`super::h1`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::AbortHandle;

use super::OutgoingBody;
use super::dns::ResolveError;
use crate::config::TlsConfig;

/// hyper's HTTP/2 client handle, sending bodies of type `B`.
pub type H2Sender<B> = http2::SendRequest<B>;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("connect to {addr} failed: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("connect to {0} timed out")]
    Timeout(String),
    #[error("TLS handshake with {addr} failed: {source}")]
    Tls { addr: SocketAddr, source: io::Error },
    #[error("HTTP handshake with {addr} failed: {source}")]
    Handshake {
        addr: SocketAddr,
        source: hyper::Error,
    },
}

impl ConnectError {
    /// This process (or the system) is out of file descriptors: the connection failed
    /// here, not at the endpoint, which must not be blamed for it.
    pub fn out_of_descriptors(&self) -> bool {
        match self {
            ConnectError::Resolve(e) => crate::descriptors::is_exhaustion(&e.source),
            ConnectError::Connect { source, .. } => crate::descriptors::is_exhaustion(source),
            _ => false,
        }
    }
}

/// Counts a connection as open for as long as it lives.
pub struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    pub fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Relaxed);
        OpenGuard(open.clone())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// A transport after TCP (and TLS) is up: which protocol it will carry.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Transport {
    /// Whether ALPN settled on HTTP/2.
    pub fn alpn_h2(&self) -> bool {
        match self {
            Transport::Plain(_) => false,
            Transport::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
        }
    }
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// TCP (and TLS) to `addr`, within `timeout`.
pub async fn open(
    addr: SocketAddr,
    tls: Option<&TlsConfig>,
    timeout: Duration,
) -> Result<Transport, ConnectError> {
    let work =
        async {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|source| ConnectError::Connect { addr, source })?;
            let _ = tcp.set_nodelay(true);
            match tls {
                None => Ok(Transport::Plain(tcp)),
                Some(t) => {
                    let name = rustls_pki_types::ServerName::try_from(t.server_name.clone())
                        .map_err(|e| ConnectError::Tls {
                            addr,
                            source: io::Error::new(io::ErrorKind::InvalidInput, e),
                        })?;
                    let stream = tokio_rustls::TlsConnector::from(t.client.clone())
                        .connect(name, tcp)
                        .await
                        .map_err(|source| ConnectError::Tls { addr, source })?;
                    Ok(Transport::Tls(Box::new(stream)))
                }
            }
        };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout(addr.to_string())),
    }
}

fn spawn_counted<F>(open: &Arc<AtomicUsize>, conn: F) -> AbortHandle
where
    F: std::future::Future + Send + 'static,
{
    let guard = OpenGuard::new(open);
    tokio::spawn(async move {
        let _guard = guard;
        let _ = conn.await;
    })
    .abort_handle()
}

pub async fn handshake_h2<B>(
    transport: Transport,
    addr: SocketAddr,
    open: &Arc<AtomicUsize>,
) -> Result<(H2Sender<B>, AbortHandle), ConnectError>
where
    B: OutgoingBody,
{
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .adaptive_window(true)
        .keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .max_concurrent_reset_streams(1024);
    macro_rules! go {
        ($io:expr) => {{
            let (sender, conn) = builder
                .handshake(TokioIo::new($io))
                .await
                .map_err(|source| ConnectError::Handshake { addr, source })?;
            Ok((sender, spawn_counted(open, conn)))
        }};
    }
    match transport {
        Transport::Plain(s) => go!(s),
        Transport::Tls(s) => go!(*s),
    }
}
