//! The inbound service, whole, on a scripted app with paused time: a caller's request as
//! the app-facing server hands it over, through the deadline, dedupe, the concurrency
//! limit and the fleet's retry budget, to the answer the caller gets, with the app's
//! side played by a script ([`Scripted`]) and no socket. As the outbound service is
//! tested (`crate::proxy`'s tests): what a caller would notice, per stage, and whether
//! the app was called.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, Method, Request, StatusCode, Version};
use http_body_util::BodyExt;
use prometheus::IntCounter;
use tokio::time::Instant;

use super::Inbound;
use super::app::{App, AppWire, DeadlineFields, NoAnswer};
use super::service::InboundService;
use crate::answer::OutboundAnswers;
use crate::fault::Fault;
use crate::metrics::{Metrics, Outcome};
use crate::retry::forward::script::Step;
use crate::server::got::Got;
use crate::server::socket::Http1Body;
use crate::server::watchdog::ConnState;
use crate::server::{AppBody, Service};
use crate::upstream::OutgoingBody;
use crate::upstream::pool::Want;
use crate::upstream::request::RequestHead;
use crate::upstream::response::UpstreamResponse;
use crate::upstream::scripted;

const MS: Duration = Duration::from_millis(1);

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nfrom app";
const CREATED: &str = "HTTP/1.1 201 Created\r\nx-order: 1\r\ncontent-length: 7\r\n\r\norder 1";
const S503: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy";
/// A gRPC answer whose status, `UNAVAILABLE`, comes in its trailers.
const GRPC_UNAVAILABLE: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n\
    transfer-encoding: chunked\r\n\r\n5\r\n\0\0\0\0\0\r\n0\r\ngrpc-status: 14\r\n\
    grpc-message: down\r\n\r\n";
/// The same with `OK` in its trailers.
const GRPC_OK: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\n\
    transfer-encoding: chunked\r\n\r\n5\r\n\0\0\0\0\0\r\n0\r\ngrpc-status: 0\r\n\r\n";

/// What the app received of one request: its head, with the fields the inbound side
/// added (the deadline's time left, `traceparent`).
#[derive(Clone, Debug)]
struct Received {
    method: Method,
    headers: HeaderMap,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The app's side: each request, in the order they reach it, gets the next [`Step`]
/// (an answer after a while, a reset once it has read the whole request, a refused
/// connection, or nothing until the deadline), and what each received is kept for the
/// test to read. An answer is real bytes, read by tollgate's HTTP/1.1 codec from an
/// in-memory connection ([`scripted::answer`]).
#[derive(Default)]
struct Script {
    steps: Mutex<VecDeque<Step>>,
    received: Mutex<Vec<Received>>,
}

impl Script {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Script {
            steps: Mutex::new(steps.into_iter().collect()),
            received: Mutex::default(),
        }
    }

    /// What the app received so far.
    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// How many requests reached the app.
    fn calls(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    fn next(&self) -> Step {
        self.steps.lock().unwrap().pop_front().unwrap_or(Step::Hang)
    }
}

/// The app, as a script plays it.
#[derive(Clone)]
struct Scripted(Arc<Script>);

impl AppWire for Scripted {
    fn send<'a, B: OutgoingBody>(
        &'a self,
        _app: &'a App<B>,
        _want: Want,
        head: &'a RequestHead<'a>,
        body: B,
        fields: &'a DeadlineFields<'a>,
        _exhausted: &'a IntCounter,
    ) -> impl Future<Output = Result<UpstreamResponse, NoAnswer>> + Send + 'a {
        self.0.play(head, body, fields)
    }
}

