//! Random config files, valid and not: every section and key, values of the right and
//! the wrong type, in range and out of it, keys in the wrong section, typos, other
//! proxies' words, now and then a TOML syntax error. A file is a function of its seed,
//! so the outputs of one build can be compared with another's.
//!
//! The key lists are written out here on purpose, apart from the library's table of
//! keys: they are what the file format was when the outputs were recorded.

use fastrand::Rng;

const DUR: &[&str] = &[
    "\"250ms\"",
    "\"2s\"",
    "!\"1m\"",
    "\"100ms\"",
    "\"5s\"",
    "!\"10s\"",
    "!\"1h\"",
    "\"1.5s\"",
    "!\"0s\"",
    "!\"30m\"",
    "!\"1m30s\"",
    "!5",
    "!\"5 parsecs\"",
    "!true",
    "!\"-1s\"",
    "!\"1ms\"",
];
const SHORT: &[&str] = &["\"1ms\"", "\"10ms\"", "\"25ms\"", "!\"2s\""];
const HEAD_SIZE: &[&str] = &[
    "\"32KiB\"",
    "\"64KiB\"",
    "\"1MiB\"",
    "!\"512B\"",
    "!\"2MiB\"",
];
const CEILING: &[&str] = &["1000.0", "500", "!0.05"];
const LONG: &[&str] = &[
    "\"1h\"", "\"30m\"", "\"2s\"", "\"10s\"", "!\"0s\"", "!\"40d\"",
];
const COUNT: &[&str] = &["1", "2", "3", "5", "10", "!0", "!11"];
const FRACTION: &[&str] = &["0.0", "0.05", "0.1", "0.5", "1", "!1.5", "!-0.1"];
const K: &[&str] = &["1", "2.0", "1.5", "3.0", "!0.5", "!101"];
const SIZE: &[&str] = &[
    "\"64KiB\"",
    "\"1MiB\"",
    "\"512B\"",
    "1024",
    "\"32KiB\"",
    "\"2MiB\"",
    "!\"1GB\"",
    "!\"abc\"",
    "!1.5",
    "!\"1GiB\"",
    "!0",
];
const INT: &[&str] = &[
    "!0",
    "1",
    "2",
    "3",
    "5",
    "10",
    "100",
    "!10000",
    "!-1",
    "!\"3\"",
    "!1000000000",
    "0x10",
];
const FLOAT: &[&str] = &[
    "0.0", "0.05", "0.1", "0.5", "1", "3.0", "1000.0", "!2000.0", "!-0.1", "!\"0.1\"", "1e3",
];
const BOOL: &[&str] = &["true", "false", "!\"yes\""];
const ADDR: &[&str] = &[
    "\"127.0.0.1:0\"",
    "!\"127.0.0.1:15001\"",
    "!\"127.0.0.1:15090\"",
    "\"0.0.0.0:15006\"",
    "\"[::1]:7001\"",
    "\"127.0.0.1:7001\"",
    "!\"localhost:80\"",
    "!\"nope\"",
    "!5",
];
const ENDPOINTS: &[&str] = &[
    "[\"127.0.0.1:9\"]",
    "[\"a:80\", \"b.example:8080\"]",
    "[\"[::1]:9\"]",
    "![]",
    "![\"http://x:1\"]",
    "![\"x\"]",
    "!\"127.0.0.1:9\"",
    "![\"x:0\"]",
];
const AUTHORITIES: &[&str] = &[
    "[\"NAME\"]",
    "[\"NAME\"]",
    "[\"NAME\"]",
    "!\"[\"a\", \"b:8080\"]",
    "![\"Pay.example.\"]",
    "![\"a b\"]",
    "!\"pay\"",
    "![]",
    "![\"u@h\"]",
];
const METHODS: &[&str] = &[
    "[\"GET\", \"POST\"]",
    "![\"post\"]",
    "![]",
    "[\"PATCH\", \"PUT\"]",
    "![1]",
    "[\"POST\"]",
    "!\"GET\"",
];
const ON: &[&str] = &[
    "[\"502\", \"503\"]",
    "[502, \"reset\"]",
    "![\"5xx\"]",
    "[\"timeout\", \"unavailable\"]",
    "![\"bogus\"]",
    "[\"connect-failure\", 429]",
    "![\"gateway-error\", 700]",
];
const HEADER: &[&str] = &[
    "\"x-timeout-ms\"",
    "\"idempotency-key\"",
    "\"\"",
    "!\"bad header\"",
    "\"grpc-timeout\"",
    "!7",
];
const HEADERS: &[&str] = &[
    "[\"x-timeout-ms\"]",
    "[]",
    "![\"grpc-timeout\", \"bad header\"]",
];
const WORKERS: &[&str] = &["1", "2", "!0", "!2000", "!\"4\""];
const HONOR: &[&str] = &["\"honor\"", "\"honour\"", "\"ignore\"", "!\"maybe\""];
const PERCENT: &[&str] = &[
    "\"50%\"",
    "\"100%\"",
    "\"0%\"",
    "!50",
    "!\"150%\"",
    "!\"half\"",
    "\" 25 %\"",
];
const AFTER: &[&str] = &[
    "\"p95\"",
    "\"p50\"",
    "\"p99.9\"",
    "!\"p10\"",
    "\"50ms\"",
    "!\"0s\"",
    "!\"px\"",
    "!\"soon\"",
];
const PATHS: &[&str] = &["[\"/healthz\"]", "![\"healthz\"]", "![\"/a?b\"]", "[]"];
const PROBES: &[&str] = &[
    "[{ port = 8080, path = \"/healthz\" }]",
    "[{ port = 8080, path = \"/healthz?full=1\", headers = { \"X-Probe\" = \"1\" } }, { port = 9090, path = \"/\" }]",
    "![{ port = 0, path = \"/\" }]",
    "![{ port = 8080, path = \"healthz\" }]",
    "![8080]",
    "[]",
];
const STORE: &[&str] = &[
    "\"memory\"",
    "\"redis://127.0.0.1:6379/0\"",
    "\"redis://:pw@h:1/2\"",
    "!\"rediss://h\"",
    "!\"mem\"",
    "!\"redis://h:0\"",
    "!\"redis://[::1]/x\"",
];
const OTLP: &[&str] = &[
    "\"http://127.0.0.1:4318\"",
    "\"http://collector:4318/base/\"",
    "!\"https://c:4318\"",
    "!\"c:4318\"",
];
const FILE: &[&str] = &["\"/etc/ca.pem\"", "\"rel/ca.pem\"", "!5"];
const SERVER_NAME: &[&str] = &["\"api.example\"", "\"10.0.0.1\"", "!\"not a name\"", "!1"];
const INFLIGHT: &[&str] = &["10", "\"adaptive\"", "!0", "!\"lots\"", "!1.5", "200"];

