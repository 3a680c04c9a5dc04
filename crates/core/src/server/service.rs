//! What answers the requests of a client connection. The connection's codecs (HTTP/1.1
//! on tollgate's own, HTTP/2 on hyper's) are handed a service and know nothing of what
//! it does: the outbound listener's routes to upstreams and retries; another listener
//! can hand its connections something else.

use std::future::Future;
use std::sync::Arc;

use http::{Request, Response};

use super::body::{AppBody, ResponseBody};
use super::watchdog::ConnState;

/// A request as a codec hands it to the service. Boxed where its head is read, as the
/// answer is where it is made: each passes through several futures on its way, and a
/// box moves as one word where the value is a few hundred bytes copied at every step.
pub type AppRequest = Box<Request<AppBody>>;
/// An answer as the service hands it back to the codec.
pub type AppResponse = Box<Response<ResponseBody>>;

pub trait Service: Clone + Send + Sync + 'static {
    /// The answer is worked out to its end even when the caller has gone: the inbound
    /// side's exchange with its app runs on to the app's response head, holding its
    /// place in `max_inflight` meanwhile. Otherwise a caller going away cancels it.
    const OUTLIVES_CALLER: bool = false;

    /// Answers one request that came over `conn`. The answer's body holds whatever must
    /// live until the response has gone out (the in-flight count, the request's timer).
    fn call(
        &self,
        req: AppRequest,
        conn: &Arc<ConnState>,
    ) -> impl Future<Output = AppResponse> + Send + use<Self>;
}
