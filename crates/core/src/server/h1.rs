//! HTTP/1.1 from the app, read and answered on the connection's own task: the server's
//! side of tollgate's HTTP/1.1 codec. It is handed the [`Service`] that answers each
//! request; what a request is and what tollgate adds to its answer are the service's.
//!
//! One read buffer and one write buffer per connection. A request head is read in
//! place ([`crate::http::request`]) and its header values are slices of the buffer;
//! the next head is read only once the response has gone out. A connection waiting
//! for its next request gives its read buffer back, and the read that ends the wait
//! allocates only what it brings ([`crate::http::read`]): an idle keep-alive
//! connection holds no read buffer, and one being answered holds its head's bytes. The response head, and as much of its body as is already there, leave in
//! one write: small body chunks copied after the head, large ones written from their
//! own buffers beside it ([`WriteBuf`]). A refused head gets its status and the
//! connection is closed.
//!
//! While a request is answered the socket is still watched: the app going away (a
//! reset, or a close before its request was whole) cancels the request (and every
//! attempt in flight), as nobody waits for the answer; a close after a whole request is
//! a half-close, and the answer still goes out. A service whose work must outlive its
//! caller ([`Service::OUTLIVES_CALLER`]) is polled to its answer all the same.
//!
//! A `101 Switching Protocols` that carries the upstream's connection, or a `2xx` to a
//! `CONNECT` that carries the connection to its authority, ends the HTTP part: the
//! head goes out and the connection becomes a byte tunnel ([`tunnel`]).

use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body::Body;
use tokio::net::TcpStream;

use super::body::{AppBody, ResponseBody};
use super::service::{AppRequest, AppResponse, Service};
use super::socket::{AppStream, CONTINUE, Http1Body, Io, close, discard_body, lock};
use super::tunnel;
use super::watchdog::ConnState;
use crate::http::encode::{
    BodyEncoder, BodyFraming, status_digits, write_content_length, write_date,
};
use crate::http::fields::{content_length, has_token, write_field};
use crate::http::framing::Framing;
use crate::http::read::release;
use crate::http::request::parse_request_head;
use crate::http::write::WriteBuf;
use crate::http::{KEEP_WRITE, WRITE_BATCH, set_new_headers, set_new_uri};

/// What one client connection needs to answer its requests.
pub struct Settings<S> {
    pub service: S,
    pub state: Arc<ConnState>,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// How long a tunnel (after `101`) may outlive the start of a drain.
    pub drain_timeout: std::time::Duration,
}

/// Serves `stream`, whose first bytes (`prefix`) were already read; ends when the
/// connection closes. [`ConnState::close_gracefully`] on the settings' state closes it
/// after the response in flight, or at once when idle.
pub fn connection<S: Service>(
    stream: TcpStream,
    prefix: &[u8],
    settings: Settings<S>,
) -> impl Future<Output = ()> + Send + use<S> {
    serve(AppStream::Tcp(stream), prefix, settings)
}

/// [`connection`], on a socket or a pipe.
fn serve<S: Service>(
    stream: AppStream,
    prefix: &[u8],
    settings: Settings<S>,
) -> impl Future<Output = ()> + Send + use<S> {
    // Only what was read: the rest of the head is read into it as it comes.
    let rbuf = BytesMut::from(prefix);
    let io = Arc::new(Mutex::new(Io {
        stream,
        rbuf,
        body: Framing::Length(0),
        body_failed: false,
        continue_left: 0,
        eof: false,
        reset: false,
    }));
    run(io, settings)
}

/// A request as read, and whether its connection may carry another.
struct Incoming {
    req: AppRequest,
    keep_alive: bool,
}