/// A value of `pool`: one written wrong (marked `!` in the pool) once in 60 times.
fn value(rng: &mut Rng, pool: Pool) -> String {
    let (list, quote) = match pool {
        Of(list) => (list, false),
        Words(list) => (list, true),
    };
    let wrong = rng.u8(..60) == 0;
    let fits: Vec<&str> = list
        .iter()
        .filter(|v| v.starts_with('!') == wrong)
        .copied()
        .collect();
    let fits = if fits.is_empty() { list.to_vec() } else { fits };
    let v = fits[rng.usize(..fits.len())].trim_start_matches('!');
    if quote {
        format!("\"{v}\"")
    } else {
        v.to_string()
    }
}

type Keys = &'static [(&'static str, Pool)];

#[derive(Clone, Copy)]
enum Pool {
    Of(&'static [&'static str]),
    Words(&'static [&'static str]),
}

use Pool::{Of, Words};

const RUNTIME: Keys = &[("worker_threads", Of(WORKERS))];
const LISTENER: Keys = &[
    ("addr", Of(ADDR)),
    ("drain_timeout", Of(DUR)),
    ("header_read_timeout", Of(DUR)),
    ("max_header_bytes", Of(HEAD_SIZE)),
    ("max_headers", Of(INT)),
    ("idle_timeout", Of(DUR)),
    ("max_connections", Of(INT)),
    ("unknown_authorities", Words(&["pass", "refuse", "!drop"])),
    ("passthrough_connect_timeout", Of(DUR)),
];
const ADMIN: Keys = &[("addr", Of(ADDR)), ("probes", Of(PROBES))];
const DEADLINE: Keys = &[
    (
        "header",
        Of(&["\"x-timeout-ms\"", "\"x-deadline\"", "!\"\""]),
    ),
    ("accept", Of(HEADERS)),
];
const ACCESS_LOG: Keys = &[
    ("enabled", Of(BOOL)),
    ("format", Words(&["text", "json", "!xml"])),
    ("query", Of(BOOL)),
];
const UPSTREAM: Keys = &[
    ("authorities", Of(AUTHORITIES)),
    ("listen", Of(ADDR)),
    ("endpoints", Of(ENDPOINTS)),
    (
        "host",
        Of(&[
            "\"api.example\"",
            "\"api.example:8443\"",
            "!\"bad host\"",
            "!\"\"",
        ]),
    ),
    (
        "protocol",
        Words(&["http1", "h2c", "h2", "http2", "auto", "!h3"]),
    ),
    ("connect_timeout", Of(DUR)),
    ("request_timeout", Of(DUR)),
    ("attempt_timeout", Of(DUR)),
    ("max_inflight", Of(INT)),
    ("max_connection_age", Of(LONG)),
    (
        "app_retries",
        Words(&["count", "refuse", "ignore", "!drop"]),
    ),
];
const RETRY: Keys = &[
    ("max_attempts", Of(COUNT)),
    ("on", Of(ON)),
    ("methods", Of(METHODS)),
    ("idempotency_header", Of(HEADER)),
    ("mint_idempotency_key", Of(METHODS)),
    ("backoff_base", Of(SHORT)),
    ("backoff_max", Of(DUR)),
    ("backoff_jitter", Words(&["full", "none", "!half"])),
    ("retry_after", Of(HONOR)),
    ("max_retry_after", Of(DUR)),
    ("max_body", Of(SIZE)),
    ("ownership", Of(HONOR)),
];
const BUDGET: Keys = &[
    ("ratio", Of(FLOAT)),
    ("min_per_sec", Of(FLOAT)),
    ("window", Of(DUR)),
    ("max_ratio", Of(CEILING)),
];
const TLS: Keys = &[
    ("server_name", Of(SERVER_NAME)),
    ("ca_file", Of(FILE)),
    ("client_cert", Of(FILE)),
];
const OUTLIER: Keys = &[
    ("consecutive_failures", Of(COUNT)),
    ("base_ejection", Of(DUR)),
    ("max_ejected", Of(PERCENT)),
];
const HEDGE: Keys = &[("after", Of(AFTER)), ("max_extra", Of(FRACTION))];
const THROTTLE: Keys = &[("k", Of(K)), ("window", Of(DUR))];
const INBOUND: Keys = &[
    ("addr", Of(ADDR)),
    (
        "app",
        Of(&[
            "\"127.0.0.1:8080\"",
            "\"localhost:9000\"",
            "!\"127.0.0.1:15006\"",
            "!\"x\"",
        ]),
    ),
    ("max_inflight", Of(INFLIGHT)),
    ("request_timeout", Of(DUR)),
    ("probe_paths", Of(PATHS)),
    ("owned_failures", Words(&["mark", "off", "!on"])),
];
const INBOUND_RETRIES: Keys = &[
    ("ratio", Of(FLOAT)),
    ("min_per_sec", Of(FLOAT)),
    ("window", Of(DUR)),
    ("per_caller", Words(&["fair", "off", "!greedy"])),
];
const DEDUPE: Keys = &[
    ("methods", Of(METHODS)),
    ("ttl", Of(LONG)),
    ("max_response", Of(SIZE)),
    ("store", Of(STORE)),
    ("max_entries", Of(INT)),
    ("store_timeout", Of(DUR)),
    ("on_store_error", Words(&["closed", "open", "!fail"])),
];
const TRACING: Keys = &[
    ("otlp", Of(OTLP)),
    ("sample", Of(FRACTION)),
    ("batch", Of(INT)),
    ("queue", Of(INT)),
    ("timeout", Of(DUR)),
];

