//! Kubelet probes moved to the admin port by `tollgate inject`: `GET /probe/PORT/PATH`
//! is a GET to the app at `127.0.0.1:PORT/PATH`, answered with the app's status.
//!
//! Not a relay: only the probes `[admin] probes` declares are forwarded, each an exact
//! port and path compared as the request wrote its target (no normalisation: `..`,
//! encoded slashes and absolute forms match nothing and get `404`), only `GET`, and
//! only the probe's declared fields plus the kubelet's `User-Agent` and `Accept` go
//! along (`Authorization`, `Cookie` and forwarding fields never do). Identical probes
//! coalesce: one in flight per port and path, the others share its answer.
//!
//! When the app refuses `127.0.0.1`, the probe goes to the pod's own address
//! (`POD_IP`, which inject sets from the downward API), as the kubelet's own probe
//! would: an app bound to its pod IP is probed all the same.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, HOST, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::Probe;

/// The timeout of one forwarded probe, connect to response head. The kubelet gives up
/// sooner by its own `timeoutSeconds` (1 s unless set); this only keeps an app that
/// never answers from holding the admin endpoint's tasks.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A probe's answer: the status to give and a line saying why.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub text: String,
}

fn answer(status: StatusCode, text: impl Into<String>) -> Answer {
    Answer {
        status,
        text: text.into(),
    }
}

/// The probes in flight, one per declared target, each shared by every request that
/// asks for it meanwhile.
#[derive(Default)]
pub struct Probes {
    inflight: Mutex<HashMap<String, watch::Receiver<Option<Answer>>>>,
}

/// Takes the probe's place out of the map when it ends, however it ends.
struct Leading<'a> {
    probes: &'a Probes,
    target: String,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut inflight = self
            .probes
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        inflight.remove(&self.target);
    }
}

/// The declared probe `uri` asks for, compared as written; `None` for any other
/// target (an absolute form included).
pub fn declared<'p>(declared: &'p [Probe], uri: &Uri) -> Option<&'p Probe> {
    if uri.scheme().is_some() || uri.authority().is_some() {
        return None;
    }
    let target = uri.path_and_query()?.as_str();
    declared.iter().find(|p| {
        target
            .strip_prefix("/probe/")
            .and_then(|rest| rest.strip_prefix(p.port.to_string().as_str()))
            == Some(p.path.as_str())
    })
}

