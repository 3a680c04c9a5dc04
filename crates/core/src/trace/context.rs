//! W3C Trace Context: the `traceparent` header read strictly and written, and the ids a
//! span is known by.
//!
//! `traceparent` is `version-traceid-parentid-flags` in lowercase hex. Version `00` is
//! exactly 55 characters; a later version (not `ff`) is read as far as version `00`
//! goes, provided what follows is cut at a dash, as the recommendation says a reader of
//! an older version must. Anything else (upper case, a missing dash, an id of zeros)
//! is no context at all: a trace is never continued from a value half understood.
//! `tracestate` is never parsed: it travels as the app sent it.
//!
//! New ids come from fastrand's thread-local generator: a request that is traced pays
//! for two or three draws, never a lock or a system call.

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};

pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The length of a version `00` value.
const LEN: usize = 55;

/// The sampled bit of the trace flags.
pub const SAMPLED: u8 = 0x01;

/// A trace's id: 16 bytes, never all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub(crate) [u8; 16]);

/// A span's id: 8 bytes, never all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub(crate) [u8; 8]);

impl TraceId {
    /// A new random id, whose low half is `low` (the draw the sampling decision made).
    pub(crate) fn random_with(low: u64) -> Self {
        let high = fastrand::u64(..);
        let mut id = [0; 16];
        id[..8].copy_from_slice(&high.to_be_bytes());
        id[8..].copy_from_slice(&low.to_be_bytes());
        if id == [0; 16] {
            id[15] = 1;
        }
        TraceId(id)
    }

    pub fn from_bytes(id: [u8; 16]) -> Option<Self> {
        (id != [0; 16]).then_some(TraceId(id))
    }

    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// The 32 lowercase hex characters `traceparent` and the logs write.
    pub fn to_hex(self) -> [u8; 32] {
        let mut out = [0; 32];
        hex_into(&self.0, &mut out);
        out
    }
}

impl SpanId {
    pub(crate) fn random() -> Self {
        SpanId(fastrand::u64(1..).to_be_bytes())
    }

    pub fn from_bytes(id: [u8; 8]) -> Option<Self> {
        (id != [0; 8]).then_some(SpanId(id))
    }

    pub fn to_bytes(self) -> [u8; 8] {
        self.0
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex();
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut hex = [0; 16];
        hex_into(&self.0, &mut hex);
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

/// A parsed `traceparent`: the trace, the caller's span, and the flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    /// The span of the caller this request is a child of.
    pub parent_id: SpanId,
    pub flags: u8,
}

impl TraceParent {
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// Reads a `traceparent` value; `None` when it is not one (see the module doc).
    pub fn parse(v: &[u8]) -> Option<TraceParent> {
        let version = hex_byte(v.get(0..2)?)?;
        match version {
            0x00 if v.len() == LEN => {}
            // A later version: read as far as version 00 goes, cut at a dash.
            0x01..=0xfe if v.len() == LEN || (v.len() > LEN && v[LEN] == b'-') => {}
            _ => return None,
        }
        if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let mut trace = [0; 16];
        hex_bytes(&v[3..35], &mut trace)?;
        let mut parent = [0; 8];
        hex_bytes(&v[36..52], &mut parent)?;
        let flags = hex_byte(&v[53..55])?;
        Some(TraceParent {
            trace_id: TraceId::from_bytes(trace)?,
            parent_id: SpanId::from_bytes(parent)?,
            flags,
        })
    }

    /// The request's `traceparent`: `None` when it has none, or more than one (which W3C
    /// says to treat as none), or one that is not valid.
    pub fn from_headers(headers: &HeaderMap) -> Option<TraceParent> {
        let mut all = headers.get_all(TRACEPARENT).iter();
        let first = all.next()?;
        if all.next().is_some() {
            return None;
        }
        TraceParent::parse(first.as_bytes())
    }

    /// The value, always written as version `00`.
    pub fn to_bytes(&self) -> [u8; LEN] {
        let mut out = [b'-'; LEN];
        out[0] = b'0';
        out[1] = b'0';
        hex_into(&self.trace_id.0, &mut out[3..35]);
        hex_into(&self.parent_id.0, &mut out[36..52]);
        hex_into(&[self.flags], &mut out[53..55]);
        out
    }