impl Script {
    /// The next step, played for a request with `head` and `body`.
    async fn play<B: OutgoingBody>(
        &self,
        head: &RequestHead<'_>,
        body: B,
        fields: &DeadlineFields<'_>,
    ) -> Result<UpstreamResponse, NoAnswer> {
        let now = Instant::now();
        let head = RequestHead {
            fields: fields.at(now),
            ..*head
        };
        let mut headers = head.headers.clone();
        for (name, value) in head.added() {
            headers.insert(name.clone(), value.clone());
        }
        self.received.lock().unwrap().push(Received {
            method: head.method.clone(),
            headers,
        });
        let by = fields.deadline.at();
        let no = |fault, sent| Err(NoAnswer { fault, sent });
        // Whether `d` passed before the deadline.
        let wait = |d: Duration| async move {
            let at = now + d;
            match by {
                Some(by) if by < at => {
                    tokio::time::sleep_until(by).await;
                    false
                }
                _ => {
                    tokio::time::sleep_until(at).await;
                    true
                }
            }
        };
        match self.next() {
            Step::Refuse | Step::Tls => no(Fault::ConnectFailure, false),
            Step::Reset(after) => {
                // The app reads the whole request, then breaks the connection.
                let _ = body.collect().await;
                if !wait(after).await {
                    return no(Fault::Timeout, true);
                }
                no(Fault::Reset, true)
            }
            Step::Hang => {
                match by {
                    Some(by) => tokio::time::sleep_until(by).await,
                    None => std::future::pending().await,
                }
                no(Fault::Timeout, true)
            }
            Step::Answer(after, bytes) => {
                if !wait(after).await {
                    return no(Fault::Timeout, true);
                }
                scripted::answer(&head, body, bytes.as_bytes())
                    .await
                    .map_err(|_| NoAnswer {
                        fault: Fault::Reset,
                        sent: true,
                    })
            }
        }
    }
}

/// An inbound side in front of a scripted app, with `extra` TOML in its `[inbound]`
/// table.
struct Side {
    inbound: Arc<Inbound>,
    service: InboundService<Scripted>,
    app: Arc<Script>,
    conn: Arc<ConnState>,
}

fn side(extra: &str, steps: impl IntoIterator<Item = Step>) -> Side {
    let text = format!("[inbound]\naddr = \"127.0.0.1:0\"\napp = \"127.0.0.1:1\"\n{extra}\n");
    let config = crate::config::parse("t.toml", &text, std::path::Path::new("."))
        .unwrap_or_else(|e| panic!("{e}"));
    let settings = config.inbound.as_ref().expect("an [inbound] table");
    let inbound = Inbound::new(
        settings,
        (&config.deadline, config.access_log, None),
        Metrics::new(),
        1,
    );
    let app = Arc::new(Script::new(steps));
    Side {
        service: inbound.service_on(Scripted(app.clone())),
        inbound,
        app,
        conn: Arc::new(ConnState::for_tests([10, 0, 0, 7].into())),
    }
}

/// A caller's request to the app, over HTTP/2 (the answer's fields are then in its
/// head, where the test reads them), with `headers` and `body`.
fn request(method: Method, headers: &[(&str, &str)], body: &str) -> Request<AppBody> {
    let mut req = Request::builder()
        .method(method)
        .uri("http://app/orders")
        .version(Version::HTTP_2);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    req.body(AppBody::Http1(Http1Body::read_ahead(body.as_bytes())))
        .unwrap()
}

impl Side {
    async fn call(&self, req: Request<AppBody>) -> Got {
        Got::of(self.service.call(Box::new(req), &self.conn).await).await
    }

    async fn get(&self, headers: &[(&str, &str)]) -> Got {
        self.call(request(Method::GET, headers, "")).await
    }

    /// Until `n` requests have reached the app (virtual time: bounded by the loop).
    async fn until_the_app_has(&self, n: usize) {
        for _ in 0..100 {
            if self.app.calls() >= n {
                return;
            }
            tokio::time::sleep(MS).await;
        }
        panic!("the app got {} requests, not {n}", self.app.calls());
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_reaches_the_app_and_its_answer_comes_back_as_it_came() {
    let s = side("", [Step::Answer(MS, OK)]);
    let got = s.get(&[("x-request-id", "r-1")]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body, "from app");
    assert_eq!(
        got.outcome(),
        None,
        "nothing of tollgate's on the app's answer"
    );
    assert_eq!(got.header("x-tollgate-attempts"), None);
    assert_eq!(got.header("connection"), None);
    let received = s.app.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].method, Method::GET);
    assert_eq!(received[0].header("host"), Some("app"));
    assert_eq!(received[0].header("x-request-id"), Some("r-1"));
    assert_eq!(
        received[0].header("x-timeout-ms"),
        None,
        "no deadline, none sent"
    );
}

