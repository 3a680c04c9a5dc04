//! What answers the requests of a client connection. The connection's codecs (HTTP/1.1
//! on tollgate's own, HTTP/2 on hyper's) are handed a service and know nothing of what
//! it does: the outbound listener's routes to upstreams and retries; another listener
//! can hand its connections something else.

use std::future::Future;
use std::sync::Arc;

use http::{Request, Response};

use super::body::{AppBody, ResponseBody};
use super::watchdog::ConnState;

pub trait Service: Clone + Send + Sync + 'static {
    /// Answers one request that came over `conn`. The answer's body holds whatever must
    /// live until the response has gone out (the in-flight count, the request's timer).
    fn call(
        &self,
        req: Request<AppBody>,
        conn: &Arc<ConnState>,
    ) -> impl Future<Output = Response<ResponseBody>> + Send + use<Self>;
}
