//! Two pods on one machine, the mesh as it is deployed: two network namespaces joined
//! by a veth pair on a private /30 of this test's own (10.213.77.0/30), each with its
//! own tollgate running as its own UID behind the capture rules `tollgate iptables`
//! installs, an app in pod A that calls pod B's address with no proxy settings, pod B's
//! app behind its inbound listener, and an unrelated server-speaks-first TCP service in
//! pod B.
//!
//! It shows: a call goes through both sidecars (the attempts header the app receives,
//! both sides' metrics); a failure is retried in pod A's sidecar only, and rejected
//! across the link when pod B's fleet budget has no room; the TCP service
//! is reached through passthrough both ways, its greeting heard before the client says
//! anything; a connection the app sends to one of its own sidecar's listeners is
//! refused, not looped; what is not HTTP at an upstream's port (a real Redis, a server
//! that speaks first) is passed through untouched, answered as it is directly;
//! removing the rules restores direct traffic.
//!
//! Needs root, `ip`, `iptables`, `setpriv`, `curl` and `redis-server`; skipped, loudly, without them.
//! The namespaces (and with them the veth pair and every rule) and every process are
//! removed by a guard, also when an assertion fails; leftovers of an earlier run that
//! was killed are removed first. The processes inside the namespaces are this test
//! binary run again ([`pod_process`]), each bounded in how long it lives.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::tempdir::TempDir;
use common::{Upstream, metric};

const NS_A: &str = "tg-pod-a";
const NS_B: &str = "tg-pod-b";
const VETH_A: &str = "tg-pod-a0";
const VETH_B: &str = "tg-pod-b0";
const IP_A: &str = "10.213.77.1";
const IP_B: &str = "10.213.77.2";
const UID_A: u32 = 2101;
const UID_B: u32 = 2102;
const APP_PORT: u16 = 8080;
const BANNER_PORT: u16 = 7000;
/// The banner again, at a port pod A's config lists as an HTTP upstream.
const OWNED_BANNER_PORT: u16 = 7001;
const REDIS_PORT: u16 = 6379;
/// How long any process of the test may live, whatever happens to the test.
const LIFETIME: Duration = Duration::from_secs(120);
const ROLE: &str = "TOLLGATE_POD_ROLE";

fn ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn has(tool: &str, arg: &str) -> bool {
    ok(Command::new(tool).arg(arg))
}

fn can_run() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let tools = [
        ("ip", "-V"),
        ("iptables", "--version"),
        ("setpriv", "--version"),
        ("curl", "--version"),
        ("redis-server", "--version"),
        ("redis-cli", "--version"),
    ];
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(t, a)| !has(t, a))
        .map(|(t, _)| *t)
        .collect();
    if !root || !missing.is_empty() {
        let msg = format!(
            "SKIP tests/it/pods.rs: needs root and ip, iptables, setpriv, curl, redis-server, redis-cli (root: {root}, missing: {missing:?}; scripts/deps.sh installs them)"
        );
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{msg}: under CI this fails"
        );
        eprintln!("{msg}");
        return false;
    }
    true
}

/// Everything the test set up: removed when dropped, whatever happened.
struct Pods {
    children: Vec<(String, Child)>,
    dir: TempDir,
}