#[tokio::test(start_paused = true)]
async fn an_app_that_refuses_is_a_502_that_closes_the_connection_for_the_caller_to_go_elsewhere() {
    let s = side("", [Step::Refuse]);
    let mut req = request(Method::GET, &[], "");
    *req.version_mut() = Version::HTTP_11;
    let got = s.call(req).await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        got.outcome(),
        Some("app-unreachable; ran=no"),
        "it did not run"
    );
    assert_eq!(
        got.header("connection"),
        Some("close"),
        "the caller's next connection may reach another pod"
    );
    assert_eq!(got.body, "the app could not be reached\n");
    assert_eq!(
        s.app.calls(),
        1,
        "tried once: the inbound side never retries"
    );
}

#[tokio::test(start_paused = true)]
async fn a_grpc_call_to_an_app_that_refuses_gets_unavailable_which_its_caller_may_retry() {
    let s = side("", [Step::Refuse]);
    let grpc = [("content-type", "application/grpc")];
    let got = s.call(request(Method::POST, &grpc, "")).await;
    assert_eq!(
        got.status,
        StatusCode::OK,
        "gRPC's failures travel in grpc-status"
    );
    assert_eq!(got.header("grpc-status"), Some("14"), "UNAVAILABLE");
    assert_eq!(
        got.outcome(),
        Some("app-unreachable; ran=no"),
        "it did not run"
    );
    assert_eq!(got.header("grpc-retry-pushback-ms"), None, "not owned");
}

