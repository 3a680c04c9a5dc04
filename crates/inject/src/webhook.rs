//! `tollgate inject --serve`: the rewrite of `tollgate inject` as a Kubernetes mutating
//! admission webhook. The API server POSTs an AdmissionReview (v1) for each pod created
//! in a namespace labelled `tollgate.io/inject=enabled` (the selector is the
//! MutatingWebhookConfiguration's, deploy/kubernetes/webhook.yaml) to `/mutate` over
//! TLS; the answer is `review.rs`'s. `GET /healthz` is for the kubelet, `GET /metrics`
//! counts the reviews by outcome; every review is logged once (uid, pod, outcome,
//! status, duration). The webhook is registered with `failurePolicy: Ignore`: when it is
//! down, pods are created without tollgate, never blocked.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::Options;
use super::review::{self, Outcome};

/// The largest AdmissionReview read: a pod is at most 1.5 MiB in etcd, and the review
/// may carry it twice.
const MAX_BODY: usize = 4 * 1024 * 1024;
/// A TLS handshake and a request head must come within this long.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// Where and with what the webhook serves.
#[derive(Debug, Clone)]
pub struct Serve {
    pub addr: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

/// The webhook's own metrics.
struct Metrics {
    registry: Registry,
    reviews: IntCounterVec,
    duration: HistogramVec,
}

impl Metrics {
    fn new() -> Result<Metrics, String> {
        let registry = Registry::new();
        let reviews = IntCounterVec::new(
            Opts::new(
                "tollgate_webhook_reviews_total",
                "AdmissionReviews answered, by outcome (injected, unchanged, left-alone, \
                 refused: admitted unchanged with a warning; invalid: not an AdmissionReview)",
            ),
            &["outcome"],
        )
        .map_err(|e| e.to_string())?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "tollgate_webhook_review_duration_seconds",
                "Time to answer one AdmissionReview, body read to answer written",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ]),
            &["outcome"],
        )
        .map_err(|e| e.to_string())?;
        registry
            .register(Box::new(reviews.clone()))
            .map_err(|e| e.to_string())?;
        registry
            .register(Box::new(duration.clone()))
            .map_err(|e| e.to_string())?;
        for o in ["injected", "unchanged", "left-alone", "refused", "invalid"] {
            reviews.with_label_values(&[o]);
        }
        Ok(Metrics {
            registry,
            reviews,
            duration,
        })
    }

    fn text(&self) -> String {
        let mut out = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The TLS acceptor for the certificate chain and key at these paths.
fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: holds no certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| format!("{}: no usable private key: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Runs the webhook until SIGTERM or SIGINT: 0 then, 2 when it cannot start.
pub fn serve(serve: &Serve, opts: Options) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tollgate inject --serve: {e}");
            return 2;
        }
    };
    runtime.block_on(async move {
        let started = async {
            let tls = acceptor(&serve.tls_cert, &serve.tls_key)?;
            let listener = TcpListener::bind(serve.addr)
                .await
                .map_err(|e| format!("binding {}: {e}", serve.addr))?;
            let metrics = Arc::new(Metrics::new()?);
            Ok::<_, String>((tls, listener, metrics))
        };
        let (tls, listener, metrics) = match started.await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("tollgate inject --serve: {e}");
                return 2;
            }
        };
        let addr = listener.local_addr().map_or(serve.addr, |a| a);
        tracing::info!(%addr, "admission webhook serving");
        let opts = Arc::new(opts);
        let accepting = accept_loop(listener, tls, metrics, opts);
        tokio::select! {
            () = accepting => {}
            () = stop_signal() => tracing::info!("admission webhook stopping"),
        }
        0
    })
}

async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: TlsAcceptor,
    metrics: Arc<Metrics>,
    opts: Arc<Options>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (tls, metrics, opts) = (tls.clone(), metrics.clone(), opts.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_WAIT, tls.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let service = service_fn(move |req| {
                let (metrics, opts) = (metrics.clone(), opts.clone());
                async move { Ok::<_, Infallible>(handle(req, &metrics, &opts).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .header_read_timeout(HANDSHAKE_WAIT)
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(
    req: Request<Incoming>,
    metrics: &Metrics,
    opts: &Options,
) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => reply(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, "/metrics") => {
            reply(StatusCode::OK, "text/plain; version=0.0.4", metrics.text())
        }
        (&Method::POST, "/mutate") => mutate(req, metrics, opts).await,
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

async fn mutate(
    req: Request<Incoming>,
    metrics: &Metrics,
    opts: &Options,
) -> Response<Full<Bytes>> {
    let started = tokio::time::Instant::now();
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return invalid(metrics, started, &format!("reading the body: {e}")),
    };
    match review::review(&body, opts) {
        Ok(r) => {
            let label = r.outcome.label();
            metrics.reviews.with_label_values(&[label]).inc();
            let took = started.elapsed();
            metrics
                .duration
                .with_label_values(&[label])
                .observe(took.as_secs_f64());
            let uid = r.response["response"]["uid"].as_str().unwrap_or_default();
            tracing::info!(
                uid,
                pod = %r.pod,
                outcome = label,
                status = 200,
                duration_ms = took.as_secs_f64() * 1000.0,
                notes = %r.notes.join("; "),
                "admission review"
            );
            if r.outcome == Outcome::Refused {
                tracing::warn!(pod = %r.pod, notes = %r.notes.join("; "), "admitted without tollgate");
            }
            let text = serde_json::to_vec(&r.response).unwrap_or_default();
            reply(StatusCode::OK, "application/json", text)
        }
        Err(e) => invalid(metrics, started, &e),
    }
}

fn invalid(metrics: &Metrics, started: tokio::time::Instant, why: &str) -> Response<Full<Bytes>> {
    metrics.reviews.with_label_values(&["invalid"]).inc();
    let took = started.elapsed();
    metrics
        .duration
        .with_label_values(&["invalid"])
        .observe(took.as_secs_f64());
    tracing::info!(
        outcome = "invalid",
        status = 400,
        duration_ms = took.as_secs_f64() * 1000.0,
        error = why,
        "admission review"
    );
    reply(StatusCode::BAD_REQUEST, "text/plain", format!("{why}\n"))
}