/// What waiting for the next request head found.
enum Next {
    Request(Incoming),
    /// The app closed the connection, or it is being drained and nothing is pending.
    Closed,
    /// A head that will not be served.
    Refused(StatusCode, &'static str),
}

/// What the response must match in the request it answers.
#[derive(Clone, Copy)]
struct Asked {
    version: Version,
    head_request: bool,
    keep_alive: bool,
    /// A `CONNECT`: a `2xx` answer opens a tunnel.
    connect: bool,
}

async fn run<S: Service>(io: Arc<Mutex<Io>>, settings: Settings<S>) {
    let mut wbuf = WriteBuf::default();
    loop {
        let (req, keep_alive) = match poll_fn(|cx| poll_head(&io, &settings, cx)).await {
            // The Host was checked as the head was read.
            Next::Request(Incoming { req, keep_alive }) => (req, keep_alive),
            Next::Closed => return,
            Next::Refused(status, why) => {
                // Boxed: rare, and inline it would add its size to every connection's.
                Box::pin(refuse(&io, &mut wbuf, status, why)).await;
                return;
            }
        };
        let asked = Asked {
            version: req.version(),
            head_request: req.method() == Method::HEAD,
            keep_alive,
            connect: req.method() == Method::CONNECT,
        };
        // The request's future (kilobytes) lives in this block only, and the response
        // is written by a future of its own, which takes its room in this loop's
        // future once it is gone: every connection holds this future all its life,
        // idle or not, so it is the size of the larger of the two, not of both.
        let Some(resp) = ({
            let mut answer = pin!(settings.service.call(req, &settings.state));
            let mut gone = false;
            poll_fn(|cx| {
                if let Poll::Ready(resp) = answer.as_mut().poll(cx) {
                    return Poll::Ready((!gone).then_some(resp));
                }
                if gone {
                    return Poll::Pending;
                }
                match lock(&io).poll_gone(cx) {
                    // The work runs on to its answer, which nobody reads.
                    Poll::Ready(()) if S::OUTLIVES_CALLER => {
                        gone = true;
                        Poll::Pending
                    }
                    // Nobody waits for the answer: dropping the request cancels it.
                    Poll::Ready(()) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await
        }) else {
            return;
        };
        match respond(&io, &settings, &mut wbuf, resp, asked).await {
            After::Next => {}
            After::Close => return,
            After::Inside(inside, guard) => {
                // Boxed: rare, and inline it would add its size to every connection's.
                Box::pin(serve_inside(io, inside, guard)).await;
                return;
            }
        }
        wbuf.clear_and_bound(KEEP_WRITE);
    }
}

/// What follows a response on its connection.
enum After {
    /// The next request.
    Next,
    Close,
    /// A `CONNECT` answered `2xx` whose connection is served from here on.
    Inside(super::body::Inside, Option<super::body::RequestGuard>),
}

/// Hands the socket, and what the app sent after its `CONNECT`, to what serves the
/// connection from here on (with its own watchdog and drain). The `CONNECT` is in
/// flight meanwhile, as a tunnel's is: this connection's own watchdog never takes it
/// for idle and cuts what is served inside.
async fn serve_inside(
    io: Arc<Mutex<Io>>,
    inside: super::body::Inside,
    guard: Option<super::body::RequestGuard>,
) {
    // The request (and its body's share of the socket) is gone with its answer.
    let Ok(io) = Arc::try_unwrap(io) else {
        return;
    };
    let io = io.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(stream) = io.stream.into_tcp() {
        inside(stream, io.rbuf.freeze()).await;
    }
    drop(guard);
}

/// Writes the response (after a `101 Switching Protocols`, then runs the tunnel);
/// what follows it on the connection.
async fn respond<S>(
    io: &Mutex<Io>,
    settings: &Settings<S>,
    wbuf: &mut WriteBuf,
    mut resp: AppResponse,
    asked: Asked,
) -> After {
    if asked.connect
        && resp.status().is_success()
        && let Some((inside, guard)) = resp.body_mut().take_inside()
    {
        let written = write_response(io, wbuf, resp, asked.version, true, true).await;
        return match written {
            Ok(_) => After::Inside(inside, guard),
            Err(_) => After::Close,
        };
    }
    // A protocol switch, or a `CONNECT` answered: the head goes out (with no framing,
    // RFC 9110 section 9.3.6), then the connection is a tunnel.
    let upgrade = match resp.status() {
        StatusCode::SWITCHING_PROTOCOLS => resp.body_mut().take_upgrade(),
        s if asked.connect && s.is_success() => resp.body_mut().take_upgrade(),
        _ => None,
    };
    if let Some((upstream, guard)) = upgrade {
        if write_response(io, wbuf, resp, asked.version, true, true)
            .await
            .is_ok()
        {
            tunnel::run(io, upstream, &settings.state, settings.drain_timeout).await;
        }
        drop(guard);
        return After::Close;
    }
    let keep_alive = asked.keep_alive && !settings.state.closing();
    let written = write_response(
        io,
        wbuf,
        resp,
        asked.version,
        asked.head_request,
        keep_alive,
    );
    let Ok(kept) = written.await else {
        return After::Close;
    };
    let unread = !lock(io).body_done() && (!kept || !discard_body(io).await);
    if !kept || unread {
        close(io, unread).await;
        return After::Close;
    }
    After::Next
}

/// Reads until a whole request head is in the buffer, and takes it.
fn poll_head<S>(
    shared: &Arc<Mutex<Io>>,
    settings: &Settings<S>,
    cx: &mut Context<'_>,
) -> Poll<Next> {
    let mut io = lock(shared);
    loop {
        if !io.rbuf.is_empty() {
            match parse_request_head(
                &mut io.rbuf,
                settings.max_header_bytes,
                settings.max_headers,
            ) {
                Ok(Some(head)) => {
                    io.body = head.framing;
                    io.body_failed = false;
                    io.continue_left = if head.expect_continue {
                        CONTINUE.len()
                    } else {
                        0
                    };
                    let empty = io.body == Framing::Length(0) && io.continue_left == 0;
                    if !empty && io.continue_left == 0 && io.rbuf.is_empty() {
                        // The head came without its body: acknowledged at once, so an
                        // app whose Nagle holds the body back until the head is
                        // acknowledged waits for no delayed ACK (40 ms). A head with no
                        // body, or with its body, makes no call.
                        io.quick_ack();
                    }
                    let mut req = Box::new(Request::new(AppBody::Http1(Http1Body {
                        io: shared.clone(),
                        empty,
                    })));
                    *req.method_mut() = head.method;
                    set_new_uri(req.uri_mut(), head.uri);
                    *req.version_mut() = head.version;
                    set_new_headers(req.headers_mut(), head.headers);
                    return Poll::Ready(Next::Request(Incoming {
                        req,
                        keep_alive: head.keep_alive,
                    }));
                }
                Ok(None) if io.rbuf.len() >= settings.max_header_bytes => {
                    return Poll::Ready(Next::Refused(
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        "the request head is larger than this proxy accepts\n",
                    ));
                }
                // Part of a head: its timer starts (a head that arrives whole, the
                // usual case, never needs the clock).
                Ok(None) => settings.state.bytes_read(),
                Err((status, why)) => return Poll::Ready(Next::Refused(status, why)),
            }
        } else if settings.state.closing() {
            return Poll::Ready(Next::Closed);
        }
        if io.eof {
            // Closed, between requests or within a head: nothing to answer.
            return Poll::Ready(Next::Closed);
        }
        let Poll::Ready(filled) = io.poll_fill_small(cx) else {
            // Nothing more yet: the connection waits, and holds no read buffer while it
            // does (the next read allocates what it brings).
            release(&mut io.rbuf);
            return Poll::Pending;
        };
        if let Err(_) | Ok(0) = filled {
            // An error or the end: either way the next turn ends the connection.
            io.eof = true;
        }
    }
}

/// After the app closed its side, how long a response body may stall with nothing to
/// write before the connection is given up: a half-closed app still reads what comes,
/// but one that closed for good shows only when a write fails, and an upstream that
/// stops mid-body would otherwise hold its connection (and the upstream's) for ever.
const STALL_AFTER_CLOSE: std::time::Duration = std::time::Duration::from_secs(5);

/// Writes the response; `Ok(true)` when the connection may carry another request.
async fn write_response(
    io: &Mutex<Io>,
    wbuf: &mut WriteBuf,
    mut resp: AppResponse,
    version: Version,
    head_request: bool,
    keep_alive: bool,
) -> io::Result<bool> {
    // The answer is final: no `100 Continue` may follow it, whoever reads the body
    // later (an HTTP/2 upstream's connection reads it on a task of its own). Given
    // before the `100 Continue` went out, with the body unread, it ends the connection:
    // the app may never send that body.
    let before_continue = {
        let mut io = lock(io);
        std::mem::take(&mut io.continue_left) > 0 && !io.body_done()
    };
    wbuf.clear();
    let (framing, keep_alive) =
        write_head(wbuf.bytes_mut(), &resp, version, head_request, keep_alive);
    let mut encoder = BodyEncoder::new(framing);
    // Read where it is, in the answer's box.
    let body = resp.body_mut();
    // Armed once the app has half-closed: how long the body may stall.
    let mut stall: Option<Pin<Box<tokio::time::Sleep>>> = None;
    poll_fn(|cx| {
        loop {
            let mut waiting = false;
            while !encoder.ended() && wbuf.len() < WRITE_BATCH {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => encoder.frame(wbuf, frame),
                    Poll::Ready(Some(Err(e))) => {
                        tracing::debug!(error = %e, "response body broke; closing");
                        encoder.abort();
                    }
                    Poll::Ready(None) => encoder.finish(wbuf, None),
                    Poll::Pending => {
                        waiting = true;
                        break;
                    }
                }
                if !encoder.ended() && body.is_end_stream() {
                    encoder.finish(wbuf, None);
                }
            }
            let mut io = lock(io);
            let wrote = !wbuf.is_empty();
            ready!(io.poll_write_all(cx, wbuf))?;
            if encoder.ended() {
                return Poll::Ready(Ok::<(), io::Error>(()));
            }
            if wrote && let Some(s) = stall.as_mut() {
                s.as_mut()
                    .reset(tokio::time::Instant::now() + STALL_AFTER_CLOSE);
            }
            if waiting {
                // Nobody left to send the rest to.
                if io.poll_gone(cx).is_ready() {
                    return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
                }
                // Half-closed, or closed for good: only a write tells which, and a
                // body with nothing to write tells nothing.
                if io.eof {
                    let s = stall
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(STALL_AFTER_CLOSE)));
                    if s.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
                    }
                }
                return Poll::Pending;
            }
        }
    })
    .await?;
    Ok(keep_alive && !before_continue && !encoder.broken() && !encoder.to_close())
}

