//! What makes two requests the same one: the scope of a key, and the fingerprint of a
//! body.
//!
//! A key is scoped to (key, method, target, the `Authorization` header): two callers
//! who happen to pick the same key, or one caller using it on two targets, never see
//! each other's answers. The scope is kept only as a SHA-256 digest of those four,
//! length-prefixed so no two different scopes run together into the same bytes; the
//! store never holds a key or a credential in the clear.
//!
//! The fingerprint is a SHA-256 of the body, computed frame by frame as the body
//! streams: memory stays constant whatever the body's size, and a request is not held
//! back to be hashed. A different body under the same key is a caller's mistake
//! (`422 key-mismatch`), never a replay of someone else's answer.
//!
//! Why SHA-256 from `ring`: `ring` is already built for TLS, so a strong hash costs no
//! new crate and no build time; SHA-256 is the hash the idempotency-key draft and
//! payment APIs name for fingerprints, and at ~1 GB/s it is not what a request waits
//! on. (BLAKE3 is faster, but it would be one more crate with its own SIMD build.)

use std::fmt;

use http::{HeaderMap, HeaderName, Method, Uri, header::AUTHORIZATION};
use ring::digest::{Context, SHA256};

/// The header that carries a key (the IETF httpapi draft's name).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Bytes of a digest.
pub const DIGEST_LEN: usize = 32;

/// A key's scope, as the stores know it: a digest, never the key or a credential.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope([u8; DIGEST_LEN]);

impl Scope {
    /// The scope of a request carrying `keys` (every `idempotency-key` field, in order).
    pub fn of(method: &Method, uri: &Uri, headers: &HeaderMap) -> Option<Scope> {
        let mut keys = headers.get_all(IDEMPOTENCY_KEY).iter().peekable();
        if keys.peek().is_none_or(|k| k.is_empty()) {
            return None;
        }
        let mut ctx = Context::new(&SHA256);
        let mut part = |tag: u8, bytes: &[u8]| {
            ctx.update(&[tag]);
            ctx.update(&(bytes.len() as u64).to_be_bytes());
            ctx.update(bytes);
        };
        for key in keys {
            part(b'k', key.as_bytes());
        }
        part(b'm', method.as_str().as_bytes());
        part(
            b't',
            uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes(),
        );
        for auth in headers.get_all(AUTHORIZATION) {
            part(b'a', auth.as_bytes());
        }
        Some(Scope(digest(ctx)))
    }

    pub fn as_bytes(&self) -> &[u8; DIGEST_LEN] {
        &self.0
    }

    /// Lower-case hex, as the Redis key carries it.
    pub fn hex(&self) -> String {
        hex(&self.0)
    }

    /// Which of `n` shards this scope lives in.
    pub fn shard(&self, n: usize) -> usize {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        (u64::from_le_bytes(first) % n.max(1) as u64) as usize
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({}…)", &self.hex()[..12])
    }
}

/// A body's SHA-256.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; DIGEST_LEN]);

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({}…)", &hex(&self.0)[..12])
    }
}

impl Fingerprint {
    /// The fingerprint of a whole body at once.
    pub fn of(body: &[u8]) -> Fingerprint {
        let mut f = Fingerprinter::new();
        f.update(body);
        f.finish()
    }
}

/// A fingerprint in the making, fed each frame of the body as it passes.
#[derive(Clone)]
pub struct Fingerprinter(Context);

impl fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprinter")
    }
}

impl Default for Fingerprinter {
    fn default() -> Self {
        Self::new()
    }
}

impl Fingerprinter {
    pub fn new() -> Self {
        Fingerprinter(Context::new(&SHA256))
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> Fingerprint {
        Fingerprint(digest(self.0))
    }
}

fn digest(ctx: Context) -> [u8; DIGEST_LEN] {
    let mut out = [0u8; DIGEST_LEN];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use http::HeaderValue;

    fn scope(method: Method, target: &str, fields: &[(&str, &str)]) -> Option<Scope> {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        Scope::of(&method, &target.parse().unwrap(), &h)
    }

    #[test]
    fn each_part_of_the_scope_tells_requests_apart() {
        let key = ("idempotency-key", "\"k1\"");
        let base = scope(Method::POST, "/charge", &[key]).unwrap();
        assert_eq!(base, scope(Method::POST, "/charge", &[key]).unwrap());
        let others = [
            scope(Method::PATCH, "/charge", &[key]),
            scope(Method::POST, "/charge?x=1", &[key]),
            scope(Method::POST, "/refund", &[key]),
            scope(Method::POST, "/charge", &[("idempotency-key", "\"k2\"")]),
            scope(
                Method::POST,
                "/charge",
                &[key, ("authorization", "Bearer a")],
            ),
        ];
        for other in others {
            assert_ne!(Some(base), other);
        }
        assert_ne!(
            scope(
                Method::POST,
                "/charge",
                &[key, ("authorization", "Bearer a")]
            ),
            scope(
                Method::POST,
                "/charge",
                &[key, ("authorization", "Bearer b")]
            ),
            "two callers with the same key never share a scope"
        );
        // Length prefixes: moving a byte from the key into the target is another scope.
        assert_ne!(
            scope(Method::POST, "/ab", &[("idempotency-key", "x")]),
            scope(Method::POST, "/b", &[("idempotency-key", "x/a")]),
        );
    }

    #[test]
    fn no_key_no_scope_and_the_form_of_the_target_does_not_matter() {
        assert!(scope(Method::POST, "/charge", &[]).is_none());
        assert!(scope(Method::POST, "/charge", &[("idempotency-key", "")]).is_none());
        let key = [("idempotency-key", "k")];
        assert_eq!(
            scope(Method::POST, "http://payments/charge", &key),
            scope(Method::POST, "/charge", &key),
        );
    }

    #[test]
    fn a_fingerprint_fed_in_pieces_is_the_fingerprint_of_the_whole() {
        let mut f = Fingerprinter::new();
        for piece in [&b"amount="[..], b"10", b"&currency=eur"] {
            f.update(piece);
        }
        assert_eq!(f.finish(), Fingerprint::of(b"amount=10&currency=eur"));
        assert_ne!(Fingerprint::of(b"amount=10"), Fingerprint::of(b"amount=11"));
        assert_eq!(
            hex(&Fingerprint::of(b"").0),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
