//! The app's own retries: a request the app sends again within 2 s of a failure
//! tollgate owned, with the same method, authority, target and idempotency key.
//!
//! An app behind tollgate should have turned its retries off; one that did not still
//! multiplies the attempts of a failing upstream by its own. tollgate cannot stop the
//! app from sending, but it can see it and keep it inside the rules:
//!
//! - `app_retries = "count"` (the default): counted in `tollgate_app_retries_total`,
//!   and sent as what it is, a retry: `x-tollgate-attempt: 2` (so a callee's inbound
//!   side counts it against its fleet budget), in `retries_sent` of the retry budget
//!   and not in `requests_received`, refused with `budget-exhausted` when the budget
//!   has no room, and never retried again by tollgate;
//! - `app_retries = "refuse"`: counted, and answered at once with the status the
//!   failure had and outcome `app-retry`, with no upstream call. A refusal is not a
//!   new failure: the 2 s still run from the failure itself;
//! - `app_retries = "ignore"`: not looked for, so the app's retries multiply with
//!   tollgate's; only to demonstrate retry storms (`check` warns).
//!
//! A failure is any answer that carries an outcome, tollgate's own or a tollgate's
//! nearer the upstream. A success of the same request ends its memory. The memory
//! itself, its bound and its cost are [`crate::retry::recent`]'s.

use std::cell::Cell;

use http::header::{CONTENT_TYPE, HOST};
use http::{HeaderValue, StatusCode};
use tokio::time::Instant;

use super::Upstream;
use super::grpc;
use crate::config::AppRetries;
use crate::http::grpc::{GRPC_STATUS, is_grpc_answer};
use crate::metrics::{Denied, Outcome};
use crate::retry::recent::Remembered;
use crate::retry::{Answer, Head, Reply};
use crate::server::ResponseBody;
use crate::upstream::response::Fields;

/// What makes two requests the same: method, the authority the app called, target and
/// the idempotency key, if any; and their fingerprint, hashed when first asked for. A
/// request needs it only when a failure was recorded in the last 2 s (to look for it)
/// or when it is answered with a failure (to remember it), so most hash nothing.
pub(super) struct Sameness<'a> {
    up: &'a Upstream,
    /// The request as it goes upstream.
    head: &'a Head,
    /// The authority the app called, when the head's Host is not it (a configured
    /// `host` replaced it).
    called: Option<&'a str>,
    /// The fingerprint once taken (never 0).
    value: Cell<u64>,
}

impl<'a> Sameness<'a> {
    pub(super) fn new(up: &'a Upstream, head: &'a Head, called: Option<&'a str>) -> Self {
        Sameness {
            up,
            head,
            called,
            value: Cell::new(0),
        }
    }

    fn fingerprint(&self) -> u64 {
        if self.value.get() == 0 {
            let head = self.head;
            let authority = self.called.unwrap_or_else(|| {
                head.headers
                    .get(HOST)
                    .and_then(|h| h.to_str().ok())
                    .unwrap_or("")
            });
            let key = self
                .up
                .config
                .retry
                .idempotency_header
                .as_ref()
                .and_then(|h| head.headers.get(h))
                .map(HeaderValue::as_bytes);
            let target = head.uri.path_and_query().map(|pq| pq.as_str());
            let what = (head.method.as_str(), authority, target, key);
            self.value.set(self.up.recent.fingerprint(what));
        }
        self.value.get()
    }
}

/// The failure this request repeats, if the app is retrying one tollgate owned. Looks
/// (and takes the fingerprint) only when a failure was recorded in the last 2 s.
pub(super) fn recall(up: &Upstream, same: &Sameness<'_>, now: Instant) -> Option<Remembered> {
    if up.config.app_retries == AppRetries::Ignore || !up.recent.active(now) {
        return None;
    }
    let again = up.recent.lookup(same.fingerprint(), now)?;
    up.metrics.app_retries.inc();
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

/// Whether an app's own retry is stopped here; when it goes on, its retry has been
/// taken from the budget.
pub(super) fn stop(up: &Upstream, again: Remembered, now: Instant) -> Option<Stopped> {
    let status = StatusCode::from_u16(again.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let (outcome, text) = match up.config.app_retries {
        AppRetries::Refuse => (
            Outcome::AppRetry,
            "the app sent this request again within 2 s of a failure tollgate owned \
             (app_retries = \"refuse\")\n",
        ),
        AppRetries::Count | AppRetries::Ignore if up.budget.try_retry(now) => return None,
        AppRetries::Count | AppRetries::Ignore => {
            up.metrics.denied(Denied::Budget);
            (
                Outcome::BudgetExhausted,
                "the app sent this request again; the retry budget has no room for it\n",
            )
        }
    };
    Some(Stopped {
        status,
        outcome,
        text,
        grpc: again.grpc,
    })
}

/// A gRPC answer made for a stopped app retry says the status the failure had.
pub(super) fn with_grpc_status(
    mut resp: http::Response<ResponseBody>,
    code: Option<u8>,
) -> http::Response<ResponseBody> {
    if let Some(c) = code
        && resp.headers().contains_key(GRPC_STATUS)
    {
        resp.headers_mut()
            .insert(GRPC_STATUS, HeaderValue::from(u16::from(c)));
    }
    resp
}

/// Remembers a failure tollgate owned (an answer with an outcome), and forgets one the
/// request has now succeeded past. Not called for a refusal of an app retry. A success
/// that was not an app's retry touches nothing.
pub(super) fn remember(up: &Upstream, same: &Sameness<'_>, verdict: Verdict, now: Instant) {
    if up.config.app_retries == AppRetries::Ignore {
        return;
    }
    match verdict {
        Verdict::Failed(answer) => up.recent.record(same.fingerprint(), answer, now),
        Verdict::Succeeded { again: true } => up.recent.forget(same.fingerprint()),
        Verdict::Succeeded { again: false } => {}
    }
}

/// How a request ended, for the memory of failures.
pub(super) enum Verdict {
    /// With an outcome: what the app was answered.
    Failed(Remembered),
    /// Without one; `again`: it was the app's own retry.
    Succeeded { again: bool },
}

impl Verdict {
    /// What the app is about to be answered.
    pub(super) fn of(answer: &Answer, grpc: bool, again: bool) -> Verdict {
        if answer.outcome == Outcome::Ok {
            return Verdict::Succeeded { again };
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
        Verdict::Failed(remembered)
    }

    /// A refusal tollgate made before any upstream call (overloaded, throttled, a
    /// deadline already spent).
    pub(super) fn refused(status: StatusCode, outcome: Outcome, grpc: bool) -> Verdict {
        Verdict::Failed(if grpc {
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
