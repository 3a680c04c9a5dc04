//! The app's own retries: a request tollgate takes for the app repeating an earlier
//! call, on evidence only, never on its shape alone. Many users asking for one popular
//! URL are many first attempts, and a guess that took them for retries would refuse
//! them what the upstream would have given.
//!
//! The evidence, in the order it is looked for:
//!
//! - **marker**: its HTTP client counts it as a retry ([`crate::contract::markers`]:
//!   `grpc-previous-rpc-attempts` >= 1, `x-envoy-attempt-count` >= 2,
//!   `amz-sdk-request: attempt=N` with N >= 2, `retry-attempt` >= 1);
//! - **key**: the same per-call identity (the idempotency header as the app sent it,
//!   else `amz-sdk-invocation-id`) as a request tollgate answered with an outcome in
//!   the last 2 s, with the same method, authority and target;
//! - **trace**: the same trace id of `traceparent` (else the same `x-request-id`) as
//!   such a failure. That names the app's *incoming* request, not the call (a poll loop
//!   or a fan-out repeats it), so it is only counted: the request is a first attempt.
//!
//! A request with a marker and a key is counted once, as a marker. Each is counted in
//! `tollgate_app_retries_total{evidence}`, and one on a marker or a key is, with
//! `app_retries = "count"` (the default), sent as what it is, a retry:
//! `x-tollgate-attempt: 2` (a callee's inbound side counts it against its fleet
//! budget), in `retries_sent` of the retry budget and not in `requests_received`,
//! answered `budget-exhausted` when the budget has no room, and never retried again
//! by tollgate. With `app_retries = "refuse"` it is answered at once with the status
//! of the failure it repeats and outcome `app-retry`, with no upstream call (a refusal
//! is not a new failure: the 2 s still run from the failure itself). A marker whose
//! failure tollgate does not remember (the call has no identity, and the same method,
//! authority and target have no failure in the last 2 s, or have since succeeded) has
//! no status to repeat: it goes as a counted retry, as with `"count"`.
//! `app_retries = "ignore"` looks for nothing (the lab's naive chain).
//!
//! A failure is any answer that carries an outcome, tollgate's own or a tollgate's
//! nearer the upstream. It is remembered by the request's key and trace, when it
//! carries them, and with `"refuse"` by its method, authority and target too (the
//! status a marker's retry is refused with). A success of an app's retry forgets them.
//! A request with none of this costs one atomic load: whether anything was remembered
//! in the last 2 s. The memory itself, its bound and its cost are
//! [`crate::retry::evidence::recent`]'s.

use std::cell::Cell;

use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderName, HeaderValue, StatusCode};
use tokio::time::Instant;

use super::Upstream;
use crate::answer as grpc;
use crate::config::AppRetries;
use crate::http::grpc::{GRPC_STATUS, is_grpc_answer};
use crate::http::response::Fields;
use crate::metrics::{Denied, Evidence, Outcome};
use crate::retry::evidence::recent::Remembered;
use crate::retry::{Answer, Head, Reply};
use crate::server::ResponseBody;

/// The AWS SDKs' identity of one call, the same on each of its attempts.
const AMZ_INVOCATION_ID: HeaderName = HeaderName::from_static("amz-sdk-invocation-id");
/// W3C trace context: `00-<trace id>-<parent id>-<flags>`.
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Which of a request's identities a fingerprint is of.
#[derive(Clone, Copy, Hash)]
enum Kind {
    /// Method, authority and target alone.
    Plain,
    Key,
    Trace,
}

/// A fingerprint not taken yet.
const UNTAKEN: u64 = 0;
/// No fingerprint: the request does not carry that identity.
const ABSENT: u64 = 1;

/// What makes two requests the same call, and their fingerprints, each taken when
/// first asked for. A request needs them only when a failure was recorded in the last
/// 2 s (to look for it) or when it is answered with a failure (to remember it), so
/// most take none. Kept in the request's future while it runs: a word each, a
/// fingerprint being above [`ABSENT`].
pub(super) struct Sameness<'a> {
    up: &'a Upstream,
    /// The request as it goes upstream.
    head: &'a Head,
    /// The authority the app called, when the head's Host is not it (a configured
    /// `host` replaced it).
    called: Option<&'a str>,
    /// Its client marked it as a retry.
    marker: bool,
    plain: Cell<u64>,
    key: Cell<u64>,
    trace: Cell<u64>,
}

impl<'a> Sameness<'a> {
    pub(super) fn new(
        up: &'a Upstream,
        head: &'a Head,
        called: Option<&'a str>,
        marker: bool,
    ) -> Self {
        Sameness {
            up,
            head,
            called,
            marker,
            plain: Cell::new(UNTAKEN),
            key: Cell::new(UNTAKEN),
            trace: Cell::new(UNTAKEN),
        }
    }

