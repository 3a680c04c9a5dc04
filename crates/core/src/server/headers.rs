//! A request's headers, read and cleaned in one pass, at the outbound hop and at the
//! inbound side alike: the caller's deadline, whether it is a gRPC call and whether its
//! client marked it as a retry are read; hop-by-hop headers (RFC 9110 section 7.6.1),
//! the accepted deadline headers and every `x-tollgate-*` header go: each attempt writes
//! its own `x-tollgate-attempt` (and `x-tollgate-hedge`), and one the app sent would make
//! the callee count a first attempt as a retry. A request passed through as it is loses
//! its hop-by-hop headers alone.
//!
//! Almost no request carries any of them, so the headers are read once and changed
//! only where something was found: removing a header that is not there still costs a
//! hash and a probe, and it would be a dozen per request.

use std::time::Duration;

use http::HeaderValue;
use http::header::{self, HeaderMap, HeaderName};

use crate::contract::dedupe::StoreId;
use crate::contract::headers::DEDUPE_STORE_HEADER;
use crate::contract::markers::marks_retry;
use crate::http::fields::{has_token, is_hop_by_hop, strip_hop_by_hop};

/// What a request's headers say, read in one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// The caller's deadline: the smallest valid value among the accepted headers.
    pub caller_timeout: Option<Duration>,
    /// A gRPC call: its deadline travels as `grpc-timeout` too.
    pub grpc: bool,
    /// An HTTP/1.1 upgrade: `Connection: upgrade` and `Upgrade` were kept.
    pub upgrade: bool,
    /// Its HTTP client counts it as a retry ([`crate::contract::markers`]).
    pub retry_marker: bool,
    /// The dedupe store a caller's retry is meant for (`x-tollgate-dedupe-store`), read
    /// before tollgate's own headers go.
    pub dedupe_store: Option<StoreId>,
}

/// Reads what the request says and cleans it for the upstream: hop-by-hop headers go,
/// and so do the accepted deadline headers and every `x-tollgate-*` header (each
/// attempt writes its own).
///
/// With `http1` (an HTTP/1.1 request), `Connection: upgrade` with an `Upgrade` keeps
/// both for this exchange (a WebSocket handshake, say): an upgrade is end to end.
pub fn prepare_request(
    headers: &mut HeaderMap,
    accept: &[HeaderName],
    http1: bool,
) -> RequestFacts {
    let mut facts = RequestFacts::default();
    let (mut hop, mut deadline) = (false, false);
    let mut own: Vec<HeaderName> = Vec::new();
    let mut upgrade = None;
    let (mut asks_upgrade, mut typed, mut te_trailers) = (false, false, false);
    for (name, value) in headers.iter() {
        if *name == header::CONTENT_TYPE {
            // The first, as a lookup by name would read it.
            facts.grpc |= !typed && value.as_bytes().starts_with(b"application/grpc");
            typed = true;
        } else if *name == header::TE && !te_trailers && value.as_bytes() == b"trailers" {
            // What every gRPC client sends, and the one `TE` that goes on as it is: by
            // itself, nothing to strip.
            te_trailers = true;
        } else if is_hop_by_hop(name) {
            hop = true;
            if *name == header::UPGRADE {
                upgrade = Some(value.clone());
            } else if *name == header::CONNECTION {
                asks_upgrade |= has_token(value.as_bytes(), b"upgrade");
            }
        } else if is_own(name) {
            if !own.contains(name) {
                own.push(name.clone());
            }
            if *name == DEDUPE_STORE_HEADER {
                facts.dedupe_store = Some(StoreId::named(value.as_bytes()));
            }
        } else if accept.contains(name) {
            deadline = true;
            if let Some(d) = crate::deadline::parse_header(name, value) {
                facts.caller_timeout = Some(facts.caller_timeout.map_or(d, |b| b.min(d)));
            }
        } else {
            facts.retry_marker |= marks_retry(name, value);
        }
    }
    if hop {
        strip_hop_by_hop(headers);
    }
    if let Some(protocol) = upgrade.filter(|_| http1 && asks_upgrade) {
        headers.insert(header::UPGRADE, protocol);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        facts.upgrade = true;
    }
    if deadline {
        for name in accept {
            headers.remove(name);
        }
    }
    for name in &own {
        headers.remove(name);
    }
    facts
}

/// A header of tollgate's own (`x-tollgate-*`): only tollgate writes them on a request.
fn is_own(name: &HeaderName) -> bool {
    name.as_str().starts_with("x-tollgate-")
}

