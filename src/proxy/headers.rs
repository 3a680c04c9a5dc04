//! Header hygiene at the hop: hop-by-hop headers (RFC 9110 section 7.6.1) belong to one
//! connection and are removed in both directions, including every header the
//! `Connection` header names. `TE: trailers` is kept: gRPC needs it end to end.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers in place.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers listed in `Connection` are hop-by-hop too.
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
            .collect();
        for name in named {
            if name != header::TE {
                headers.remove(name);
            }
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if let Some(te) = headers.get(header::TE) {
        if !te.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
        }) {
            headers.remove(header::TE);
        } else if te.as_bytes() != b"trailers" {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }
}

/// Whether a request is a gRPC call (its deadline travels as `grpc-timeout` too).
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
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
}
