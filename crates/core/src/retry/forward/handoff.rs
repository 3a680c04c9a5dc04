//! What the attempt loop takes and gives back: a request ready to forward
//! ([`Exchange`]), and the [`Answer`] for the app, with the retries it went through.

use http::{HeaderValue, StatusCode, Version};
use tokio::time::Instant;

use crate::contract::outcome::Callee;
use crate::deadline::Deadline;
use crate::fault::Fault;
use crate::metrics::{Denied, Outcome};
use crate::retry::forward::attempt::Head;
use crate::upstream::response::UpstreamResponse;

/// A request ready to forward.
pub struct Exchange<'h, A> {
    pub head: &'h Head,
    /// The idempotency key minted for it (`mint_idempotency_key`), sent on every
    /// attempt. Boxed: a request without one (nearly every one) moves a word for it.
    pub minted: Option<Box<HeaderValue>>,
    /// The HTTP version the app spoke (for `protocol = "auto"`).
    pub version: Version,
    pub body: A,
    pub deadline: Deadline,
    /// When the request arrived: its first attempt starts then.
    pub arrived: Instant,
    /// A gRPC call: `grpc-timeout` carries the caller's own deadline, and tollgate's
    /// own answers are gRPC answers.
    pub grpc: bool,
    /// An HTTP/1.1 upgrade (`Connection: upgrade`, `Upgrade: websocket`): sent over
    /// HTTP/1.1, never retried once sent, and a `101` is its answer.
    pub upgrade: bool,
    /// The app sent this again after a failure tollgate owned: it goes as a retry
    /// (`x-tollgate-attempt: 2`, its budget already spent) and is not retried again.
    pub app_retry: bool,
    /// The request's spans, when it is traced.
    pub trace: Option<&'h mut crate::trace::RequestTrace>,
}

/// What goes back to the app.
// Unboxed: almost every answer is the upstream's, and a box would cost an allocation
// per request for the rare local one's sake.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// The upstream's response. An HTTP/1.1 body carries its connection, which goes
    /// back to the pool once the body has been read to the end.
    Upstream(UpstreamResponse),
    /// tollgate answers itself: 502 or 504 for the upstream, 400 for a malformed body
    /// from the app, 503 (with `Retry-After`) when out of file descriptors.
    Local(StatusCode),
}

pub struct Answer {
    pub reply: Reply,
    /// The retries made, and why the last failure was not retried.
    pub trail: Trail,
    pub attempts: u32,
    pub outcome: Outcome,
    /// The failure tollgate gave up on, when it gave up.
    pub failure: Option<Fault>,
    /// What went wrong, in words for the app, when there is more to say than the
    /// status (a TLS failure's reason).
    pub detail: Option<String>,
    /// What the response's own `x-tollgate-outcome` (another tollgate's) says: owned
    /// there (it goes back as it came), stray (it is removed), or nothing.
    pub callee: Callee,
    /// How much of the app's body was read.
    pub body: BodyRead,
    /// Whether a hedge was asked for, and sent (it is counted in `attempts`).
    pub hedge: HedgeState,
}

impl Answer {
    /// The response carries another tollgate's verdict, owned there.
    pub fn owned_elsewhere(&self) -> bool {
        self.callee.owned()
    }

    /// The response carries an `x-tollgate-outcome` that means nothing on its status
    /// (a `1xx`-`3xx` that is not a gRPC answer): it is removed.
    pub fn strip_outcome(&self) -> bool {
        self.callee == Callee::Stray
    }
}

/// How much of the app's body the attempts read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyRead {
    /// To its end.
    Whole,
    /// Not to its end: the client connection cannot carry another request.
    Partly,
    /// Nothing, and nothing will be: an endpoint answered before its `100 Continue`, or
    /// no attempt took the body.
    Untouched,
}

/// A request's hedge: at most one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeState {
    NotAsked,
    /// Asked for, and refused by `max_extra`.
    Denied,
    Sent,
}

/// What the attempts of a request went through, for the access log: the condition
/// that fired each retry, and why a retry was refused.
/// No endpoint (yet).
const NO_PEER: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub struct Trail {
    retries: [Option<Fault>; 9],
    /// The reason a retry was refused, when one was.
    pub denied: Option<Denied>,
    /// The number of the endpoint the first attempt went to ([`NO_PEER`]: none), and
    /// those of the later ones (rare: boxed, so a request moves a word for them): which
    /// pod failed, behind any Service.
    first_peer: u32,
    later_peers: Option<Box<[u32]>>,
}

/// An endpoint's number as the trail keeps it.
fn id32(id: usize) -> u32 {
    u32::try_from(id).unwrap_or(NO_PEER)
}

impl Default for Trail {
    fn default() -> Self {
        Trail {
            retries: [None; 9],
            denied: None,
            first_peer: NO_PEER,
            later_peers: None,
        }
    }
}

impl Trail {
    /// An attempt went to the endpoint numbered `id`.
    #[inline]
    pub(super) fn went_to(&mut self, id: usize, first: bool) {
        let id = id32(id);
        if first {
            self.first_peer = id;
        } else {
            let mut later = self.later_peers.take().map(Vec::from).unwrap_or_default();
            later.push(id);
            self.later_peers = Some(later.into_boxed_slice());
        }
    }

    /// The attempt that went to endpoint `from` (the last that did) was carried by
    /// endpoint `to`: its connect was slow, and one raced beside it was made first.
    pub(super) fn moved(&mut self, from: usize, to: usize) {
        let (from, to) = (id32(from), id32(to));
        let later = self.later_peers.iter_mut().flat_map(|v| v.iter_mut().rev());
        if let Some(p) = later.chain([&mut self.first_peer]).find(|p| **p == from) {
            *p = to;
        }
    }

    /// The numbers of the endpoints the attempts went to, in order.
    pub fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.first_peer)
            .chain(self.later_peers.iter().flat_map(|v| v.iter().copied()))
            .filter(|id| *id != NO_PEER)
            .map(|id| id as usize)
    }

    pub(super) fn retried(&mut self, failure: Fault) {
        if let Some(slot) = self.retries.iter_mut().find(|r| r.is_none()) {
            *slot = Some(failure);
        }
    }

    /// The conditions of the retries, in order.
    pub fn retries(&self) -> impl Iterator<Item = Fault> + '_ {
        self.retries.iter().map_while(|r| *r)
    }
}
