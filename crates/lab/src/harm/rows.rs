//! The rows of the harm scenario: an upstream's behaviour, a mix of traffic, and the
//! paths (columns) the same calls take side by side. Column 0 is always `direct`: the
//! same client straight to the upstream, no proxy at all. The others go through
//! tollgate at its defaults (retries on: the `[retry]` section and the `[budget]`
//! section `check` asks for, every key at its default) plus, in a feature's row, that
//! feature.

use std::time::Duration;

use super::app::{Behaviour, Latency};
use super::client::{Caller, Program, Traffic, Urls};

/// The replicas behind the service a row calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replicas {
    /// One.
    One,
    /// Two alike.
    Two,
    /// Three, one of which is broken.
    ThreeOneBroken(Broken),
    /// One, on IPv4 only, named by two addresses: `::1` (where nothing listens) first,
    /// then `127.0.0.1`, as a pod's `localhost` resolves.
    DualStack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// Its process is gone: connections are refused.
    Dead,
    /// It accepts connections and never answers.
    Hung,
}

/// How a column's calls reach the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Straight to it: the same client, taking the replicas in turn and dialling the
    /// next one when a connection is refused.
    Direct,
    /// Through the caller's tollgate (its outbound listener, `Host: app`; or, in the
    /// unknown-host row, as `http_proxy`).
    Outbound,
    /// Through the caller's tollgate, then an inbound tollgate (`[inbound]`) in front
    /// of each replica: the mesh.
    Sidecars,
    /// Through an inbound tollgate in front of the app (callers reach it at its
    /// `[inbound]` port, as a Service's targetPort sends them).
    Inbound,
}

impl Path {
    /// tollgate hops a call crosses.
    pub fn hops(self) -> u32 {
        match self {
            Path::Direct => 0,
            Path::Outbound | Path::Inbound => 1,
            Path::Sidecars => 2,
        }
    }
}

/// The feature a column adds to the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    None,
    /// `[upstreams.app.outlier]` at its defaults.
    Outlier,
    /// `max_ratio = 0.5` in the budget.
    MaxRatio,
    /// `[upstreams.app.throttle]` at its defaults.
    Throttle,
    /// `app_retries = "refuse"`.
    RefuseAppRetries,
    /// `[inbound] max_inflight = "adaptive"`.
    AdaptiveLimit,
    /// `max_inflight = FIXED_LIMIT` on the upstream.
    FixedLimit,
    /// `[inbound.dedupe]` at its defaults on the callee's sidecars.
    Dedupe,
}

/// The fixed `max_inflight` of the [`Feature::FixedLimit`] column.
pub const FIXED_LIMIT: u32 = 10;

/// An opt-in trade's documented purpose, by which its column is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The throttle sends fewer calls to an upstream that rejects most of them.
    ThrottleSheds,
    /// The throttle rejects nothing while the upstream accepts more than one call in
    /// k (= 2).
    ThrottleIdle,
    /// A 500 is an answer, not overload: it never trips the throttle.
    ThrottleIgnores500,
    /// Only the app's own retries, known on evidence, are refused: first attempts never.
    RefusesOnlyAppRetries,
    /// A fixed `max_inflight` bounds the calls waiting upstream at once.
    BoundsWaiting,
}

