//! The HTTP side of a watch: one request per connection to the API server, HTTPS over
//! hyper's HTTP/1.1 client and tokio-rustls, with the bearer token read for each.
//!
//! A watch makes few requests (a list and the Service at each relist, one long watch
//! request every few minutes), so nothing is pooled: a fresh connection each time
//! also means a connection broken while the API server restarted is never reused.
//! Every failure is classified once, as the metric's `reason` and the log's words.

use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, HOST, USER_AGENT};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::credentials::Credentials;
use crate::metrics::discovery::Reason;

/// Connect, TLS and the response head, each request.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A whole answer that is not a watch (a list of a large Service's slices included).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read whole.
const MAX_BODY: usize = 64 << 20;

/// Why a request to the API failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("cannot reach the API server: {0}")]
    Connect(String),
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the API server refused the credentials ({0}): {1}")]
    Auth(StatusCode, String),
    #[error("the API server answered {0}: {1}")]
    Status(StatusCode, String),
    #[error("the API server's answer is not what was asked for: {0}")]
    Decode(String),
    #[error("the watched version is gone (410): {0}")]
    Gone(String),
}

impl Failure {
    pub fn reason(&self) -> Reason {
        match self {
            Failure::Connect(_) => Reason::Connect,
            Failure::Timeout(_) => Reason::Timeout,
            Failure::Auth(..) => Reason::Auth,
            Failure::Status(..) => Reason::Status,
            Failure::Decode(_) => Reason::Decode,
            Failure::Gone(_) => Reason::Gone,
        }
    }

    /// The failure a status other than 200 stands for; `body` is the API's Status.
    pub fn of_status(status: StatusCode, body: &[u8]) -> Failure {
        let message = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Failure::Auth(status, message),
            StatusCode::GONE => Failure::Gone(message),
            _ => Failure::Status(status, message),
        }
    }
}

/// A response being read, and the connection carrying it: closed when this is dropped.
pub struct Streaming {
    pub body: Incoming,
    conn: JoinHandle<()>,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// `GET path` on the API; the answer of a 200 read whole.
pub async fn get(creds: &Credentials, path: &str) -> Result<Bytes, Failure> {
    let work = async {
        let mut s = open(creds, path).await?;
        Limited::new(&mut s.body, MAX_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| Failure::Connect(format!("reading the answer: {e}")))
    };
    tokio::time::timeout(HEAD_TIMEOUT + BODY_TIMEOUT, work)
        .await
        .map_err(|_| Failure::Timeout(HEAD_TIMEOUT + BODY_TIMEOUT))?
}

/// `GET path` on the API, a 200's body left to be read as it streams (a watch).
pub async fn stream(creds: &Credentials, path: &str) -> Result<Streaming, Failure> {
    open(creds, path).await
}

/// Connects, sends `GET path` and waits for a 200's head; another status is read (a
/// Status object, small) and becomes its failure.
async fn open(creds: &Credentials, path: &str) -> Result<Streaming, Failure> {
    let head = async {
        let token = creds
            .token
            .current()
            .map_err(|e| Failure::Auth(StatusCode::UNAUTHORIZED, e))?;
        let server = &creds.server;
        let tcp = TcpStream::connect((server.host.as_str(), server.port))
            .await
            .map_err(|e| Failure::Connect(format!("{}: {e}", server.authority)))?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(creds.tls.clone())
            .connect(creds.server_name.clone(), tcp)
            .await
            .map_err(|e| Failure::Connect(format!("TLS with {}: {e}", server.authority)))?;
        let (mut sender, conn) = http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tls))
            .await
            .map_err(|e| Failure::Connect(format!("HTTP with {}: {e}", server.authority)))?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut req = Request::get(format!("{}{path}", server.prefix))
            .header(HOST, server.authority.as_str())
            .header(ACCEPT, "application/json")
            .header(USER_AGENT, concat!("tollgate/", env!("CARGO_PKG_VERSION")));
        if let Some(token) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let sent = match req.body(Empty::new()) {
            Ok(req) => sender
                .send_request(req)
                .await
                .map_err(|e| Failure::Connect(format!("{}: {e}", server.authority))),
            Err(e) => Err(Failure::Decode(format!("the request for {path}: {e}"))),
        };
        match sent {
            // Dropped with it, the connection is closed (its task is aborted).
            Ok(resp) if resp.status() == StatusCode::OK => Ok(Streaming {
                body: resp.into_body(),
                conn,
            }),
            Ok(resp) => {
                let status = resp.status();
                let body = Limited::new(resp.into_body(), 64 * 1024)
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                conn.abort();
                Err(Failure::of_status(status, &body))
            }
            Err(e) => {
                conn.abort();
                Err(e)
            }
        }
    };
    tokio::time::timeout(HEAD_TIMEOUT, head)
        .await
        .map_err(|_| Failure::Timeout(HEAD_TIMEOUT))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified_with_the_apis_message() {
        let status =
            br#"{"kind":"Status","message":"endpointslices is forbidden: User cannot list"}"#;
        let f = Failure::of_status(StatusCode::FORBIDDEN, status);
        assert_eq!(f.reason(), Reason::Auth);
        assert!(f.to_string().contains("endpointslices is forbidden"), "{f}");
        assert_eq!(
            Failure::of_status(StatusCode::UNAUTHORIZED, b"").reason(),
            Reason::Auth
        );
        assert_eq!(
            Failure::of_status(StatusCode::GONE, b"{}").reason(),
            Reason::Gone
        );
        let f = Failure::of_status(StatusCode::SERVICE_UNAVAILABLE, b"<html>down</html>");
        assert_eq!(f.reason(), Reason::Status);
        assert!(f.to_string().contains("<html>down"), "{f}");
    }
}