    /// The fingerprint in `cell`, taken by `take` the first time.
    fn taken(cell: &Cell<u64>, take: impl FnOnce() -> Option<u64>) -> Option<u64> {
        if cell.get() == UNTAKEN {
            cell.set(take().unwrap_or(ABSENT));
        }
        Some(cell.get()).filter(|fp| *fp != ABSENT)
    }

    /// `owner`: who made the call, for an identity that is only theirs (see [`Self::key`]).
    fn fingerprint(&self, kind: Kind, identity: &[u8], owner: &[u8]) -> u64 {
        let head = self.head;
        let authority = self.called.unwrap_or_else(|| {
            head.headers
                .get(HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("")
        });
        let target = head.uri.path_and_query().map(|pq| pq.as_str());
        let what = (
            kind,
            head.method.as_str(),
            authority,
            target,
            identity,
            owner,
        );
        self.up.recent_failures().fingerprint(what).max(ABSENT + 1)
    }

    fn plain(&self) -> u64 {
        Self::taken(&self.plain, || {
            Some(self.fingerprint(Kind::Plain, b"", b""))
        })
        .unwrap_or(ABSENT)
    }

    /// The call's own identity: the idempotency header, else the AWS SDK's, of the
    /// user its `Authorization` names. A key is its client's choice, and clients choose
    /// alike (an order's number): the same key from two users is two calls, as a
    /// callee's dedupe keeps them apart.
    fn key(&self) -> Option<u64> {
        Self::taken(&self.key, || {
            let h = &self.head.headers;
            let own = self.up.config().retry.idempotency_header.as_ref();
            let v = own
                .and_then(|name| h.get(name))
                .or_else(|| h.get(AMZ_INVOCATION_ID))?;
            let owner = h.get(AUTHORIZATION).map_or(&b""[..], HeaderValue::as_bytes);
            Some(self.fingerprint(Kind::Key, v.as_bytes(), owner))
        })
    }

    /// The app's incoming request: the trace id of `traceparent`, else `x-request-id`.
    fn trace(&self) -> Option<u64> {
        Self::taken(&self.trace, || {
            let h = &self.head.headers;
            let id = h
                .get(TRACEPARENT)
                .and_then(|v| trace_id(v.as_bytes()))
                .or_else(|| h.get(REQUEST_ID).map(HeaderValue::as_bytes))?;
            Some(self.fingerprint(Kind::Trace, id, b""))
        })
    }
}

/// The trace id of a `traceparent` value, if it has one.
fn trace_id(v: &[u8]) -> Option<&[u8]> {
    let id = v.split(|b| *b == b'-').nth(1)?;
    (id.len() == 32).then_some(id)
}

/// A request taken for the app's own retry: on what evidence, and the failure it
/// repeats when tollgate remembers one.
#[derive(Clone, Copy, Debug)]
pub(super) struct AppRetry {
    pub evidence: Evidence,
    pub failure: Option<Remembered>,
}

impl AppRetry {
    /// Sent as a retry (on a marker or a key), not as a first attempt (a trace only).
    pub(super) fn charged(again: Option<&AppRetry>) -> bool {
        again.is_some_and(|a| a.evidence != Evidence::Trace)
    }
}

/// Whether the request is the app's own retry, and on what evidence; counted. With
/// no marker and nothing remembered in the last 2 s, one atomic load decides.
#[inline]
pub(super) fn recall(up: &Upstream, same: &Sameness<'_>, now: Instant) -> Option<AppRetry> {
    if !(same.marker || up.recent_failures().active(now))
        || up.config().app_retries == AppRetries::Ignore
    {
        return None;
    }
    look(up, same, now)
}

/// [`recall`] once there is something to look for.
fn look(up: &Upstream, same: &Sameness<'_>, now: Instant) -> Option<AppRetry> {
    let lookup = |fp: Option<u64>| fp.and_then(|fp| up.recent_failures().lookup(fp, now));
    let keyed = lookup(same.key());
    let again = if same.marker {
        let failure = keyed.or_else(|| {
            (up.config().app_retries == AppRetries::Refuse)
                .then(|| lookup(Some(same.plain())))
                .flatten()
        });
        AppRetry {
            evidence: Evidence::Marker,
            failure,
        }
    } else if keyed.is_some() {
        AppRetry {
            evidence: Evidence::Key,
            failure: keyed,
        }
    } else {
        AppRetry {
            evidence: Evidence::Trace,
            failure: Some(lookup(same.trace())?),
        }
    };
    up.metrics().app_retry(again.evidence);
    Some(again)
}

/// Why an app's own retry goes no further: refused by `app_retries = "refuse"`, or no
/// room in the budget.
pub(super) struct Stopped {
    pub status: StatusCode,
    pub outcome: Outcome,
    pub text: &'static str,
    /// For a gRPC call: the `grpc-status` to answer with.
    pub grpc: Option<u8>,
}

/// Whether an app's own retry is stopped here; when it goes on as a retry, its retry
/// has been taken from the budget. A trace alone stops nothing and takes nothing.
pub(super) fn stop(up: &Upstream, again: &AppRetry, now: Instant) -> Option<Stopped> {
    if again.evidence == Evidence::Trace {
        return None;
    }
    let refuse = up.config().app_retries == AppRetries::Refuse;
    let (failure, outcome, text) = match again.failure {
        Some(f) if refuse => (
            Some(f),
            Outcome::AppRetry,
            "the app sent this call again within 2 s of a failure tollgate owned \
             (app_retries = \"refuse\")\n",
        ),
        _ if up.budget().try_retry(now) => return None,
        f => {
            up.metrics().denied(Denied::Budget);
            (
                f,
                Outcome::BudgetExhausted,
                "the app sent this call again; the retry budget has no room for it\n",
            )
        }
    };
    // A retry whose failure tollgate never saw: refused as tollgate refuses what it
    // has no room for.
    let status = failure
        .and_then(|f| StatusCode::from_u16(f.status).ok())
        .unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    Some(Stopped {
        status,
        outcome,
        text,
        grpc: failure.and_then(|f| f.grpc),
    })
}

/// A gRPC answer made for a stopped app retry says the status the failure had.
pub(super) fn with_grpc_status(resp: &mut http::Response<ResponseBody>, code: Option<u8>) {
    if let Some(c) = code
        && resp.headers().contains_key(GRPC_STATUS)
    {
        resp.headers_mut()
            .insert(GRPC_STATUS, HeaderValue::from(u16::from(c)));
    }
}

/// Remembers a failure tollgate owned (an answer with an outcome) by the identities
/// the request carries, and forgets them when an app's retry has now succeeded. Not
/// called for a refusal of an app retry. With `"refuse"`, a success forgets the last
/// failure of its method, authority and target, which a marker's retry would be
/// refused with; otherwise a success that was not an app's retry touches nothing.
pub(super) fn remember(up: &Upstream, same: &Sameness<'_>, end: RequestEnd, now: Instant) {
    let refuse = match up.config().app_retries {
        AppRetries::Ignore => return,
        mode => mode == AppRetries::Refuse,
    };
    let recent = up.recent_failures();
    match end {
        RequestEnd::Failed(answer) => {
            for fp in [same.key(), same.trace(), refuse.then(|| same.plain())]
                .into_iter()
                .flatten()
            {
                recent.record(fp, answer, now);
            }
        }
        RequestEnd::Succeeded { again: true } => {
            for fp in [same.key(), same.trace(), Some(same.plain())]
                .into_iter()
                .flatten()
            {
                recent.forget(fp);
            }
        }
        RequestEnd::Succeeded { again: false } => {
            if refuse && recent.active(now) {
                recent.forget(same.plain());
            }
        }
    }
}

/// How a request ended, for the memory of failures.
pub(super) enum RequestEnd {
    /// With an outcome: what the app was answered.
    Failed(Remembered),
    /// Without one; `again`: it was taken for the app's own retry.
    Succeeded { again: bool },
}

impl RequestEnd {
    /// What the app is about to be answered.
    pub(super) fn of(answer: &Answer, grpc: bool, again: bool) -> RequestEnd {
        if answer.outcome == Outcome::Ok {
            return RequestEnd::Succeeded { again };
        }
        let code =
            |status: StatusCode| Some(grpc::code(answer.outcome, answer.failure, status) as u8);
        let remembered = match &answer.reply {
            Reply::Local(status) if grpc => Remembered {
                status: 200,
                grpc: code(*status),
            },
            Reply::Local(status) => Remembered {
                status: status.as_u16(),
                grpc: None,
            },
            Reply::Upstream(resp) if grpc => {
                let fields = Fields::of(resp);
                let own = fields
                    .get(&GRPC_STATUS)
                    .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u8>().ok());
                let answered =
                    is_grpc_answer(resp.status(), fields.get(&CONTENT_TYPE), own.is_some());
                Remembered {
                    status: 200,
                    grpc: own.filter(|_| answered).or_else(|| code(resp.status())),
                }
            }
            Reply::Upstream(resp) => Remembered {
                status: resp.status().as_u16(),
                grpc: None,
            },
        };
        RequestEnd::Failed(remembered)
    }

    /// A refusal tollgate made before any upstream call (overloaded, throttled, a
    /// deadline already spent).
    pub(super) fn refused(status: StatusCode, outcome: Outcome, grpc: bool) -> RequestEnd {
        RequestEnd::Failed(if grpc {
            Remembered {
                status: 200,
                grpc: Some(grpc::code(outcome, None, status) as u8),
            }
        } else {
            Remembered {
                status: status.as_u16(),
                grpc: None,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_id_is_the_second_part_of_traceparent() {
        assert_eq!(
            trace_id(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some(&b"4bf92f3577b34da6a3ce929d0e0e4736"[..])
        );
        assert_eq!(trace_id(b"00-short-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id(b"garbage"), None);
    }
}
