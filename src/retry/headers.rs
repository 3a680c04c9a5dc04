//! tollgate's own headers, by which the hops of a chain tell each other what happened:
//! the attempt number an upstream receives, and the attempt count and outcome the app
//! receives. Names and the values written on every request, made without formatting.

use http::{HeaderName, HeaderValue, StatusCode};

use crate::metrics::Outcome;
use crate::upstream::response::Fields;

/// Why tollgate stopped, on a response it made or a failure it gave up on.
pub const OUTCOME_HEADER: HeaderName = HeaderName::from_static("x-tollgate-outcome");
/// Which attempt this is: 1 for the first try (tollgate -> upstream).
pub const ATTEMPT_HEADER: HeaderName = HeaderName::from_static("x-tollgate-attempt");
/// How many attempts the response took (tollgate -> app).
pub const ATTEMPTS_HEADER: HeaderName = HeaderName::from_static("x-tollgate-attempts");
/// On an attempt sent beside another one still running (tollgate -> upstream).
pub const HEDGE_HEADER: HeaderName = HeaderName::from_static("x-tollgate-hedge");
/// The value of [`HEDGE_HEADER`].
pub const HEDGE_VALUE: HeaderValue = HeaderValue::from_static("1");
/// On every answer of a callee's inbound side while `[inbound.dedupe]` is on (callee ->
/// caller): keyed requests run there once; which header carries the key, and where the
/// keys are remembered ([`DedupeAdvert`]).
pub const DEDUPE_HEADER: HeaderName = HeaderName::from_static("x-tollgate-dedupe");
/// On a retry that may only run where the attempt before it may have run (caller ->
/// callee): the store ID that callee named, which must still be its own.
pub const DEDUPE_STORE_HEADER: HeaderName = HeaderName::from_static("x-tollgate-dedupe-store");
/// `true` on an answer a callee's dedupe replayed from its store.
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");
pub use crate::http::grpc::{GRPC_PUSHBACK, GRPC_STATUS};

/// Where a callee remembers its keys, as its `x-tollgate-dedupe` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DedupeScope {
    /// A store every replica shares (Redis): a retry may go to any of them.
    Shared,
    /// This replica's memory, named by an ID that changes at every process start: a
    /// retry of a request that may have run must go back to it, carrying the ID.
    Replica(StoreId),
}

/// A memory store's name: random, never 0, written as 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StoreId(u64);

impl StoreId {
    /// A new random ID.
    pub fn random() -> StoreId {
        StoreId(fastrand::u64(1..))
    }

    /// The ID of `text` (16 hex digits, as [`StoreId::value`] writes it).
    pub fn parse(text: &[u8]) -> Option<StoreId> {
        if text.len() != 16 {
            return None;
        }
        let s = std::str::from_utf8(text).ok()?;
        u64::from_str_radix(s, 16)
            .ok()
            .filter(|n| *n != 0)
            .map(StoreId)
    }

    /// The store `text` names: its ID, or, when it is no ID, one that names no store
    /// (0, never any store's).
    pub fn named(text: &[u8]) -> StoreId {
        StoreId::parse(text).unwrap_or(StoreId(0))
    }

    /// As `x-tollgate-dedupe-store` carries it.
    pub fn value(self) -> HeaderValue {
        let text = format!("{:016x}", self.0);
        // Hex digits are always a valid value.
        HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("0"))
    }
}

/// What a callee's `x-tollgate-dedupe` says: `on; header=NAME; scope=shared`, or `on;
/// header=NAME; scope=replica; store=ID`. Both sides speak it from here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DedupeAdvert {
    /// The header the callee reads a key from.
    pub header: HeaderName,
    pub scope: DedupeScope,
}

impl DedupeAdvert {
    /// The field's value, as the callee writes it.
    pub fn to_value(&self) -> String {
        match self.scope {
            DedupeScope::Shared => format!("on; header={}; scope=shared", self.header),
            DedupeScope::Replica(id) => format!(
                "on; header={}; scope=replica; store={:016x}",
                self.header, id.0
            ),
        }
    }

    /// Where keys sent in `own` are deduplicated, by what `value` says: `None` unless
    /// it is on, names `own` as its header (a callee reading another header sees no
    /// key at all), and says where it keeps them.
    pub fn scope_for(value: &[u8], own: &HeaderName) -> Option<DedupeScope> {
        let mut parts = value.split(|b| *b == b';').map(<[u8]>::trim_ascii);
        if parts.next()? != b"on" {
            return None;
        }
        let (mut header, mut scope, mut store) = (None, None, None);
        for part in parts {
            let Some(eq) = part.iter().position(|b| *b == b'=') else {
                continue;
            };
            let (name, v) = (part[..eq].trim_ascii(), part[eq + 1..].trim_ascii());
            match name {
                b"header" => header = Some(v),
                b"scope" => scope = Some(v),
                b"store" => store = Some(v),
                _ => {}
            }
        }
        if !header?.eq_ignore_ascii_case(own.as_str().as_bytes()) {
            return None;
        }
        match scope? {
            b"shared" => Some(DedupeScope::Shared),
            b"replica" => Some(DedupeScope::Replica(StoreId::parse(store?)?)),
            _ => None,
        }
    }
}

