//! Field rules every hop keeps (RFC 9110 and 9112): reading `Content-Length` and token
//! lists, the hop-by-hop fields that belong to one connection (and the ones no
//! `Connection` can make so), a `Host` that can be trusted to route a request, a request
//! target valid for its method, and where the fields of a parsed head sit in its buffer.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};

/// The largest `Content-Length` accepted: `i64::MAX`, the most a peer written in a
/// language with signed sizes can represent. A larger value is refused rather than
/// passed to a hop that would read it as something else.
pub const MAX_CONTENT_LENGTH: u64 = i64::MAX as u64;

/// A `Content-Length` value: digits only (no sign, no spaces inside, no hex), at most
/// [`MAX_CONTENT_LENGTH`].
pub fn content_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    (n <= MAX_CONTENT_LENGTH).then_some(n)
}

/// Why the `Content-Length` fields of a message cannot frame it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LengthProblem {
    /// A value that is no length (a sign, hex, spaces inside, empty, too large).
    Invalid,
    /// Two values that differ, in one field line or across lines.
    Conflicting,
}

/// Folds one `Content-Length` field line into the length read so far (RFC 9110 section
/// 8.6): each comma-separated element must be a valid length and equal to every other,
/// so `5, 5` and two lines of `5` are the length 5, and `5, 6` is refused. Both sides of
/// the HTTP/1.1 codec read lengths with this, so a request and a response are held to
/// the same rule; a reader that found more than one value passes on one field with it.
pub fn fold_content_length(so_far: Option<u64>, value: &[u8]) -> Result<u64, LengthProblem> {
    let mut length = so_far;
    for part in value.split(|&b| b == b',') {
        let v = content_length(part.trim_ascii()).ok_or(LengthProblem::Invalid)?;
        if length.is_some_and(|l| l != v) {
            return Err(LengthProblem::Conflicting);
        }
        length = Some(v);
    }
    length.ok_or(LengthProblem::Invalid)
}

/// Whether a comma-separated field value lists `token` (any case).
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Whether `token` (a field name or token as it came) is `lower`, in any case. `lower`
/// holds only lowercase letters, digits and `-`, for which setting bit 5 of each byte is
/// exact: no other byte of a token becomes one of them. Eight bytes at a time, as this
/// runs for fields of every request and response.
pub fn is_token(token: &[u8], lower: &[u8]) -> bool {
    if token.len() != lower.len() {
        return false;
    }
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    token
        .chunks(8)
        .zip(lower.chunks(8))
        .all(|(t, l)| word(t) | (0x2020_2020_2020_2020 >> (8 * (8 - t.len()))) == word(l))
}

/// Whether a `Connection` value names fields of its own, beyond `keep-alive` and
/// `close` (which name nothing outside the usual set).
pub fn names_others(value: &[u8]) -> bool {
    value.split(|b| *b == b',').any(|t| {
        let t = t.trim_ascii();
        !t.eq_ignore_ascii_case(b"keep-alive") && !t.eq_ignore_ascii_case(b"close")
    })
}

/// Writes one field as a line of an HTTP/1.1 head.
pub fn write_field(wbuf: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    wbuf.extend_from_slice(name.as_str().as_bytes());
    wbuf.extend_from_slice(b": ");
    wbuf.extend_from_slice(value.as_bytes());
    wbuf.extend_from_slice(b"\r\n");
}

/// Heads with up to this many fields are taken apart without an allocation.
pub const FEW_HEADERS: usize = 24;

/// Where a field of a parsed head sits in its buffer: where its name starts and ends,
/// where its value starts and ends. Offsets into a head, which is never near 4 GiB (a
/// head is refused long before: `max_header_bytes`, `MAX_HEAD`).
pub type Span = [u32; 4];

/// The spans of `fields`, parsed from `buf`: in `few` when they fit, else in `many`.
pub fn field_spans<'s>(
    buf: &[u8],
    fields: &[httparse::Header<'_>],
    few: &'s mut [Span; FEW_HEADERS],
    many: &'s mut Vec<Span>,
) -> &'s [Span] {
    let base = buf.as_ptr() as usize;
    let spans = if fields.len() <= FEW_HEADERS {
        &mut few[..fields.len()]
    } else {
        many.resize(fields.len(), [0; 4]);
        &mut many[..]
    };
    for (span, f) in spans.iter_mut().zip(fields) {
        let (ns, vs) = (
            f.name.as_ptr() as usize - base,
            f.value.as_ptr() as usize - base,
        );
        *span = [
            ns as u32,
            (ns + f.name.len()) as u32,
            vs as u32,
            (vs + f.value.len()) as u32,
        ];
    }
    spans
}

