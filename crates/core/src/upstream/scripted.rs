//! A scripted endpoint, for the tests of the layers above: an in-memory connection whose
//! other end answers with the bytes a test gives, so the response is read by tollgate's
//! own HTTP/1.1 codec exactly as from a socket, and no socket is opened.

use std::io;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::OutgoingBody;
use super::connect::EndpointStream;
use super::h1::{self, Connection, IdleQueues, Lease};
use super::request::RequestHead;
use super::response::UpstreamResponse;

/// Sends `head` and `body` to an endpoint that reads the request head and answers
/// `response` (a status line, fields and body, as they go on the wire), then waits for
/// the connection to close.
pub async fn answer<B: OutgoingBody>(
    head: &RequestHead<'_>,
    body: B,
    response: &'static [u8],
) -> io::Result<UpstreamResponse> {
    let (client, mut server) = tokio::io::duplex(64 * 1024);
    let open = Arc::new(AtomicUsize::new(0));
    let idle = Arc::new(IdleQueues::new(1, None));
    let lease = Lease::new(
        Connection::new(EndpointStream::Memory(client), &open),
        &idle,
        0,
    );
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match server.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        if server.write_all(response).await.is_err() {
            return;
        }
        // Until the client is done with the connection.
        while matches!(server.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    h1::send(lease, head, body).await
}
