//! A scripted [`Transport`] for the retry loop's tests: each attempt, in the order they
//! start, gets the next [`Step`] of the script (an answer after a while, a reset, a
//! refused connection, a TLS failure, or nothing at all), and what each attempt sent is
//! kept for the test to read. Answers are real responses, read by tollgate's HTTP/1.1
//! codec from an in-memory connection ([`crate::upstream::scripted`]); time is tokio's,
//! so a test with paused time runs a script of seconds in no time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::fault::Fault;
use crate::retry::forward::attempt::Attempt;
use crate::retry::forward::attempt::{NoHead, Transport};
use crate::retry::forward::replay::{ReplayBody, RetriedBody};
use crate::upstream::pool::Endpoint;
use crate::upstream::response::UpstreamResponse;
use crate::upstream::scripted;

/// What the endpoint does with one attempt.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// Answers these bytes (status line, fields, body) after this long.
    Answer(Duration, &'static str),
    /// Breaks the connection after this long, once the request went out.
    Reset(Duration),
    /// Refuses the connection.
    Refuse,
    /// The TLS handshake fails.
    Tls,
    /// Never answers: the attempt lasts until its deadline, or until it is dropped.
    Hang,
}

/// What one attempt sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub endpoint: usize,
    /// `x-tollgate-attempt`.
    pub number: u32,
    pub hedge: bool,
    /// When it went out.
    pub at: Instant,
    /// The deadline header it carried, in milliseconds.
    pub deadline_ms: Option<u64>,
    /// The idempotency key it carried (the request's own, or minted for it).
    pub key: Option<String>,
    /// The dedupe store it named (`x-tollgate-dedupe-store`).
    pub store: Option<String>,
}

#[derive(Default)]
pub struct Script {
    steps: Mutex<VecDeque<Step>>,
    sent: Mutex<Vec<Sent>>,
}

impl Script {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Script {
            steps: Mutex::new(steps.into_iter().collect()),
            sent: Mutex::default(),
        }
    }

    /// What the attempts sent so far, in the order they started.
    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn next(&self) -> Step {
        self.steps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .unwrap_or(Step::Hang)
    }
}

impl<A: RetriedBody> Transport<A> for Script {
    async fn exchange(
        &self,
        a: &Attempt<'_, A>,
        body: &mut Option<ReplayBody<A>>,
        _carried: &mut Option<Arc<Endpoint<ReplayBody<A>>>>,
    ) -> Result<UpstreamResponse, NoHead> {
        self.play(a, body).await.map_err(NoHead::from)
    }
}

impl Script {
    /// The next step, played for attempt `a`.
    async fn play<A: RetriedBody>(
        &self,
        a: &Attempt<'_, A>,
        body: &mut Option<ReplayBody<A>>,
    ) -> Result<UpstreamResponse, Fault> {
        let now = Instant::now();
        let head = a.head_at(now);
        let deadline_ms = head
            .added()
            .find(|(name, _)| *name == "x-timeout-ms")
            .and_then(|(_, v)| v.to_str().ok()?.parse().ok());
        let key = head
            .added()
            .find(|(name, _)| *name == "idempotency-key")
            .map(|(_, v)| v)
            .or_else(|| head.headers.get("idempotency-key"))
            .and_then(|v| Some(v.to_str().ok()?.to_string()));
        let store = head
            .added()
            .find(|(name, _)| *name == "x-tollgate-dedupe-store")
            .and_then(|(_, v)| Some(v.to_str().ok()?.to_string()));
        self.sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Sent {
                endpoint: a.endpoint,
                number: a.number,
                hedge: a.hedge,
                at: now,
                deadline_ms,
                key,
                store,
            });
        let wait = |d: Duration| async move {
            let at = now + d;
            match a.by {
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
            Step::Refuse => Err(Fault::ConnectFailure),
            Step::Tls => Err(Fault::Tls),
            Step::Reset(after) => {
                if !wait(after).await {
                    return Err(Fault::Timeout);
                }
                body.take();
                Err(Fault::Reset)
            }
            Step::Hang => {
                match a.by {
                    Some(by) => tokio::time::sleep_until(by).await,
                    None => std::future::pending().await,
                }
                Err(Fault::Timeout)
            }
            Step::Answer(after, bytes) => {
                if !wait(after).await {
                    return Err(Fault::Timeout);
                }
                let Some(sending) = body.take() else {
                    return Err(Fault::ConnectFailure);
                };
                scripted::answer(&head, sending, bytes.as_bytes())
                    .await
                    .map_err(|_| Fault::Reset)
            }
        }
    }
}
