//! One request on one endpoint, as both sides send it: a pooled connection when one is
//! ready (the common case, no timer), else a new one within the connect timeout; the
//! head, made for the moment it goes out; the body; and the response head awaited until
//! the deadline, if there is one. A pooled connection the endpoint had closed is passed
//! over for another without resending anything (the request never left), a few times.
//!
//! The outbound side's attempts and the inbound side's requests to the app both send
//! this way, and both read a failure ([`Failed`], with the detail worth logging) as
//! the one [`Fault`] it is ([`Failed::fault`]); what each side then does with it is its
//! own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use super::OutgoingBody;
use super::connect::ConnectError;
use super::pool::{Conn, Endpoint, SendError, Want};
use super::request::{ContinueWait, RequestHead};
use super::response::UpstreamResponse;
use super::tls::TlsClient;
use super::tls_failure;
use crate::deadline;
use crate::fault::Fault;
use crate::http::BoxError;

/// Stale pooled connections passed over within one exchange before giving up on it.
pub const MAX_STALE: u32 = 3;
/// How long a connect raced past its connect timeout is waited for, without a
/// deadline to end it sooner.
pub const CONNECT_MAX: Duration = Duration::from_secs(10);
/// How long a body behind `Expect: 100-continue` waits for `100 Continue` at most (some
/// servers never send one), as curl does; never more than a quarter of the time left.
pub const CONTINUE_WAIT: Duration = Duration::from_secs(1);

/// How to reach the endpoint.
pub struct Reach<'a, B> {
    pub want: Want,
    pub tls: Option<&'a TlsClient>,
    pub connect_timeout: Duration,
    /// When the exchange started: a pooled connection taken at once is used as of then.
    pub started: Instant,
    /// When the response head is no longer waited for: the request's deadline.
    pub by: Option<Instant>,
    /// On a connection of its own, not a pooled one: a retry to the endpoint that just
    /// failed the request (behind a Service's virtual IP a new connection may reach
    /// another pod; the pooled one reaches the same).
    pub own_connection: bool,
    /// How a connect still not made at `connect_timeout` is raced; without it
    /// (`None`), such a connect fails.
    pub race: Option<&'a Race<'a, B>>,
}

/// What racing a second connect beside a slow one takes: the endpoint and the TLS
/// client owned, since a connect that loses runs on in a task of its own (its
/// connection is pooled if it is made), and where the second connect goes.
pub struct Race<'a, B> {
    /// The endpoint the exchange is sent to.
    pub endpoint: &'a Arc<Endpoint<B>>,
    pub tls: Option<&'a Arc<TlsClient>>,
    /// Another endpoint for the second connect, asked only when one is due (`None`:
    /// the same endpoint again, on a connection of its own).
    pub other: &'a (dyn Fn() -> Option<Arc<Endpoint<B>>> + Sync),
}

impl<B> Clone for Reach<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Reach<'_, B> {}

/// Why no response head came, with what is worth logging of it.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    /// No connection could be opened (the endpoint's address, refused, TLS, a
    /// descriptor shortage: [`ConnectError`] says which).
    #[error("{0}")]
    Connect(ConnectError),
    /// No connection within the connect timeout.
    #[error("connect timed out")]
    ConnectTimeout,
    /// The deadline passed while connecting: a timeout, and nothing was sent.
    #[error("no connection before the deadline")]
    DeadlineConnecting,
    /// The deadline passed before the response head.
    #[error("no response head in time")]
    Timeout,
    /// The connection broke after the request may have gone out; `fresh`: on a
    /// connection opened for this exchange.
    #[error("{error}")]
    Broken { error: BoxError, fresh: bool },
    /// Connections kept turning out closed before the request left; `closed`: why the
    /// last one opened for this exchange closed, when one was (a server that refuses
    /// tollgate's client certificate closes a new TLS 1.3 connection so, right after
    /// the handshake seemed done).
    #[error("connections kept closing before the request left")]
    Stale { closed: Option<hyper::Error> },
}

/// What carried an exchange, as far as telling a server's TLS refusal goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Plain,
    /// TLS; `client_cert`: with a client certificate presented, so a connection closed
    /// right after the handshake is most likely its refusal.
    Tls {
        client_cert: bool,
    },
}