/// The hop-by-hop fields of RFC 9110 section 7.6.1 (and the ones that were, in
/// practice). `TE` is handled apart: `TE: trailers` is kept, gRPC needs it end to end.
pub const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || *name == header::TE
}

/// Removes hop-by-hop fields, if there are any.
///
/// Almost no message carries one, so the map is read once and changed only where
/// something was found: removing a field that is not there still costs a hash and a
/// probe, and it would be a dozen per message.
pub fn strip(headers: &mut HeaderMap) {
    if headers.keys().any(is_hop_by_hop) {
        strip_hop_by_hop(headers);
    }
}

/// Fields a `Connection` cannot make hop-by-hop: the framing of the message and the
/// `Host` it was routed by. Dropping them would leave a body without its length on a
/// kept-alive connection, or a request without the authority it was routed by.
pub fn never_connection_named(name: &HeaderName) -> bool {
    *name == header::HOST || *name == header::CONTENT_LENGTH || *name == header::TRANSFER_ENCODING
}

/// Removes hop-by-hop fields in place, touching only those present, and every field
/// a `Connection` names (but [`never_connection_named`] ones).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let mut present: [Option<HeaderName>; 8] = Default::default();
    let mut n = 0;
    let mut connection_names = false;
    let mut te = None;
    for (name, value) in headers.iter() {
        if *name == header::TE {
            te = Some(value.clone());
        } else if n < present.len()
            && HOP_BY_HOP.contains(name)
            && !present.contains(&Some(name.clone()))
        {
            present[n] = Some(name.clone());
            n += 1;
            connection_names |= *name == header::CONNECTION && names_others(value.as_bytes());
        }
    }
    // Fields listed in `Connection` are hop-by-hop too.
    if connection_names {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .collect();
        for name in named {
            if name != header::TE && !never_connection_named(&name) {
                headers.remove(name);
            }
        }
    }
    for name in present.iter().flatten() {
        headers.remove(name);
    }
    if let Some(te) = te {
        let trailers = te.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        });
        if !trailers {
            headers.remove(header::TE);
        } else if te.as_bytes() != b"trailers" || headers.get_all(header::TE).iter().count() > 1 {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }
}

/// The authority a request names: the URI's (absolute form, HTTP/2) or `Host`.
pub fn authority_of<B>(req: &Request<B>) -> Option<&str> {
    if let Some(a) = req.uri().authority() {
        return Some(a.as_str());
    }
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
}

/// Why a request's `Host` cannot be trusted to route it, if it cannot: more than one
/// `Host` line, or a value that is no `host[:port]` (RFC 9112 section 3.2 asks for a
/// 400 for both). Two `Host` lines are the classic way to make two hops route one
/// request differently; tollgate refuses rather than pick one. An empty `Host` is
/// allowed (the URI may have no authority) and routes nowhere.
pub fn host_problem<B>(req: &Request<B>) -> Option<&'static str> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let first = hosts.next()?;
    if hosts.next().is_some() {
        return Some(TWO_HOSTS);
    }
    host_value_problem(first.as_bytes())
}

pub const TWO_HOSTS: &str = "more than one Host header\n";

/// Why a request target cannot be forwarded for its method, if it cannot (RFC 9112
/// section 3.2): origin-form (`/path?query`) and absolute-form (`http://host/path`) for
/// every method, asterisk-form (`*`) for OPTIONS only, authority-form (`host:port`) for
/// CONNECT only, and CONNECT with nothing else. An absolute-form target with an empty
/// path is valid and means `/`. Holds for HTTP/2 requests too, whose `:path` is read
/// into the same URI.
pub fn target_problem(method: &Method, uri: &Uri) -> Option<&'static str> {
    let authority_form = uri.scheme().is_none() && uri.authority().is_some();
    if *method == Method::CONNECT {
        return (!authority_form).then_some("CONNECT needs an authority-form target\n");
    }
    if authority_form {
        return Some("an authority-form target is only for CONNECT\n");
    }
    let pq = uri.path_and_query().map_or("", |p| p.as_str());
    if pq == "*" {
        return (*method != Method::OPTIONS)
            .then_some("an asterisk-form target is only for OPTIONS\n");
    }
    let valid = match uri.scheme_str() {
        None => pq.starts_with('/'),
        Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") => {
            pq.is_empty() || pq.starts_with('/') || pq.starts_with('?')
        }
        Some(_) => false,
    };
    (!valid).then_some("the request target is not valid for its method\n")
}

