//! Whether a captured connection to an upstream's port speaks HTTP, told from its first
//! bytes without taking them.
//!
//! Capture redirects every connection to an upstream's address, and not everything
//! sent there is HTTP: a Redis client on a port an app's environment named, TLS to a
//! port an upstream also serves in the clear, a server that speaks first. Served as
//! HTTP, each would get `400` where a direct connection works. So a redirected
//! connection is looked at before it is served: its first bytes are peeked
//! (`MSG_PEEK`: they stay in the socket for whoever reads them), and unless they begin a
//! request line (`METHOD SP target SP HTTP/`, the HTTP/2 preface being one) it is passed
//! through, bytes untouched. A client that says nothing for [`SILENCE`] is waiting for
//! the server to speak first: passed through too.
//!
//! The cost is one `peek` per redirected connection (one system call; the request is
//! nearly always there by the time the connection is accepted), and nothing on
//! connections that were not redirected.

use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long a client may stay silent before it is taken to wait for the server.
pub const SILENCE: Duration = Duration::from_millis(300);

/// How much of the first line is looked at: a request line whose target runs past it
/// is taken for HTTP (the server answers a target too long as it always does).
const LOOK: usize = 2048;

/// The longest method taken for one (the longest registered is 17 bytes).
const METHOD_MAX: usize = 24;

/// What the bytes seen so far say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guess {
    Http,
    Not,
    /// A prefix of a request line: more bytes tell.
    Unsure,
}

/// Whether the client of `stream` begins an HTTP request, within [`SILENCE`] of now.
pub async fn speaks_http(stream: &TcpStream) -> bool {
    let deadline = Instant::now() + SILENCE;
    let mut buf = [0u8; LOOK];
    let mut seen = 0;
    let mut pause = Duration::from_millis(1);
    loop {
        let peeked = tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await;
        let n = match peeked {
            Ok(Ok(n)) => n,
            // Closed without a byte, or broken: nothing to serve, pass it on as it is.
            Ok(Err(_)) => return false,
            // Silent: a server that speaks first. Begun like a request line but slow:
            // served as HTTP, whose server has its own bounds.
            Err(_) => return seen > 0,
        };
        if n == 0 {
            return false;
        }
        match request_line(&buf[..n]) {
            Guess::Http => return true,
            Guess::Not => return false,
            Guess::Unsure if n == LOOK => return true,
            Guess::Unsure => {}
        }
        seen = n;
        // The bytes there are still there: wait a little for more before looking again.
        if Instant::now() + pause >= deadline {
            return true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// Whether `b` begins `METHOD SP target SP HTTP/`.
fn request_line(b: &[u8]) -> Guess {
    let method = b.iter().take_while(|&&c| is_tchar(c)).count();
    if method > METHOD_MAX {
        return Guess::Not;
    }
    let Some(&after) = b.get(method) else {
        return Guess::Unsure;
    };
    if method == 0 || after != b' ' {
        return Guess::Not;
    }
    let rest = &b[method + 1..];
    let target = rest.iter().take_while(|&&c| c > b' ' && c != 0x7f).count();
    let Some(&after) = rest.get(target) else {
        return Guess::Unsure;
    };
    if target == 0 || after != b' ' {
        return Guess::Not;
    }
    let version = &rest[target + 1..];
    let n = version.len().min(5);
    if version[..n] != b"HTTP/"[..n] {
        Guess::Not
    } else if n == 5 {
        Guess::Http
    } else {
        Guess::Unsure
    }
}

/// A token character (RFC 9110, section 5.6.2).
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_http_and_other_protocols_are_not() {
        for http in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"POST http://payments/charge HTTP/1.1\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"CONNECT db:5432 HTTP/1.1\r\n",
            b"GET /x HTTP/",
        ] {
            assert_eq!(request_line(http), Guess::Http, "{http:?}");
        }
        for other in [
            // Redis (RESP), also its inline form, which looks like a request line at first.
            &b"*1\r\n$4\r\nPING\r\n"[..],
            b"PING\r\n",
            b"SET key value\r\n",
            // A TLS ClientHello.
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            // A PostgreSQL startup message.
            b"\x00\x00\x00\x08\x04\xd2\x16\x2f",
            // Memcached's text protocol.
            b"get key\r\n",
            b"GET  / HTTP/1.1\r\n",
            b" GET / HTTP/1.1\r\n",
        ] {
            assert_eq!(request_line(other), Guess::Not, "{other:?}");
        }
        for prefix in [
            &b"G"[..],
            b"GET",
            b"GET ",
            b"GET /a",
            b"GET /a ",
            b"GET /a HT",
        ] {
            assert_eq!(request_line(prefix), Guess::Unsure, "{prefix:?}");
        }
        assert_eq!(request_line(&[b'A'; 40]), Guess::Not);
    }
}