impl Failed {
    /// Whether the request may have reached the peer: it went out on a connection (a
    /// timeout after that, or a break). A connect that failed or outlasted the deadline,
    /// or connections that closed before it left, sent nothing.
    pub fn sent(&self) -> bool {
        matches!(self, Failed::Timeout | Failed::Broken { .. })
    }

    /// The fault this failure is: the one reading of an exchange's failure, for both
    /// sides.
    ///
    /// Over TLS, a server that refuses the connection (tollgate's client certificate,
    /// say) may say so only once the handshake seemed done: a new connection that
    /// closes before the request leaves, or breaks on its first exchange, with a TLS
    /// alert or right away with a client certificate presented, is a TLS fault, not a
    /// connect failure or a reset ([`Self::tls_refusal`] says why).
    pub fn fault(&self, wire: Wire) -> Fault {
        match self {
            Failed::Connect(e) if e.out_of_descriptors() => Fault::NoDescriptors,
            Failed::Timeout | Failed::DeadlineConnecting => Fault::Timeout,
            _ if self.tls_refusal(wire).is_some() => Fault::Tls,
            Failed::Broken { .. } => Fault::Reset,
            // The request never left.
            _ => Fault::ConnectFailure,
        }
    }

    /// Why the TLS handshake failed or the server refused the connection, when that is
    /// what this failure is: worth telling the app.
    pub fn tls_refusal(&self, wire: Wire) -> Option<String> {
        let tls = matches!(wire, Wire::Tls { .. });
        let client_cert = wire == Wire::Tls { client_cert: true };
        match self {
            Failed::Connect(e) if e.out_of_descriptors() => None,
            Failed::Connect(e) => e.tls_reason(client_cert),
            Failed::ConnectTimeout | Failed::Timeout | Failed::DeadlineConnecting => None,
            Failed::Stale { closed } => closed
                .as_ref()
                .filter(|_| tls)
                .and_then(|e| tls_failure::rejection(e, client_cert)),
            Failed::Broken { error, fresh } => Some(error)
                .filter(|_| tls && *fresh)
                .and_then(|e| tls_failure::rejection(&**e, client_cert)),
        }
    }
}

/// Sends the request on `endpoint`: `head(now, fresh)` makes its head as it goes out
/// (`fresh`: on a connection opened for it). The body comes back in `body` when it never
/// left. `carried` is set to the endpoint that carried the request when that is not
/// `endpoint`: its connect was slow, and another endpoint's connect, raced beside it,
/// was made first.
pub async fn send<'h, B: OutgoingBody>(
    endpoint: &Endpoint<B>,
    reach: Reach<'_, B>,
    head: impl Fn(Instant) -> RequestHead<'h>,
    body: &mut Option<B>,
    carried: &mut Option<Arc<Endpoint<B>>>,
) -> Result<UpstreamResponse, Failed> {
    let mut closed = None;
    for turn in 0..=MAX_STALE {
        let on = carried.as_deref().unwrap_or(endpoint);
        let owned = carried.as_ref().or(reach.race.map(|r| r.endpoint));
        let pooled = match reach.own_connection && turn == 0 {
            true => None,
            false => on.pooled(reach.want, reach.started),
        };
        let (conn, fresh) = match pooled {
            Some(c) => (c, false),
            None => {
                let own = reach.own_connection && turn == 0;
                let (conn, moved) = connect(on, owned, reach, own).await?;
                if moved.is_some() {
                    *carried = moved;
                }
                conn
            }
        };
        // A pooled connection is taken at once: the exchange's start is still now.
        let now = if fresh { Instant::now() } else { reach.started };
        let head = head(now);
        let Some(sending) = body.take() else {
            return Err(Failed::Stale { closed });
        };
        match deadline::within(reach.by, conn.send(&head, sending)).await {
            None => return Err(Failed::Timeout),
            Some(Ok(resp)) => return Ok(resp),
            // The pooled connection had closed under us: the request never left, so it
            // goes out on another connection.
            Some(Err(SendError::NotSent(unsent, error))) => {
                *body = Some(unsent);
                if fresh {
                    closed = error;
                }
            }
            Some(Err(SendError::Failed(error))) => return Err(Failed::Broken { error, fresh }),
        }
    }
    Err(Failed::Stale { closed })
}

