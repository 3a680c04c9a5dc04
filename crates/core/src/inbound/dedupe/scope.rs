//! What makes two requests the same one: the scope of a key, and the fingerprint of a
//! body.
//!
//! A key is scoped to (key, method, authority, target with its query, the caller's
//! identity): two callers who happen to pick the same key, or one caller using it on
//! two targets, never see each other's answers. The identity is every credential the
//! request carries: `Authorization`, `Cookie`, and the fields of `identity_headers`
//! (`x-api-key` by default); each is tagged by its name, so a request without any (an
//! anonymous one) never shares a scope with one that has some. The scope is kept only
//! as a SHA-256 digest of those parts, length-prefixed so no two different scopes run
//! together into the same bytes; the store never holds a key or a credential in the
//! clear.
//!
//! The fingerprint is a SHA-256 of the request's `Content-Type` and its body, computed
//! frame by frame as the body streams: memory stays constant whatever the body's size,
//! and a request is not held back to be hashed. The same bytes sent as another type are
//! another request. A different body under the same key is a caller's mistake
//! (`422 key-mismatch`), never a replay of someone else's answer.
//!
//! Why SHA-256 from `ring`: `ring` is already built for TLS, so a strong hash costs no
//! new crate and no build time; SHA-256 is the hash the idempotency-key draft and
//! payment APIs name for fingerprints, and at ~1 GB/s it is not what a request waits
//! on. (BLAKE3 is faster, but it would be one more crate with its own SIMD build.)

use std::fmt;

use http::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE, HOST};
use http::{HeaderMap, HeaderName, Method, Uri};
use ring::digest::{Context, SHA256};

/// The header that carries a key (the IETF httpapi draft's name).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Bytes of a digest.
pub const DIGEST_LEN: usize = 32;

/// A key's scope, as the stores know it: a digest, never the key or a credential.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope([u8; DIGEST_LEN]);

/// Where a key and its caller's identity are read from (`[inbound.dedupe] header` and
/// `identity_headers`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFields {
    /// The header carrying the key.
    pub header: HeaderName,
    /// Credentials besides `Authorization` and `Cookie`.
    pub identity: Vec<HeaderName>,
}

impl Default for KeyFields {
    fn default() -> Self {
        KeyFields {
            header: IDEMPOTENCY_KEY,
            identity: vec![HeaderName::from_static("x-api-key")],
        }
    }
}

impl KeyFields {
    /// Whether `headers` carry a key: a field that is not empty (an empty one is no
    /// key).
    #[inline]
    pub fn keyed(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(&self.header)
            .iter()
            .any(|v| !v.as_bytes().trim_ascii().is_empty())
    }
}