/// Writes the response head: the response's own fields (hop-by-hop ones dropped), the
/// fields the service added, the upstream's fields kept in their head, then framing,
/// `Connection` and `Date` as this connection needs them. Returns how the body goes
/// out and whether the connection may be kept.
fn write_head(
    wbuf: &mut Vec<u8>,
    resp: &Response<ResponseBody>,
    version: Version,
    head_request: bool,
    mut keep_alive: bool,
) -> (BodyFraming, bool) {
    let (status, body) = (resp.status(), resp.body());
    let code = status.as_u16();
    let bodiless = head_request || status.is_informational() || code == 204 || code == 304;
    let lengthless = status.is_informational() || code == 204;
    if code == 200 && version != Version::HTTP_10 {
        // Nearly every answer: the line whole, with no status formatted or looked up.
        wbuf.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        wbuf.extend_from_slice(if version == Version::HTTP_10 {
            b"HTTP/1.0 "
        } else {
            b"HTTP/1.1 "
        });
        wbuf.extend_from_slice(&status_digits(code));
        wbuf.push(b' ');
        wbuf.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        wbuf.extend_from_slice(b"\r\n");
    }
    let added = body.added_fields();
    let mut length = None;
    let mut dated = false;
    for (name, value) in resp.headers() {
        if name == CONNECTION {
            if has_token(value.as_bytes(), b"close") {
                keep_alive = false;
            }
            continue;
        }
        if name == TRANSFER_ENCODING || added.names(name) {
            continue;
        }
        if name == CONTENT_LENGTH {
            if lengthless {
                continue;
            }
            length = content_length(value.as_bytes().trim_ascii());
            if length.is_none() {
                continue;
            }
        }
        dated |= name == DATE;
        write_field(wbuf, name, value);
    }
    added.write_to(wbuf);
    if let Some(raw) = body.raw_fields() {
        raw.write_to(wbuf, !lengthless, |name| added.names_raw(name));
        dated |= raw.has_date();
        if raw.has_length() && !lengthless {
            // The upstream's own length, which its body is framed by.
            length = body.size_hint().exact().or(Some(0));
        }
    }
    let framing = if bodiless {
        BodyFraming::None
    } else if let Some(n) = length {
        BodyFraming::Length(n)
    } else if let Some(n) = body.size_hint().exact() {
        write_content_length(wbuf, n);
        BodyFraming::Length(n)
    } else if version == Version::HTTP_11 {
        wbuf.extend_from_slice(b"transfer-encoding: chunked\r\n");
        BodyFraming::Chunked
    } else {
        keep_alive = false;
        BodyFraming::Close
    };
    if code == 101 {
        wbuf.extend_from_slice(b"connection: upgrade\r\n");
    } else if !keep_alive {
        wbuf.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 {
        wbuf.extend_from_slice(b"connection: keep-alive\r\n");
    }
    if !dated {
        wbuf.extend_from_slice(b"date: ");
        write_date(wbuf);
        wbuf.extend_from_slice(b"\r\n");
    }
    wbuf.extend_from_slice(b"\r\n");
    (framing, keep_alive)
}

/// Answers a head that will not be served, and closes.
async fn refuse(io: &Mutex<Io>, wbuf: &mut WriteBuf, status: StatusCode, why: &'static str) {
    tracing::debug!(
        status = status.as_u16(),
        reason = why.trim_end(),
        "request head refused"
    );
    let mut resp = Box::new(Response::new(ResponseBody::full(why, None)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if write_response(io, wbuf, resp, Version::HTTP_11, false, false)
        .await
        .is_ok()
    {
        close(io, true).await;
    }
}

#[cfg(test)]
#[path = "h1_tests.rs"]
mod tests;