/// Why one `Host` value cannot be trusted to route a request, if it cannot.
pub fn host_value_problem(value: &[u8]) -> Option<&'static str> {
    let valid = value.is_empty() || authority_syntax(value);
    (!valid).then_some("the Host header is not a valid host[:port]\n")
}

/// A table of the bytes that are ASCII letters or digits or one of `others`.
pub const fn byte_class(others: &[u8]) -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let mut i = 0;
    while i < others.len() {
        t[others[i] as usize] = true;
        i += 1;
    }
    t
}

/// The characters of a reg-name (RFC 3986): unreserved, percent-encoded, sub-delims.
const REG_NAME: [bool; 256] = byte_class(b"-._~%!$&'()*+,;=");

/// `uri-host [ ":" port ]` (RFC 3986): an IP literal in brackets or a reg-name, then
/// nothing or a colon and digits. Checked in place: this runs on every request.
pub fn authority_syntax(value: &[u8]) -> bool {
    if value.first() == Some(&b'[') {
        let Some(end) = value.iter().position(|b| *b == b']') else {
            return false;
        };
        let literal = &value[1..end];
        return !literal.is_empty()
            && literal
                .iter()
                .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
            && port_syntax(&value[end + 1..]);
    }
    // A reg-name has no colon: it ends at the first byte that is not its own, which
    // must begin the port. One pass over the bytes.
    let host = value
        .iter()
        .position(|&b| !REG_NAME[usize::from(b)])
        .unwrap_or(value.len());
    host > 0 && port_syntax(&value[host..])
}

