//! Writing HTTP/1.1: a body in the framing its head announced (a length, chunked, or
//! to the close), and the small pieces of a head written without formatting
//! machinery. Both sides use it: the server for responses, the client for requests.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;

use super::fields::write_field;
use super::write::WriteBuf;

/// How a body goes out after its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body may follow (a response to HEAD, a 1xx, 204 or 304).
    None,
    /// Exactly this many bytes.
    Length(u64),
    Chunked,
    /// Until the connection closes (a response to an HTTP/1.0 client of unknown length).
    Close,
}

/// Puts a body's frames into a write queue in its framing (a large chunk as it is, not
/// copied; see [`WriteBuf`]), and notices a body that
/// does not fit it: more bytes than its length, or fewer when it ends. Such a body is
/// `broken`: what was written is all that may be, and the connection must close.
#[derive(Clone, Copy, Debug)]
pub struct BodyEncoder {
    framing: BodyFraming,
    /// Bytes still owed in `Length` framing.
    left: u64,
    ended: bool,
    broken: bool,
}

impl BodyEncoder {
    pub fn new(framing: BodyFraming) -> Self {
        let left = match framing {
            BodyFraming::Length(n) => n,
            _ => 0,
        };
        BodyEncoder {
            framing,
            left,
            ended: framing == BodyFraming::None || framing == BodyFraming::Length(0),
            broken: false,
        }
    }

    /// The body has been written to its end (or broke).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The body did not fit its framing.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// The body runs to the close of the connection.
    pub fn to_close(&self) -> bool {
        self.framing == BodyFraming::Close
    }

    /// The body broke before its end: what was written is all there will be.
    pub fn abort(&mut self) {
        self.ended = true;
        self.broken = true;
    }

    /// Puts one frame into `wbuf`: data, or trailers (which end the body).
    pub fn frame(&mut self, wbuf: &mut WriteBuf, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) => self.data(wbuf, data),
            Err(frame) => self.finish(wbuf, frame.trailers_ref()),
        }
    }

    fn data(&mut self, wbuf: &mut WriteBuf, mut data: Bytes) {
        if data.is_empty() || self.ended {
            return;
        }
        match self.framing {
            BodyFraming::None => {}
            BodyFraming::Length(_) => {
                let n = self.left.min(data.len() as u64);
                let more = n < data.len() as u64;
                data.truncate(n as usize);
                wbuf.put(data);
                self.left -= n;
                if more {
                    // More than the length said: the rest cannot go in this framing.
                    self.broken = true;
                    self.ended = true;
                } else if self.left == 0 {
                    self.ended = true;
                }
            }
            BodyFraming::Chunked => {
                let bytes = wbuf.bytes_mut();
                write_hex(bytes, data.len());
                bytes.extend_from_slice(b"\r\n");
                wbuf.put(data);
                wbuf.bytes_mut().extend_from_slice(b"\r\n");
            }
            BodyFraming::Close => wbuf.put(data),
        }
    }

    /// The body has ended (with these trailers, which only chunked framing carries).
    pub fn finish(&mut self, wbuf: &mut WriteBuf, trailers: Option<&HeaderMap>) {
        if self.ended {
            return;
        }
        self.ended = true;
        match self.framing {
            BodyFraming::Chunked => {
                let bytes = wbuf.bytes_mut();
                bytes.extend_from_slice(b"0\r\n");
                for (name, value) in trailers.into_iter().flatten() {
                    write_field(bytes, name, value);
                }
                bytes.extend_from_slice(b"\r\n");
            }
            // Shorter than its length: the peer must see it cut short.
            BodyFraming::Length(_) if self.left > 0 => self.broken = true,
            _ => {}
        }
    }
}

/// A status code's three digits.
pub fn status_digits(code: u16) -> [u8; 3] {
    [
        b'0' + (code / 100 % 10) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
    ]
}

/// Writes `n` in decimal.
pub fn write_decimal(wbuf: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    wbuf.extend_from_slice(&buf[i..]);
}