/// Counts up to 10, as header values, so no attempt formats its number.
static COUNT_VALUES: [HeaderValue; 10] = [
    HeaderValue::from_static("1"),
    HeaderValue::from_static("2"),
    HeaderValue::from_static("3"),
    HeaderValue::from_static("4"),
    HeaderValue::from_static("5"),
    HeaderValue::from_static("6"),
    HeaderValue::from_static("7"),
    HeaderValue::from_static("8"),
    HeaderValue::from_static("9"),
    HeaderValue::from_static("10"),
];

/// A count as a header value.
pub fn count_value(n: u32) -> HeaderValue {
    match COUNT_VALUES.get((n as usize).wrapping_sub(1)) {
        Some(v) => v.clone(),
        None => HeaderValue::from(n),
    }
}

/// `x-tollgate-attempts: N` as a whole head line, for counts up to 16 (a request
/// makes at most 10 attempts); made once.
pub fn attempts_line(n: u32) -> Option<&'static str> {
    static LINES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let lines = LINES.get_or_init(|| {
        (1..=16)
            .map(|i| format!("{}: {i}", ATTEMPTS_HEADER.as_str()))
            .collect()
    });
    lines.get((n as usize).wrapping_sub(1)).map(String::as_str)
}

/// `x-tollgate-outcome: OUTCOME` as a whole head line; made once.
pub fn outcome_line(o: Outcome) -> &'static str {
    static LINES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let lines = LINES.get_or_init(|| {
        Outcome::ALL
            .iter()
            .map(|o| format!("{}: {}", OUTCOME_HEADER.as_str(), o.as_str()))
            .collect()
    });
    Outcome::ALL
        .iter()
        .position(|x| *x == o)
        .and_then(|i| lines.get(i))
        .map_or("", String::as_str)
}

/// `x-tollgate-outcome:` with no value: in the fields a hop adds to an HTTP/1.1 head,
/// it drops the response's own field of that name and writes nothing.
pub const OUTCOME_REMOVED_LINE: &str = "x-tollgate-outcome:";

/// What another tollgate's `x-tollgate-outcome` on a response means to this one: the
/// ownership rule and its closed list of exceptions, read once per response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callee {
    /// No outcome: the endpoint's own answer.
    Silent,
    /// An outcome on a `1xx`-`3xx` response that is not a gRPC answer: no tollgate
    /// sends one there, so it is removed and means nothing.
    Stray,
    /// Another tollgate owned the failure (retried it, or deliberately did not): it
    /// passes straight back. An outcome this build does not know counts as owned, as
    /// `ok` in the metrics.
    Owned(Outcome),
    /// A callee's inbound side could not reach its app (`app-unreachable`): that
    /// endpoint's connect failure or reset.
    AppUnreachable,
    /// A callee's inbound side waited for its app until the deadline (`app-timeout`):
    /// that endpoint's timeout.
    AppTimeout,
    /// A callee's dedupe still runs the same keyed request (`in-progress`): a retry
    /// joins it, so it is retried like a `503`.
    InProgress,
}

impl Callee {
    /// Reads the response's outcome, if any.
    #[inline]
    pub fn of(status: StatusCode, fields: Fields<'_>) -> Callee {
        let Some(v) = fields.get(&OUTCOME_HEADER) else {
            return Callee::Silent;
        };
        // tollgate's own gRPC answers are HTTP 200 with their status in the head.
        if status.as_u16() < 400 && !fields.contains(&GRPC_STATUS) {
            return Callee::Stray;
        }
        match known(v) {
            Some(Outcome::AppUnreachable) => Callee::AppUnreachable,
            Some(Outcome::AppTimeout) => Callee::AppTimeout,
            Some(Outcome::InProgress) => Callee::InProgress,
            o => Callee::Owned(o.unwrap_or(Outcome::Ok)),
        }
    }

    /// Another tollgate owned it: no retry, and it passes back as it came.
    pub fn owned(self) -> bool {
        matches!(self, Callee::Owned(_))
    }

    /// The outcome the response goes back to the app with when this tollgate adds none
    /// of its own (`ok` for a silent or stray one).
    pub fn outcome(self) -> Outcome {
        match self {
            Callee::Silent | Callee::Stray => Outcome::Ok,
            Callee::Owned(o) => o,
            Callee::AppUnreachable => Outcome::AppUnreachable,
            Callee::AppTimeout => Outcome::AppTimeout,
            Callee::InProgress => Outcome::InProgress,
        }
    }

    /// Whether the response says its endpoint failed, for outlier ejection: a 5xx of
    /// the endpoint's own (no outcome), another tollgate shedding load in front of it
    /// (`overloaded`), or a callee's inbound side that could not get an answer from its
    /// app. Any other outcome is another layer's verdict, not the endpoint's fault.
    pub fn endpoint_failed(self, status: StatusCode) -> bool {
        match self {
            Callee::Silent => status.is_server_error(),
            Callee::Owned(o) => o == Outcome::Overloaded,
            Callee::AppUnreachable | Callee::AppTimeout => true,
            Callee::Stray | Callee::InProgress => false,
        }
    }
}