/// A connection to `on`: a pooled one when one is ready (unless `own`), else a new one,
/// `true` with a new one; given up after `timeout`.
async fn open<B: OutgoingBody>(
    on: &Endpoint<B>,
    want: Want,
    tls: Option<&TlsClient>,
    own: bool,
    timeout: Duration,
) -> Result<(Conn<B>, bool), ConnectError> {
    if own {
        on.open_new(want, tls, timeout).await
    } else {
        on.checkout(want, tls, timeout).await
    }
}

/// A connect in a race: owning what it uses, so that it can run on alone.
type Racing<B> = Pin<Box<dyn Future<Output = Result<(Conn<B>, bool), ConnectError>> + Send>>;

/// [`open`], owning what it uses.
fn racing<B: OutgoingBody>(
    on: Arc<Endpoint<B>>,
    want: Want,
    tls: Option<Arc<TlsClient>>,
    own: bool,
    timeout: Duration,
) -> Racing<B> {
    Box::pin(async move { open(&on, want, tls.as_deref(), own, timeout).await })
}

/// A connect that lost its race runs on in a task of its own: a connection it makes is
/// pooled (an HTTP/2 one is its worker's shared connection already); a failure counts
/// against its endpoint as any refused connect does.
fn run_on<B: OutgoingBody>(loser: Racing<B>) {
    tokio::spawn(async move {
        if let Ok((conn, _)) = loser.await {
            conn.keep();
        }
    });
}