impl Scope {
    /// The scope of a request carrying a key in `fields.header` (every such field that
    /// is not empty, in order); `None` without one.
    pub fn of(
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        fields: &KeyFields,
    ) -> Option<Scope> {
        let mut keys = headers
            .get_all(&fields.header)
            .iter()
            .filter(|k| !k.as_bytes().trim_ascii().is_empty())
            .peekable();
        keys.peek()?;
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
        // The authority a caller named: the target's own, else `Host`; names are
        // case-insensitive.
        let authority = uri
            .authority()
            .map(|a| a.as_str().as_bytes())
            .or_else(|| headers.get(HOST).map(|h| h.as_bytes()))
            .unwrap_or_default();
        part(b'h', &authority.to_ascii_lowercase());
        part(
            b't',
            uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes(),
        );
        // The caller's identity: every credential, each under its own name.
        for auth in headers.get_all(AUTHORIZATION) {
            part(b'a', auth.as_bytes());
        }
        for cookie in headers.get_all(COOKIE) {
            part(b'c', cookie.as_bytes());
        }
        for name in &fields.identity {
            for v in headers.get_all(name) {
                part(b'n', name.as_str().as_bytes());
                part(b'i', v.as_bytes());
            }
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
    /// The fingerprint of a whole body at once, sent without a `Content-Type`.
    pub fn of(body: &[u8]) -> Fingerprint {
        Fingerprint::typed(None, body)
    }

    /// The fingerprint of a whole body at once, sent as `content_type`.
    pub fn typed(content_type: Option<&[u8]>, body: &[u8]) -> Fingerprint {
        let mut f = Fingerprinter::new(content_type);
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

impl Fingerprinter {
    /// A fingerprint of a body sent as `content_type` (`None`: without one, which is
    /// not the same as an empty one).
    pub fn new(content_type: Option<&[u8]>) -> Self {
        let mut ctx = Context::new(&SHA256);
        match content_type {
            None => ctx.update(&[0]),
            Some(t) => {
                ctx.update(&[1]);
                ctx.update(&(t.len() as u64).to_be_bytes());
                ctx.update(t);
            }
        }
        Fingerprinter(ctx)
    }

    /// A fingerprint of the body of a request with these fields.
    pub fn of_request(headers: &HeaderMap) -> Self {
        Fingerprinter::new(headers.get(CONTENT_TYPE).map(|v| v.as_bytes()))
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
        Scope::of(&method, &target.parse().unwrap(), &h, &KeyFields::default())
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
    fn no_key_no_scope_and_the_authority_is_the_targets_or_the_hosts() {
        assert!(scope(Method::POST, "/charge", &[]).is_none());
        assert!(scope(Method::POST, "/charge", &[("idempotency-key", "")]).is_none());
        assert!(scope(Method::POST, "/charge", &[("idempotency-key", " ")]).is_none());
        let key = ("idempotency-key", "k");
        assert_eq!(
            scope(Method::POST, "http://payments/charge", &[key]),
            scope(Method::POST, "/charge", &[key, ("host", "Payments")]),
        );
        assert_ne!(
            scope(Method::POST, "/charge", &[key, ("host", "payments")]),
            scope(Method::POST, "/charge", &[key, ("host", "refunds")]),
            "the authority is part of the scope"
        );
        // An empty field beside a key is no part of it.
        assert_eq!(
            scope(Method::POST, "/charge", &[key]),
            scope(Method::POST, "/charge", &[("idempotency-key", ""), key]),
        );
    }

    #[test]
    fn every_credential_is_part_of_the_scope_and_anonymous_is_apart() {
        let key = ("idempotency-key", "\"k1\"");
        let anonymous = scope(Method::POST, "/charge", &[key]).unwrap();
        let with = |f: (&str, &str)| scope(Method::POST, "/charge", &[key, f]).unwrap();
        let identified = [
            with(("authorization", "Bearer a")),
            with(("cookie", "session=a")),
            with(("x-api-key", "a")),
        ];
        for (i, s) in identified.iter().enumerate() {
            assert_ne!(*s, anonymous, "credential {i} shares the anonymous scope");
            for (j, t) in identified.iter().enumerate().skip(i + 1) {
                assert_ne!(s, t, "credentials {i} and {j} share a scope");
            }
        }
        assert_ne!(with(("cookie", "session=a")), with(("cookie", "session=b")));
        assert_ne!(with(("x-api-key", "a")), with(("x-api-key", "b")));
        // A header that is not a credential changes nothing.
        assert_eq!(with(("x-trace", "1")), anonymous);
        // The configured identity headers are the ones that count.
        let fields = KeyFields {
            header: HeaderName::from_static("idempotency-key"),
            identity: vec![HeaderName::from_static("x-tenant")],
        };
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", HeaderValue::from_static("k"));
        let uri: Uri = "/charge".parse().unwrap();
        let plain = Scope::of(&Method::POST, &uri, &h, &fields);
        h.insert("x-tenant", HeaderValue::from_static("t1"));
        assert_ne!(Scope::of(&Method::POST, &uri, &h, &fields), plain);
        // And the key is read from the configured header.
        let other = KeyFields {
            header: HeaderName::from_static("x-request-key"),
            identity: vec![],
        };
        assert!(Scope::of(&Method::POST, &uri, &h, &other).is_none());
    }

    #[test]
    fn a_fingerprint_fed_in_pieces_is_the_fingerprint_of_the_whole() {
        let mut f = Fingerprinter::new(None);
        for piece in [&b"amount="[..], b"10", b"&currency=eur"] {
            f.update(piece);
        }
        assert_eq!(f.finish(), Fingerprint::of(b"amount=10&currency=eur"));
        assert_ne!(Fingerprint::of(b"amount=10"), Fingerprint::of(b"amount=11"));
    }

    #[test]
    fn the_content_type_is_part_of_the_fingerprint() {
        let json = Fingerprint::typed(Some(b"application/json"), b"{}");
        assert_ne!(json, Fingerprint::typed(Some(b"text/plain"), b"{}"));
        assert_ne!(json, Fingerprint::of(b"{}"));
        assert_ne!(Fingerprint::typed(Some(b""), b"{}"), Fingerprint::of(b"{}"));
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let mut f = Fingerprinter::of_request(&h);
        f.update(b"{}");
        assert_eq!(f.finish(), json);
    }
}
