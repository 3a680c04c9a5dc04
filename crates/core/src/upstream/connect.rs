//! Opening a connection to one endpoint, its name resolved by [`super::dns`]: TCP
//! connect with `TCP_NODELAY`, TLS when configured, then for HTTP/2 the handshake. An
//! HTTP/2 connection's I/O task is spawned and held by an abort handle, so dropping a
//! connection really closes it; an HTTP/1.1 connection has no task (see [`super::h1`]).
//!
//! Cleartext HTTP/2 to an endpoint whose protocol is not known yet (`protocol = "auto"`
//! and an app that spoke HTTP/2) waits for the endpoint's first bytes before the
//! connection is used: an HTTP/1.1-only server answers the HTTP/2 preface with an
//! HTTP/1.1 status line (`505`, `400`), and that is recognised here, before any request
//! was sent on the connection, rather than as a protocol error of the first request.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::AbortHandle;

use super::OutgoingBody;
use super::dns::ResolveError;
use super::tls::TlsClient;
use crate::http::read::hand_on_ahead;
use crate::http::spawn::BoxedSpawn;

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
    /// The endpoint answered the HTTP/2 preface in HTTP/1.1.
    #[error("{addr} answered the HTTP/2 preface in HTTP/1.1")]
    SpeaksHttp1 { addr: SocketAddr },
}

impl ConnectError {
    /// Why the TLS handshake failed, in words for the operator, when that is what failed.
    /// `client_cert`: a client certificate was presented over TLS, so a server that
    /// refuses it after the handshake, while the HTTP/2 handshake is under way, is a TLS
    /// failure too (the same refusal shows at the first request when it comes later).
    pub fn tls_reason(&self, client_cert: bool) -> Option<String> {
        match self {
            ConnectError::Tls { source, .. } => Some(super::tls_failure::describe(source)),
            ConnectError::Handshake { source, .. } if client_cert => {
                super::tls_failure::rejection(source, true)
            }
            _ => None,
        }
    }
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

/// The byte stream to an endpoint once TCP (and TLS) is up: which protocol it will carry.
pub enum EndpointStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// An in-memory pipe to a scripted endpoint, for the tests of the layers above.
    #[cfg(test)]
    Memory(tokio::io::DuplexStream),
}

impl EndpointStream {
    /// Whether ALPN settled on HTTP/2.
    pub fn alpn_h2(&self) -> bool {
        match self {
            EndpointStream::Plain(_) => false,
            EndpointStream::Tls(s) => s.get_ref().1.alpn_protocol() == Some(b"h2"),
            #[cfg(test)]
            EndpointStream::Memory(_) => false,
        }
    }
}

