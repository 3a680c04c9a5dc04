//! The outbound service, whole, on a scripted transport with paused time: a request as
//! the app's connection hands it over, through routing, admission, the deadline, the
//! budget and the retry loop, to the answer the app gets, with each upstream attempt
//! answered by a script ([`crate::retry::forward::script`]) and no socket. As
//! linkerd2-proxy tests its outbound stack: what the app would notice, per stage.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, StatusCode};
use tokio::time::Instant;

use super::handler::{Outbound, Wire};
use super::{Shared, Snapshot};
use crate::listen::Listeners;
use crate::metrics::Metrics;
use crate::retry::forward::script::{Script, Step};
use crate::retry::{Answer, Exchange};
use crate::server::got::Got;
use crate::server::socket::Http1Body;
use crate::server::watchdog::ConnState;
use crate::server::{AppBody, Service};

const MS: Duration = Duration::from_millis(1);

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
const S503: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy";
const OWNED: &str = "HTTP/1.1 503 Service Unavailable\r\nx-tollgate-outcome: attempts-exhausted\r\ncontent-length: 0\r\n\r\n";

/// The attempts carried by a script.
#[derive(Clone)]
struct Scripted(Arc<Script>);

impl Wire for Scripted {
    fn forward<'a>(
        &'a self,
        up: &'a super::Upstream,
        ex: Exchange<'a, AppBody>,
    ) -> impl Future<Output = Answer> + Send + 'a {
        crate::retry::forward_on(up, &*self.0, ex)
    }
}

/// An outbound side with one upstream, `payments`, of two endpoints: three attempts,
/// a roomy budget and a tiny backoff, with `extra` TOML in its table and `budget` as
/// its budget's.
struct Side {
    outbound: Outbound<Scripted>,
    script: Arc<Script>,
    conn: Arc<ConnState>,
}

fn side(extra: &str, budget: &str, steps: impl IntoIterator<Item = Step>) -> Side {
    let text = format!(
        "[listener]\nunknown_authorities = \"refuse\"\n\
         [upstreams.payments]\nauthorities = [\"payments\"]\n\
         endpoints = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n{extra}\n\
         [upstreams.payments.retry]\nmax_attempts = 3\nbackoff_base = \"1ms\"\nbackoff_max = \"2ms\"\n\
         on = [\"connect-failure\", \"reset\", \"timeout\", \"502\", \"503\", \"504\"]\n\
         [upstreams.payments.budget]\n{budget}\n"
    );
    let config = crate::config::parse("t.toml", &text, std::path::Path::new("."))
        .unwrap_or_else(|e| panic!("{e}"));
    let metrics = Metrics::new();
    let listeners = Listeners::new(&config.listener);
    let snapshot = Snapshot::build(config, &metrics, None, 1);
    let shared = Shared::new(snapshot, metrics, 1, Box::new([]), listeners, None);
    let script = Arc::new(Script::new(steps));
    Side {
        outbound: Outbound {
            shared,
            dedicated: None,
            captured: None,
            wire: Scripted(script.clone()),
        },
        script,
        conn: Arc::new(ConnState::for_tests([127, 0, 0, 1].into())),
    }
}

const ROOMY: &str = "ratio = 1.0\nmin_per_sec = 100";