/// Every key of every section, for keys written in the wrong place.
const ALL: &[Keys] = &[
    RUNTIME,
    LISTENER,
    ADMIN,
    DEADLINE,
    ACCESS_LOG,
    UPSTREAM,
    RETRY,
    BUDGET,
    TLS,
    OUTLIER,
    HEDGE,
    THROTTLE,
    INBOUND,
    INBOUND_RETRIES,
    DEDUPE,
    TRACING,
];

const FOREIGN: &[&str] = &[
    "timeout",
    "per_try_timeout",
    "perTryTimeout",
    "num_retries",
    "attempts",
    "retry_on",
    "retryOn",
    "retry_budget",
    "zzzzzzzzzz",
    "\"\"",
];

fn pick<'a>(rng: &mut Rng, list: &'a [&'a str]) -> &'a str {
    list[rng.usize(..list.len())]
}

/// A near miss of `key`: a letter dropped, doubled or swapped.
fn typo(rng: &mut Rng, key: &str) -> String {
    let mut chars: Vec<char> = key.chars().collect();
    let i = rng.usize(..chars.len());
    match rng.u8(..3) {
        0 if chars.len() > 1 => {
            chars.remove(i);
        }
        1 => chars.insert(i, chars[i]),
        _ if i + 1 < chars.len() => chars.swap(i, i + 1),
        _ => chars.push('s'),
    }
    chars.into_iter().collect()
}

/// The body of one section: some of its keys, and now and then a key it does not take.
fn section(rng: &mut Rng, out: &mut String, header: &str, keys: Keys, must: &[&str]) {
    let name = header.split('.').nth(1).unwrap_or("x").trim_matches('"');
    out.push_str(&format!("[{header}]\n"));
    for (key, pool) in keys {
        let written = must.contains(key) && rng.u8(..40) > 0;
        if written || rng.u8(..3) == 0 {
            let v = value(rng, *pool).replace("NAME", name);
            out.push_str(&format!("{key} = {v}\n"));
            // mTLS takes both or neither.
            if *key == "client_cert" && rng.u8(..25) > 0 {
                out.push_str(&format!("client_key = {}\n", value(rng, *pool)));
            }
        }
    }
    match rng.u8(..60) {
        0 => {
            let (key, pool) = keys[rng.usize(..keys.len())];
            out.push_str(&format!("{} = {}\n", typo(rng, key), value(rng, pool)));
        }
        1 => {
            let other = ALL[rng.usize(..ALL.len())];
            let (key, pool) = other[rng.usize(..other.len())];
            if !keys.iter().any(|(k, _)| *k == key) {
                out.push_str(&format!("{key} = {}\n", value(rng, pool)));
            }
        }
        2 => out.push_str(&format!("{} = 1\n", pick(rng, FOREIGN))),
        _ => {}
    }
}

/// The config file of `seed`.
pub fn config(seed: u64) -> String {
    let rng = &mut Rng::with_seed(seed);
    let mut out = String::new();
    let top: [(&str, Keys); 6] = [
        ("runtime", RUNTIME),
        ("listener", LISTENER),
        ("admin", ADMIN),
        ("deadline", DEADLINE),
        ("access_log", ACCESS_LOG),
        ("tracing", TRACING),
    ];
    for (name, keys) in top {
        if rng.u8(..3) == 0 {
            section(rng, &mut out, name, keys, &[]);
        }
    }
    let mut names = ["a", "b", "pay"];
    rng.shuffle(&mut names);
    let count = if rng.u8(..10) == 0 {
        0
    } else {
        rng.usize(1..4)
    };
    for &base in names.iter().take(count) {
        let name = match rng.u8(..60) {
            0 if rng.bool() => "passthrough",
            0 => "bad name",
            _ => base,
        };
        let name = if name.contains(' ') {
            format!("\"{name}\"")
        } else {
            name.to_string()
        };
        section(
            rng,
            &mut out,
            &format!("upstreams.{name}"),
            UPSTREAM,
            &["authorities", "endpoints"],
        );
        let subs: [(&str, Keys, &[&str]); 6] = [
            ("retry", RETRY, &[]),
            ("budget", BUDGET, &[]),
            ("tls", TLS, &["server_name"]),
            ("outlier", OUTLIER, &[]),
            ("hedge", HEDGE, &[]),
            ("throttle", THROTTLE, &[]),
        ];
        for (sub, keys, must) in subs {
            if rng.u8(..3) == 0 {
                section(
                    rng,
                    &mut out,
                    &format!("upstreams.{name}.{sub}"),
                    keys,
                    must,
                );
            }
        }
    }
    if rng.u8(..3) == 0 {
        section(rng, &mut out, "inbound", INBOUND, &["app"]);
        if rng.bool() {
            section(rng, &mut out, "inbound.retries", INBOUND_RETRIES, &[]);
        }
        if rng.bool() {
            section(rng, &mut out, "inbound.dedupe", DEDUPE, &[]);
        }
    }
    match rng.u8(..50) {
        0 => out.push_str("[broken\n"),
        1 => out.push_str("upstreams = 5\n"),
        2 => out.push_str("[listener]\naddr = \"127.0.0.1:1\"\n"),
        3 => out.insert_str(0, "listener = \"x\"\n"),
        _ => {}
    }
    out
}