/// Nothing, or a colon and digits.
#[inline]
fn port_syntax(port: &[u8]) -> bool {
    match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_class_is_letters_digits_and_the_bytes_named() {
        let t = byte_class(b"-~");
        let members: Vec<u8> = (0..=255u8).filter(|&b| t[usize::from(b)]).collect();
        let mut expected: Vec<u8> = (b'0'..=b'9')
            .chain(b'A'..=b'Z')
            .chain(b'a'..=b'z')
            .collect();
        expected.extend_from_slice(b"-~");
        expected.sort_unstable();
        assert_eq!(members, expected);
        // The reg-name table is RFC 3986's: no `@`, `:` or `/`, which would split an
        // authority another way.
        for b in [b'@', b':', b'/', b' ', b'[', 0x80] {
            assert!(!REG_NAME[usize::from(b)], "{b:#x}");
        }
    }

    #[test]
    fn tokens_compare_in_any_case_and_nothing_else_matches() {
        let (same, other) = (true, false);
        for (token, lower, expected) in [
            (&b"Content-Length"[..], &b"content-length"[..], same),
            (b"CONNECTION", b"connection", same),
            (b"Keep-Alive", b"keep-alive", same),
            (b"date", b"date", same),
            (b"TE", b"te", same),
            (b"Proxy-Authorization", b"proxy-authorization", same),
            // One byte off, at each end and past the first eight.
            (b"content-lengtx", b"content-length", other),
            (b"xontent-length", b"content-length", other),
            (b"content_length", b"content-length", other),
            (b"content-length ", b"content-length", other),
            (b"content-lengt", b"content-length", other),
            (b"keep.alive", b"keep-alive", other),
            (b"dat", b"date", other),
            (b"", b"te", other),
            // Bit 5 makes other punctuation of these, never a letter.
            (b"@ate", b"date", other),
            (b"Dat^", b"date", other),
        ] {
            assert_eq!(
                is_token(token, lower),
                expected,
                "{}",
                String::from_utf8_lossy(token)
            );
        }
    }

    #[test]
    fn host_values_are_checked_in_place() {
        for good in [
            &b"payments"[..],
            b"payments:8080",
            b"payments.default.svc.cluster.local",
            b"10.0.0.5:80",
            b"[::1]:8080",
            b"[fe80::1]",
            b"my_host~x",
        ] {
            assert!(authority_syntax(good), "{}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b""[..],
            b":80",
            b"pay ments",
            b"payments:80x",
            b"user@payments",
            b"payments/x",
            b"[::1",
            b"[zz]:80",
            b"payments:80:90",
        ] {
            assert!(!authority_syntax(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// RFC 3986's `uri-host [ ":" port ]` read by its parts, the slow way: the check
    /// made in one pass must agree with it on every input.
    fn authority_by_parts(value: &[u8]) -> bool {
        let (host, port) = match value.iter().position(|b| *b == b']') {
            Some(end) if value[0] == b'[' => {
                let literal = &value[1..end];
                let ok = !literal.is_empty()
                    && literal
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                if !ok {
                    return false;
                }
                (None, &value[end + 1..])
            }
            _ if value.first() == Some(&b'[') => return false,
            _ => match value.iter().rposition(|b| *b == b':') {
                Some(i) => (Some(&value[..i]), &value[i..]),
                None => (Some(value), &value[value.len()..]),
            },
        };
        let host_ok =
            host.is_none_or(|h| !h.is_empty() && h.iter().all(|&b| REG_NAME[usize::from(b)]));
        host_ok
            && (port.is_empty() || (port[0] == b':' && port[1..].iter().all(u8::is_ascii_digit)))
    }

    proptest::proptest! {
        #[test]
        fn the_one_pass_check_agrees_with_the_parts(
            value in proptest::collection::vec(
                proptest::sample::select(b"a.Z_~-09:[]@/ %\x80".to_vec()), 0..12)
        ) {
            proptest::prop_assert_eq!(authority_syntax(&value), authority_by_parts(&value));
        }
    }

    #[test]
    fn hop_by_hop_and_connection_named_fields_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(
            header::PROXY_AUTHORIZATION,
            HeaderValue::from_static("Basic x"),
        );
        h.insert(header::TE, HeaderValue::from_static("gzip"));
        h.insert("x-end-to-end", HeaderValue::from_static("stays"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "left: {h:?}");
        assert_eq!(h["x-end-to-end"], "stays");
    }

    #[test]
    fn te_trailers_survives_for_grpc() {
        let mut h = HeaderMap::new();
        h.insert(header::TE, HeaderValue::from_static("trailers, deflate"));
        h.insert(header::CONNECTION, HeaderValue::from_static("te"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h[header::TE], "trailers");
    }

    #[test]
    fn a_connection_cannot_name_framing_or_host_away() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("content-length, host, x-hop"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.insert(header::HOST, HeaderValue::from_static("payments"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h[header::CONTENT_LENGTH], "5");
        assert_eq!(h[header::HOST], "payments");
        assert!(!h.contains_key("x-hop") && !h.contains_key(header::CONNECTION));
    }

    #[test]
    fn content_lengths_fold_to_one_value_or_are_refused() {
        let fold = |lines: &[&str]| {
            lines
                .iter()
                .try_fold(None, |l, v| fold_content_length(l, v.as_bytes()).map(Some))
        };
        assert_eq!(fold(&["5"]), Ok(Some(5)));
        assert_eq!(fold(&["5, 5"]), Ok(Some(5)));
        assert_eq!(fold(&["5", "5"]), Ok(Some(5)));
        assert_eq!(fold(&["5,5 , 5"]), Ok(Some(5)));
        assert_eq!(fold(&["9223372036854775807"]), Ok(Some(i64::MAX as u64)));
        assert_eq!(fold(&["5, 6"]), Err(LengthProblem::Conflicting));
        assert_eq!(fold(&["5", "6"]), Err(LengthProblem::Conflicting));
        for bad in [
            "9223372036854775808",
            "18446744073709551615",
            "99999999999999999999",
            "",
            "5,",
            ",5",
            "+5",
            "0x5",
            "5 5",
        ] {
            assert_eq!(fold(&[bad]), Err(LengthProblem::Invalid), "{bad:?}");
        }
    }

    #[test]
    fn each_target_form_is_valid_for_its_methods_only() {
        let check = |method: &str, target: &str| {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            let uri: Uri = target.parse().unwrap();
            target_problem(&method, &uri).is_none()
        };
        for (method, target) in [
            ("GET", "/"),
            ("GET", "/a?x=1"),
            ("POST", "http://up/a"),
            ("GET", "http://up"),
            ("GET", "http://up?x=1"),
            ("GET", "HTTPS://up:8443/a"),
            ("OPTIONS", "*"),
            ("OPTIONS", "/"),
            ("CONNECT", "up:443"),
        ] {
            assert!(check(method, target), "{method} {target} is valid");
        }
        for (method, target) in [
            ("POST", "*"),
            ("GET", "*"),
            ("GET", "up:443"),
            ("CONNECT", "/"),
            ("CONNECT", "http://up/"),
            ("GET", "ftp://up/a"),
        ] {
            assert!(!check(method, target), "{method} {target} is refused");
        }
    }

    #[test]
    fn absolute_form_uri_wins_over_host() {
        let req = Request::builder()
            .uri("http://payments/charge")
            .header(header::HOST, "other")
            .body(())
            .unwrap();
        assert_eq!(authority_of(&req), Some("payments"));
        let req = Request::builder()
            .uri("/charge")
            .header(header::HOST, "ledger:9000")
            .body(())
            .unwrap();
        assert_eq!(authority_of(&req), Some("ledger:9000"));
    }
}