impl Pods {
    /// Removes leftovers, then creates the namespaces and the link.
    fn create() -> Self {
        remove_namespaces();
        let pods = Pods {
            children: Vec::new(),
            dir: TempDir::new("pods"),
        };
        for ns in [NS_A, NS_B] {
            must(Command::new("ip").args(["netns", "add", ns]));
            must(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]));
        }
        must(Command::new("ip").args([
            "link", "add", VETH_A, "netns", NS_A, "type", "veth", "peer", "name", VETH_B, "netns",
            NS_B,
        ]));
        for (ns, dev, ip) in [(NS_A, VETH_A, IP_A), (NS_B, VETH_B, IP_B)] {
            must(Command::new("ip").args([
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ip}/30"),
                "dev",
                dev,
            ]));
            must(Command::new("ip").args(["-n", ns, "link", "set", dev, "up"]));
        }
        pods
    }

    /// Starts `argv` inside `ns`, kept until the end of the test.
    fn spawn(&mut self, ns: &str, argv: &[&str], env: &[(&str, &str)], log: &str) {
        let name = log.trim_end_matches(".log").to_string();
        let log = std::fs::File::create(self.dir.path().join(log)).unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.children.push((name, cmd.spawn().unwrap()));
    }

    /// Stops the process whose log is `name`.log.
    fn stop(&mut self, name: &str) {
        if let Some(i) = self.children.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.children.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// This test binary again, as one of the pod's processes.
    fn spawn_role(&mut self, ns: &str, role: &str) {
        let exe = std::env::current_exe().unwrap();
        let dir = self.dir.path().to_str().unwrap().to_string();
        self.spawn(
            ns,
            &[
                exe.to_str().unwrap(),
                "--exact",
                "pods::pod_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ],
            &[(ROLE, role), ("TOLLGATE_POD_DIR", &dir)],
            &format!("{role}.log"),
        );
    }

    /// tollgate in `ns` as `uid`, on `config`.
    fn spawn_tollgate(&mut self, ns: &str, uid: u32, name: &str, config: &str) {
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let bin = common::binary();
        let id = uid.to_string();
        self.spawn(
            ns,
            &[
                "setpriv",
                &format!("--reuid={id}"),
                &format!("--regid={id}"),
                "--clear-groups",
                bin.to_str().unwrap(),
                "run",
                "--config",
                path.to_str().unwrap(),
            ],
            &[("RUST_LOG", "info")],
            &format!("{name}.log"),
        );
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    fn logs(&self) -> String {
        ["tollgate-a", "tollgate-b", "app", "banner", "redis"]
            .iter()
            .map(|n| format!("--- {n}.log\n{}", self.log(n)))
            .collect()
    }

    /// Waits (bounded) until `cond` holds; fails the test, with the logs, if it never did.
    fn wait(&self, what: &str, cond: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if cond() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{what}: not within 30s\n{}", self.logs());
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_namespaces();
    }
}

/// Deleting a namespace deletes its end of the veth pair (and so the pair) and its
/// rules.
fn remove_namespaces() {
    for ns in [NS_A, NS_B] {
        ok(Command::new("ip").args(["netns", "del", ns]));
    }
    ok(Command::new("ip").args(["link", "del", VETH_A]));
}

fn must(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `argv` run inside `ns`: its output and whether it succeeded.
fn run_in(ns: &str, argv: &[&str]) -> (String, bool) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(argv)
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        out.status.success(),
    )
}

/// A plain HTTP GET from inside `ns`, the app's way: no proxy settings.
struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

fn get(ns: &str, url: &str) -> Option<Reply> {
    get_with(ns, url, &[], None)
}

/// A GET from inside `ns` with extra `headers`, as `uid` when given (tollgate's own UID
/// is one the capture rules spare: a caller with no sidecar of its own).
fn get_with(ns: &str, url: &str, headers: &[&str], uid: Option<u32>) -> Option<Reply> {
    let id = uid.map(|u| u.to_string());
    let mut argv: Vec<&str> = Vec::new();
    if let Some(id) = &id {
        argv.extend(["setpriv", "--reuid", id, "--regid", id, "--clear-groups"]);
    }
    argv.extend(["curl", "-sS", "-i", "--noproxy", "*", "--max-time", "5"]);
    for h in headers {
        argv.extend(["-H", h]);
    }
    argv.push(url);
    let (out, ok) = run_in(ns, &argv);
    if !ok {
        return None;
    }
    let out = out.replace("\r\n", "\n");
    let (head, body) = out.split_once("\n\n").unwrap_or((&out, ""));
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some(Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

fn metrics(ns: &str) -> String {
    get(ns, "http://127.0.0.1:15090/metrics")
        .map(|r| r.body)
        .unwrap_or_default()
}

fn value(text: &str, series: &str) -> f64 {
    metric(text, series).unwrap_or(0.0)
}

const CONFIG_A: &str = r#"
[listener]
addr = "127.0.0.1:15001"
drain_timeout = "1s"
[admin]
addr = "0.0.0.0:15090"

[upstreams.b]
authorities = ["b"]
endpoints = ["10.213.77.2:8080"]
# New connections soon, so that rules changed during the test apply to them.
max_connection_age = "100ms"
connect_timeout = "1s"
request_timeout = "5s"
attempt_timeout = "2s"
[upstreams.b.retry]
max_attempts = 3
on = ["connect-failure", "reset", "503"]
backoff_base = "5ms"
backoff_max = "20ms"
[upstreams.b.budget]
ratio = 0.1
min_per_sec = 10
window = "10s"

# Not HTTP, listed as if it were: capture must pass them through untouched.
[upstreams.redis]
authorities = ["redis:6379"]
endpoints = ["10.213.77.2:6379"]
[upstreams.greeter]
authorities = ["greeter:7001"]
endpoints = ["10.213.77.2:7001"]
"#;

const CONFIG_B: &str = r#"
[listener]
addr = "127.0.0.1:15001"
drain_timeout = "1s"
[admin]
addr = "0.0.0.0:15090"

[inbound]
addr = "0.0.0.0:15006"
app = "127.0.0.1:8080"
max_inflight = 100
[inbound.retries]
ratio = 0.5
min_per_sec = 0
window = "1m"
"#;

#[test]
fn two_pods_talk_through_both_sidecars_and_pass_other_tcp_through() {
    if !can_run() {
        return;
    }
    let mut pods = Pods::create();
    start(&mut pods);
    calls_go_through_both_sidecars(&pods);
    a_failure_is_retried_in_the_callers_sidecar_only();
    the_deadline_travels_and_is_shed_across_the_link();
    the_callees_budget_rejects_a_retry_across_the_link(&pods);
    other_tcp_is_passed_through_both_ways(&pods);
    no_connection_loops_into_the_sidecar();
    what_is_not_http_at_an_upstreams_port_passes_untouched(&pods);
    removing_the_rules_restores_direct_traffic();
    rules_for_the_wrong_uid_loop_once_and_stop_a_start(&mut pods);
    eprintln!(
        "two pods: 5 captured calls through both sidecars (1 retried in pod A only), \
         1 retry rejected by pod B's fleet budget, 1 TCP connection passed through both \
         ways, 1 loop refused, Redis and a greeting at upstream ports passed untouched, direct after --clean; rules for the wrong UID: its own \
         connection refused at the first turn (508), and a start refused naming the UID"
    );
}

/// Rules in both pods, then the app, the TCP service and both sidecars, ready.
fn start(pods: &mut Pods) {
    let bin = common::binary();
    let bin = bin.to_str().unwrap();
    for (ns, uid) in [(NS_A, UID_A), (NS_B, UID_B)] {
        let (out, ok) = run_in(ns, &[bin, "iptables", "--uid", &uid.to_string()]);
        assert!(ok, "tollgate iptables in {ns}: {out}");
    }
    pods.spawn_role(NS_B, "app");
    pods.spawn_role(NS_B, "banner");
    let port = REDIS_PORT.to_string();
    pods.spawn(
        NS_B,
        // Started as itself (`ip netns exec` becomes it), so that stopping the child
        // stops Redis: under `timeout`, killing `timeout` left Redis running in the
        // deleted namespace.
        &[
            "redis-server",
            "--port",
            &port,
            "--bind",
            "0.0.0.0",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        &[],
        "redis.log",
    );
    pods.spawn_tollgate(NS_A, UID_A, "tollgate-a", CONFIG_A);
    pods.spawn_tollgate(NS_B, UID_B, "tollgate-b", CONFIG_B);
    let dir = pods.dir.path().to_path_buf();
    pods.wait("the app and the TCP service in pod B", || {
        dir.join("app.ready").exists() && dir.join("banner.ready").exists()
    });
    pods.wait("redis-server in pod B", || {
        run_in(NS_B, &["redis-cli", "-h", "127.0.0.1", "-p", &port, "ping"])
            .0
            .contains("PONG")
    });
    for ns in [NS_A, NS_B] {
        pods.wait(&format!("tollgate ready in {ns}"), || {
            get(ns, "http://127.0.0.1:15090/readyz").is_some_and(|r| r.status == 200)
        });
    }
}

fn calls_go_through_both_sidecars(pods: &Pods) {
    // 1. The app in pod A calls pod B's address: both sidecars are on the path.
    for _ in 0..4 {
        let r = get(NS_A, &url("/hello")).unwrap_or_else(|| panic!("{}", pods.logs()));
        assert_eq!(r.status, 200, "{}\n{}", r.head, pods.logs());
        assert_eq!(
            r.header("x-tollgate-attempts").as_deref(),
            Some("1"),
            "{}",
            r.head
        );
        assert_eq!(r.body, "path=/hello");
    }
    let (a, b) = (metrics(NS_A), metrics(NS_B));
    assert_eq!(
        value(
            &a,
            r#"tollgate_requests_total{code="200",outcome="ok",upstream="b"}"#
        ),
        4.0,
        "pod A's outbound side routed the captured calls to upstream b:\n{a}"
    );
    assert_eq!(
        value(
            &b,
            r#"tollgate_inbound_requests_total{code="200",kind="first",outcome="ok"}"#
        ),
        4.0,
        "pod B's inbound side admitted them:\n{b}"
    );
}

fn a_failure_is_retried_in_the_callers_sidecar_only() {
    // 2. A failure is retried by pod A's sidecar, once, and only there.
    let r = get(NS_A, &url("/flaky")).unwrap();
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("x-tollgate-attempts").as_deref(), Some("2"));
    assert_eq!(r.body, "flaky call 2", "one retry reached the app, no more");
    let (a, b) = (metrics(NS_A), metrics(NS_B));
    assert_eq!(
        value(&a, r#"tollgate_retries_total{reason="503",upstream="b"}"#),
        1.0,
        "{a}"
    );
    assert_eq!(
        value(
            &b,
            r#"tollgate_inbound_requests_total{code="200",kind="retry",outcome="ok"}"#
        ),
        1.0,
        "pod B's inbound side saw the retry as a retry, and admitted it:\n{b}"
    );
    assert_eq!(
        value(
            &b,
            r#"tollgate_inbound_requests_total{code="503",kind="first",outcome="ok"}"#
        ),
        1.0,
        "the first attempt's 503 came from the app and was not retried in pod B:\n{b}"
    );
}

fn the_deadline_travels_and_is_shed_across_the_link() {
    // 2a. Pod A's app gives 1.5 s: pod A's sidecar passes on what is left of it, and pod
    // B's inbound side hands its app what is left on arrival, never more.
    let r = get_with(NS_A, &url("/deadline"), &["x-timeout-ms: 1500"], None).unwrap();
    assert_eq!(r.status, 200, "{}", r.head);
    let left: u64 = r
        .body
        .strip_prefix("x-timeout-ms ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("pod B's app got no deadline: {}", r.body));
    assert!(
        (1..=1500).contains(&left),
        "pod B's app was given {left} ms"
    );
    // A caller with no sidecar (it runs as tollgate's UID, which the rules spare) that
    // has no time left: shed by pod B's inbound side, the app never called.
    let r = get_with(NS_A, &url("/deadline"), &["x-timeout-ms: 0"], Some(UID_A)).unwrap();
    assert_eq!(r.status, 504, "{}", r.head);
    assert_eq!(
        r.header("x-tollgate-outcome").as_deref(),
        Some("deadline-exceeded"),
        "{}",
        r.head
    );
    let b = metrics(NS_B);
    assert_eq!(
        value(&b, r#"tollgate_inbound_denied_total{reason="deadline"}"#),
        1.0,
        "{b}"
    );
    let direct = get(NS_B, &format!("http://127.0.0.1:{APP_PORT}/deadline")).unwrap();
    assert!(
        direct.body.ends_with("call 2"),
        "the shed request never reached the app: {}",
        direct.body
    );
}

fn the_callees_budget_rejects_a_retry_across_the_link(pods: &Pods) {
    // 2b. Pod B's fleet budget, made to admit no retry (a reload): pod A's retry of a
    // failure is rejected across the link (`retry-rejected`, no further attempt), pod
    // A's app gets the failure the retry retried (the app's own first 503), and the app
    // was called once.
    let path = pods.dir.path().join("tollgate-b.toml");
    let next = pods.dir.path().join("tollgate-b.toml.next");
    std::fs::write(&next, CONFIG_B.replace("ratio = 0.5", "ratio = 0.0")).unwrap();
    std::fs::rename(&next, &path).unwrap();
    pods.wait("pod B's sidecar to reload its config", || {
        value(
            &metrics(NS_B),
            r#"tollgate_config_reloads_total{result="ok"}"#,
        ) >= 1.0
    });
    let r = get(NS_A, &url("/down")).unwrap();
    assert_eq!(r.status, 503, "{}", r.head);
    assert_eq!(
        r.header("x-tollgate-outcome").as_deref(),
        Some("retry-rejected"),
        "{}",
        r.head
    );
    assert_eq!(
        r.header("x-tollgate-attempts").as_deref(),
        Some("2"),
        "{}",
        r.head
    );
    assert_eq!(
        r.body, "down call 1",
        "the previous failure goes back: {}",
        r.head
    );
    let a = metrics(NS_A);
    assert_eq!(
        value(
            &a,
            r#"tollgate_retries_denied_total{reason="upstream-rejected",upstream="b"}"#
        ),
        1.0,
        "{a}"
    );
    let b = metrics(NS_B);
    assert_eq!(
        value(
            &b,
            r#"tollgate_inbound_denied_total{reason="retry-budget"}"#
        ),
        1.0,
        "{b}"
    );
    // The app itself (on pod B's loopback, which capture leaves alone) had one call.
    let direct = get(NS_B, &format!("http://127.0.0.1:{APP_PORT}/down")).unwrap();
    assert_eq!(
        direct.body, "down call 2",
        "the rejected retry never reached the app"
    );
}

fn other_tcp_is_passed_through_both_ways(pods: &Pods) {
    // 3. A TCP service no upstream owns: passed through by both sidecars, the server's
    // greeting heard before the client sends a byte.
    let (out, ok) = pods_role_once(NS_A, "banner-client", pods.dir.path());
    assert!(ok, "{out}\n{}", pods.logs());
    assert!(out.contains("GREETING:hello from b"), "{out}");
    assert!(out.contains("ECHO:ping"), "{out}");
    let (a, b) = (metrics(NS_A), metrics(NS_B));
    assert_eq!(passed(&a, "outbound"), 1.0, "{a}");
    assert_eq!(passed(&b, "inbound"), 1.0, "{b}");
}

fn no_connection_loops_into_the_sidecar() {
    // 4. No loop: a connection to pod A's own sidecar at its pod address is captured,
    // recognised as tollgate's own listener and closed, not connected to again.
    let own = get(NS_A, &format!("http://{IP_A}:15090/metrics"));
    assert!(
        own.is_none(),
        "the sidecar's own listener was reached through capture"
    );
    let (a, b) = (metrics(NS_A), metrics(NS_B));
    assert_eq!(
        value(
            &a,
            r#"tollgate_passthrough_failures_total{direction="outbound",reason="loop"}"#
        ),
        1.0,
        "{a}"
    );
    assert_eq!(
        passed(&a, "outbound"),
        1.0,
        "the refused one was not passed through, nothing looped:\n{a}"
    );
    assert_eq!(
        passed(&b, "outbound"),
        0.0,
        "pod B's sidecar sent nothing of its own:\n{b}"
    );
}

fn what_is_not_http_at_an_upstreams_port_passes_untouched(pods: &Pods) {
    // 5. Pod A's config lists pod B's Redis and a second banner port as HTTP upstreams,
    // as an app's environment (`REDIS_ADDR=b:6379`) can make it. Capture still hands
    // Redis's client bytes (RESP) to Redis, and the greeting of a server that speaks
    // first to its silent client, as calling them directly does.
    let before = passed(&metrics(NS_A), "outbound");
    let port = REDIS_PORT.to_string();
    let redis = |ns: &str, host: &str, argv: &[&str]| {
        let mut all = vec!["redis-cli", "-h", host, "-p", &port];
        all.extend(argv);
        run_in(ns, &all)
    };
    let direct = redis(NS_B, "127.0.0.1", &["ping"]);
    let (out, ok) = redis(NS_A, IP_B, &["ping"]);
    assert!(ok, "{out}\n{}", pods.logs());
    assert_eq!(out.trim(), direct.0.trim(), "through capture vs direct");
    assert_eq!(out.trim(), "PONG");
    let (out, ok) = redis(NS_A, IP_B, &["set", "cart:1", "3 items"]);
    assert!(ok && out.contains("OK"), "{out}");
    let (out, _) = redis(NS_B, "127.0.0.1", &["get", "cart:1"]);
    assert_eq!(out.trim(), "3 items", "the write arrived as written");
    let (out, ok) = pods_role_once(NS_A, "owned-banner-client", pods.dir.path());
    assert!(ok, "{out}\n{}", pods.logs());
    assert!(out.contains("GREETING:hello from b"), "{out}");
    assert!(out.contains("ECHO:ping"), "{out}");
    let a = metrics(NS_A);
    assert_eq!(
        passed(&a, "outbound") - before,
        3.0,
        "two redis-cli calls, one greeting, all passed:\n{a}"
    );
    for upstream in ["redis", "greeter"] {
        assert_eq!(
            value(
                &a,
                &format!(
                    r#"tollgate_requests_total{{code="400",outcome="ok",upstream="{upstream}"}}"#
                )
            ),
            0.0,
            "{a}"
        );
    }
}

fn removing_the_rules_restores_direct_traffic() {
    // 6. Rules removed in pod A: the app reaches pod B directly (still through pod B's
    // inbound side), pod A's sidecar sees nothing.
    let bin = common::binary();
    let (out, ok) = run_in(NS_A, &[bin.to_str().unwrap(), "iptables", "--clean"]);
    assert!(ok, "{out}");
    let r = get(NS_A, &url("/hello")).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-tollgate-attempts"),
        None,
        "pod A's sidecar answered: {}",
        r.head
    );
    assert_eq!(r.body, "path=/hello");
    let a = metrics(NS_A);
    assert_eq!(
        value(
            &a,
            r#"tollgate_requests_total{code="200",outcome="ok",upstream="b"}"#
        ),
        6.0,
        "four calls, the retried one and the one with a deadline, nothing since:\n{a}"
    );
}

/// A UID the rules spare that tollgate does not run as.
const WRONG_UID: u32 = 2199;

fn rules_for_the_wrong_uid_loop_once_and_stop_a_start(pods: &mut Pods) {
    // 7. Rules that spare another UID than pod A's sidecar runs as: its own connection to
    // pod B is captured and comes back to it. It is refused at the first turn (the app
    // gets 508, outcome loop), not passed on again and again.
    let bin = common::binary();
    let bin = bin.to_str().unwrap();
    let (out, ok) = run_in(NS_A, &[bin, "iptables", "--uid", &WRONG_UID.to_string()]);
    assert!(ok, "{out}");
    let before = metrics(NS_A);
    let loops = |m: &str| {
        value(
            m,
            r#"tollgate_passthrough_failures_total{direction="outbound",reason="loop"}"#,
        )
    };
    let r = get(NS_A, &url("/hello")).unwrap_or_else(|| panic!("{}", pods.logs()));
    assert_eq!(r.status, 508, "{}\n{}", r.head, pods.logs());
    assert_eq!(r.header("x-tollgate-outcome").as_deref(), Some("loop"));
    let after = metrics(NS_A);
    assert_eq!(
        loops(&after) - loops(&before),
        1.0,
        "one turn, then closed:\n{after}"
    );
    assert!(
        pods.log("tollgate-a")
            .contains(&format!("tollgate iptables --uid {UID_A}"))
    );
    // A tollgate started under such rules refuses to start, naming its UID.
    pods.stop("tollgate-a");
    let path = pods.dir.path().join("again.toml");
    std::fs::write(&path, CONFIG_A).unwrap();
    let id = UID_A.to_string();
    let (out, ok) = run_in(
        NS_A,
        &[
            "timeout",
            "20",
            "setpriv",
            &format!("--reuid={id}"),
            &format!("--regid={id}"),
            "--clear-groups",
            bin,
            "run",
            "--config",
            path.to_str().unwrap(),
        ],
    );
    assert!(
        !ok,
        "tollgate started under rules that capture its own connections:\n{out}"
    );
    assert!(
        out.contains(&format!("the UID tollgate runs as, {UID_A}"))
            && out.contains(&format!("tollgate iptables --uid {UID_A}")),
        "{out}"
    );
}

/// pod B's app at `path`, by pod B's address.
fn url(path: &str) -> String {
    format!("http://{IP_B}:{APP_PORT}{path}")
}

/// `tollgate_passthrough_connections_total{direction}` in a metrics text.
fn passed(metrics: &str, direction: &str) -> f64 {
    value(
        metrics,
        &format!("tollgate_passthrough_connections_total{{direction=\"{direction}\"}}"),
    )
}

/// This test binary run once as `role` inside `ns`, to its end (bounded).
fn pods_role_once(ns: &str, role: &str, dir: &Path) -> (String, bool) {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args([
            "--exact",
            "pods::pod_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env("TOLLGATE_POD_DIR", dir)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        out.status.success(),
    )
}

/// A process of the two-pod test, run by it inside a namespace (`TOLLGATE_POD_ROLE`):
/// `app`, `banner` (servers, living at most [`LIFETIME`]) or `banner-client`.
#[test]
#[ignore = "a process of the two-pod test, started by it inside a network namespace"]
fn pod_process() {
    let role = std::env::var(ROLE).expect("run by the two-pod test");
    let dir = PathBuf::from(std::env::var("TOLLGATE_POD_DIR").unwrap());
    // Whatever happens to the test, this process ends.
    std::thread::spawn(|| {
        std::thread::sleep(LIFETIME);
        std::process::exit(0);
    });
    match role.as_str() {
        "app" => app(&dir),
        "banner" => banner(&dir),
        "banner-client" => banner_client(BANNER_PORT),
        "owned-banner-client" => banner_client(OWNED_BANNER_PORT),
        other => panic!("unknown role {other}"),
    }
}

/// Pod B's app: `/flaky` fails its first call, `/down` every call, `/deadline` says
/// the `x-timeout-ms` it was given; each says how many calls it has had.
fn app(dir: &Path) {
    static FLAKY: AtomicUsize = AtomicUsize::new(0);
    static DOWN: AtomicUsize = AtomicUsize::new(0);
    static DEADLINE: AtomicUsize = AtomicUsize::new(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind(("127.0.0.1", APP_PORT))
            .await
            .unwrap();
        let _app = Upstream::serve(l, |req| async move {
            let path = req.uri().path().to_string();
            match path.as_str() {
                "/flaky" => {
                    let n = FLAKY.fetch_add(1, Ordering::SeqCst) + 1;
                    common::respond(if n == 1 { 503 } else { 200 }, format!("flaky call {n}"))
                }
                "/deadline" => {
                    let n = DEADLINE.fetch_add(1, Ordering::SeqCst) + 1;
                    let given = req
                        .headers()
                        .get("x-timeout-ms")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_string();
                    common::respond(200, format!("x-timeout-ms {given} call {n}"))
                }
                "/down" => {
                    let n = DOWN.fetch_add(1, Ordering::SeqCst) + 1;
                    common::respond(503, format!("down call {n}"))
                }
                _ => common::respond(200, format!("path={path}")),
            }
        });
        std::fs::write(dir.join("app.ready"), "").unwrap();
        tokio::time::sleep(LIFETIME).await;
    });
}

/// Pod B's TCP service: greets first, then echoes one line; on two ports.
fn banner(dir: &Path) {
    let owned = std::net::TcpListener::bind(("0.0.0.0", OWNED_BANNER_PORT)).unwrap();
    std::thread::spawn(move || greet(owned));
    let l = std::net::TcpListener::bind(("0.0.0.0", BANNER_PORT)).unwrap();
    std::fs::write(dir.join("banner.ready"), "").unwrap();
    greet(l);
}

fn greet(l: std::net::TcpListener) {
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        std::thread::spawn(move || {
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            if s.write_all(b"hello from b\n").is_err() {
                return;
            }
            let mut line = String::new();
            if BufReader::new(&s).read_line(&mut line).is_ok() {
                let _ = s.write_all(line.as_bytes());
            }
        });
    }
}

/// Pod A's client of that service: reads the greeting before writing anything.
fn banner_client(port: u16) {
    let addr = format!("{IP_B}:{port}").parse().unwrap();
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut greeting = String::new();
    r.read_line(&mut greeting).unwrap();
    println!("GREETING:{}", greeting.trim());
    s.write_all(b"ping\n").unwrap();
    let mut echo = String::new();
    r.read_line(&mut echo).unwrap();
    println!("ECHO:{}", echo.trim());
}