/// The outcome an `x-tollgate-outcome` value names, if this build knows it.
fn known(v: &[u8]) -> Option<Outcome> {
    Outcome::ALL
        .iter()
        .copied()
        .find(|o| o.as_str().as_bytes() == v)
}

/// Whether a callee's inbound side refused the attempt from its fleet-wide retry
/// budget (`503` with `x-tollgate-outcome: retry-rejected`).
pub fn refused_as_retry(status: StatusCode, fields: Fields<'_>) -> bool {
    status == StatusCode::SERVICE_UNAVAILABLE
        && fields.get(&OUTCOME_HEADER) == Some(Outcome::RetryRejected.as_str().as_bytes())
}

/// The outcome another tollgate put on a response, for our own metrics (`ok` when it
/// carries none, or one that means nothing on its status).
pub fn outcome_of(status: StatusCode, fields: Fields<'_>) -> Outcome {
    Callee::of(status, fields).outcome()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn callee(status: u16, pairs: &[(&'static str, &'static str)]) -> Callee {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        Callee::of(StatusCode::from_u16(status).unwrap(), (&h).into())
    }

    #[test]
    fn the_ownership_rule_and_its_exceptions() {
        let outcome = |v| [("x-tollgate-outcome", v)];
        assert_eq!(callee(503, &[]), Callee::Silent);
        assert_eq!(
            callee(503, &outcome("attempts-exhausted")),
            Callee::Owned(Outcome::AttemptsExhausted)
        );
        assert_eq!(
            callee(503, &outcome("overloaded")),
            Callee::Owned(Outcome::Overloaded)
        );
        assert_eq!(
            callee(503, &outcome("from-the-future")),
            Callee::Owned(Outcome::Ok),
            "an outcome this build does not know is still owned"
        );
        assert_eq!(
            callee(502, &outcome("app-unreachable")),
            Callee::AppUnreachable
        );
        assert_eq!(callee(504, &outcome("app-timeout")), Callee::AppTimeout);
        assert_eq!(callee(409, &outcome("in-progress")), Callee::InProgress);
        for status in [101, 200, 204, 302] {
            assert_eq!(callee(status, &outcome("budget-exhausted")), Callee::Stray);
        }
        // A trailers-only gRPC answer is HTTP 200: its outcome counts.
        assert_eq!(
            callee(
                200,
                &[
                    ("grpc-status", "14"),
                    ("x-tollgate-outcome", "app-unreachable")
                ]
            ),
            Callee::AppUnreachable
        );
        assert_eq!(
            callee(
                200,
                &[("grpc-status", "8"), ("x-tollgate-outcome", "throttled")]
            ),
            Callee::Owned(Outcome::Throttled)
        );
        assert!(!callee(502, &outcome("app-unreachable")).owned());
        assert!(callee(502, &outcome("app-unreachable")).endpoint_failed(StatusCode::BAD_GATEWAY));
        assert!(
            !callee(503, &outcome("budget-exhausted"))
                .endpoint_failed(StatusCode::SERVICE_UNAVAILABLE)
        );
        assert!(!callee(409, &outcome("in-progress")).endpoint_failed(StatusCode::CONFLICT));
    }

    #[test]
    fn a_dedupe_advert_counts_only_for_the_header_it_names() {
        let own = HeaderName::from_static("idempotency-key");
        let id = StoreId::random();
        for scope in [DedupeScope::Shared, DedupeScope::Replica(id)] {
            let advert = DedupeAdvert {
                header: own.clone(),
                scope,
            };
            let value = advert.to_value();
            assert_eq!(DedupeAdvert::scope_for(value.as_bytes(), &own), Some(scope));
            let other = HeaderName::from_static("x-idempotency-key");
            assert_eq!(DedupeAdvert::scope_for(value.as_bytes(), &other), None);
        }
        let read = |v: &str| DedupeAdvert::scope_for(v.as_bytes(), &own);
        assert_eq!(read("on"), None, "no header named: nothing to trust");
        assert_eq!(read("on; header=idempotency-key"), None, "no scope");
        assert_eq!(
            read("on;header=Idempotency-Key ;scope=shared"),
            Some(DedupeScope::Shared)
        );
        assert_eq!(read("on; header=idempotency-key; scope=replica"), None);
        assert_eq!(
            read("on; header=idempotency-key; scope=replica; store=xyz"),
            None
        );
        assert_eq!(
            read("on; header=idempotency-key; scope=replica; store=0000000000000000"),
            None
        );
        assert_eq!(read("off; header=idempotency-key; scope=shared"), None);
        assert_eq!(
            StoreId::parse(id.value().as_bytes()),
            Some(id),
            "the ID reads back"
        );
    }

    #[test]
    fn head_lines_are_the_header_and_its_value() {
        assert_eq!(attempts_line(3), Some("x-tollgate-attempts: 3"));
        assert_eq!(attempts_line(0), None);
        for o in Outcome::ALL {
            assert_eq!(
                outcome_line(o),
                format!("x-tollgate-outcome: {}", o.as_str())
            );
        }
    }
}