impl Probes {
    /// Answers a request to `/probe/...`.
    pub async fn answer(
        &self,
        probes: &[Probe],
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Answer {
        let Some(probe) = declared(probes, uri) else {
            return answer(
                StatusCode::NOT_FOUND,
                "no probe is declared for this port and path ([admin] probes)\n",
            );
        };
        if method != Method::GET {
            return answer(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
        }
        let target = probe.target();
        let leader = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            match inflight.get(&target) {
                Some(rx) => Err(rx.clone()),
                None => {
                    let (tx, rx) = watch::channel(None);
                    inflight.insert(target.clone(), rx);
                    Ok(tx)
                }
            }
        };
        match leader {
            Ok(tx) => {
                let _leading = Leading {
                    probes: self,
                    target,
                };
                let got = forward(probe, headers).await;
                let _ = tx.send(Some(got.clone()));
                got
            }
            Err(mut rx) => {
                let shared = rx
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .map(|got| got.clone());
                match shared {
                    Some(got) => got.unwrap_or_else(unreachable_answer),
                    // The probe it waited for was abandoned (its asker left): its own.
                    None => forward(probe, headers).await,
                }
            }
        }
    }
}

fn unreachable_answer() -> Answer {
    answer(StatusCode::SERVICE_UNAVAILABLE, "no answer\n")
}

/// The probe, sent to the app: at `127.0.0.1:PORT`, or at the pod's own address
/// (`POD_IP`) when loopback is refused.
async fn forward(probe: &Probe, headers: &HeaderMap) -> Answer {
    forward_to(probe, headers, crate::inbound::app::pod_ip()).await
}

async fn forward_to(probe: &Probe, headers: &HeaderMap, pod_ip: Option<IpAddr>) -> Answer {
    let local = SocketAddr::from(([127, 0, 0, 1], probe.port));
    let pod_ip = pod_ip.filter(|ip| *ip != local.ip() && !ip.is_unspecified());
    let asked = async {
        match probe_app(local, probe, headers).await {
            Err(e) if refused(&*e) => match pod_ip {
                Some(ip) => (
                    SocketAddr::new(ip, probe.port),
                    probe_app(SocketAddr::new(ip, probe.port), probe, headers).await,
                ),
                None => (local, Err(e)),
            },
            other => (local, other),
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, asked).await {
        Ok((_, Ok(status))) => answer(status, format!("app answered {status}\n")),
        Ok((app, Err(e))) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("app at {app} unreachable: {e}\n"),
        ),
        Err(_) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("app did not answer within {PROBE_TIMEOUT:?}\n"),
        ),
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn refused(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
}

/// One GET on a new connection, closed after the response head: probes are rare, and
/// a probe must see whether the app accepts connections now. Only the probe's declared
/// fields and the asker's `User-Agent` and `Accept` go along; `Host` names the app.
async fn probe_app(
    app: SocketAddr,
    probe: &Probe,
    headers: &HeaderMap,
) -> Result<StatusCode, BoxError> {
    let stream = TcpStream::connect(app).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let mut out = Request::get(probe.path.as_str()).body(http_body_util::Empty::<Bytes>::new())?;
    let h = out.headers_mut();
    for name in [USER_AGENT, ACCEPT] {
        for value in headers.get_all(&name) {
            h.append(name.clone(), value.clone());
        }
    }
    for (name, value) in &probe.headers {
        h.insert(name.clone(), value.clone());
    }
    h.insert(HOST, HeaderValue::from_str(&app.to_string())?);
    let response = sender.send_request(out).await;
    conn.abort();
    Ok(response?.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(port: u16, path: &str) -> Probe {
        Probe {
            port,
            path: path.into(),
            headers: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_probe_loopback_refuses_goes_to_the_pods_own_address() {
        let Ok(app) = tokio::net::TcpListener::bind("127.0.0.2:0").await else {
            return; // No second loopback address here.
        };
        let Ok(addr) = app.local_addr() else {
            return;
        };
        tokio::spawn(async move {
            if let Ok((mut s, _)) = app.accept().await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
            }
        });
        let p = probe(addr.port(), "/healthz");
        let got = forward_to(&p, &HeaderMap::new(), Some(addr.ip())).await;
        assert_eq!(got.status, StatusCode::NO_CONTENT, "{}", got.text);
        let got = forward_to(&p, &HeaderMap::new(), None).await;
        assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{}", got.text);
    }

    #[test]
    fn only_the_exact_declared_target_matches() {
        let probes = [probe(8080, "/healthz?full=1"), probe(9090, "/ready")];
        let at = |uri: &str| {
            let uri: Uri = uri.parse().unwrap_or_else(|_| unreachable!());
            declared(&probes, &uri).map(Probe::target)
        };
        assert_eq!(
            at("/probe/8080/healthz?full=1").as_deref(),
            Some("/probe/8080/healthz?full=1")
        );
        assert_eq!(
            at("/probe/9090/ready").as_deref(),
            Some("/probe/9090/ready")
        );
        for other in [
            "/probe/8080/healthz",
            "/probe/8080/healthz?full=2",
            "/probe/9090/ready/",
            "/probe/9090/./ready",
            "/probe/9090/x/../ready",
            "/probe/9090/%2Fready",
            "/probe/09090/ready",
            "/probe/80800/healthz?full=1",
            "http://app/probe/9090/ready",
            "/probe/8081/ready",
        ] {
            assert_eq!(at(other), None, "{other}");
        }
    }
}