/// Writes `n` in lower-case hexadecimal (a chunk size).
fn write_hex(wbuf: &mut Vec<u8>, mut n: usize) {
    let mut buf = [0u8; 16];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    wbuf.extend_from_slice(&buf[i..]);
}

/// Writes a `content-length` field line.
pub fn write_content_length(wbuf: &mut Vec<u8>, n: u64) {
    wbuf.extend_from_slice(b"content-length: ");
    write_decimal(wbuf, n);
    wbuf.extend_from_slice(b"\r\n");
}

thread_local! {
    /// The `Date` value of the current second, formatted once per second per thread.
    static TODAY: std::cell::RefCell<(u64, [u8; 29])> = const { std::cell::RefCell::new((0, [0; 29])) };
}

/// Writes the current time as an HTTP-date (the value of a `Date` field).
pub fn write_date(wbuf: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    TODAY.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == 29 {
                cached.1.copy_from_slice(text.as_bytes());
                cached.0 = secs;
            }
        }
        wbuf.extend_from_slice(&cached.1);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the frames come to on the wire, and whether the body broke.
    fn encode(framing: BodyFraming, frames: &[&[u8]]) -> (Vec<u8>, bool) {
        let mut wbuf = WriteBuf::default();
        let mut enc = BodyEncoder::new(framing);
        for f in frames {
            enc.frame(&mut wbuf, Frame::data(Bytes::copy_from_slice(f)));
        }
        enc.finish(&mut wbuf, None);
        let mut out = Vec::new();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let written = wbuf.poll_write_all(&mut out, &mut cx);
        assert!(matches!(written, std::task::Poll::Ready(Ok(()))));
        (out, enc.broken())
    }

    #[test]
    fn a_body_is_written_in_its_framing_and_a_misfit_is_broken() {
        assert_eq!(
            encode(BodyFraming::Chunked, &[b"hello", b"", b"0123456789abcdefX"]),
            (
                b"5\r\nhello\r\n11\r\n0123456789abcdefX\r\n0\r\n\r\n".to_vec(),
                false
            )
        );
        assert_eq!(
            encode(BodyFraming::Length(5), &[b"he", b"llo"]),
            (b"hello".to_vec(), false)
        );
        assert_eq!(
            encode(BodyFraming::Length(4), &[b"hello"]),
            (b"hell".to_vec(), true)
        );
        assert_eq!(
            encode(BodyFraming::Length(6), &[b"hello"]),
            (b"hello".to_vec(), true)
        );
        assert_eq!(encode(BodyFraming::None, &[b"hello"]), (Vec::new(), false));
        assert_eq!(
            encode(BodyFraming::Close, &[b"hello"]),
            (b"hello".to_vec(), false)
        );
    }

    #[test]
    fn large_chunks_go_out_in_their_framing_as_small_ones_do() {
        let big: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut chunked = b"3\r\nabc\r\n1388\r\n".to_vec();
        chunked.extend_from_slice(&big);
        chunked.extend_from_slice(b"\r\n1\r\nz\r\n0\r\n\r\n");
        assert_eq!(
            encode(BodyFraming::Chunked, &[b"abc", &big, b"z"]),
            (chunked, false)
        );
        let mut exact = b"abc".to_vec();
        exact.extend_from_slice(&big);
        assert_eq!(
            encode(BodyFraming::Length(5003), &[b"abc", &big]),
            (exact.clone(), false)
        );
        // Longer than its length: cut at the length, and broken.
        assert_eq!(
            encode(BodyFraming::Length(4500), &[b"abc", &big]),
            (exact[..4500].to_vec(), true)
        );
    }

    #[test]
    fn numbers_are_written_without_formatting() {
        let mut w = Vec::new();
        write_decimal(&mut w, 0);
        w.push(b' ');
        write_decimal(&mut w, u64::MAX);
        assert_eq!(w, b"0 18446744073709551615");
        assert_eq!(&status_digits(204), b"204");
    }
}
