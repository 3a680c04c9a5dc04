//! A kept response: what a duplicate gets instead of a second run.
//!
//! The app's final response is kept whole (status, its fields but the hop-by-hop ones,
//! body, trailers) unless it says the request did not run or may be asked again
//! (`408`, `425`, `429`, `502`, `503`, `504`): those release the key. `Content-Length`
//! is left out too: the replay's framing is its own (the body is whole, so its length
//! is known then); and so is `Set-Cookie`: a replay gives no session away.
//!
//! [`Keeper`] gathers a response as it streams to its caller, up to `max_response`;
//! past that it stops copying and the response is not kept. The same bound applies to
//! what [`Kept::encode`] writes into a shared store, so the size counted here is the
//! size stored.

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, SET_COOKIE};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::http::fields::is_hop_by_hop;

/// A response kept for replay.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Trailers, as a gRPC answer ends with its status in them.
    pub trailers: Option<HeaderMap>,
}

/// Whether an app's final status is kept; the others release the key, since the
/// request did not run or may be asked again.
pub fn keeps(status: StatusCode) -> bool {
    !matches!(status.as_u16(), 408 | 425 | 429 | 502 | 503 | 504) && !status.is_informational()
}

/// Whether a field of the app's response is kept. `Set-Cookie` never is: a replay
/// gives no session away, whoever asks.
fn kept_field(name: &HeaderName) -> bool {
    !is_hop_by_hop(name) && *name != CONTENT_LENGTH && *name != SET_COOKIE
}

/// A response gathered as it streams, up to a bound.
#[derive(Debug)]
pub struct Keeper {
    status: StatusCode,
    headers: HeaderMap,
    body: BytesMut,
    trailers: Option<HeaderMap>,
    /// Bytes counted so far, as [`Kept::encode`] would write them.
    size: usize,
    limit: usize,
}

impl Keeper {
    /// Starts keeping a response with this head; `limit` is `max_response`.
    pub fn new(status: StatusCode, headers: &HeaderMap, limit: usize) -> Keeper {
        let mut kept = HeaderMap::with_capacity(headers.len());
        for (name, value) in headers.iter().filter(|(n, _)| kept_field(n)) {
            kept.append(name.clone(), value.clone());
        }
        let size = HEAD + fields_size(&kept);
        Keeper {
            status,
            headers: kept,
            body: BytesMut::new(),
            trailers: None,
            size,
            limit,
        }
    }

    /// The response's status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Whether it is still within the bound (once over, it stays over).
    pub fn within(&self) -> bool {
        self.size <= self.limit
    }

    /// Adds a piece of the body; returns whether the response is still within bound.
    pub fn data(&mut self, chunk: &[u8]) -> bool {
        self.size = self.size.saturating_add(chunk.len());
        if self.within() {
            self.body.extend_from_slice(chunk);
        } else {
            // Nothing more will be kept: give the copy back now, not when the body ends.
            self.body = BytesMut::new();
        }
        self.within()
    }

    /// The trailers that end the body.
    pub fn trailers(&mut self, trailers: &HeaderMap) -> bool {
        let t: HeaderMap = trailers
            .iter()
            .filter(|(n, _)| kept_field(n))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        self.size = self.size.saturating_add(4 + fields_size(&t));
        self.trailers = Some(t);
        self.within()
    }

    /// The response, or `None` when it outgrew the bound.
    pub fn finish(self) -> Option<Kept> {
        self.within().then(|| Kept {
            status: self.status,
            headers: self.headers,
            body: self.body.freeze(),
            trailers: self.trailers,
        })
    }
}

/// Version, status, field count, body length, trailers flag.
const HEAD: usize = 1 + 2 + 4 + 4 + 1;
const VERSION: u8 = 1;

fn fields_size(h: &HeaderMap) -> usize {
    h.iter()
        .map(|(n, v)| 2 + n.as_str().len() + 4 + v.len())
        .sum()
}

/// Bytes a shared store returned that are not a kept response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a kept response in the store is damaged or of another version")]
pub struct Damaged;

impl Kept {
    /// Bytes it takes in a store.
    pub fn size(&self) -> usize {
        HEAD + fields_size(&self.headers)
            + self.body.len()
            + self.trailers.as_ref().map_or(0, |t| 4 + fields_size(t))
    }

    /// The bytes a shared store keeps.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size());
        out.push(VERSION);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        put_fields(&mut out, &self.headers);
        out.extend_from_slice(&(self.body.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.body);
        match &self.trailers {
            None => out.push(0),
            Some(t) => {
                out.push(1);
                put_fields(&mut out, t);
            }
        }
        out
    }

    /// Reads what [`Kept::encode`] wrote; anything else is [`Damaged`].
    pub fn decode(bytes: &[u8]) -> Result<Kept, Damaged> {
        let mut r = Reader(bytes);
        if r.take(1)? != [VERSION] {
            return Err(Damaged);
        }
        let status = StatusCode::from_u16(r.u16()?).map_err(|_| Damaged)?;
        let headers = r.fields()?;
        let len = r.u32()? as usize;
        let body = Bytes::copy_from_slice(r.take(len)?);
        let trailers = match r.take(1)? {
            [0] => None,
            [1] => Some(r.fields()?),
            _ => return Err(Damaged),
        };
        if !r.0.is_empty() {
            return Err(Damaged);
        }
        Ok(Kept {
            status,
            headers,
            body,
            trailers,
        })
    }
}

