//! A real gRPC stack for the gRPC tests: tonic's client and server (its codec, its
//! status handling, its `grpc-timeout`), driven over hyper's HTTP/2 on loopback.
//!
//! The server applies a call's `grpc-timeout` to the whole call, streams included, as
//! grpc-go and the C core do (tonic's own server times only the response head): a
//! stream still running at the deadline ends with DEADLINE_EXCEEDED. Every call's
//! `grpc-timeout`, as the server received it, is recorded.

#![allow(dead_code, clippy::unwrap_used)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::server::{Grpc, ServerStreamingService, StreamingService, UnaryService};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

/// What a client asks: `count` items `gap_ms` apart (streams), or a failure (`fail`,
/// a gRPC code), or a wait before answering (`sleep_ms`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ask {
    #[prost(uint32, tag = "1")]
    pub count: u32,
    #[prost(uint32, tag = "2")]
    pub gap_ms: u32,
    #[prost(int32, tag = "3")]
    pub fail: i32,
    #[prost(uint32, tag = "4")]
    pub sleep_ms: u32,
}

/// One item of an answer; `note` says what the server saw.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Item {
    #[prost(uint32, tag = "1")]
    pub n: u32,
    #[prost(string, tag = "2")]
    pub note: String,
}

pub const UNARY: &str = "/test.Stream/Unary";
pub const LIST: &str = "/test.Stream/List";
pub const ECHO: &str = "/test.Stream/Echo";

/// The `grpc-timeout` of each call, as the server received it.
pub type Seen = Arc<Mutex<Vec<Option<String>>>>;

/// When the call must end, by its `grpc-timeout`.
fn deadline<T>(req: &Request<T>) -> Option<Instant> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let d = tollgate_core::deadline::parse_grpc_timeout(v.as_bytes())?;
    Some(Instant::now() + d)
}

fn note<T>(req: &Request<T>, seen: &Seen) -> String {
    let t = req
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    seen.lock().unwrap().push(t.clone());
    t.unwrap_or_else(|| "none".into())
}

type ItemStream = ReceiverStream<Result<Item, Status>>;
type BoxFut<T> = Pin<Box<dyn Future<Output = Result<Response<T>, Status>> + Send>>;

#[derive(Clone)]
struct Svc {
    seen: Seen,
}

impl UnaryService<Ask> for Svc {
    type Response = Item;
    type Future = BoxFut<Item>;

    fn call(&mut self, req: Request<Ask>) -> Self::Future {
        let note = note(&req, &self.seen);
        let ask = req.into_inner();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ask.sleep_ms.into())).await;
            if ask.fail != 0 {
                return Err(Status::new(Code::from(ask.fail), "asked to fail"));
            }
            Ok(Response::new(Item { n: 0, note }))
        })
    }
}

/// Sends `next` items on `tx` until the call's deadline (then DEADLINE_EXCEEDED).
async fn until_deadline(
    tx: mpsc::Sender<Result<Item, Status>>,
    by: Option<Instant>,
    work: impl Future<Output = ()>,
) {
    let far = Instant::now() + Duration::from_secs(3600);
    tokio::select! {
        _ = work => {}
        _ = tokio::time::sleep_until(by.unwrap_or(far)) => {
            let _ = tx.send(Err(Status::deadline_exceeded("the call's grpc-timeout passed"))).await;
        }
    }
}

impl ServerStreamingService<Ask> for Svc {
    type Response = Item;
    type ResponseStream = ItemStream;
    type Future = BoxFut<ItemStream>;

    fn call(&mut self, req: Request<Ask>) -> Self::Future {
        let note = note(&req, &self.seen);
        let by = deadline(&req);
        let ask = req.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(until_deadline(tx.clone(), by, async move {
            for n in 0..ask.count {
                if n > 0 {
                    tokio::time::sleep(Duration::from_millis(ask.gap_ms.into())).await;
                }
                let item = Item {
                    n,
                    note: note.clone(),
                };
                if tx.send(Ok(item)).await.is_err() {
                    return;
                }
            }
        }));
        Box::pin(async move { Ok(Response::new(ReceiverStream::new(rx))) })
    }
}

impl StreamingService<Item> for Svc {
    type Response = Item;
    type ResponseStream = ItemStream;
    type Future = BoxFut<ItemStream>;

