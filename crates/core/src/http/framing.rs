//! How a message body ends, and reading it off the front of a buffer: a known length,
//! chunked (RFC 9112 section 7.1, with trailers), or the close of the connection. The
//! same reader serves request bodies (the server's side) and response bodies (the
//! client's side); neither needs a copy of the data it hands on.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::SizeHint;

use super::bad;
use super::fields::byte_class;

/// The longest chunk-size line or trailer block accepted.
pub const MAX_CHUNK_META: usize = 256 * 1024;
/// Most fields in a trailer block.
const MAX_TRAILERS: usize = 128;

/// How a message body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// This many bytes still to come (`Length(0)`: none, or all read).
    Length(u64),
    Chunked(Chunk),
    /// Until the peer closes the connection (responses only).
    Eof,
}

impl Framing {
    /// What is known of the rest of the body's size.
    pub fn size_hint(&self) -> SizeHint {
        match self {
            Framing::Length(n) => SizeHint::with_exact(*n),
            _ => SizeHint::default(),
        }
    }
}

/// Where a chunked body's reader is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunk {
    Size,
    Data(u64),
    DataEnd,
    Trailers,
}

/// What the next step of reading a body found in the buffer.
pub enum Step {
    Data(Bytes),
    Trailers(HeaderMap),
    End,
    /// The buffer holds too little: read more.
    More,
}

/// Takes the next piece of a message body off the front of `rbuf`, moving `framing`
/// on. `eof`: the peer has closed the connection, so nothing more will come (and
/// `More` is never the answer).
pub fn step(rbuf: &mut BytesMut, framing: &mut Framing, eof: bool) -> io::Result<Step> {
    loop {
        match *framing {
            Framing::Length(0) => return Ok(Step::End),
            Framing::Length(left) => {
                if !rbuf.is_empty() {
                    let n = (rbuf.len() as u64).min(left) as usize;
                    *framing = Framing::Length(left - n as u64);
                    return Ok(Step::Data(take(rbuf, n)));
                }
                if eof {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed within the body",
                    ));
                }
                return Ok(Step::More);
            }
            Framing::Eof => {
                if !rbuf.is_empty() {
                    let n = rbuf.len();
                    return Ok(Step::Data(take(rbuf, n)));
                }
                if eof {
                    *framing = Framing::Length(0);
                    return Ok(Step::End);
                }
                return Ok(Step::More);
            }
            Framing::Chunked(state) => match decode_chunk(rbuf, state)? {
                Decoded::Data(data, next) => {
                    *framing = Framing::Chunked(next);
                    return Ok(Step::Data(data));
                }
                Decoded::Next(next) => *framing = Framing::Chunked(next),
                Decoded::End(trailers) => {
                    *framing = Framing::Length(0);
                    return Ok(trailers.map_or(Step::End, Step::Trailers));
                }
                Decoded::More => {
                    if rbuf.len() > MAX_CHUNK_META {
                        return Err(bad("chunk header or trailers too large"));
                    }
                    if eof {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed within the chunked body",
                        ));
                    }
                    return Ok(Step::More);
                }
            },
        }
    }
}

/// Takes `n` bytes off the front of the read buffer, without a copy.
fn take(rbuf: &mut BytesMut, n: usize) -> Bytes {
    rbuf.split_to(n).freeze()
}

enum Decoded {
    Data(Bytes, Chunk),
    Next(Chunk),
    End(Option<HeaderMap>),
    More,
}

/// One step of the chunked decoder on what the buffer holds.
fn decode_chunk(rbuf: &mut BytesMut, state: Chunk) -> io::Result<Decoded> {
    match state {
        Chunk::Size => {
            let Some(eol) = rbuf.windows(2).position(|w| w == b"\r\n") else {
                return Ok(Decoded::More);
            };
            let size = chunk_size(&rbuf[..eol])?;
            rbuf.advance(eol + 2);
            Ok(Decoded::Next(if size == 0 {
                Chunk::Trailers
            } else {
                Chunk::Data(size)
            }))
        }
        Chunk::Data(left) => {
            if rbuf.is_empty() {
                return Ok(Decoded::More);
            }
            let n = (rbuf.len() as u64).min(left) as usize;
            let data = take(rbuf, n);
            let next = if n as u64 == left {
                Chunk::DataEnd
            } else {
                Chunk::Data(left - n as u64)
            };
            Ok(Decoded::Data(data, next))
        }
        Chunk::DataEnd => {
            if rbuf.len() < 2 {
                return Ok(Decoded::More);
            }
            if &rbuf[..2] != b"\r\n" {
                return Err(bad("chunk data not followed by CRLF"));
            }
            rbuf.advance(2);
            Ok(Decoded::Next(Chunk::Size))
        }
        Chunk::Trailers => {
            if rbuf.starts_with(b"\r\n") {
                rbuf.advance(2);
                return Ok(Decoded::End(None));
            }
            let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILERS];
            let (len, trailers) = match httparse::parse_headers(rbuf, &mut fields) {
                Ok(httparse::Status::Complete((len, fields))) => {
                    let mut map = HeaderMap::with_capacity(fields.len());
                    for f in fields {
                        if let (Ok(name), Ok(value)) = (
                            HeaderName::from_bytes(f.name.as_bytes()),
                            HeaderValue::from_bytes(f.value),
                        ) {
                            map.append(name, value);
                        }
                    }
                    (len, map)
                }
                Ok(httparse::Status::Partial) => return Ok(Decoded::More),
                Err(_) => return Err(bad("malformed trailers")),
            };
            rbuf.advance(len);
            Ok(Decoded::End((!trailers.is_empty()).then_some(trailers)))
        }
    }
}

