//! Which requests are a caller's retries, by the three headers that say so:
//! `x-tollgate-attempt` (a caller's tollgate; 1 for the first try) >= 2,
//! `grpc-previous-rpc-attempts` (a gRPC client's own retry policy; 0 for the first
//! try) >= 1, and `x-envoy-attempt-count` (Envoy; 1 for the first try) >= 2; and which
//! are the kubelet's probes (a GET with `User-Agent: kube-probe/...`), never shed, at a
//! cost to nobody ([`ProbeSlots`]).
//!
//! The counts are read strictly: one to nine ASCII digits and nothing else (no sign,
//! space, fraction or unit). A value that is not a count says nothing, and the request
//! is not taken for a retry by it: a caller gains nothing by sending a malformed value
//! it could as well leave out.

use std::sync::atomic::{AtomicUsize, Ordering::*};

use http::header::{HeaderName, USER_AGENT};
use http::{HeaderMap, Method};

use crate::server::Admission;

use crate::contract::headers::ATTEMPT_HEADER;

pub use crate::contract::markers::{ENVOY_ATTEMPT_COUNT, GRPC_PREVIOUS_ATTEMPTS, parse_count};

/// The first value of each header that makes a request a retry.
const RETRY_FROM: [(HeaderName, u32); 3] = [
    (ATTEMPT_HEADER, 2),
    (GRPC_PREVIOUS_ATTEMPTS, 1),
    (ENVOY_ATTEMPT_COUNT, 2),
];

/// Whether the request is a caller's retry. A caller's tollgate says it with
/// `x-tollgate-attempt`, which it writes itself on every attempt (removing whatever its
/// app sent): when present, it alone decides, and an app's own `x-envoy-attempt-count` or
/// `grpc-previous-rpc-attempts` that its tollgate passed on does not make a first attempt
/// a retry. Without it, any value of either other header says so.
pub fn is_retry(headers: &HeaderMap) -> bool {
    // One pass over the fields (a request has a few), not a look-up for each of three
    // names that are nearly never there; a name is compared only at its length.
    let [
        (attempt, from_attempt),
        (grpc, from_grpc),
        (envoy, from_envoy),
    ] = &RETRY_FROM;
    let counts =
        |v: &http::HeaderValue, from: u32| parse_count(v.as_bytes()).is_some_and(|n| n >= from);
    let mut tollgate = None;
    let mut others = false;
    for (name, value) in headers {
        let name = name.as_str();
        if name.len() == attempt.as_str().len() && name == attempt.as_str() {
            tollgate = Some(tollgate == Some(true) || counts(value, *from_attempt));
        } else if (name.len() == grpc.as_str().len()
            && name == grpc.as_str()
            && counts(value, *from_grpc))
            || (name.len() == envoy.as_str().len()
                && name == envoy.as_str()
                && counts(value, *from_envoy))
        {
            others = true;
        }
    }
    tollgate.unwrap_or(others)
}

/// The caller's attempt number (1 for the first try), as the first of the three headers
/// that carries a count says it: for a trace, which says nothing about admission.
pub fn attempt_number(headers: &HeaderMap) -> Option<u32> {
    RETRY_FROM.iter().find_map(|(name, from)| {
        let n = parse_count(headers.get(name)?.as_bytes())?;
        // gRPC counts the attempts before this one.
        Some(if *from == 1 { n.saturating_add(1) } else { n })
    })
}

/// Whether the request says it is the kubelet's probe: a GET with
/// `User-Agent: kube-probe/...`, for one of `paths` when any are listed. Anyone can say
/// so: what a probe is spared must cost nobody ([`ProbeSlots`]).
pub fn is_kube_probe(method: &Method, path: &str, headers: &HeaderMap, paths: &[String]) -> bool {
    method == Method::GET
        && headers
            .get(USER_AGENT)
            .is_some_and(|v| v.as_bytes().starts_with(b"kube-probe/"))
        && (paths.is_empty() || paths.iter().any(|p| p == path))
}

/// Kubelet probes spared from shedding at once. A probe must not fail because the app is
/// busy (the kubelet would restart a working pod), but a `User-Agent` proves nothing: so
/// an exempt probe holds no place in the concurrency limit (it sheds no other request),
/// and at most [`EXEMPT_PROBES`] are exempt at once; more go through normal admission.
#[derive(Debug, Default)]
pub struct ProbeSlots {
    taken: AtomicUsize,
}

/// The most probes exempt from shedding at once.
pub const EXEMPT_PROBES: usize = 8;

impl ProbeSlots {
    /// Takes an exempt place, if one is free.
    pub fn try_take(&self) -> bool {
        self.taken
            .fetch_update(AcqRel, Acquire, |n| (n < EXEMPT_PROBES).then_some(n + 1))
            .is_ok()
    }

    pub fn taken(&self) -> usize {
        self.taken.load(Acquire)
    }
}

/// An exempt probe has its answer's head: its place is free.
impl Admission for ProbeSlots {
    fn leave(&self) {
        self.taken.fetch_sub(1, AcqRel);
    }