/// Cleans a request that is passed through as it is: only its hop-by-hop headers go
/// (an HTTP/1.1 upgrade's kept, as [`prepare_request`] keeps them), and nothing of
/// tollgate's is read or taken out. Whether it is an upgrade.
pub fn strip_for_passing(headers: &mut HeaderMap, http1: bool) -> bool {
    if !headers.keys().any(is_hop_by_hop) {
        return false;
    }
    let asks_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| has_token(v.as_bytes(), b"upgrade"));
    let protocol = headers
        .get(header::UPGRADE)
        .filter(|_| http1 && asks_upgrade)
        .cloned();
    strip_hop_by_hop(headers);
    let Some(protocol) = protocol else {
        return false;
    };
    headers.insert(header::UPGRADE, protocol);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::testing::fields;

    #[test]
    fn one_pass_reads_the_deadline_and_grpc_and_cleans_up() {
        let accept = [
            HeaderName::from_static("x-timeout-ms"),
            crate::deadline::GRPC_TIMEOUT,
        ];
        let mut h = fields(&[
            ("x-timeout-ms", "900"),
            ("grpc-timeout", "250m"),
            ("content-type", "application/grpc+proto"),
            ("x-tollgate-attempt", "7"),
            ("x-tollgate-hedge", "1"),
            ("x-tollgate-hedge", "1"),
            ("x-tollgate-outcome", "ok"),
            ("x-envoy-attempt-count", "3"),
            ("connection", "keep-alive"),
            ("x-app", "kept"),
        ]);
        let facts = prepare_request(&mut h, &accept, true);
        assert_eq!(facts.caller_timeout, Some(Duration::from_millis(250)));
        assert!(facts.grpc);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        // Another proxy's words pass on; only tollgate writes tollgate's.
        assert_eq!(left, ["content-type", "x-app", "x-envoy-attempt-count"]);

        let mut marked = fields(&[("x-envoy-attempt-count", "2")]);
        assert!(prepare_request(&mut marked, &accept, true).retry_marker);
        assert_eq!(marked.len(), 1, "a marker goes on as it came");

        let mut plain = fields(&[("accept", "*/*")]);
        assert_eq!(
            prepare_request(&mut plain, &accept, true),
            RequestFacts::default()
        );
        assert_eq!(plain.len(), 1);
    }

    #[test]
    fn an_http1_upgrade_keeps_its_fields_and_nothing_else_does() {
        let ws = || {
            fields(&[
                ("connection", "keep-alive, Upgrade"),
                ("upgrade", "websocket"),
                ("keep-alive", "timeout=5"),
            ])
        };
        let mut h = ws();
        assert!(prepare_request(&mut h, &[], true).upgrade);
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["upgrade"], "websocket");
        assert!(h.get("keep-alive").is_none());

        let mut h = ws();
        assert!(
            !prepare_request(&mut h, &[], false).upgrade,
            "HTTP/2 has none"
        );
        assert!(h.is_empty());
        let mut h = ws();
        h.insert("connection", HeaderValue::from_static("keep-alive"));
        assert!(
            !prepare_request(&mut h, &[], true).upgrade,
            "Upgrade alone asks nothing"
        );
        assert!(h.is_empty());
    }

    #[test]
    fn te_goes_on_only_as_trailers() {
        fn cleaned(pairs: &[(&'static str, &'static str)]) -> Vec<(String, String)> {
            let mut h = fields(pairs);
            prepare_request(&mut h, &[], false);
            let mut left: Vec<(String, String)> = h
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_string()))
                .collect();
            left.sort();
            left
        }
        fn kept(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        }
        // A gRPC call's `te: trailers` goes on untouched.
        let grpc = [("content-type", "application/grpc"), ("te", "trailers")];
        assert_eq!(cleaned(&grpc), kept(&grpc));
        // Anything else of TE is cut back to `trailers`, or goes.
        assert_eq!(
            cleaned(&[("te", "trailers"), ("te", "trailers")]),
            kept(&[("te", "trailers")])
        );
        assert_eq!(
            cleaned(&[("te", "gzip, trailers")]),
            kept(&[("te", "trailers")])
        );
        assert_eq!(cleaned(&[("te", "gzip")]), kept(&[]));
        // A field `Connection` names goes, `te: trailers` stays.
        assert_eq!(
            cleaned(&[
                ("te", "trailers"),
                ("connection", "te, x-hop"),
                ("x-hop", "1")
            ]),
            kept(&[("te", "trailers")])
        );
    }

    #[test]
    fn passing_drops_only_the_hop_by_hop_fields() {
        let mut h = fields(&[
            ("x-timeout-ms", "900"),
            ("x-tollgate-attempt", "2"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("proxy-authorization", "Basic x"),
        ]);
        assert!(!strip_for_passing(&mut h, true));
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["x-timeout-ms", "x-tollgate-attempt"]);

        let mut up = fields(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert!(strip_for_passing(&mut up.clone(), true));
        assert!(!strip_for_passing(&mut up, false), "no upgrade over HTTP/2");
        assert!(up.is_empty());
    }
}