#[tokio::test(start_paused = true)]
async fn an_app_that_breaks_the_connection_is_a_502_and_one_that_is_too_slow_a_504() {
    let s = side("", [Step::Reset(MS), Step::Hang]);
    let reset = s.get(&[]).await;
    assert_eq!(reset.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        reset.outcome(),
        Some("app-unreachable; ran=maybe"),
        "it may have run"
    );
    assert_eq!(reset.header("connection"), Some("close"));
    assert_eq!(
        reset.body,
        "the app closed the connection without an answer\n"
    );

    let start = Instant::now();
    let slow = s.get(&[("x-timeout-ms", "300")]).await;
    let took = start.elapsed();
    assert_eq!(slow.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(slow.outcome(), Some("app-timeout"), "the app's, not owned");
    assert_eq!(slow.header("connection"), Some("close"));
    assert!(
        took >= 300 * MS && took < 400 * MS,
        "answered at the deadline: {took:?}"
    );
    assert_eq!(s.app.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_spent_deadline_is_refused_unsent_and_the_app_gets_the_time_left() {
    let s = side("", [Step::Answer(10 * MS, OK)]);
    let spent = s.get(&[("x-timeout-ms", "0")]).await;
    assert_eq!(spent.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(spent.outcome(), Some("deadline-exceeded"));
    assert_eq!(s.app.calls(), 0, "no work nobody will wait for");

    let got = s.get(&[("x-timeout-ms", "300")]).await;
    assert_eq!(got.status, StatusCode::OK);
    let left = s.app.received()[0]
        .header("x-timeout-ms")
        .and_then(|v| v.parse::<u64>().ok())
        .expect("the deadline travels to the app");
    assert!(left <= 300 && left > 250, "the time left: {left}");
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_runs_once_and_a_duplicate_gets_the_kept_answer_without_the_app() {
    let s = side(
        "[inbound.dedupe]\nstore = \"memory\"",
        [Step::Answer(MS, CREATED), Step::Answer(MS, CREATED)],
    );
    let key = [("idempotency-key", "\"k-1\"")];
    let first = s.call(request(Method::POST, &key, "coffee")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body, "order 1");
    assert_eq!(first.header("idempotent-replayed"), None);
    let advert = first.header("x-tollgate-dedupe").expect("dedupe says so");
    assert!(
        advert.starts_with("on; header=idempotency-key; scope=replica; store="),
        "{advert}"
    );
    assert_eq!(s.app.calls(), 1);

    let again = s.call(request(Method::POST, &key, "coffee")).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.body, "order 1");
    assert_eq!(again.header("x-order"), Some("1"), "the app's own fields");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("x-tollgate-dedupe"), Some(advert));
    assert_eq!(s.app.calls(), 1, "the app ran once");

    let other = s.call(request(Method::POST, &key, "tea")).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.outcome(), Some("key-mismatch"));
    assert_eq!(s.app.calls(), 1, "a key reused for another body never runs");

    let unkeyed = s.call(request(Method::POST, &[], "coffee")).await;
    assert_eq!(unkeyed.status, StatusCode::CREATED);
    assert_eq!(unkeyed.header("idempotent-replayed"), None);
    assert_eq!(
        s.app.calls(),
        2,
        "a request without a key is not deduplicated"
    );
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_in_flight_joins_the_first_and_one_whose_deadline_comes_first_is_told_to_wait()
{
    let s = Arc::new(side(
        "[inbound.dedupe]\nstore = \"memory\"",
        [Step::Answer(Duration::from_secs(1), CREATED)],
    ));
    let key = [("idempotency-key", "\"k-2\"")];
    let first = tokio::spawn({
        let s = s.clone();
        async move { s.call(request(Method::POST, &key, "coffee")).await }
    });
    s.until_the_app_has(1).await;
    let joined = tokio::spawn({
        let s = s.clone();
        async move { s.call(request(Method::POST, &key, "coffee")).await }
    });
    let hurried = [key[0], ("x-timeout-ms", "100")];
    let early = s.call(request(Method::POST, &hurried, "coffee")).await;
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(early.outcome(), Some("in-progress"));
    assert_eq!(early.header("retry-after"), Some("1"));

    let (first, joined) = (first.await.unwrap(), joined.await.unwrap());
    assert_eq!(
        (first.status, first.body.as_str()),
        (StatusCode::CREATED, "order 1")
    );
    assert_eq!(
        (joined.status, joined.body.as_str()),
        (StatusCode::CREATED, "order 1")
    );
    assert_eq!(s.app.calls(), 1, "the app ran once for all three");
}

#[tokio::test(start_paused = true)]
async fn a_keyed_request_the_app_never_got_frees_its_key_and_one_it_may_have_run_is_not_replayed() {
    let s = side(
        "[inbound.dedupe]\nstore = \"memory\"",
        [Step::Refuse, Step::Reset(MS), Step::Answer(MS, CREATED)],
    );
    let key = [("idempotency-key", "\"k-3\"")];
    let refused = s.call(request(Method::POST, &key, "coffee")).await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
    assert_eq!(refused.outcome(), Some("app-unreachable; ran=no"));

    // It never ran: the same request runs now, and the app breaks the connection once
    // it has it.
    let reset = s.call(request(Method::POST, &key, "coffee")).await;
    assert_eq!(reset.status, StatusCode::BAD_GATEWAY);
    assert_eq!(s.app.calls(), 2);

    // It may have run, and its answer is gone: never run again, never replayed.
    let again = s.call(request(Method::POST, &key, "coffee")).await;
    assert_eq!(again.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(again.outcome(), Some("not-replayable"));
    assert_eq!(s.app.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_full_limit_refuses_at_once_spares_a_probe_and_frees_its_place_when_the_answer_ends() {
    let s = Arc::new(side(
        "max_inflight = 1",
        [
            Step::Answer(Duration::from_secs(1), OK),
            Step::Answer(MS, OK),
            Step::Answer(MS, OK),
        ],
    ));
    let first = tokio::spawn({
        let s = s.clone();
        async move { s.get(&[]).await }
    });
    s.until_the_app_has(1).await;
    let refused = s.get(&[]).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.outcome(), Some("overloaded"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        s.app.calls(),
        1,
        "the refused request never reached the app"
    );

    let probe = s.get(&[("user-agent", "kube-probe/1.31")]).await;
    assert_eq!(probe.status, StatusCode::OK, "a probe is never shed");
    assert_eq!(s.app.calls(), 2);

    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    let after = s.get(&[]).await;
    assert_eq!(after.status, StatusCode::OK, "its place was given back");
}

#[tokio::test(start_paused = true)]
async fn a_retry_beyond_the_fleet_budget_is_rejected_and_never_reaches_the_app() {
    let s = side(
        "[inbound.retries]\nratio = 0.0\nmin_per_sec = 0",
        [Step::Answer(MS, OK)],
    );
    let first = s.get(&[("x-tollgate-attempt", "1")]).await;
    assert_eq!(first.status, StatusCode::OK);
    let retry = s.get(&[("x-tollgate-attempt", "2")]).await;
    assert_eq!(retry.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry.outcome(), Some("retry-rejected"));
    assert_eq!(s.app.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_apps_failure_after_its_own_call_was_given_up_on_is_marked_owned() {
    let s = side(
        "",
        [Step::Answer(10 * MS, S503), Step::Answer(10 * MS, S503)],
    );
    // This pod's outbound side gives up on a call made for the request in flight.
    let marked = tokio::spawn({
        let (service, conn) = (s.service.clone(), s.conn.clone());
        async move {
            let req = request(Method::GET, &[("x-request-id", "r-7")], "");
            service.call(Box::new(req), &conn).await
        }
    });
    s.until_the_app_has(1).await;
    let mut call = HeaderMap::new();
    call.insert("x-request-id", http::HeaderValue::from_static("r-7"));
    s.inbound
        .outbound_answered(Outcome::AttemptsExhausted, &call);
    let marked = marked.await.unwrap();
    assert_eq!(marked.status(), StatusCode::SERVICE_UNAVAILABLE);
    let header = |name| marked.headers().get(name).and_then(|v| v.to_str().ok());
    assert_eq!(header("x-tollgate-outcome"), Some("downstream-owned"));
    assert_eq!(header("grpc-retry-pushback-ms"), Some("-1"));

    // Another request's failure, with no give-up made for it, goes back as it came.
    let plain = s.get(&[("x-request-id", "r-8")]).await;
    assert_eq!(plain.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(plain.body, "busy");
    assert_eq!(plain.outcome(), None, "its callers may retry it");
}

#[tokio::test(start_paused = true)]
async fn a_grpc_unavailable_in_the_trailers_after_its_own_call_was_given_up_on_is_marked_there() {
    let s = side(
        "",
        [
            Step::Answer(10 * MS, GRPC_UNAVAILABLE),
            Step::Answer(10 * MS, GRPC_UNAVAILABLE),
            Step::Answer(10 * MS, GRPC_OK),
        ],
    );
    let grpc = |id: &'static str| {
        request(
            Method::POST,
            &[
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("x-request-id", id),
            ],
            "\0\0\0\0\0",
        )
    };
    let given_up = |id: &'static str| {
        let mut call = HeaderMap::new();
        call.insert("x-request-id", http::HeaderValue::from_static(id));
        s.inbound
            .outbound_answered(Outcome::AttemptsExhausted, &call);
    };
    let in_flight = |id: &'static str| {
        let (service, conn) = (s.service.clone(), s.conn.clone());
        tokio::spawn(async move { Got::of(service.call(Box::new(grpc(id)), &conn).await).await })
    };

    // The pod's outbound side gives up, owned, on a call made for the request in flight.
    let marked = in_flight("g-1");
    s.until_the_app_has(1).await;
    given_up("g-1");
    let marked = marked.await.unwrap();
    assert_eq!(marked.status, StatusCode::OK);
    assert_eq!(marked.outcome(), None, "the head said nothing yet");
    assert_eq!(marked.trailer("grpc-status"), Some("14"));
    assert_eq!(
        marked.trailer("x-tollgate-outcome"),
        Some("downstream-owned")
    );
    assert_eq!(marked.trailer("grpc-retry-pushback-ms"), Some("-1"));

    // Another call's UNAVAILABLE, with no give-up made for it, goes back as it came.
    let plain = s.call(grpc("g-2")).await;
    assert_eq!(plain.trailer("grpc-status"), Some("14"));
    assert_eq!(
        plain.trailer("x-tollgate-outcome"),
        None,
        "its callers may retry it"
    );
    assert_eq!(plain.trailer("grpc-retry-pushback-ms"), None);

    // A success after a give-up is not a failure to mark.
    let ok = in_flight("g-3");
    s.until_the_app_has(3).await;
    given_up("g-3");
    let ok = ok.await.unwrap();
    assert_eq!(ok.trailer("grpc-status"), Some("0"));
    assert_eq!(ok.trailer("x-tollgate-outcome"), None);
}

#[tokio::test(start_paused = true)]
async fn a_connect_is_refused_without_reaching_the_app() {
    let s = side("", [Step::Answer(MS, OK)]);
    let got = s.call(request(Method::CONNECT, &[], "")).await;
    assert_eq!(got.status.as_u16() / 100, 4, "{got:?}");
    assert!(got.outcome().is_some(), "{got:?}");
    assert_eq!(s.app.calls(), 0);
}
