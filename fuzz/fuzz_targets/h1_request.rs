//! Requests from the app are read by tollgate's own HTTP/1.1 codec: any bytes, arriving
//! in any pieces, never panic; what is read does not depend on where the reads fell; a
//! body never holds more than arrived; a request read with both framings or a refused
//! one ends the connection, so nothing after it is read as another request.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::http::request::parse_requests;

fuzz_target!(|data: &[u8]| {
    // First byte: where to cut the rest into reads, and a small head limit or not.
    let Some((&first, input)) = data.split_first() else {
        return;
    };
    let step = usize::from(first & 0x7f) + 1;
    let max_header_bytes = if first & 0x80 == 0 { 32 * 1024 } else { 256 };
    let pieces: Vec<&[u8]> = input.chunks(step).collect();

    let whole = parse_requests(&[input], max_header_bytes, 100);
    let cut = parse_requests(&pieces, max_header_bytes, 100);
    assert_eq!(whole, cut, "the same bytes read in {step}-byte pieces");
    let body_bytes: usize = whole
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|r| r.body.len())
        .sum();
    assert!(body_bytes <= input.len(), "more body than input");
    for (i, r) in whole.iter().enumerate() {
        let last = i + 1 == whole.len();
        match r {
            Err(_) => assert!(last, "a refused request ends the connection"),
            Ok(r) => {
                assert!(r.keep_alive || last, "a request that closes is the last read");
                assert!(
                    r.headers.get("transfer-encoding").is_none()
                        || r.headers.get("content-length").is_none(),
                    "both framings passed on"
                );
            }
        }
    }
});