/// A new connection to `endpoint` (`own`: never a pooled one), `true` with it, or one
/// to the endpoint a connect raced beside it went to (returned with it). `owned` is
/// `endpoint`, owned, where the exchange may race ([`Reach::race`]).
///
/// A connect not made within `connect_timeout` is not a failure: where the exchange may
/// race, another connect starts beside the slow one, to another endpoint when there is
/// one, else to the same on a connection of its own (a full accept queue drops SYNs and
/// the kernel resends them only after a second; behind a Service's virtual IP a new
/// connection may reach another pod). The first connection made carries the exchange;
/// the other connect runs on alone and its connection is pooled if it is made. A
/// refused one hands its place to a connect to a third endpoint, if there is one not yet
/// tried ([`MAX_RACED`]: three endpoints, two connects at a time); else it leaves the
/// other to finish. An endpoint outraced by another
/// is passed over for a while ([`Endpoint::outraced`]). Given up at the deadline, or
/// after [`CONNECT_MAX`] without one. Without a race, a connect not made within
/// `connect_timeout` fails.
async fn connect<B: OutgoingBody>(
    endpoint: &Endpoint<B>,
    owned: Option<&Arc<Endpoint<B>>>,
    reach: Reach<'_, B>,
    own: bool,
) -> Result<((Conn<B>, bool), Option<Arc<Endpoint<B>>>), Failed> {
    let timed_out = || match reach.by {
        Some(by) if Instant::now() >= by => Failed::DeadlineConnecting,
        _ => Failed::ConnectTimeout,
    };
    let now = Instant::now();
    let slow_at = now + reach.connect_timeout;
    let (Some(race), Some(owned)) = (reach.race, owned) else {
        let by = reach.by.map_or(slow_at, |by| slow_at.min(by));
        // Boxed: connecting (TLS included) is a large future, and inline it would make
        // every request's future that large to move.
        let opening = Box::pin(open(
            endpoint,
            reach.want,
            reach.tls,
            own,
            reach.connect_timeout,
        ));
        return match timeout_at(by, opening).await {
            Ok(r) => r.map(|c| (c, None)).map_err(Failed::Connect),
            Err(_) => Err(timed_out()),
        };
    };
    let give_up = reach
        .by
        .map_or(now + CONNECT_MAX, |by| by.min(now + CONNECT_MAX));
    let tls = race.tls.cloned();
    let left = |now: Instant| give_up.saturating_duration_since(now);
    let mut first = racing(owned.clone(), reach.want, tls.clone(), own, left(now));
    match timeout_at(slow_at.min(give_up), &mut first).await {
        Ok(r) => return r.map(|c| (c, None)).map_err(Failed::Connect),
        Err(_) if Instant::now() >= give_up => return Err(timed_out()),
        Err(_) => {}
    }
    // The connects of the race: the slow one first; `None` where a connect goes to
    // `endpoint` itself.
    let mut racers: Vec<Racer<B>> = Vec::with_capacity(MAX_RACED);
    racers.push(Racer {
        connect: first,
        to: None,
        done: false,
    });
    let second = match (race.other)().filter(|o| o.id != endpoint.id) {
        Some(o) => Racer::to(o, reach, &tls, left(Instant::now())),
        // The same endpoint again, on a connection of its own.
        None => Racer {
            connect: racing(
                owned.clone(),
                reach.want,
                tls.clone(),
                true,
                left(Instant::now()),
            ),
            to: None,
            done: false,
        },
    };
    racers.push(second);
    let mut failed = None;
    // The index of the connect made first; a refused one hands its place to another
    // endpoint's, while fewer than MAX_RACED have started.
    let raced = std::future::poll_fn(|cx| {
        let mut i = 0;
        while i < racers.len() {
            let r = &mut racers[i];
            i += 1;
            if r.done {
                continue;
            }
            let Poll::Ready(result) = r.connect.as_mut().poll(cx) else {
                continue;
            };
            r.done = true;
            match result {
                Ok(c) => return Poll::Ready(Ok((c, i - 1))),
                Err(e) => failed = Some(e),
            }
            if racers.len() < MAX_RACED {
                let next = (race.other)().filter(|o| {
                    o.id != endpoint.id
                        && racers
                            .iter()
                            .all(|r| r.to.as_ref().is_none_or(|t| t.id != o.id))
                });
                if let Some(next) = next {
                    racers.push(Racer::to(next, reach, &tls, left(Instant::now())));
                }
            }
        }
        match racers.iter().all(|r| r.done) {
            true => Poll::Ready(Err(failed.take())),
            false => Poll::Pending,
        }
    });
    let won = timeout_at(give_up, raced).await;
    let Ok(won) = won else {
        return Err(timed_out());
    };
    let (conn, winner) = match won {
        Ok(w) => w,
        Err(Some(e)) => return Err(Failed::Connect(e)),
        Err(None) => return Err(timed_out()),
    };
    let slow_outraced = !racers[0].done && winner != 0;
    let mut carried = None;
    for (i, r) in racers.into_iter().enumerate() {
        if i == winner {
            carried = r.to;
        } else if !r.done {
            run_on(r.connect);
        }
    }
    if slow_outraced && carried.is_some() {
        endpoint.outraced();
    }
    Ok((conn, carried))
}

/// The most connects one exchange starts: the slow one, the one raced beside it, and
/// one more in place of one of them that is refused; never more than two at a time.
const MAX_RACED: usize = 3;

/// One connect of a race, and the endpoint it goes to (`None`: the exchange's own).
struct Racer<B> {
    connect: Racing<B>,
    to: Option<Arc<Endpoint<B>>>,
    done: bool,
}

impl<B: OutgoingBody> Racer<B> {
    /// A connect to another endpoint than the exchange's, a pooled connection if one is
    /// ready.
    fn to(
        to: Arc<Endpoint<B>>,
        reach: Reach<'_, B>,
        tls: &Option<Arc<TlsClient>>,
        left: Duration,
    ) -> Self {
        Racer {
            connect: racing(to.clone(), reach.want, tls.clone(), false, left),
            to: Some(to),
            done: false,
        }
    }
}

/// How long a body behind `Expect: 100-continue` may wait for `100 Continue`, given the
/// time the exchange has (`None`: no bound).
pub fn continue_wait(patience: Option<Duration>) -> ContinueWait {
    ContinueWait::of(patience.map_or(CONTINUE_WAIT, |p| CONTINUE_WAIT.min(p / 4)))
}
