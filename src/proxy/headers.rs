//! Header hygiene at the hop: hop-by-hop headers (RFC 9110 section 7.6.1) belong to one
//! connection and are removed in both directions, including every header the
//! `Connection` header names. `TE: trailers` is kept: gRPC needs it end to end.
//!
//! Almost no request carries a hop-by-hop header, so the headers are read once, in one
//! pass, and changed only where something was found: removing a header that is not
//! there still costs a hash and a probe, and it would be a dozen per request.

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::retry::policy::ATTEMPT_HEADER;

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

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || *name == header::TE
}

/// Whether a `Connection` value names headers of its own, beyond `keep-alive` and
/// `close` (which name nothing outside the usual set).
pub fn names_others(value: &[u8]) -> bool {
    value.split(|b| *b == b',').any(|t| {
        let t = t.trim_ascii();
        !t.eq_ignore_ascii_case(b"keep-alive") && !t.eq_ignore_ascii_case(b"close")
    })
}

/// Removes hop-by-hop headers, if there are any.
pub fn strip(headers: &mut HeaderMap) {
    if headers.keys().any(is_hop_by_hop) {
        strip_hop_by_hop(headers);
    }
}

/// What a request's headers say, read in one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// The caller's deadline: the smallest valid value among the accepted headers.
    pub caller_timeout: Option<Duration>,
    /// A gRPC call: its deadline travels as `grpc-timeout` too.
    pub grpc: bool,
}

/// Reads what the request says and cleans it for the upstream: hop-by-hop headers go,
/// and so do the accepted deadline headers and any `x-tollgate-attempt` (each attempt
/// writes its own).
pub fn prepare_request(headers: &mut HeaderMap, accept: &[HeaderName]) -> RequestFacts {
    let mut facts = RequestFacts::default();
    let (mut hop, mut deadline, mut attempt) = (false, false, false);
    for (name, value) in headers.iter() {
        if *name == header::CONTENT_TYPE {
            facts.grpc = value.as_bytes().starts_with(b"application/grpc");
        } else if is_hop_by_hop(name) {
            hop = true;
        } else if *name == ATTEMPT_HEADER {
            attempt = true;
        } else if accept.contains(name) {
            deadline = true;
            if let Some(d) = crate::deadline::parse_header(name, value) {
                facts.caller_timeout = Some(facts.caller_timeout.map_or(d, |b| b.min(d)));
            }
        }
    }
    if hop {
        strip_hop_by_hop(headers);
    }
    if deadline {
        for name in accept {
            headers.remove(name);
        }
    }
    if attempt {
        headers.remove(&ATTEMPT_HEADER);
    }
    facts
}

/// Removes hop-by-hop headers in place, touching only those present.
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
    // Headers listed in `Connection` are hop-by-hop too.
    if connection_names {
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
    fn one_pass_reads_the_deadline_and_grpc_and_cleans_up() {
        let accept = [
            HeaderName::from_static("x-timeout-ms"),
            crate::deadline::GRPC_TIMEOUT,
        ];
        let mut h = HeaderMap::new();
        h.insert("x-timeout-ms", HeaderValue::from_static("900"));
        h.insert("grpc-timeout", HeaderValue::from_static("250m"));
        h.insert(
            "content-type",
            HeaderValue::from_static("application/grpc+proto"),
        );
        h.insert("x-tollgate-attempt", HeaderValue::from_static("7"));
        h.insert("connection", HeaderValue::from_static("keep-alive"));
        h.insert("x-app", HeaderValue::from_static("kept"));
        let facts = prepare_request(&mut h, &accept);
        assert_eq!(facts.caller_timeout, Some(Duration::from_millis(250)));
        assert!(facts.grpc);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["content-type", "x-app"]);

        let mut plain = HeaderMap::new();
        plain.insert("accept", HeaderValue::from_static("*/*"));
        assert_eq!(
            prepare_request(&mut plain, &accept),
            RequestFacts::default()
        );
        assert_eq!(plain.len(), 1);
    }

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