impl AsyncRead for EndpointStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EndpointStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            EndpointStream::Tls(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(test)]
            EndpointStream::Memory(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for EndpointStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            EndpointStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            EndpointStream::Tls(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(test)]
            EndpointStream::Memory(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            EndpointStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            EndpointStream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            #[cfg(test)]
            EndpointStream::Memory(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            EndpointStream::Plain(s) => s.is_write_vectored(),
            EndpointStream::Tls(s) => s.is_write_vectored(),
            #[cfg(test)]
            EndpointStream::Memory(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EndpointStream::Plain(s) => Pin::new(s).poll_flush(cx),
            EndpointStream::Tls(s) => Pin::new(s).poll_flush(cx),
            #[cfg(test)]
            EndpointStream::Memory(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            EndpointStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            EndpointStream::Tls(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(test)]
            EndpointStream::Memory(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// TCP (and TLS) to `addr`, within `timeout`.
pub async fn open(
    addr: SocketAddr,
    tls: Option<&TlsClient>,
    timeout: Duration,
) -> Result<EndpointStream, ConnectError> {
    let work = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| ConnectError::Connect { addr, source })?;
        crate::loops::outgoing(&tcp);
        let _ = tcp.set_nodelay(true);
        match tls {
            None => Ok(EndpointStream::Plain(tcp)),
            Some(t) => {
                let stream = t
                    .connect(tcp)
                    .await
                    .map_err(|source| ConnectError::Tls { addr, source })?;
                Ok(EndpointStream::Tls(Box::new(stream)))
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

/// The first bytes an endpoint sent on a connection, noted as they are read.
#[derive(Default)]
struct FirstBytes {
    bytes: std::sync::OnceLock<Vec<u8>>,
    arrived: tokio::sync::Notify,
}

impl FirstBytes {
    fn note(&self, bytes: &[u8]) {
        if self.bytes.set(bytes.to_vec()).is_ok() {
            self.arrived.notify_one();
        }
    }

    /// Waits until the first bytes (or the end, or an error) arrived.
    async fn wait(&self) -> &[u8] {
        loop {
            if let Some(b) = self.bytes.get() {
                return b;
            }
            self.arrived.notified().await;
        }
    }
}

/// A socket whose first bytes read are noted in a [`FirstBytes`]. Nothing is written
/// after the HTTP/2 preface until they are in: an HTTP/1.1 server answers the preface
/// and closes, and a write racing that close would fail before its answer is read.
struct Sniffed<T> {
    inner: T,
    first: Arc<FirstBytes>,
    /// Bytes written so far, up to the preface's length.
    written: usize,
    /// Bytes read while writes waited for the first ones, not yet handed on.
    ahead: BytesMut,
}

/// The HTTP/2 client connection preface's length.
const PREFACE_LEN: usize = 24;

impl<T: AsyncRead + Unpin> Sniffed<T> {
    /// Reads the first bytes, to note them, while a write waits for them.
    fn poll_first(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut chunk = [0u8; 64];
        let mut buf = ReadBuf::new(&mut chunk);
        match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => {
                self.ahead.extend_from_slice(buf.filled());
                self.first.note(buf.filled());
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => {
                self.first.note(&[]);
                Poll::Ready(Err(e))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Sniffed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if hand_on_ahead(&mut self.ahead, buf) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.first.bytes.get().is_none() {
            match &polled {
                Poll::Ready(Ok(())) => self.first.note(&buf.filled()[before..]),
                Poll::Ready(Err(_)) => self.first.note(&[]),
                Poll::Pending => {}
            }
        }
        polled
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Sniffed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.first.bytes.get().is_none() {
            if this.written < PREFACE_LEN {
                let n = buf.len().min(PREFACE_LEN - this.written);
                let n = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..n]))?;
                this.written += n;
                return Poll::Ready(Ok(n));
            }
            std::task::ready!(this.poll_first(cx))?;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The largest response head taken from an HTTP/2 upstream, as HTTP/2 counts it (each
/// field's name and value and 32 bytes): twice [`MAX_HEAD`](crate::http::response::MAX_HEAD).
const H2_MAX_HEAD: u32 = 2 * crate::http::response::MAX_HEAD as u32;

/// The HTTP/2 handshake on `transport`. With `sniff` (cleartext, protocol not known
/// yet) the connection is handed out only once the endpoint's first bytes are in:
/// [`ConnectError::SpeaksHttp1`] when they are an HTTP/1.1 status line.
pub async fn handshake_h2<B>(
    transport: EndpointStream,
    addr: SocketAddr,
    open: &Arc<AtomicUsize>,
    sniff: bool,
) -> Result<(H2Sender<B>, AbortHandle), ConnectError>
where
    B: OutgoingBody,
{
    let mut builder = http2::Builder::new(BoxedSpawn);
    builder
        .timer(TokioTimer::new())
        .adaptive_window(true)
        .keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .max_concurrent_reset_streams(1024)
        // A response head is limited by its size as over HTTP/1.1 (64 KiB), here as
        // HTTP/2 counts it: 32 bytes more a field, so room is made for as many fields
        // as an HTTP/1.1 head of that size holds. hyper's own default is 16 KiB.
        .max_header_list_size(H2_MAX_HEAD);
    macro_rules! go {
        ($io:expr) => {{
            let (sender, conn) = builder
                .handshake(TokioIo::new($io))
                .await
                .map_err(|source| ConnectError::Handshake { addr, source })?;
            (sender, spawn_counted(open, conn))
        }};
    }
    match transport {
        EndpointStream::Plain(s) if sniff => {
            let first = Arc::new(FirstBytes::default());
            let (sender, task) = go!(Sniffed {
                inner: s,
                first: first.clone(),
                written: 0,
                ahead: BytesMut::new(),
            });
            if first.wait().await.starts_with(b"HTTP/1.") {
                task.abort();
                return Err(ConnectError::SpeaksHttp1 { addr });
            }
            Ok((sender, task))
        }
        EndpointStream::Plain(s) => Ok(go!(s)),
        EndpointStream::Tls(s) => Ok(go!(*s)),
        #[cfg(test)]
        EndpointStream::Memory(s) => Ok(go!(s)),
    }
}
