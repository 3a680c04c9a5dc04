//! What a service's caller got, read whole: for the tests of both services, which call
//! them without a socket and look at the answer as a caller would.

use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;

use super::service::AppResponse;

/// An answer, its body read to the end.
#[derive(Debug)]
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
    /// The trailers the body ended with, if any.
    pub trailers: Option<HeaderMap>,
}

impl Got {
    /// Reads `resp` whole (a body that breaks reads as what came before it).
    pub async fn of(resp: AppResponse) -> Got {
        let (parts, body) = resp.into_parts();
        let collected = body.collect().await.ok();
        let trailers = collected.as_ref().and_then(|c| c.trailers().cloned());
        let body = collected.map(|c| c.to_bytes()).unwrap_or_default();
        Got {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            trailers,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A field of the trailers.
    pub fn trailer(&self, name: &str) -> Option<&str> {
        self.trailers.as_ref()?.get(name)?.to_str().ok()
    }

    pub fn outcome(&self) -> Option<&str> {
        self.header("x-tollgate-outcome")
    }

    pub fn attempts(&self) -> Option<&str> {
        self.header("x-tollgate-attempts")
    }
}
