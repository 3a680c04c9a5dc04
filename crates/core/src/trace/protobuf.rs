//! The few words of the protobuf wire format an OTLP export needs: varints, fixed
//! 32- and 64-bit fields, length-delimited bytes and nested messages. Written by hand
//! because OTLP's trace request is five small messages, written (never read) by one
//! function: a generated-code dependency would bring its runtime and a build step for
//! what fits here (see Cargo.toml). Checked against the official definitions by the
//! tests of `encode.rs`, which decode with the OpenTelemetry protobuf crate.
//!
//! A nested message is written in place, its length in front of it: one byte is
//! reserved and the rest of the varint inserted if the message outgrew 127 bytes, so
//! nothing is measured twice.

/// Wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

#[derive(Default)]
pub(super) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn tag(&mut self, field: u32, wire: u32) {
        self.varint(u64::from(field << 3 | wire));
    }

    /// A varint field (`uint32`, `uint64`, an enum). Zero is proto3's default and is
    /// left out.
    pub fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.tag(field, VARINT);
            self.varint(v);
        }
    }

    /// A `bool`, written even when false: inside a `oneof` the field's presence is the
    /// value's type.
    pub fn bool_always(&mut self, field: u32, v: bool) {
        self.tag(field, VARINT);
        self.varint(u64::from(v));
    }

    /// An `int64` written even when zero (a `oneof` member).
    pub fn int_always(&mut self, field: u32, v: i64) {
        self.tag(field, VARINT);
        self.varint(v as u64);
    }

    /// A `double` written even when zero (a `oneof` member).
    pub fn double_always(&mut self, field: u32, v: f64) {
        self.tag(field, FIXED64);
        self.buf.extend_from_slice(&v.to_bits().to_le_bytes());
    }

    pub fn fixed64(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.tag(field, FIXED64);
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    pub fn fixed32(&mut self, field: u32, v: u32) {
        if v != 0 {
            self.tag(field, FIXED32);
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// `bytes` or `string`; empty is left out.
    pub fn bytes(&mut self, field: u32, v: &[u8]) {
        if !v.is_empty() {
            self.bytes_always(field, v);
        }
    }

    /// `bytes` or `string` written even when empty (a `oneof` member).
    pub fn bytes_always(&mut self, field: u32, v: &[u8]) {
        self.tag(field, LEN);
        self.varint(v.len() as u64);
        self.buf.extend_from_slice(v);
    }

    /// A nested message, written by `body`.
    pub fn message(&mut self, field: u32, body: impl FnOnce(&mut Writer)) {
        self.tag(field, LEN);
        let at = self.buf.len();
        self.buf.push(0);
        body(self);
        let len = self.buf.len() - at - 1;
        if len < 0x80 {
            self.buf[at] = len as u8;
            return;
        }
        let mut prefix = [0u8; 10];
        let mut n = 0;
        let mut v = len as u64;
        while v >= 0x80 {
            prefix[n] = (v as u8) | 0x80;
            v >>= 7;
            n += 1;
        }
        prefix[n] = v as u8;
        self.buf.splice(at..at + 1, prefix[..=n].iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_tags_are_the_wire_formats() {
        let mut w = Writer::default();
        w.uint(1, 150);
        assert_eq!(w.buf, [0x08, 0x96, 0x01], "the protobuf guide's example");
        let mut w = Writer::default();
        w.uint(1, 0);
        w.bytes(2, b"");
        w.fixed64(3, 0);
        assert!(w.buf.is_empty(), "proto3 defaults are left out");
        let mut w = Writer::default();
        w.bytes(2, b"testing");
        assert_eq!(w.buf, b"\x12\x07testing");
        let mut w = Writer::default();
        w.int_always(3, -1);
        assert_eq!(w.buf.len(), 1 + 10, "a negative int64 takes ten bytes");
        let mut w = Writer::default();
        w.fixed32(16, 0x301);
        assert_eq!(w.buf, [0x85, 0x01, 0x01, 0x03, 0, 0]);
    }

    #[test]
    fn a_long_nested_message_gets_its_whole_length_in_front() {
        for size in [0usize, 1, 125, 126, 127, 200, 20_000, 3_000_000] {
            let payload = vec![7u8; size];
            let mut w = Writer::default();
            w.message(4, |w| w.bytes(1, &payload));
            let inner_len = if size == 0 {
                0
            } else {
                1 + varint_len(size) + size
            };
            assert_eq!(w.buf[0], 4 << 3 | 2);
            let mut len = 0usize;
            let mut shift = 0;
            let mut i = 1;
            loop {
                let b = w.buf[i];
                len |= usize::from(b & 0x7f) << shift;
                i += 1;
                if b < 0x80 {
                    break;
                }
                shift += 7;
            }
            assert_eq!(len, inner_len, "{size}");
            assert_eq!(w.buf.len(), i + inner_len, "{size}");
        }
    }

    fn varint_len(mut v: usize) -> usize {
        let mut n = 1;
        while v >= 0x80 {
            v >>= 7;
            n += 1;
        }
        n
    }
}