fn put_fields(out: &mut Vec<u8>, h: &HeaderMap) {
    out.extend_from_slice(&(h.len() as u32).to_be_bytes());
    for (name, value) in h {
        out.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Damaged> {
        if self.0.len() < n {
            return Err(Damaged);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, Damaged> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, Damaged> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn fields(&mut self) -> Result<HeaderMap, Damaged> {
        let n = self.u32()? as usize;
        // Each field takes at least 6 bytes: a count beyond that is damage, not a
        // reason to reserve memory.
        if n > self.0.len() / 6 {
            return Err(Damaged);
        }
        let mut h = HeaderMap::with_capacity(n);
        for _ in 0..n {
            let len = usize::from(self.u16()?);
            let name = HeaderName::from_bytes(self.take(len)?).map_err(|_| Damaged)?;
            let len = self.u32()? as usize;
            let value = HeaderValue::from_bytes(self.take(len)?).map_err(|_| Damaged)?;
            h.append(name, value);
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::http::testing::fields;
    use proptest::prelude::*;

    fn head() -> HeaderMap {
        fields(&[
            ("content-type", "application/json"),
            ("connection", "close"),
            ("transfer-encoding", "chunked"),
            ("content-length", "12"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
        ])
    }

    #[test]
    fn the_statuses_that_say_it_did_not_run_are_not_kept() {
        for s in [408, 425, 429, 502, 503, 504, 100] {
            assert!(!keeps(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [200, 201, 204, 302, 400, 404, 409, 422, 500, 501] {
            assert!(keeps(StatusCode::from_u16(s).unwrap()), "{s}");
        }
    }

    #[test]
    fn a_keeper_drops_hop_by_hop_fields_and_framing_and_keeps_the_rest() {
        let mut k = Keeper::new(StatusCode::CREATED, &head(), 1 << 20);
        assert!(k.data(b"{\"id\":"));
        assert!(k.data(b"7}"));
        let kept = k.finish().unwrap();
        assert_eq!(kept.status, StatusCode::CREATED);
        assert_eq!(kept.body, Bytes::from_static(b"{\"id\":7}"));
        assert!(kept.headers.get("connection").is_none());
        assert!(kept.headers.get("transfer-encoding").is_none());
        assert!(kept.headers.get("content-length").is_none());
        assert!(
            kept.headers.get("set-cookie").is_none(),
            "a replay gives no session away"
        );
        assert_eq!(Kept::decode(&kept.encode()).unwrap(), kept);
        assert_eq!(kept.encode().len(), kept.size());
    }

    #[test]
    fn a_response_over_the_bound_is_not_kept_and_its_copy_is_given_back() {
        let mut k = Keeper::new(StatusCode::OK, &HeaderMap::new(), HEAD + 10);
        assert!(k.data(b"0123456789"));
        assert!(!k.data(b"x"));
        assert!(k.body.is_empty());
        assert!(!k.data(b"more"), "once over, always over");
        assert!(k.finish().is_none());
        // Exactly at the bound is kept.
        let mut k = Keeper::new(StatusCode::OK, &HeaderMap::new(), HEAD + 10);
        k.data(b"0123456789");
        assert_eq!(k.finish().unwrap().size(), HEAD + 10);
    }

    #[test]
    fn damaged_bytes_are_refused_not_trusted() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let kept = Kept {
            status: StatusCode::OK,
            headers: head(),
            body: Bytes::from_static(b"abc"),
            trailers: Some(t),
        };
        let bytes = kept.encode();
        assert_eq!(Kept::decode(&bytes).unwrap(), kept);
        for cut in 0..bytes.len() {
            assert_eq!(Kept::decode(&bytes[..cut]), Err(Damaged), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Kept::decode(&longer), Err(Damaged));
        let mut other_version = bytes;
        other_version[0] = 9;
        assert_eq!(Kept::decode(&other_version), Err(Damaged));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Kept::decode(&bytes);
        }

        #[test]
        fn what_is_encoded_decodes_the_same(
            status in 200u16..600,
            body in proptest::collection::vec(any::<u8>(), 0..256),
            values in proptest::collection::vec("[a-z0-9 ]{0,12}", 0..6),
        ) {
            let mut headers = HeaderMap::new();
            for (i, v) in values.iter().enumerate() {
                headers.append(
                    HeaderName::from_bytes(format!("x-f{}", i % 3).as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            let kept = Kept {
                status: StatusCode::from_u16(status).unwrap(),
                headers,
                body: Bytes::from(body),
                trailers: None,
            };
            prop_assert_eq!(Kept::decode(&kept.encode()).unwrap(), kept);
        }
    }
}