    fn finished(&self, _took: std::time::Duration) {}
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn headers(pairs: &[(&HeaderName, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append((*name).clone(), HeaderValue::from_bytes(value).unwrap());
        }
        h
    }

    #[test]
    fn each_header_says_retry_from_its_own_first_count() {
        for (name, from) in &RETRY_FROM {
            for n in 0..5u32 {
                let h = headers(&[(name, n.to_string().as_bytes())]);
                assert_eq!(is_retry(&h), n >= *from, "{name}: {n}");
            }
        }
        assert!(!is_retry(&HeaderMap::new()), "no header: a first attempt");
        let both = headers(&[(&ATTEMPT_HEADER, b"1"), (&ENVOY_ATTEMPT_COUNT, b"3")]);
        assert!(
            !is_retry(&both),
            "a caller's tollgate decides: an app's own marker it passed on does not"
        );
        let both = headers(&[(&ATTEMPT_HEADER, b"2"), (&GRPC_PREVIOUS_ATTEMPTS, b"0")]);
        assert!(is_retry(&both));
    }

    #[test]
    fn a_value_that_is_not_a_count_says_nothing() {
        for bad in [
            &b""[..],
            b" 2",
            b"2 ",
            b"+2",
            b"-2",
            b"2.0",
            b"2e0",
            b"0x2",
            b"1234567890",
            b"two",
            b"\xff",
        ] {
            assert_eq!(parse_count(bad), None, "{bad:?}");
        }
        assert_eq!(parse_count(b"007"), Some(7));
        assert_eq!(parse_count(b"999999999"), Some(999_999_999));
        let h = headers(&[(&ATTEMPT_HEADER, b"1"), (&ATTEMPT_HEADER, b"x")]);
        assert!(!is_retry(&h));
        let h = headers(&[(&ATTEMPT_HEADER, b"x"), (&ATTEMPT_HEADER, b"4")]);
        assert!(is_retry(&h), "another value of the header says retry");
    }

    #[test]
    fn only_the_kubelets_get_of_a_probe_path_is_a_probe() {
        let ua = HeaderName::from_static("user-agent");
        let probe = |method: &Method, path: &str, h: &HeaderMap, paths: &[&str]| {
            let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
            is_kube_probe(method, path, h, &paths)
        };
        let kubelet = headers(&[(&ua, b"kube-probe/1.31")]);
        assert!(probe(&Method::GET, "/x", &kubelet, &[]));
        assert!(!probe(&Method::POST, "/x", &kubelet, &[]));
        assert!(probe(&Method::GET, "/healthz", &kubelet, &["/healthz"]));
        assert!(!probe(&Method::GET, "/slow", &kubelet, &["/healthz"]));
        assert!(!probe(
            &Method::GET,
            "/x",
            &headers(&[(&ua, b"curl/8.5.0")]),
            &[]
        ));
        let other = headers(&[(&ua, b"not-kube-probe/1.31")]);
        assert!(!probe(&Method::GET, "/x", &other, &[]));
        assert!(!probe(&Method::GET, "/x", &HeaderMap::new(), &[]));
    }

    #[test]
    fn at_most_eight_probes_are_exempt_at_once() {
        let slots = ProbeSlots::default();
        for _ in 0..EXEMPT_PROBES {
            assert!(slots.try_take());
        }
        assert!(!slots.try_take());
        slots.leave();
        assert!(slots.try_take());
        assert_eq!(slots.taken(), EXEMPT_PROBES);
    }

    /// What a count is, said another way: the text of a number below a billion.
    fn model(value: &[u8]) -> Option<u32> {
        let s = std::str::from_utf8(value).ok()?;
        if s.is_empty() || s.len() > 9 || s.starts_with('+') {
            return None;
        }
        s.parse::<u32>().ok()
    }

    fn header_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            (0u32..1_000_000_000).prop_map(|n| n.to_string().into_bytes()),
            (0u32..20).prop_map(|n| format!("{n:0>3}").into_bytes()),
            "[0-9+ .a-z-]{0,12}".prop_map(String::into_bytes),
            prop::collection::vec(0x20u8..0x7f, 0..12),
        ]
    }

    proptest! {
        #[test]
        fn parse_count_is_exactly_a_decimal_number(value in header_value()) {
            prop_assert_eq!(parse_count(&value), model(&value));
        }

        #[test]
        fn a_count_reads_back_as_written(n in 0u32..1_000_000_000) {
            prop_assert_eq!(parse_count(n.to_string().as_bytes()), Some(n));
        }

        /// A request is a retry exactly when one of its values of `x-tollgate-attempt`
        /// is a count of 2 or more; without that header, when one of the others' values
        /// is a count at or above that header's first retry.
        #[test]
        fn is_retry_follows_the_three_rules(
            values in prop::collection::vec((0usize..4, header_value()), 0..6),
        ) {
            let names = [
                ATTEMPT_HEADER,
                GRPC_PREVIOUS_ATTEMPTS,
                ENVOY_ATTEMPT_COUNT,
                HeaderName::from_static("x-other"),
            ];
            let mut h = HeaderMap::new();
            let (mut ours, mut theirs, mut tollgate_said) = (false, false, false);
            for (i, v) in &values {
                let Ok(value) = HeaderValue::from_bytes(v) else { continue };
                h.append(names[*i].clone(), value);
                let from = [2, 1, 2, u32::MAX][*i];
                let says = model(v).is_some_and(|n| n >= from);
                if *i == 0 {
                    tollgate_said = true;
                    ours |= says;
                } else {
                    theirs |= says;
                }
            }
            let want = if tollgate_said { ours } else { theirs };
            prop_assert_eq!(is_retry(&h), want);
        }
    }
}