/// The size on a chunk-size line (without its CRLF), read as strictly as RFC 9112
/// section 7.1 writes it: hex digits, then extensions only as
/// `*( BWS ";" BWS token [ BWS "=" BWS ( token / quoted-string ) ] )`. Anything else
/// (garbage after the size, whitespace with no extension after it, a bare CR or LF) is
/// refused: a line two hops could cut differently is how a body is smuggled.
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    let (digits, extensions) = line.split_at(end);
    if digits.is_empty() || digits.len() > 15 {
        return Err(bad("invalid chunk size"));
    }
    if !chunk_extensions(extensions) {
        return Err(bad("invalid chunk extension"));
    }
    let mut size = 0u64;
    for &d in digits {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => d - b'A' + 10,
        };
        size = size * 16 + u64::from(v);
    }
    Ok(size)
}

/// Whether `s` is a list of chunk extensions, each `BWS ";" BWS name [BWS "=" BWS value]`.
fn chunk_extensions(mut s: &[u8]) -> bool {
    while !s.is_empty() {
        let Some(rest) = skip_ws(s).strip_prefix(b";") else {
            return false;
        };
        let rest = skip_ws(rest);
        let name = token_len(rest);
        if name == 0 {
            return false;
        }
        s = &rest[name..];
        if let Some(value) = skip_ws(s).strip_prefix(b"=") {
            let value = skip_ws(value);
            let n = if value.first() == Some(&b'"') {
                quoted_len(value)
            } else {
                token_len(value)
            };
            if n == 0 {
                return false;
            }
            s = &value[n..];
        }
    }
    true
}

fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    &s[n..]
}

/// `tchar` (RFC 9110 section 5.6.2).
const TCHAR: [bool; 256] = byte_class(b"!#$%&'*+-.^_`|~");

/// The length of the token at the front of `s` (0: none).
fn token_len(s: &[u8]) -> usize {
    s.iter().take_while(|&&b| TCHAR[usize::from(b)]).count()
}

/// The length of the quoted-string at the front of `s`, quotes included (0: none, or
/// unterminated). Inside: tab, space, visible characters and obs-text, or a backslash
/// and one of those.
fn quoted_len(s: &[u8]) -> usize {
    let text = |b: u8| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b) || b >= 0x80;
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'"' => return i + 1,
            b'\\' if s.get(i + 1).is_some_and(|&b| text(b)) => i += 2,
            b'\\' => return 0,
            b if text(b) => i += 1,
            _ => return 0,
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_size_lines_are_read_as_the_grammar_writes_them() {
        for (line, size) in [
            (&b"5"[..], 5),
            (b"0", 0),
            (b"00A", 10),
            (b"fF", 255),
            (b"5;name", 5),
            (b"5;name=value", 5),
            (b"5 ; name = value ;b", 5),
            (b"5;name=\"a \\\" ;b\"", 5),
            (b"5;a=\"\";b=c", 5),
            (b"5\t;\ta", 5),
        ] {
            assert_eq!(chunk_size(line).ok(), Some(size), "{}", line.escape_ascii());
        }
        for line in [
            &b""[..],
            b";a",
            b"5 ",
            b"5x",
            b"5 5",
            b"5;",
            b"5;=v",
            b"5;a=",
            b"5;a b",
            b"5;a=b c",
            b"5;a ",
            b"5;a\nb",
            b"5\n",
            b"5;a\r",
            b"5;a=\"open",
            b"5;a=\"x\ny\"",
            b"5;a=\"x\\\n\"",
            b"5;a=b\x00",
            b"-5",
            b"0x5",
            b"1000000000000000",
        ] {
            assert!(chunk_size(line).is_err(), "{}", line.escape_ascii());
        }
    }
}