    fn call(&mut self, req: Request<Streaming<Item>>) -> Self::Future {
        note(&req, &self.seen);
        let by = deadline(&req);
        let mut incoming = req.into_inner();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(until_deadline(tx.clone(), by, async move {
            while let Ok(Some(item)) = incoming.message().await {
                if tx.send(Ok(item)).await.is_err() {
                    return;
                }
            }
        }));
        Box::pin(async move { Ok(Response::new(ReceiverStream::new(rx))) })
    }
}

/// A gRPC server on loopback (HTTP/2 with prior knowledge). Stops when dropped.
pub struct Server {
    pub addr: SocketAddr,
    pub seen: Seen,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Seen::default();
        let svc = Svc { seen: seen.clone() };
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let svc = svc.clone();
                conns.spawn(async move {
                    let serve = service_fn(move |req: http::Request<Incoming>| {
                        let svc = svc.clone();
                        async move { Ok::<_, Infallible>(dispatch(svc, req).await) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), serve)
                        .await;
                });
            }
        });
        Server { addr, seen, task }
    }

    /// The `grpc-timeout` values received so far.
    pub fn seen(&self) -> Vec<Option<String>> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn dispatch(svc: Svc, req: http::Request<Incoming>) -> http::Response<tonic::body::Body> {
    match req.uri().path() {
        UNARY => {
            let mut g = Grpc::new(ProstCodec::<Item, Ask>::default());
            g.unary(svc, req).await
        }
        LIST => {
            let mut g = Grpc::new(ProstCodec::<Item, Ask>::default());
            g.server_streaming(svc, req).await
        }
        ECHO => {
            let mut g = Grpc::new(ProstCodec::<Item, Item>::default());
            g.streaming(svc, req).await
        }
        _ => Status::unimplemented("no such method").into_http(),
    }
}

/// tonic's client on an HTTP/2 connection (prior knowledge) of hyper's.
#[derive(Clone)]
pub struct Channel(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tower_service::Service<http::Request<tonic::body::Body>> for Channel {
    type Response = http::Response<Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

/// A gRPC client of `authority` through `addr` (a tollgate, or the server itself).
pub struct Client {
    grpc: tonic::client::Grpc<Channel>,
    conn: JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl Client {
    pub async fn connect(addr: SocketAddr, authority: &str) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let origin: http::Uri = format!("http://{authority}").parse().unwrap();
        Client {
            grpc: tonic::client::Grpc::with_origin(Channel(sender), origin),
            conn,
        }
    }

    fn request<T>(msg: T, deadline: Option<Duration>) -> Request<T> {
        let mut req = Request::new(msg);
        if let Some(d) = deadline {
            req.set_timeout(d);
        }
        req
    }

    pub async fn unary(&mut self, ask: Ask, deadline: Option<Duration>) -> Result<Item, Status> {
        self.grpc.ready().await.unwrap();
        let codec = ProstCodec::<Ask, Item>::default();
        let path = PathAndQuery::from_static(UNARY);
        let r = self
            .grpc
            .unary(Self::request(ask, deadline), path, codec)
            .await?;
        Ok(r.into_inner())
    }

    /// The items of a server stream, and how it ended.
    pub async fn list(&mut self, ask: Ask, deadline: Option<Duration>) -> (Vec<Item>, Status) {
        self.grpc.ready().await.unwrap();
        let codec = ProstCodec::<Ask, Item>::default();
        let path = PathAndQuery::from_static(LIST);
        let mut stream = match self
            .grpc
            .server_streaming(Self::request(ask, deadline), path, codec)
            .await
        {
            Ok(r) => r.into_inner(),
            Err(s) => return (Vec::new(), s),
        };
        drain(&mut stream).await
    }

    /// Sends `count` items `gap` apart on a bidirectional stream; what came back, and
    /// how it ended.
    pub async fn echo(&mut self, count: u32, gap: Duration) -> (Vec<Item>, Status) {
        self.grpc.ready().await.unwrap();
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            for n in 0..count {
                if n > 0 {
                    tokio::time::sleep(gap).await;
                }
                let item = Item {
                    n,
                    note: "echo".into(),
                };
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        });
        let codec = ProstCodec::<Item, Item>::default();
        let path = PathAndQuery::from_static(ECHO);
        let req = Request::new(ReceiverStream::new(rx));
        let mut stream = match self.grpc.streaming(req, path, codec).await {
            Ok(r) => r.into_inner(),
            Err(s) => return (Vec::new(), s),
        };
        drain(&mut stream).await
    }
}

async fn drain(stream: &mut Streaming<Item>) -> (Vec<Item>, Status) {
    let mut items = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(item)) => items.push(item),
            Ok(None) => return (items, Status::ok("")),
            Err(s) => return (items, s),
        }
    }
}
