//! Upstream HTTP/1.1 responses are parsed by tollgate's own reader: any bytes, arriving
//! in any pieces, never panic; the answer does not depend on where the reads fell; a
//! body never holds more than arrived, and a length-delimited body holds exactly its
//! length. A connection is reused only after a response framed beyond doubt.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::http::response::parse_response;

fuzz_target!(|data: &[u8]| {
    // First byte: HEAD or not, and where to cut the rest into reads.
    let Some((&first, input)) = data.split_first() else {
        return;
    };
    let head_request = first & 1 == 1;
    let step = usize::from(first >> 1) + 1;
    let pieces: Vec<&[u8]> = input.chunks(step).collect();

    let whole = parse_response(&[input], head_request);
    let cut = parse_response(&pieces, head_request);
    match (&whole, &cut) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the same response read in {step}-byte pieces"),
        (Err(_), Err(_)) => {}
        _ => panic!("read whole: {whole:?}; in {step}-byte pieces: {cut:?}"),
    }
    let Ok(r) = whole else {
        return;
    };
    assert!(r.body.len() <= input.len(), "more body than input");
    let length = r
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    let bodiless = head_request || r.status.is_informational() || [204, 304].contains(&r.status.as_u16());
    if let Some(n) = length
        && !bodiless
        && r.reusable
    {
        assert_eq!(r.body.len(), n, "a reusable length-delimited response");
    }
    if r.reusable {
        assert!(
            r.headers.get("connection").is_none() && r.headers.get("transfer-encoding").is_none(),
            "hop-by-hop fields reached the app"
        );
    }
});
