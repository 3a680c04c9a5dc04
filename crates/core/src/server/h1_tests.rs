//! The HTTP/1.1 connection driver on scripted I/O: a test writes the app's bytes into
//! an in-memory pipe and reads what the driver answers, as Pingora tests its HTTP/1
//! server session, with no socket. The service echoes what it got: method, path and
//! the length of the body it read (or `unread` when asked to answer without reading).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::{Instant, timeout};

use super::{Settings, serve};
use crate::server::service::{AppRequest, AppResponse};
use crate::server::socket::AppStream;
use crate::server::watchdog::ConnState;
use crate::server::{RequestGuard, ResponseBody, Service};

/// Every wait of these tests ends within this.
const BOUND: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Echo;

impl Service for Echo {
    fn call(
        &self,
        req: AppRequest,
        conn: &Arc<ConnState>,
    ) -> impl Future<Output = AppResponse> + Send + use<> {
        let guard = RequestGuard::new(conn.clone(), Instant::now());
        async move {
            let unread = req.headers().contains_key("x-no-read");
            let (parts, body) = req.into_parts();
            let got = if unread {
                "unread".to_string()
            } else {
                match body.collect().await {
                    Ok(c) => c.to_bytes().len().to_string(),
                    Err(_) => "broken".to_string(),
                }
            };
            let text = format!("{} {} {got}\n", parts.method, parts.uri.path());
            Box::new(Response::new(ResponseBody::full(text, Some(guard))))
        }
    }
}

/// A connection served on a pipe: the app's end of it.
fn connect(max_header_bytes: usize) -> DuplexStream {
    let (app, ours) = tokio::io::duplex(256 * 1024);
    let settings = Settings {
        service: Echo,
        state: Arc::new(ConnState::new(false, Instant::now(), [127, 0, 0, 1].into())),
        max_header_bytes,
        max_headers: 64,
        drain_timeout: Duration::from_secs(1),
    };
    tokio::spawn(serve(AppStream::Memory(ours), b"", settings));
    app
}

/// Everything the driver writes until it closes the connection.
async fn read_to_close(app: &mut DuplexStream) -> String {
    let mut out = Vec::new();
    timeout(BOUND, app.read_to_end(&mut out))
        .await
        .expect("the connection closes")
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// Sends `bytes`, half-closes, and reads what comes back until the driver closes.
async fn exchange(bytes: &[u8]) -> String {
    let mut app = connect(8192);
    app.write_all(bytes).await.unwrap();
    app.shutdown().await.unwrap();
    read_to_close(&mut app).await
}

/// Reads until `want` has come.
async fn read_until(app: &mut DuplexStream, want: &str) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    timeout(BOUND, async {
        while !String::from_utf8_lossy(&out).contains(want) {
            let n = app.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before {want:?}: {:?}",
                String::from_utf8_lossy(&out)
            );
            out.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("it comes");
    String::from_utf8(out).unwrap()
}

fn statuses(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.starts_with("HTTP/1."))
        .map(|l| l.split(' ').nth(1).unwrap_or(""))
        .collect()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let out = exchange(
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert_eq!(statuses(&out), ["200", "200", "200"], "{out}");
    let (a, b, c) = (
        out.find("GET /a 0").unwrap(),
        out.find("GET /b 0").unwrap(),
        out.find("GET /c 0").unwrap(),
    );
    assert!(a < b && b < c, "in order: {out}");
}

#[tokio::test]
async fn a_body_of_known_length_and_a_chunked_one_with_trailers_reach_the_service_whole() {
    let out = exchange(
        b"POST /length HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
          POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 1\r\n\r\n",
    )
    .await;
    assert!(out.contains("POST /length 5"), "{out}");
    assert!(out.contains("POST /chunked 11"), "{out}");
    assert_eq!(statuses(&out), ["200", "200"], "{out}");
}

#[tokio::test]
async fn a_malformed_head_is_answered_400_and_nothing_after_it_is_served() {
    let out =
        exchange(b"GET /bad HTTP/1.1\r\nHost x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
    assert_eq!(statuses(&out), ["400"], "{out}");
    assert!(!out.contains("/after"), "{out}");
}

#[tokio::test]
async fn a_head_larger_than_the_limit_is_answered_431() {
    let mut big = b"GET / HTTP/1.1\r\nHost: x\r\nx-big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 4096));
    big.extend_from_slice(b"\r\n\r\n");
    let mut app = connect(1024);
    app.write_all(&big).await.unwrap();
    let out = read_to_close(&mut app).await;
    assert_eq!(statuses(&out), ["431"], "{out}");
}

#[tokio::test]
async fn a_chunked_body_that_lies_about_its_sizes_breaks_off_and_is_not_served_further() {
    let out = exchange(
        b"POST /lie HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
          zz\r\nhello\r\n0\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert!(out.contains("POST /lie broken"), "{out}");
    assert!(!out.contains("/after"), "the connection ends: {out}");
}

#[tokio::test]
async fn expect_100_continue_is_answered_when_the_service_reads_the_body() {
    let mut app = connect(8192);
    app.write_all(
        b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let first = read_until(&mut app, "\r\n\r\n").await;
    assert!(
        first.starts_with("HTTP/1.1 100 Continue\r\n\r\n"),
        "{first}"
    );
    app.write_all(b"hello").await.unwrap();
    let answer = read_until(&mut app, "POST /e 5").await;
    assert_eq!(statuses(&answer), ["200"], "{answer}");
}

#[tokio::test]
async fn an_answer_before_100_continue_sends_none_and_ends_the_connection() {
    let mut app = connect(8192);
    app.write_all(
        b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\
          x-no-read: 1\r\n\r\n",
    )
    .await
    .unwrap();
    // The app never sends the body: the driver must not wait for it.
    let out = read_to_close(&mut app).await;
    assert!(!out.contains("100 Continue"), "{out}");
    assert!(out.contains("POST /e unread"), "{out}");
}

#[tokio::test]
async fn a_small_body_left_unread_is_read_after_the_answer_and_the_connection_kept() {
    let out = exchange(
        b"POST /skip HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nx-no-read: 1\r\n\r\nhello\
          GET /next HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert!(out.contains("POST /skip unread"), "{out}");
    assert!(
        out.contains("GET /next 0"),
        "the next request is served: {out}"
    );
    assert!(
        !out.to_ascii_lowercase().contains("connection: close"),
        "{out}"
    );
}

#[tokio::test]
async fn an_http10_request_without_keep_alive_closes_after_its_answer() {
    let mut app = connect(8192);
    app.write_all(b"GET /old HTTP/1.0\r\n\r\n").await.unwrap();
    // Not half-closed by the app: the driver closes.
    let out = read_to_close(&mut app).await;
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    assert!(out.contains("GET /old 0"), "{out}");
}
