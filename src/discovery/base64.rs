//! Standard base64 (RFC 4648, `+/`, padding optional), decoding only: a kubeconfig's
//! `certificate-authority-data`, `client-certificate-data` and `client-key-data` are
//! written in it. Thirty lines here rather than a crate for the one use.

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