    pub fn header_value(&self) -> HeaderValue {
        // Hex digits and dashes only: always a valid field value.
        HeaderValue::from_bytes(&self.to_bytes()).unwrap_or(HeaderValue::from_static(""))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_into(bytes: &[u8], out: &mut [u8]) {
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
}

/// A lowercase hex digit's value: upper case is not Trace Context.
fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    Some(nibble(pair[0])? << 4 | nibble(pair[1])?)
}

fn hex_bytes(hex: &[u8], out: &mut [u8]) -> Option<()> {
    for (pair, b) in hex.chunks_exact(2).zip(out.iter_mut()) {
        *b = hex_byte(pair)?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_value_is_read_and_written_back_the_same() {
        let tp = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(tp.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.parent_id.to_string(), "00f067aa0ba902b7");
        assert!(tp.sampled());
        assert_eq!(&tp.to_bytes()[..], GOOD.as_bytes());
        assert_eq!(tp.header_value(), GOOD);
        let unsampled = GOOD.replace("-01", "-00");
        assert!(!TraceParent::parse(unsampled.as_bytes()).unwrap().sampled());
    }

    #[test]
    fn anything_not_quite_right_is_no_context() {
        let bad = [
            // Upper case hex.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
            // Ids of zeros.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Lengths.
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            // Separators, characters.
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // Version ff is invalid; a version of upper case or non-hex is none.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // A later version must be cut at a dash.
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "",
        ];
        for v in bad {
            assert_eq!(TraceParent::parse(v.as_bytes()), None, "{v:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_as_far_as_version_00_goes() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-says";
        let tp = TraceParent::parse(later.as_bytes()).unwrap();
        assert_eq!(&tp.to_bytes()[..], GOOD.as_bytes(), "continued as 00");
        let exact = GOOD.replacen("00", "01", 1);
        assert!(TraceParent::parse(exact.as_bytes()).is_some());
    }

    #[test]
    fn two_traceparent_fields_are_none() {
        let mut h = HeaderMap::new();
        assert_eq!(TraceParent::from_headers(&h), None);
        h.append(TRACEPARENT, HeaderValue::from_static(GOOD));
        assert!(TraceParent::from_headers(&h).is_some());
        h.append(TRACEPARENT, HeaderValue::from_static(GOOD));
        assert_eq!(TraceParent::from_headers(&h), None);
    }

    #[test]
    fn new_ids_are_never_zero() {
        for _ in 0..1000 {
            assert_ne!(SpanId::random().0, [0; 8]);
        }
        assert_ne!(TraceId::random_with(0).0, [0; 16]);
    }

    fn traceparent() -> impl Strategy<Value = TraceParent> {
        (any::<[u8; 16]>(), any::<[u8; 8]>(), any::<u8>()).prop_filter_map(
            "ids of zeros are not ids",
            |(t, s, flags)| {
                Some(TraceParent {
                    trace_id: TraceId::from_bytes(t)?,
                    parent_id: SpanId::from_bytes(s)?,
                    flags,
                })
            },
        )
    }

    proptest! {
        #[test]
        fn what_is_written_reads_back(tp in traceparent()) {
            let bytes = tp.to_bytes();
            prop_assert_eq!(TraceParent::parse(&bytes), Some(tp));
            prop_assert!(bytes.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b) || *b == b'-'));
        }

        #[test]
        fn a_changed_character_is_read_only_if_still_valid(
            tp in traceparent(), at in 0..LEN, c in any::<u8>()
        ) {
            let mut bytes = tp.to_bytes();
            bytes[at] = c;
            let still_valid = match at {
                2 | 35 | 52 => c == b'-',
                0 | 1 => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
                _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
            };
            match TraceParent::parse(&bytes) {
                Some(read) => {
                    prop_assert!(still_valid);
                    // Whatever was read is written back as version 00, the rest unchanged.
                    let mut expected = bytes;
                    expected[0] = b'0';
                    expected[1] = b'0';
                    prop_assert_eq!(&read.to_bytes()[..], &expected[..]);
                }
                None => prop_assert!(
                    !still_valid
                        || (at <= 1 && bytes[..2] == *b"ff")
                        || read_zero_id(&bytes)
                ),
            }
        }

        #[test]
        fn any_bytes_never_panic(v in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = TraceParent::parse(&v);
        }
    }

    fn read_zero_id(bytes: &[u8]) -> bool {
        bytes[3..35].iter().all(|b| *b == b'0') || bytes[36..52].iter().all(|b| *b == b'0')
    }
}
