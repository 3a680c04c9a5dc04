//! Standard base64 (RFC 4648, `+/`, padding optional): a kubeconfig's
//! `certificate-authority-data`, `client-certificate-data` and `client-key-data` are
//! written in it, and an AdmissionReview's patch. Forty lines here rather than a crate
//! for the two uses.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in base64, padded.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let at = |i: usize| chunk.get(i).copied().unwrap_or(0);
        let b = [at(0), at(1), at(2)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The bytes `text` encodes; whitespace (a wrapped line) is skipped.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut acc: u32 = 0;
    let mut bits = 0;
    let mut padding = 0;
    for (i, c) in text.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding += 1;
                continue;
            }
            b' ' | b'\t' | b'\r' | b'\n' => continue,
            _ => return Err(format!("`{}` at {i} is not base64", char::from(c))),
        };
        if padding > 0 {
            return Err(format!("base64 goes on after its padding at {i}"));
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    // Six bits left over is one character too many: no whole byte ends there.
    if bits >= 6 || padding > 2 {
        return Err("base64 ends in the middle of a byte".to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn the_rfc_4648_vectors_decode_with_and_without_padding() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(decode(encoded).unwrap(), plain.as_bytes(), "{encoded}");
            assert_eq!(super::encode(plain.as_bytes()), encoded);
            let bare = encoded.trim_end_matches('=');
            assert_eq!(decode(bare).unwrap(), plain.as_bytes(), "{bare}");
        }
        assert_eq!(decode("Zm9v\nYmFy\n").unwrap(), b"foobar", "wrapped lines");
        assert_eq!(decode("/+8=").unwrap(), [0xff, 0xef]);
    }

    #[test]
    fn what_is_not_base64_is_refused() {
        assert!(decode("Zm9v!").is_err());
        assert!(decode("Zg==Zg").is_err(), "data after the padding");
        assert!(decode("Z").is_err(), "a lone character is no byte");
        assert!(
            decode("-_8=").is_err(),
            "the URL alphabet is not the standard one"
        );
    }
}