impl Side {
    /// The app's request to `host`, with `headers`, over HTTP/2 (its answer's fields
    /// are then in its head, where the test reads them).
    async fn send(&self, method: Method, host: &str, headers: &[(&str, &str)]) -> Got {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{host}/pay"))
            .version(http::Version::HTTP_2);
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let req = req
            .body(AppBody::Http1(Http1Body::read_ahead(b"")))
            .unwrap();
        Got::of(self.outbound.call(Box::new(req), &self.conn).await).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_goes_to_the_upstream_its_authority_names_and_an_unknown_one_is_named() {
    let s = side("", ROOMY, [Step::Answer(MS, OK)]);
    let got = s.send(Method::GET, "payments", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body, "ok");
    assert_eq!(got.attempts(), Some("1"));
    assert_eq!(got.outcome(), None);

    let lost = s.send(Method::GET, "paymnets", &[]).await;
    assert_eq!(lost.status, StatusCode::NOT_FOUND);
    assert_eq!(lost.outcome(), Some("no-route"));
    assert!(lost.body.contains("\"paymnets\""), "{}", lost.body);
    assert_eq!(s.script.sent().len(), 1, "nothing was sent for the typo");
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_retried_on_the_other_endpoint_and_the_app_told_how_many_attempts() {
    let s = side("", ROOMY, [Step::Answer(MS, S503), Step::Answer(MS, OK)]);
    let got = s.send(Method::GET, "payments", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.attempts(), Some("2"));
    let sent = s.script.sent();
    assert_eq!(sent.len(), 2);
    assert_ne!(
        sent[0].endpoint, sent[1].endpoint,
        "not back to the same pod"
    );
    assert_eq!((sent[0].number, sent[1].number), (1, 2));
}

#[tokio::test(start_paused = true)]
async fn every_attempt_failing_gives_the_last_failure_with_the_outcome_that_says_owned() {
    let s = side("", ROOMY, [Step::Answer(MS, S503); 3]);
    let got = s.send(Method::GET, "payments", &[]).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(got.body, "busy", "the upstream's own answer");
    assert_eq!(got.attempts(), Some("3"));
    assert_eq!(got.outcome(), Some("attempts-exhausted"));
}

#[tokio::test(start_paused = true)]
async fn the_callers_deadline_travels_down_and_one_already_spent_is_refused_unsent() {
    let s = side("", ROOMY, [Step::Hang]);
    let spent = s
        .send(Method::GET, "payments", &[("x-timeout-ms", "0")])
        .await;
    assert_eq!(spent.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(spent.outcome(), Some("deadline-exceeded"));
    assert_eq!(spent.attempts(), Some("0"));
    assert!(
        s.script.sent().is_empty(),
        "no attempt for a deadline already gone"
    );

    let start = Instant::now();
    let got = s
        .send(Method::GET, "payments", &[("x-timeout-ms", "300")])
        .await;
    assert_eq!(got.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(got.outcome(), Some("deadline-exceeded"));
    let took = start.elapsed();
    assert!(
        took >= 300 * MS && took < 400 * MS,
        "answered at the deadline: {took:?}"
    );
    let sent = s.script.sent();
    assert_eq!(sent.len(), 1, "no retry starts that nobody waits for");
    assert!(
        sent[0].deadline_ms.is_some_and(|d| d <= 300 && d > 250),
        "the time left travels down: {:?}",
        sent[0].deadline_ms
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_the_budget_has_no_room_for_is_not_made_and_the_app_is_told_why() {
    let s = side(
        "",
        "ratio = 0.0\nmin_per_sec = 0",
        [Step::Answer(MS, S503), Step::Answer(MS, OK)],
    );
    let got = s.send(Method::GET, "payments", &[]).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(got.outcome(), Some("budget-exhausted"));
    assert_eq!(got.attempts(), Some("1"));
    assert_eq!(s.script.sent().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failure_another_tollgate_owned_is_passed_back_as_it_came_and_not_retried() {
    let s = side("", ROOMY, [Step::Answer(MS, OWNED), Step::Answer(MS, OK)]);
    let got = s.send(Method::GET, "payments", &[]).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        got.outcome(),
        Some("attempts-exhausted"),
        "the callee's word"
    );
    assert_eq!(got.attempts(), Some("1"));
    assert_eq!(s.script.sent().len(), 1, "one layer retries");
}

#[tokio::test(start_paused = true)]
async fn a_full_upstream_refuses_at_once_and_frees_its_place_when_the_request_in_flight_ends() {
    let s = Arc::new(side(
        "max_inflight = 1",
        ROOMY,
        [
            Step::Answer(Duration::from_secs(1), OK),
            Step::Answer(MS, OK),
        ],
    ));
    let first = tokio::spawn({
        let s = s.clone();
        async move { s.send(Method::GET, "payments", &[]).await }
    });
    // Until the first request's attempt is out (virtual time: bounded by the loop).
    for _ in 0..100 {
        if !s.script.sent().is_empty() {
            break;
        }
        tokio::time::sleep(MS).await;
    }
    assert_eq!(s.script.sent().len(), 1, "the first request is in flight");
    let refused = s.send(Method::GET, "payments", &[]).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.outcome(), Some("overloaded"));
    assert_eq!(refused.attempts(), Some("0"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    let after = s.send(Method::GET, "payments", &[]).await;
    assert_eq!(after.status, StatusCode::OK, "its place was given back");
}

#[tokio::test(start_paused = true)]
async fn a_grpc_call_given_up_gets_a_grpc_answer_that_says_do_not_retry() {
    let s = side("", ROOMY, [Step::Answer(MS, S503)]);
    let grpc = [("content-type", "application/grpc")];
    let got = s.send(Method::POST, "payments", &grpc).await;
    assert_eq!(
        got.status,
        StatusCode::OK,
        "gRPC's failures travel in grpc-status"
    );
    assert_eq!(got.header("grpc-status"), Some("14"), "UNAVAILABLE");
    assert_eq!(got.header("grpc-retry-pushback-ms"), Some("-1"));
    // A POST without a key is not retried: one attempt, the failure owned here.
    assert_eq!(got.outcome(), Some("not-retryable"));
    assert_eq!(got.attempts(), Some("1"));

    // Refused before any attempt: in gRPC's words too.
    let lost = s.send(Method::POST, "elsewhere", &grpc).await;
    assert_eq!(lost.status, StatusCode::OK);
    assert_eq!(lost.header("grpc-status"), Some("12"), "UNIMPLEMENTED");
    assert_eq!(lost.outcome(), Some("no-route"));
}

#[tokio::test(start_paused = true)]
async fn a_connect_over_http2_is_refused_without_an_attempt() {
    let s = side("", ROOMY, [Step::Answer(MS, OK)]);
    let got = s.send(Method::CONNECT, "payments", &[]).await;
    assert_eq!(got.status.as_u16() / 100, 4, "{got:?}");
    assert!(got.outcome().is_some(), "{got:?}");
    assert!(s.script.sent().is_empty());
}