impl Purpose {
    pub fn describe(self) -> &'static str {
        match self {
            Purpose::ThrottleSheds => {
                "[throttle]: sends an upstream that rejects most calls fewer of them"
            }
            Purpose::ThrottleIdle => {
                "[throttle]: rejects nothing while the upstream accepts more than one call in two"
            }
            Purpose::ThrottleIgnores500 => "[throttle]: a 500 is an answer, it never trips it",
            Purpose::BoundsWaiting => {
                "max_inflight: never more calls waiting upstream at once than the limit"
            }
            Purpose::RefusesOnlyAppRetries => {
                "app_retries = \"refuse\": refuses the app's own retries, never a first attempt"
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// Its name in `--json`.
    pub key: &'static str,
    pub title: &'static str,
    pub path: Path,
    pub feature: Feature,
    /// The columns whose success this one must not fall below beyond noise.
    pub against: &'static [usize],
    /// An opt-in trade, judged by its purpose instead.
    pub trade: Option<Purpose>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub key: &'static str,
    /// The upstream and the traffic, in a line.
    pub what: &'static str,
    pub behaviour: Behaviour,
    pub traffic: Traffic,
    pub replicas: Replicas,
    /// The app calls, through `http_proxy`, a host no upstream of tollgate lists.
    pub unknown_host: bool,
    /// The app's client.
    pub caller: Caller,
    /// What the columns are, where it needs saying.
    pub note: Option<&'static str>,
    pub columns: Vec<Column>,
    /// A Kubernetes Service's shape, run in network namespaces (`netns.rs`); `None`:
    /// on loopback, in this process.
    pub service: Option<Shape>,
}

const DIRECT: Column = Column {
    key: "direct",
    title: "direct",
    path: Path::Direct,
    feature: Feature::None,
    against: &[],
    trade: None,
};

const TOLLGATE: Column = Column {
    key: "tollgate",
    title: "tollgate (defaults)",
    path: Path::Outbound,
    feature: Feature::None,
    against: &[0],
    trade: None,
};

/// The columns of a feature's row: direct, tollgate without it, tollgate with it
/// (judged against both).
fn with_feature(key: &'static str, title: &'static str, feature: Feature) -> Vec<Column> {
    vec![
        DIRECT,
        Column {
            key: "without",
            title: "tollgate (defaults)",
            ..TOLLGATE
        },
        Column {
            key,
            title,
            feature,
            against: &[0, 1],
            ..TOLLGATE
        },
    ]
}

/// The columns of a trade's row: the feature column judged by `purpose`.
fn with_trade(
    key: &'static str,
    title: &'static str,
    feature: Feature,
    purpose: Purpose,
) -> Vec<Column> {
    let mut c = with_feature(key, title, feature);
    c[2].against = &[];
    c[2].trade = Some(purpose);
    c
}

/// The columns of a replica row: direct, the caller's tollgate straight to the replicas
/// (the reference: what the caller gets without sidecars), and the mesh.
fn replica_columns() -> Vec<Column> {
    vec![
        DIRECT,
        Column {
            key: "no-sidecars",
            title: "tollgate, no sidecars",
            ..TOLLGATE
        },
        Column {
            key: "sidecars",
            title: "tollgate + [inbound] sidecars",
            path: Path::Sidecars,
            against: &[0, 1],
            ..TOLLGATE
        },
    ]
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn traffic(rps: f64, seconds: u64, urls: Urls) -> Traffic {
    Traffic {
        steps: vec![(rps, secs(seconds))],
        urls,
        post: false,
        keyed: false,
        deadline: None,
        patience: secs(10),
    }
}

fn failing(share: f64, status: u16) -> Behaviour {
    Behaviour {
        failures: Some((share, status)),
        ..Behaviour::HEALTHY
    }
}

fn waits(latency: Latency) -> Behaviour {
    Behaviour {
        latency,
        ..Behaviour::HEALTHY
    }
}

fn row(key: &'static str, what: &'static str, behaviour: Behaviour, traffic: Traffic) -> Row {
    Row {
        key,
        what,
        behaviour,
        traffic,
        replicas: Replicas::One,
        unknown_host: false,
        caller: Caller::Lab,
        note: None,
        columns: vec![DIRECT, TOLLGATE],
        service: None,
    }
}

/// Every row of the full run, in order.
pub fn all() -> Vec<Row> {
    let zipf = Urls::Zipf(100);
    let mut rows = vec![
        row(
            "healthy",
            "an app that answers at once; Zipf over 100 URLs, 250/s",
            Behaviour::HEALTHY,
            traffic(250.0, 4, zipf),
        ),
        row(
            "slow-700ms",
            "healthy, just slow: every answer after 700 ms; Zipf over 100 URLs, 200/s, no deadline",
            waits(Latency::Fixed(ms(700))),
            traffic(200.0, 5, zipf),
        ),
        row(
            "deadline-10s",
            "the app sends x-timeout-ms: 10000, the answer takes 2.5 s; 200/s",
            waits(Latency::Fixed(ms(2500))),
            Traffic {
                deadline: Some(secs(10)),
                patience: secs(12),
                ..traffic(200.0, 5, zipf)
            },
        ),
        row(
            "lognormal",
            "a log-normal latency, median 200 ms, sigma 1 (p99 2 s); 200/s, no deadline",
            waits(Latency::LogNormal {
                median: ms(200),
                sigma: 1.0,
            }),
            Traffic {
                patience: secs(20),
                ..traffic(200.0, 5, zipf)
            },
        ),
        row(
            "long-poll",
            "a long poll: the head after 5 s; 220/s (1,100 waiting at once)",
            waits(Latency::Fixed(secs(5))),
            Traffic {
                patience: secs(15),
                ..traffic(220.0, 5, zipf)
            },
        ),
        row(
            "streams",
            "streams: the head at once, the body over 4 s; 300/s (1,200 open at once)",
            Behaviour {
                stream: Some(secs(4)),
                ..Behaviour::HEALTHY
            },
            Traffic {
                patience: secs(15),
                ..traffic(300.0, 4, zipf)
            },
        ),
        row(
            "errors-one-url",
            "30% of answers 503 at random; one popular GET URL, 100/s",
            failing(0.3, 503),
            traffic(100.0, 10, Urls::One),
        ),
        row(
            "errors-zipf",
            "30% of answers 503 at random; Zipf over 100 URLs, 200/s",
            failing(0.3, 503),
            traffic(200.0, 5, zipf),
        ),
        row(
            "errors-distinct",
            "30% of answers 503 at random; a distinct URL per request, 200/s",
            failing(0.3, 503),
            traffic(200.0, 5, Urls::Distinct),
        ),
        row(
            "post-one-url",
            "30% of answers 503 at random; POSTs to one URL, a distinct body each, 100/s",
            failing(0.3, 503),
            Traffic {
                post: true,
                ..traffic(100.0, 10, Urls::One)
            },
        ),
    ];
    rows.push(keyed_posts());
    rows.extend(replica_rows());
    rows.extend(feature_rows());
    rows.push(fixed_limit());
    rows.extend(throttle_rows());
    rows.push(unknown_host());
    rows.extend(client_rows());
    rows.extend(service_rows());
    rows
}

/// Keyed POSTs through the mesh, without and with the callee's dedupe.
fn keyed_posts() -> Row {
    Row {
        replicas: Replicas::Two,
        note: Some(
            "each POST carries an idempotency key named after its URL (Zipf over 100: the same \
             key from many users, each with an Authorization of their own) and a body of its own; \
             the mesh: the caller's tollgate, an inbound tollgate in front of each replica, \
             without and with [inbound.dedupe]",
        ),
        columns: vec![
            DIRECT,
            Column {
                key: "sidecars",
                title: "tollgate + [inbound] sidecars",
                path: Path::Sidecars,
                ..TOLLGATE
            },
            Column {
                key: "dedupe",
                title: "sidecars + [inbound.dedupe]",
                path: Path::Sidecars,
                feature: Feature::Dedupe,
                against: &[0, 1],
                trade: None,
            },
        ],
        ..row(
            "keyed-posts",
            "30% of answers 503 at random; keyed POSTs, popular keys from many users, two replicas, 200/s",
            failing(0.3, 503),
            Traffic {
                post: true,
                keyed: true,
                ..traffic(200.0, 5, Urls::Zipf(100))
            },
        )
    }
}

const REPLICAS: &str = "direct: the same client takes the replicas in turn and dials the next one \
     when a connection is refused, as a client given a name with several addresses does; \
     no sidecars: the caller's tollgate straight to the replicas (it skips or retries a bad one); \
     sidecars: the same, each replica behind an inbound tollgate of its own";

fn replica_rows() -> Vec<Row> {
    let replicas = |key, what, broken, traffic| Row {
        replicas: Replicas::ThreeOneBroken(broken),
        note: Some(REPLICAS),
        columns: replica_columns(),
        ..row(key, what, Behaviour::HEALTHY, traffic)
    };
    vec![
        replicas(
            "replica-dead",
            "three replicas, one dead (connections refused); Zipf over 100 URLs, 200/s",
            Broken::Dead,
            traffic(200.0, 5, Urls::Zipf(100)),
        ),
        replicas(
            "replica-hung",
            "three replicas, one hung (accepts, never answers); x-timeout-ms: 1000, 200/s",
            Broken::Hung,
            Traffic {
                deadline: Some(secs(1)),
                patience: ms(1500),
                ..traffic(200.0, 5, Urls::Zipf(100))
            },
        ),
    ]
}

fn feature_rows() -> Vec<Row> {
    vec![
        Row {
            replicas: Replicas::Two,
            columns: with_feature("outlier", "tollgate + [outlier]", Feature::Outlier),
            ..row(
                "outlier-shared",
                "two replicas failing alike, 30% 503 each; Zipf over 100 URLs, 200/s",
                failing(0.3, 503),
                traffic(200.0, 5, Urls::Zipf(100)),
            )
        },
        Row {
            note: Some(
                "the calls reach the app at an inbound tollgate's port (as a Service's targetPort \
                 sends them), without and with the adaptive limit",
            ),
            columns: vec![
                DIRECT,
                Column {
                    key: "inbound",
                    title: "[inbound] (defaults)",
                    path: Path::Inbound,
                    ..TOLLGATE
                },
                Column {
                    key: "adaptive",
                    title: "[inbound] adaptive limit",
                    path: Path::Inbound,
                    feature: Feature::AdaptiveLimit,
                    against: &[0, 1],
                    trade: None,
                },
            ],
            ..row(
                "adaptive-step",
                "a healthy app (log-normal, median 100 ms) behind max_inflight = \"adaptive\"; 5/s for 4 s, then 150/s",
                waits(Latency::LogNormal {
                    median: ms(100),
                    sigma: 0.3,
                }),
                Traffic {
                    steps: vec![(5.0, secs(4)), (150.0, secs(7))],
                    ..traffic(0.0, 0, Urls::Zipf(100))
                },
            )
        },
        Row {
            columns: with_feature("max-ratio", "tollgate + max_ratio 0.5", Feature::MaxRatio),
            ..row(
                "blip",
                "a blip: every answer 503 for 2 s (from 4 s to 6 s); one URL, 100/s",
                Behaviour {
                    outage: Some((secs(4), secs(6))),
                    ..Behaviour::HEALTHY
                },
                traffic(100.0, 10, Urls::One),
            )
        },
        Row {
            columns: with_trade(
                "refuse",
                "tollgate + app_retries refuse",
                Feature::RefuseAppRetries,
                Purpose::RefusesOnlyAppRetries,
            ),
            ..row(
                "refuse-app-retries",
                "30% of answers 503 at random; one popular GET URL, 100/s; the app never retries",
                failing(0.3, 503),
                traffic(100.0, 10, Urls::One),
            )
        },
    ]
}

fn fixed_limit() -> Row {
    Row {
        columns: with_trade(
            "fixed-limit",
            "tollgate + max_inflight 10",
            Feature::FixedLimit,
            Purpose::BoundsWaiting,
        ),
        ..row(
            "fixed-limit",
            "a healthy app (log-normal, median 100 ms); Zipf over 100 URLs, 200/s (about 20 waiting at once)",
            waits(Latency::LogNormal {
                median: ms(100),
                sigma: 0.3,
            }),
            traffic(200.0, 5, Urls::Zipf(100)),
        )
    }
}

fn throttle_rows() -> Vec<Row> {
    let throttle = |key, what, behaviour, purpose| Row {
        columns: with_trade(
            "throttle",
            "tollgate + [throttle]",
            Feature::Throttle,
            purpose,
        ),
        ..row(key, what, behaviour, traffic(200.0, 5, Urls::Zipf(100)))
    };
    vec![
        throttle(
            "throttle-503-30",
            "30% of answers 503 at random; Zipf over 100 URLs, 200/s",
            failing(0.3, 503),
            Purpose::ThrottleIdle,
        ),
        throttle(
            "throttle-503-80",
            "80% of answers 503 at random; Zipf over 100 URLs, 200/s",
            failing(0.8, 503),
            Purpose::ThrottleSheds,
        ),
        throttle(
            "throttle-500-80",
            "80% of answers 500 at random; Zipf over 100 URLs, 200/s",
            failing(0.8, 500),
            Purpose::ThrottleIgnores500,
        ),
    ]
}

fn unknown_host() -> Row {
    Row {
        unknown_host: true,
        note: Some(
            "direct: the app without a proxy connects to the host itself; tollgate: the request \
             goes to tollgate in absolute form (http://HOST/path), whose one upstream is another",
        ),
        ..row(
            "unknown-host",
            "the app uses http_proxy and calls a host no upstream lists; Zipf over 100 URLs, 200/s",
            Behaviour::HEALTHY,
            traffic(200.0, 5, Urls::Zipf(100)),
        )
    }
}

/// The clients teams run and the networks they run on: real client programs that
/// reach tollgate through `http_proxy` (with `CONNECT`, or with Nagle's algorithm on),
/// a client that half-closes, a slow connect, a name with an address that refuses,
/// and an upstream whose answers carry many header fields.
fn client_rows() -> Vec<Row> {
    let program = |key, what, program, note| Row {
        caller: Caller::Program(program),
        note: Some(note),
        ..row(
            key,
            what,
            Behaviour::HEALTHY,
            traffic(200.0, 5, Urls::Zipf(100)),
        )
    };
    let connecting = Behaviour {
        close: true,
        ..Behaviour::HEALTHY
    };
    vec![
        program(
            "undici-proxy",
            "Node's undici through http_proxy (EnvHttpProxyAgent: CONNECT app:80, then HTTP inside); Zipf over 100 URLs, 200/s",
            Program::Undici,
            "direct: the same node script with undici's Agent to the upstream's address; tollgate:              EnvHttpProxyAgent with http_proxy at tollgate, calling http://app/...",
        ),
        program(
            "grpc-proxy",
            "Python's grpcio through http_proxy (its C core sends CONNECT app:80, then HTTP/2); unary calls, 200/s",
            Program::Grpc,
            "direct: the same python script's channel to the upstream's address; tollgate:              http_proxy at tollgate, the channel's target app:80; the upstream answers gRPC              over h2c",
        ),
        Row {
            traffic: Traffic {
                post: true,
                ..traffic(100.0, 10, Urls::Zipf(100))
            },
            ..program(
                "requests-post",
                "Python's requests POSTing a small JSON body through http_proxy (absolute form, Nagle on); Zipf over 100 URLs, 100/s",
                Program::Requests,
                "direct: the same python script straight to the upstream's address (urllib3 turns \
                 Nagle off there); tollgate: http_proxy at tollgate, calling http://app/..., on \
                 connections where urllib3 leaves Nagle on, so each body waits for its head's \
                 ACK; +p50/hop shows a delayed ACK (40 ms) if tollgate holds one back",
            )
        },
        Row {
            caller: Caller::HalfClose,
            note: Some(
                "each call on a connection of its own: the request written, the write side shut                  down (nc -N), the answer read",
            ),
            ..row(
                "half-close",
                "a client that half-closes after its request; answers after 50 ms; Zipf over 100 URLs, 200/s",
                waits(Latency::Fixed(ms(50))),
                traffic(200.0, 5, Urls::Zipf(100)),
            )
        },
        Row {
            note: Some(
                "every answer closes its connection, so every call connects anew; a SYN that finds                  the queue full is dropped and sent again a second later, past the 200 ms                  connect_timeout",
            ),
            ..row(
                "accept-queue-full",
                "the upstream stops accepting for 400 ms every 1.7 s, its accept queue (32) full; Zipf over 100 URLs, 200/s",
                Behaviour {
                    accept_pauses: Some((ms(1700), ms(400))),
                    ..connecting
                },
                traffic(200.0, 5, Urls::Zipf(100)),
            )
        },
        Row {
            replicas: Replicas::Two,
            note: Some(
                "both replicas pause together, as a load step finds every pod at once; every \
                 answer closes its connection; direct: the same client takes the two in turn",
            ),
            ..row(
                "accept-queue-full-two",
                "two replicas, each stops accepting for 400 ms every 1.7 s, its accept queue (32) full; Zipf over 100 URLs, 200/s",
                Behaviour {
                    accept_pauses: Some((ms(1700), ms(400))),
                    ..connecting
                },
                traffic(200.0, 5, Urls::Zipf(100)),
            )
        },
        Row {
            replicas: Replicas::DualStack,
            note: Some(
                "the endpoints [::1]:PORT then 127.0.0.1:PORT, nothing listening on ::1; every                  answer closes its connection; direct: the same client takes the two in turn                  and dials the other when a connection is refused",
            ),
            ..row(
                "dual-stack",
                "a name resolving to ::1 then 127.0.0.1, the upstream on IPv4 only; Zipf over 100 URLs, 200/s",
                connecting,
                traffic(200.0, 5, Urls::Zipf(100)),
            )
        },
        row(
            "many-fields",
            "every answer carries 130 header fields besides its own; Zipf over 100 URLs, 250/s",
            Behaviour {
                fields: 130,
                ..Behaviour::HEALTHY
            },
            traffic(250.0, 4, Urls::Zipf(100)),
        ),
    ]
}

/// How a row's Kubernetes Service reaches its pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A ClusterIP of three pods, one dead: kube-proxy picks a pod per connection.
    ClusterIpDeadPod,
    /// A headless name of three pods, the dead one's address first.
    HeadlessDeadFirst,
    /// A headless name of two pods; a third joins it under load.
    HeadlessScaleUp,
    /// A headless name of three pods; one leaves it under load, then stops.
    HeadlessScaleDown,
    /// `discovery = "kubernetes"` against a real API server: three pods, one dead.
    DiscoveredDeadPod,
    /// The same, two pods: a third joins the Service under load, then one leaves it and
    /// stops.
    DiscoveredScale,
    /// A name resolving to `::1`, where nothing listens, then one pod's IPv4 address; its
    /// app (no sidecar in the way) closes every connection after its answer.
    DualStackName,
}

const SERVICES: &str = "in network namespaces of the lab's own (root): pods each an app behind \
     an [inbound] tollgate sidecar, the first pod's app dead (its sidecar answers 502 \
     app-unreachable); direct: the client pod's app calls the Service itself (a headless name's \
     addresses as resolved at the start, taken in turn, the next one on a refused connection); \
     tollgate: the client pod's tollgate calls the Service by name. With a dead pod each call \
     goes on a connection of its own (kube-proxy picks a pod per connection); scaling, the \
     connections are kept alive";

const DISCOVERED: &str = "the node of the other Service rows, with etcd and a real kube-apiserver \
     in the client pod's namespace; the row writes the Service's EndpointSlices (one ready pod each) and the \
     client pod's tollgate watches them (discovery = \"kubernetes\"); direct: the app calls \
     the Service's VIP on a connection of its own per call (kube-proxy's rules for the same \
     three pods) with a dead pod, and the pods the API listed at the start, in turn, kept \
     alive, scaling";

const DUAL_STACK: &str = "the node of the other Service rows; the client pod's hosts file \
     names `payments-dual` twice, ::1 first (nothing listens there), then the second pod's \
     address, whose app (no sidecar) answers and closes every connection; direct: the client \
     pod's app resolves the name at the start and takes the addresses in turn, dialling the \
     other one when a connection is refused; tollgate: the client pod's tollgate at its \
     defaults calls the name";

/// The rows about Kubernetes Services: 50 calls a second for 20 s.
fn service_rows() -> Vec<Row> {
    let service = |key, what, shape| Row {
        replicas: Replicas::ThreeOneBroken(Broken::Dead),
        note: Some(SERVICES),
        service: Some(shape),
        ..row(
            key,
            what,
            Behaviour::HEALTHY,
            traffic(50.0, 20, Urls::Zipf(100)),
        )
    };
    vec![
        service(
            "clusterip-dead-pod",
            "a ClusterIP Service (kube-proxy's iptables DNAT) of three pods, one dead; 50/s",
            Shape::ClusterIpDeadPod,
        ),
        service(
            "headless-dead-first",
            "a headless Service of three pods, the dead one's address first; 50/s",
            Shape::HeadlessDeadFirst,
        ),
        Row {
            replicas: Replicas::Two,
            ..service(
                "headless-scale-up",
                "a headless Service of two pods, a third added at 5 s; 50/s, kept alive",
                Shape::HeadlessScaleUp,
            )
        },
        Row {
            replicas: Replicas::Two,
            ..service(
                "headless-scale-down",
                "a headless Service of three pods, one removed at 5 s and stopped at 12 s; 50/s, kept alive",
                Shape::HeadlessScaleDown,
            )
        },
        Row {
            note: Some(DISCOVERED),
            ..service(
                "discovered-dead-pod",
                "discovery = \"kubernetes\" (a real kube-apiserver): three pods, one dead; 50/s",
                Shape::DiscoveredDeadPod,
            )
        },
        Row {
            replicas: Replicas::Two,
            note: Some(DISCOVERED),
            ..service(
                "discovered-scale",
                "discovery = \"kubernetes\": two pods, a third added at 5 s, one removed at 10 s and stopped at 13 s; 50/s, kept alive",
                Shape::DiscoveredScale,
            )
        },
        Row {
            replicas: Replicas::One,
            note: Some(DUAL_STACK),
            behaviour: Behaviour {
                close: true,
                ..Behaviour::HEALTHY
            },
            traffic: traffic(100.0, 10, Urls::Zipf(100)),
            ..service(
                "dual-stack-name",
                "a name resolving to ::1 then a pod's IPv4 address, the app on IPv4 only, every answer closing its connection; 100/s",
                Shape::DualStackName,
            )
        },
    ]
}

/// The rows `--short` runs (and CI), in the order they run: one per kind of harm that
/// needs no more than a few seconds.
pub const SHORT: [&str; 7] = [
    "healthy",
    "slow-700ms",
    "errors-one-url",
    "keyed-posts",
    "replica-dead",
    "throttle-500-80",
    "unknown-host",
];

/// The rows of a run: all of them, or the short set.
pub fn rows(short: bool) -> Vec<Row> {
    let mut rows = all();
    if short {
        rows.retain(|r| SHORT.contains(&r.key));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_sends_enough_for_the_test_and_judges_against_direct() {
        let rows = all();
        assert!(rows.len() >= 15);
        for r in &rows {
            assert!(r.traffic.requests() >= 1_000, "{}", r.key);
            assert_eq!(r.columns[0].path, Path::Direct, "{}", r.key);
            assert!(r.columns.len() <= super::super::app::MAX_COLUMNS);
            for c in &r.columns[1..] {
                assert!(
                    c.trade.is_some() || c.against.contains(&0),
                    "{}: {} is judged against nothing",
                    r.key,
                    c.key
                );
                assert!(c.against.iter().all(|&i| i < r.columns.len()));
            }
        }
        let mut keys: Vec<_> = rows.iter().map(|r| r.key).collect();
        keys.dedup();
        assert_eq!(keys.len(), rows.len(), "row keys are unique");
    }

    #[test]
    fn the_short_run_is_a_subset_of_the_full_one() {
        let short = rows(true);
        assert_eq!(short.len(), SHORT.len());
        assert!(
            short
                .iter()
                .any(|r| r.columns.iter().any(|c| c.trade.is_some()))
        );
    }
}
