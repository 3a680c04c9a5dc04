//! The retry loop on a scripted transport with paused time: every way a request ends
//! (each reason to stop, each outcome), the attempt beside a slow one, the hedge race,
//! and what each attempt sends, without a socket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::script::{Script, Step};
use super::{Answer, Exchange, Head, Reply, Upstream, forward_on};
use crate::deadline::Deadline;
use crate::http::BoxError;
use crate::metrics::{Denied, Metrics, Outcome};

type TestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

const MS: Duration = Duration::from_millis(1);

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
const S503: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy";
const S500: &str = "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n";
const OWNED: &str = "HTTP/1.1 503 Service Unavailable\r\nx-tollgate-outcome: budget-exhausted\r\ncontent-length: 0\r\n\r\n";
const LATER: &str =
    "HTTP/1.1 503 Service Unavailable\r\nretry-after: 30\r\ncontent-length: 0\r\n\r\n";
const REJECTED: &str = "HTTP/1.1 503 Service Unavailable\r\nx-tollgate-outcome: retry-rejected\r\ncontent-length: 0\r\n\r\n";
const APP_UNREACHABLE: &str =
    "HTTP/1.1 502 Bad Gateway\r\nx-tollgate-outcome: app-unreachable\r\ncontent-length: 0\r\n\r\n";
/// A callee's app refused the connection: the request did not run there.
const APP_REFUSED: &str = "HTTP/1.1 502 Bad Gateway\r\nx-tollgate-outcome: app-unreachable; ran=no\r\ncontent-length: 0\r\n\r\n";
/// A callee's app took the request and broke the connection: it may have run.
const APP_BROKE: &str = "HTTP/1.1 502 Bad Gateway\r\nx-tollgate-outcome: app-unreachable; ran=maybe\r\ncontent-length: 0\r\n\r\n";

/// An upstream of three endpoints with `extra` TOML in its table: retries on, a
/// roomy budget, a tiny backoff.
fn upstream(extra: &str) -> Upstream<TestBody> {
    upstream_retrying(extra, "")
}

/// As [`upstream`], with `retry` TOML in its `[upstreams.u.retry]` table too.
fn upstream_retrying(extra: &str, retry: &str) -> Upstream<TestBody> {
    let text = format!(
        "[upstreams.u]\nauthorities = [\"u\"]\n\
         endpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\", \"127.0.0.1:3\"]\n{extra}\n\
         [upstreams.u.retry]\nmax_attempts = 3\nbackoff_base = \"1ms\"\nbackoff_max = \"2ms\"\n{retry}\n\
         on = [\"connect-failure\", \"reset\", \"timeout\", \"502\", \"503\", \"504\"]\n\
         [upstreams.u.budget]\nratio = 1.0\nmin_per_sec = 100\n"
    );
    let config = crate::config::parse("t.toml", &text, std::path::Path::new("."))
        .unwrap_or_else(|e| panic!("{e}"));
    let up = config.upstreams.into_iter().next().unwrap();
    Upstream::build(
        up,
        config.deadline,
        &Default::default(),
        &Metrics::new(),
        None,
        1,
    )
}

fn head(method: Method) -> Head {
    Head {
        method,
        uri: Uri::from_static("/x"),
        headers: HeaderMap::new(),
    }
}

fn body(bytes: &'static [u8]) -> TestBody {
    http_body_util::Full::new(Bytes::from_static(bytes))
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Forwards one request, arriving now, with the caller's deadline `caller`.
async fn call(
    up: &Upstream<TestBody>,
    script: &Script,
    head: &Head,
    caller: Option<Duration>,
) -> Answer {
    let now = Instant::now();
    let ex = Exchange {
        head,
        version: Version::HTTP_11,
        body: body(b""),
        deadline: Deadline::new(now, caller, up.config.request_timeout),
        arrived: now,
        grpc: false,
        upgrade: false,
        app_retry: false,
        minted: None,
        trace: None,
    };
    forward_on(up, script, ex).await
}

/// Forwards one request with the key `minted` for it, and no deadline.
async fn call_minted(
    up: &Upstream<TestBody>,
    script: &Script,
    head: &Head,
    minted: Option<&'static str>,
) -> Answer {
    let now = Instant::now();
    let ex = Exchange {
        head,
        version: Version::HTTP_11,
        body: body(b"order"),
        deadline: Deadline::new(now, None, up.config.request_timeout),
        arrived: now,
        grpc: false,
        upgrade: false,
        app_retry: false,
        minted: minted.map(|k| Box::new(http::HeaderValue::from_static(k))),
        trace: None,
    };
    forward_on(up, script, ex).await
}

fn status(a: &Answer) -> u16 {
    match &a.reply {
        Reply::Upstream(r) => r.status().as_u16(),
        Reply::Local(s) => s.as_u16(),
    }
}

fn get() -> Head {
    head(Method::GET)
}

#[tokio::test(start_paused = true)]
async fn a_failure_listed_is_retried_on_another_endpoint_and_the_answer_wins() {
    let up = upstream("");
    let script = Script::new([Step::Answer(MS, S503), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &get(), None).await;
    assert_eq!((status(&a), a.outcome, a.attempts), (200, Outcome::Ok, 2));
    assert_eq!(
        a.trail
            .retries()
            .map(|f| f.condition().to_string())
            .collect::<Vec<_>>(),
        ["503"]
    );
    let sent = script.sent();
    assert_eq!(sent.iter().map(|s| s.number).collect::<Vec<_>>(), [1, 2]);
    assert_ne!(sent[0].endpoint, sent[1].endpoint, "a retry goes elsewhere");
}

#[tokio::test(start_paused = true)]
async fn a_refused_connect_moves_the_same_attempt_to_another_endpoint() {
    let up = upstream("");
    // A POST, which no retry may send again: nothing left on the refused connect.
    let script = Script::new([Step::Refuse, Step::Answer(MS, OK)]);
    let a = call(&up, &script, &head(Method::POST), None).await;
    assert_eq!((status(&a), a.outcome, a.attempts), (200, Outcome::Ok, 1));
    assert_eq!(a.trail.retries().count(), 0, "not a retry");
    let sent = script.sent();
    assert_eq!(
        sent.iter().map(|s| s.number).collect::<Vec<_>>(),
        [1, 1],
        "the same attempt, at once: {sent:?}"
    );
    assert_eq!(sent[1].at, sent[0].at, "no backoff");
    assert_ne!(sent[0].endpoint, sent[1].endpoint);
    assert_eq!(
        a.trail.peers().collect::<Vec<_>>(),
        [sent[0].endpoint, sent[1].endpoint],
        "the access log names both"
    );
}

#[tokio::test(start_paused = true)]
async fn an_attempt_tries_three_endpoints_then_it_is_a_connect_failure_retried() {
    let up = upstream("");
    let script = Script::new([
        Step::Refuse,
        Step::Refuse,
        Step::Refuse,
        Step::Answer(MS, OK),
    ]);
    let a = call(&up, &script, &get(), None).await;
    assert_eq!((status(&a), a.outcome, a.attempts), (200, Outcome::Ok, 2));
    assert_eq!(
        a.trail
            .retries()
            .map(|f| f.condition().to_string())
            .collect::<Vec<_>>(),
        ["connect-failure"]
    );
    let numbers: Vec<u32> = script.sent().iter().map(|s| s.number).collect();
    assert_eq!(numbers, [1, 1, 1, 2]);
}

/// A request, what the endpoints do with its attempts, and how it must end.
struct Case {
    what: &'static str,
    steps: Vec<Step>,
    method: Method,
    caller: Option<Duration>,
    /// Status, outcome, attempts, and why a retry was refused.
    ends: (u16, Outcome, u32, Option<Denied>),
}

#[tokio::test(start_paused = true)]
async fn every_reason_to_stop_has_its_outcome() {
    let case = |what, steps: Vec<Step>, method, caller, ends| Case {
        what,
        steps,
        method,
        caller,
        ends,
    };
    let cases = [
        case(
            "another tollgate owned it: back as it came",
            vec![Step::Answer(MS, OWNED)],
            Method::GET,
            None,
            (503, Outcome::BudgetExhausted, 1, Some(Denied::Ownership)),
        ),
        case(
            "not a failure retry.on lists: an answer",
            vec![Step::Answer(MS, S500)],
            Method::GET,
            None,
            (500, Outcome::Ok, 1, None),
        ),
        case(
            "a POST may have run",
            vec![Step::Answer(MS, S503)],
            Method::POST,
            None,
            (503, Outcome::NotRetryable, 1, Some(Denied::Method)),
        ),
        case(
            "every attempt used",
            vec![Step::Answer(MS, S503); 3],
            Method::GET,
            None,
            (503, Outcome::AttemptsExhausted, 3, Some(Denied::Attempts)),
        ),
        case(
            "a wait longer than max_retry_after",
            vec![Step::Answer(MS, LATER)],
            Method::GET,
            None,
            (503, Outcome::RetryAfterTooLong, 1, Some(Denied::RetryAfter)),
        ),
        case(
            "never connected anywhere: each attempt tried three endpoints",
            vec![Step::Refuse; 9],
            Method::GET,
            None,
            (502, Outcome::UpstreamUnreachable, 3, Some(Denied::Attempts)),
        ),
        case(
            "a reset (the request went out, it may have run), then every other endpoint \
             refused: not unreachable",
            vec![
                Step::Reset(MS),
                Step::Refuse,
                Step::Refuse,
                Step::Refuse,
                Step::Refuse,
                Step::Refuse,
                Step::Refuse,
            ],
            Method::GET,
            None,
            (502, Outcome::AttemptsExhausted, 3, Some(Denied::Attempts)),
        ),
        case(
            "nothing before the deadline",
            vec![Step::Hang],
            Method::GET,
            Some(300 * MS),
            (504, Outcome::DeadlineExceeded, 1, Some(Denied::Deadline)),
        ),
        case(
            "TLS failed on every endpoint: no other to try (no refusal of a retry)",
            vec![Step::Tls, Step::Tls, Step::Tls],
            Method::GET,
            None,
            (502, Outcome::UpstreamUnreachable, 3, None),
        ),
    ];
    for c in cases {
        let up = upstream("");
        let script = Script::new(c.steps);
        let a = call(&up, &script, &head(c.method), c.caller).await;
        let got = (status(&a), a.outcome, a.attempts, a.trail.denied);
        assert_eq!(got, c.ends, "{}", c.what);
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_the_budget_cannot_afford_is_refused_at_once() {
    let up = upstream("");
    // A budget with no room: no floor, no share.
    let up = Upstream::build(
        {
            let mut c = up.config.clone();
            c.budget = Some(crate::config::BudgetConfig {
                ratio: 0.0,
                min_per_sec: 0.0,
                ..crate::config::BudgetConfig::default()
            });
            c
        },
        up.deadline.clone(),
        &Default::default(),
        &Metrics::new(),
        None,
        1,
    );
    let script = Script::new([Step::Answer(MS, S503), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &get(), None).await;
    assert_eq!(
        (status(&a), a.outcome, a.attempts),
        (503, Outcome::BudgetExhausted, 1)
    );
    assert_eq!(a.trail.denied, Some(Denied::Budget));
    assert_eq!(script.sent().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_callees_refusal_of_the_retry_sends_back_the_failure_it_retried() {
    let up = upstream("");
    let script = Script::new([Step::Answer(MS, S503), Step::Answer(MS, REJECTED)]);
    let a = call(&up, &script, &get(), None).await;
    assert_eq!(
        (status(&a), a.outcome, a.attempts),
        (503, Outcome::RetryRejected, 2)
    );
    let Reply::Upstream(r) = a.reply else {
        panic!("a local answer")
    };
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "busy", "the first failure, as it came");
}

#[tokio::test(start_paused = true)]
async fn the_app_unreachable_behind_a_callee_is_that_endpoints_failure() {
    let up = upstream("");
    let script = Script::new([Step::Answer(MS, APP_UNREACHABLE), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &get(), None).await;
    assert_eq!((status(&a), a.outcome, a.attempts), (200, Outcome::Ok, 2));
}

#[tokio::test(start_paused = true)]
async fn without_a_deadline_a_slow_answer_is_waited_for_and_none_is_sent() {
    let up = upstream("");
    let script = Script::new([Step::Answer(Duration::from_secs(600), OK)]);
    let a = call(&up, &script, &get(), None).await;
    assert_eq!((status(&a), a.attempts), (200, 1));
    assert_eq!(script.sent()[0].deadline_ms, None);
}

#[tokio::test(start_paused = true)]
async fn each_attempt_is_told_the_time_left_of_the_deadline() {
    let up = upstream("");
    let script = Script::new([Step::Answer(100 * MS, S503), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &get(), Some(Duration::from_secs(1))).await;
    assert_eq!(status(&a), 200);
    let sent = script.sent();
    assert_eq!(sent[0].deadline_ms, Some(1000));
    let left = sent[1].deadline_ms.unwrap();
    assert!((895..=900).contains(&left), "{left}");
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_gets_a_retry_beside_it_and_the_first_good_answer_wins() {
    let up = upstream("attempt_timeout = \"200ms\"");
    let script = Script::new([Step::Hang, Step::Answer(MS, OK)]);
    let started = Instant::now();
    let a = call(&up, &script, &get(), None).await;
    assert_eq!((status(&a), a.outcome, a.attempts), (200, Outcome::Ok, 2));
    let sent = script.sent();
    assert_eq!(
        sent[1].at - started,
        200 * MS,
        "beside it at the attempt timeout"
    );
    assert!(!sent[1].hedge, "a retry, not a hedge");
    assert_eq!(
        a.trail
            .retries()
            .map(|f| f.condition().to_string())
            .collect::<Vec<_>>(),
        ["timeout"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_that_is_the_only_hope_runs_on() {
    // Retries off for timeouts: nothing may start beside it.
    let up = upstream("attempt_timeout = \"200ms\"");
    let mut config = up.config.clone();
    config.retry.on.timeout = false;
    let up = Upstream::build(
        config,
        up.deadline.clone(),
        &Default::default(),
        &Metrics::new(),
        None,
        1,
    );
    let script = Script::new([Step::Answer(Duration::from_secs(5), OK)]);
    let a = call(&up, &script, &get(), None).await;
    assert_eq!((status(&a), a.outcome, a.attempts), (200, Outcome::Ok, 1));
}

#[tokio::test(start_paused = true)]
async fn a_retry_refused_beside_a_slow_attempt_ends_the_request_with_its_failure() {
    let up = upstream("attempt_timeout = \"200ms\"\nrequest_timeout = \"1s\"");
    let script = Script::new([Step::Hang, Step::Answer(MS, REJECTED)]);
    let a = call(&up, &script, &get(), None).await;
    assert_eq!((status(&a), a.outcome), (504, Outcome::RetryRejected));
    assert_eq!(a.trail.denied, Some(Denied::UpstreamRejected));
}

#[tokio::test(start_paused = true)]
async fn a_hedge_beside_a_slow_attempt_wins_and_counts_as_an_attempt() {
    let up = upstream("[upstreams.u.hedge]\nafter = \"50ms\"\nmax_extra = 1.0");
    let script = Script::new([
        Step::Answer(Duration::from_secs(2), OK),
        Step::Answer(MS, OK),
    ]);
    let started = Instant::now();
    let a = call(&up, &script, &get(), None).await;
    assert_eq!((status(&a), a.attempts), (200, 2));
    assert_eq!(a.hedge, super::HedgeState::Sent);
    let sent = script.sent();
    assert!(sent[1].hedge);
    assert_eq!(sent[1].at - started, 50 * MS);
    assert!(
        Instant::now() - started < Duration::from_secs(1),
        "the hedge's answer won"
    );
}

#[tokio::test(start_paused = true)]
async fn a_post_is_never_sent_beside_itself() {
    let up = upstream(
        "attempt_timeout = \"100ms\"\n[upstreams.u.hedge]\nafter = \"50ms\"\nmax_extra = 1.0",
    );
    let script = Script::new([Step::Answer(Duration::from_secs(1), OK)]);
    let a = call(&up, &script, &head(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (200, 1));
    assert_eq!(script.sent().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_status_the_app_gets_is_never_made_up() {
    // The reply of a failure given up on is the upstream's own response when it had one.
    let up = upstream("");
    let script = Script::new([Step::Answer(MS, S503); 3]);
    let a = call(&up, &script, &get(), None).await;
    assert!(matches!(a.reply, Reply::Upstream(_)));
    assert_eq!(status(&a), StatusCode::SERVICE_UNAVAILABLE.as_u16());
}

const DEDUPES: &str = "HTTP/1.1 200 OK\r\nx-tollgate-dedupe: on; header=idempotency-key; scope=shared\r\ncontent-length: 2\r\n\r\nok";
const DEDUPES_HERE: &str = "HTTP/1.1 200 OK\r\nx-tollgate-dedupe: on; header=idempotency-key; scope=replica; store=00000000000000ab\r\ncontent-length: 2\r\n\r\nok";
const DEDUPES_OTHER_HEADER: &str = "HTTP/1.1 200 OK\r\nx-tollgate-dedupe: on; header=x-idempotency-key; scope=shared\r\ncontent-length: 2\r\n\r\nok";

/// Every endpoint of `up` (three) answers a GET with `answer`, read as a keyed request
/// has been sent before.
async fn every_endpoint_says(up: &Upstream<TestBody>, answer: &'static str) {
    up.dedupes.want();
    for _ in 0..3 {
        call(up, &Script::new([Step::Answer(MS, answer)]), &get(), None).await;
    }
}

fn keyed(method: Method) -> Head {
    let mut h = head(method);
    h.headers
        .insert("idempotency-key", http::HeaderValue::from_static("\"own\""));
    h
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_is_never_sent_beside_itself() {
    let up = upstream(
        "attempt_timeout = \"100ms\"\n[upstreams.u.hedge]\nafter = \"50ms\"\nmax_extra = 1.0",
    );
    let script = Script::new([Step::Answer(Duration::from_secs(1), OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (200, 1));
    assert_eq!(script.sent().len(), 1);
    // A keyed PUT is idempotent: it gets its hedge.
    let script = Script::new([
        Step::Answer(Duration::from_secs(1), OK),
        Step::Answer(MS, OK),
    ]);
    let a = call(&up, &script, &keyed(Method::PUT), None).await;
    assert_eq!((status(&a), a.attempts), (200, 2));
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_that_may_have_run_is_sent_again_only_where_answers_said_dedupe() {
    let up = upstream("");
    // Nothing said so: a reset after the request went is the end.
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!(
        (status(&a), a.outcome, a.attempts),
        (502, Outcome::NotRetryable, 1)
    );
    // A failure that shows it did not run is retried all the same.
    let script = Script::new([Step::Answer(MS, S503), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (200, 2));
    // Its answers say it deduplicates: believed for a minute.
    every_endpoint_says(&up, DEDUPES).await;
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (200, 2));
    tokio::time::advance(Duration::from_secs(61)).await;
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!(
        (status(&a), a.attempts),
        (502, 1),
        "a minute later it is not"
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_a_callees_app_refused_is_sent_again_and_one_it_may_have_run_is_not() {
    let up = upstream("");
    // `ran=no`: the app behind that endpoint never got it; no dedupe needed to go again.
    let script = Script::new([Step::Answer(MS, APP_REFUSED), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!((status(&a), a.outcome, a.attempts), (200, Outcome::Ok, 2));
    assert_eq!(script.sent().len(), 2);
    // `ran=maybe`, or an older callee that says nothing: it may have run, and nothing
    // said this upstream deduplicates: the app gets the failure, and it is not sent twice.
    for answer in [APP_BROKE, APP_UNREACHABLE] {
        let script = Script::new([Step::Answer(MS, answer), Step::Answer(MS, OK)]);
        let a = call(&up, &script, &keyed(Method::POST), None).await;
        assert_eq!(
            (status(&a), a.outcome, a.attempts),
            (502, Outcome::NotRetryable, 1),
            "{answer}"
        );
        assert_eq!(script.sent().len(), 1, "{answer}");
    }
    // A POST without a key is never sent twice, whatever the callee says.
    let script = Script::new([Step::Answer(MS, APP_REFUSED), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &head(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (502, 1));
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_listed_in_methods_is_still_sent_again_only_where_answers_said_dedupe() {
    let up = upstream_retrying("", "methods = [\"GET\", \"POST\"]");
    // Listed, but keyed: the key says it must run once, and nothing is taken on trust
    // from the config alone.
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!(
        (status(&a), a.outcome, a.attempts),
        (502, Outcome::NotRetryable, 1)
    );
    every_endpoint_says(&up, DEDUPES).await;
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (200, 2));
    // Without a key the user's listing is what decides: sent again after a reset.
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &head(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (200, 2));
}

#[tokio::test(start_paused = true)]
async fn a_dedupe_that_reads_another_header_is_not_trusted() {
    let up = upstream("");
    every_endpoint_says(&up, DEDUPES_OTHER_HEADER).await;
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!(
        (status(&a), a.outcome, a.attempts),
        (502, Outcome::NotRetryable, 1),
        "its dedupe never sees this caller's key"
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_that_may_have_run_on_a_replica_store_goes_back_only_there() {
    let up = upstream("");
    every_endpoint_says(&up, DEDUPES_HERE).await;
    let script = Script::new([
        Step::Reset(MS),
        Step::Answer(MS, S503),
        Step::Answer(MS, OK),
    ]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (200, 3));
    let sent = script.sent();
    assert!(
        sent.iter().all(|s| s.endpoint == sent[0].endpoint),
        "every attempt after it may have run goes to its endpoint: {sent:?}"
    );
    assert_eq!(sent[0].store, None);
    for s in &sent[1..] {
        assert_eq!(s.store.as_deref(), Some("00000000000000ab"));
    }
    // A failure that shows it did not run is retried elsewhere, with no store named.
    let script = Script::new([Step::Answer(MS, S503), Step::Answer(MS, OK)]);
    call(&up, &script, &keyed(Method::POST), None).await;
    let sent = script.sent();
    assert_ne!(sent[0].endpoint, sent[1].endpoint);
    assert_eq!(sent[1].store, None);
}

#[tokio::test(start_paused = true)]
async fn a_replica_store_behind_one_address_is_never_sent_a_retry() {
    let text = "[upstreams.u]\nauthorities = [\"u\"]\nendpoints = [\"127.0.0.1:1\"]\n\
                [upstreams.u.retry]\nmax_attempts = 3\nbackoff_base = \"1ms\"\n\
                on = [\"reset\", \"503\"]\n[upstreams.u.budget]\nratio = 1.0\nmin_per_sec = 100\n";
    let config = crate::config::parse("t.toml", text, std::path::Path::new(".")).unwrap();
    let u = config.upstreams.into_iter().next().unwrap();
    let up = Upstream::build(
        u,
        config.deadline,
        &Default::default(),
        &Metrics::new(),
        None,
        1,
    );
    up.dedupes.want();
    call(
        &up,
        &Script::new([Step::Answer(MS, DEDUPES_HERE)]),
        &get(),
        None,
    )
    .await;
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!(
        (status(&a), a.outcome, a.attempts),
        (502, Outcome::NotRetryable, 1),
        "one address may be another pod next time"
    );
    // Shared keys are every replica's: sent again.
    call(&up, &Script::new([Step::Answer(MS, DEDUPES)]), &get(), None).await;
    let script = Script::new([Step::Reset(MS), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &keyed(Method::POST), None).await;
    assert_eq!((status(&a), a.attempts), (200, 2));
}

#[tokio::test(start_paused = true)]
async fn an_empty_key_is_no_key() {
    let up = upstream("");
    every_endpoint_says(&up, DEDUPES).await;
    let mut h = head(Method::POST);
    h.headers
        .insert("idempotency-key", http::HeaderValue::from_static(""));
    let script = Script::new([Step::Answer(MS, S503), Step::Answer(MS, OK)]);
    let a = call(&up, &script, &h, None).await;
    assert_eq!(
        (status(&a), a.attempts),
        (503, 1),
        "a POST without a key is not sent again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_minted_key_goes_on_every_attempt() {
    let up = upstream("");
    let script = Script::new([Step::Answer(MS, S503), Step::Answer(MS, OK)]);
    let a = call_minted(&up, &script, &head(Method::POST), Some("\"m-1\"")).await;
    assert_eq!((status(&a), a.attempts), (200, 2));
    let keys: Vec<_> = script.sent().into_iter().map(|s| s.key).collect();
    assert_eq!(
        keys,
        [Some("\"m-1\"".to_string()), Some("\"m-1\"".to_string())]
    );
}
