//! Kubernetes Services as they are, side by side with calling them directly: a network
//! namespace of this test's own shaped as a node makes it, with three pods (each app
//! behind its own tollgate's inbound side; one app dead, so its sidecar answers `502
//! app-unreachable`), a ClusterIP Service (kube-proxy's iptables DNAT, `statistic
//! --mode random`, one rule per pod) and a headless Service (the name resolves to every
//! pod's address, the dead one first, through the namespace's own hosts file), and a
//! client pod whose tollgate calls the Service by name.
//!
//! It shows, each at 20 requests/s with the same calls straight to the Service at the
//! same time:
//! - ClusterIP with one of three pods dead: through tollgate at least 90% and no worse
//!   than direct (a retry back to the VIP goes on a connection of its own, so
//!   kube-proxy picks again; the sidecar closes the connection that carried its app's
//!   failure);
//! - headless, dead pod first: through tollgate at least 99% (every address is an
//!   endpoint of its own, the dead one put aside: its retries stay under a tenth of
//!   the requests, where a third of the first attempts would fail without it);
//! - a pod added to the headless name under steady load takes requests within the
//!   5 s the names are followed at, without `max_connection_age`, and a pod removed
//!   from it takes none after that, with no request failed.
//!
//! The same shapes are rows of the harm matrix (`tollgate lab --scenario harm`, in
//! namespaces of the lab's own), with two more against a real kube-apiserver
//! (`discovery = "kubernetes"`): the last test here runs them and holds them to their
//! verdicts and to the figures above (those with the API server skipped loudly without
//! its binaries, and failed under CI).
//!
//! Two namespaces joined by a veth pair of this test's own: the pods' (four addresses,
//! each in a /30 of its own on the link) and the client's, where kube-proxy's rules
//! live, as on a node; the VIP is an address of another /30 of the link that no
//! process holds. Needs root, `ip` and `iptables`; skipped loudly without them, and
//! fails under CI. The namespaces (with the link and the rules), the hosts file and
//! every process are removed by a guard, also when an assertion fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::tempdir::TempDir;

/// The client pod's namespace, with kube-proxy's rules and the headless name.
const NS: &str = "tg-svc-c";
/// The server pods' namespace.
const PODS_NS: &str = "tg-svc-p";
const VETH_C: &str = "tg-svc-c0";
const VETH_P: &str = "tg-svc-p0";
/// The link's /30s: the client's end, and the pod's.
const LINKS: [(&str, &str); 4] = [
    ("10.213.78.1", "10.213.78.2"),
    ("10.213.78.5", "10.213.78.6"),
    ("10.213.78.9", "10.213.78.10"),
    ("10.213.78.13", "10.213.78.14"),
];
/// The Service's virtual IP: in a /30 of the link's own (10.213.78.16/30), held by
/// nobody; the client's rules send its connections to a pod.
const VIP: &str = "10.213.78.18";
const VIP_LINK: &str = "10.213.78.17";
const VIP_NET: &str = "10.213.78.16";
const SVC_PORT: u16 = 8080;
const APP_PORT: u16 = 9090;
/// The pods: the first one's app is dead.
const PODS: [&str; 4] = ["10.213.78.2", "10.213.78.6", "10.213.78.10", "10.213.78.14"];
const HEADLESS: &str = "payments-headless";
/// How long any process of the test may live, whatever happens to the test.
const LIFETIME: Duration = Duration::from_secs(150);
const ROLE: &str = "TOLLGATE_SVC_ROLE";

fn ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn can_run() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let tools = ok(Command::new("ip").arg("-V")) && ok(Command::new("iptables").arg("--version"));
    if !root || !tools {
        let msg = format!(
            "SKIP tests/it/services.rs: needs root, ip and iptables (root: {root}, tools: {tools})"
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

fn hosts_dir() -> PathBuf {
    PathBuf::from(format!("/etc/netns/{NS}"))
}

/// Everything the test set up: removed when dropped, whatever happened.
struct Node {
    children: Vec<(String, Child)>,
    dir: TempDir,
}

impl Node {
    fn create() -> Self {
        remove();
        let node = Node {
            children: Vec::new(),
            dir: TempDir::new("services"),
        };
        for ns in [NS, PODS_NS] {
            must(Command::new("ip").args(["netns", "add", ns]));
            must(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]));
        }
        must(Command::new("ip").args([
            "link", "add", VETH_C, "netns", NS, "type", "veth", "peer", "name", VETH_P, "netns",
            PODS_NS,
        ]));
        let mut client_ends: Vec<&str> = LINKS.iter().map(|(c, _)| *c).collect();
        client_ends.push(VIP_LINK);
        for ip in client_ends {
            let a = format!("{ip}/30");
            must(Command::new("ip").args(["-n", NS, "addr", "add", &a, "dev", VETH_C]));
        }
        for (_, ip) in LINKS {
            let a = format!("{ip}/30");
            must(Command::new("ip").args(["-n", PODS_NS, "addr", "add", &a, "dev", VETH_P]));
        }
        for (ns, dev) in [(NS, VETH_C), (PODS_NS, VETH_P)] {
            must(Command::new("ip").args(["-n", ns, "link", "set", dev, "up"]));
        }
        // A connection to the VIP leaves from the client's address in the VIP's /30:
        // the pods answer it over the link.
        let vip_net = format!("{}/30", VIP_NET);
        must(Command::new("ip").args(["-n", PODS_NS, "route", "add", &vip_net, "dev", VETH_P]));
        // kube-proxy's rules for a ClusterIP Service of three pods: each connection to
        // the VIP goes to one pod at random.
        let n = 3;
        for (i, pod) in PODS[..n].iter().enumerate() {
            let mut rule = vec![
                "netns", "exec", NS, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", VIP, "-p",
                "tcp", "--dport", "80",
            ];
            let p = format!("{:.5}", 1.0 / (n - i) as f64);
            if i + 1 < n {
                rule.extend(["-m", "statistic", "--mode", "random", "--probability", &p]);
            }
            let to = format!("{pod}:{SVC_PORT}");
            rule.extend(["-j", "DNAT", "--to-destination", &to]);
            must(Command::new("ip").args(&rule));
        }
        std::fs::create_dir_all(hosts_dir()).unwrap();
        node.set_headless(&PODS[..3]);
        node
    }

    /// The headless Service's name resolves to `pods`, in this order. Written in place:
    /// `ip netns exec` mounts this file over /etc/hosts for the namespace's processes.
    fn set_headless(&self, pods: &[&str]) {
        let mut text = String::from("127.0.0.1 localhost\n");
        for p in pods {
            text.push_str(&format!("{p} {HEADLESS}\n"));
        }
        std::fs::write(hosts_dir().join("hosts"), text).unwrap();
    }

    fn spawn(&mut self, ns: &str, argv: &[&str], env: &[(&str, &str)], name: &str) {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.children.push((name.to_string(), cmd.spawn().unwrap()));
    }

    fn spawn_role(&mut self, ns: &str, role: &str, env: &[(&str, &str)]) {
        let exe = std::env::current_exe().unwrap();
        let dir = self.dir.path().to_str().unwrap().to_string();
        let mut env = env.to_vec();
        env.push((ROLE, role));
        env.push(("TOLLGATE_SVC_DIR", &dir));
        self.spawn(
            ns,
            &[
                exe.to_str().unwrap(),
                "--exact",
                "services::service_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ],
            &env,
            role,
        );
    }

    fn spawn_tollgate(&mut self, ns: &str, name: &str, config: &str) {
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let bin = common::binary();
        self.spawn(
            ns,
            &[
                bin.to_str().unwrap(),
                "run",
                "--config",
                path.to_str().unwrap(),
            ],
            &[("RUST_LOG", "info")],
            name,
        );
    }

    fn logs(&self) -> String {
        self.children
            .iter()
            .map(|(n, _)| {
                let text = std::fs::read_to_string(self.dir.path().join(format!("{n}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {n}.log\n{}\n", tail.join("\n"))
            })
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

    /// The load role run once to its end (bounded by its own lifetime): its report.
    fn load(&self, mode: &str) -> Report {
        let exe = std::env::current_exe().unwrap();
        let out = Command::new("ip")
            .args(["netns", "exec", NS])
            .arg(exe)
            .args([
                "--exact",
                "services::service_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, "load")
            .env("TOLLGATE_SVC_MODE", mode)
            .env("TOLLGATE_SVC_DIR", self.dir.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "load {mode}:\n{text}\n{}",
            self.logs()
        );
        Report::parse(&text)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove();
    }
}

/// Deleting the namespaces deletes the link and the rules.
fn remove() {
    for ns in [NS, PODS_NS] {
        ok(Command::new("ip").args(["netns", "del", ns]));
    }
    ok(Command::new("ip").args(["link", "del", VETH_C]));
    let _ = std::fs::remove_dir_all(hosts_dir());
}

fn must(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What a load run printed: `key value` lines.
#[derive(Debug)]
struct Report(BTreeMap<String, f64>);

impl Report {
    fn parse(text: &str) -> Self {
        Report(
            text.lines()
                .filter_map(|l| l.strip_prefix("REPORT "))
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k.to_string(), v.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    fn get(&self, k: &str) -> f64 {
        *self
            .0
            .get(k)
            .unwrap_or_else(|| panic!("no {k} in the report {:?}", self.0))
    }
}

fn sidecar_config(pod: &str) -> String {
    format!(
        "[listener]\naddr = \"{pod}:15001\"\n[admin]\naddr = \"{pod}:15090\"\n\
         [inbound]\naddr = \"{pod}:{SVC_PORT}\"\napp = \"{pod}:{APP_PORT}\"\n"
    )
}

const CLIENT_CONFIG: &str = "\
[listener]
addr = \"127.0.0.1:15001\"
[admin]
addr = \"127.0.0.1:15090\"

[upstreams.vip]
authorities = [\"payments-vip\"]
endpoints = [\"10.213.78.18:80\"]
[upstreams.vip.retry]
max_attempts = 3
on = [\"connect-failure\", \"reset\", \"502\", \"503\", \"504\"]
[upstreams.vip.budget]
ratio = 0.2

[upstreams.headless]
authorities = [\"payments-headless\"]
endpoints = [\"payments-headless:8080\"]
[upstreams.headless.retry]
max_attempts = 3
on = [\"connect-failure\", \"reset\", \"502\", \"503\", \"504\"]
[upstreams.headless.budget]
ratio = 0.2
[upstreams.headless.outlier]
consecutive_failures = 3
";

/// One test at a time: each is a node of its own, and the two cores are shared.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn services_through_tollgate_serve_at_least_as_well_as_direct() {
    if !can_run() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut node = Node::create();
    // Apps on every pod but the first; each pod's sidecar in front of its app.
    node.spawn_role(PODS_NS, "apps", &[]);
    let dir = node.dir.path().to_path_buf();
    node.wait("the apps are up", || dir.join("apps.ready").exists());
    for (i, pod) in PODS.iter().enumerate() {
        node.spawn_tollgate(PODS_NS, &format!("sidecar-{i}"), &sidecar_config(pod));
    }
    node.spawn_tollgate(NS, "client", CLIENT_CONFIG);
    node.wait("every sidecar listens", || {
        PODS.iter()
            .all(|p| probe_in_ns(NS, &format!("{p}:{SVC_PORT}")))
            && probe_in_ns(NS, "127.0.0.1:15090")
    });

    // ClusterIP with one of three pods dead.
    let r = node.load("clusterip");
    let (direct, through) = (r.get("direct_ok"), r.get("tollgate_ok"));
    let n = r.get("requests");
    eprintln!(
        "clusterip: direct {:.1}%, through tollgate {:.1}% of {n}",
        100.0 * direct / n,
        100.0 * through / n
    );
    assert!(
        through >= 0.9 * n,
        "ClusterIP through tollgate: {through} of {n}\n{}",
        node.logs()
    );
    assert!(
        through >= direct,
        "ClusterIP: {through} through tollgate, {direct} direct"
    );

    // Headless, the dead pod's address first.
    let r = node.load("headless");
    let (direct, through) = (r.get("direct_ok"), r.get("tollgate_ok"));
    let n = r.get("requests");
    eprintln!(
        "headless: direct {:.1}%, through tollgate {:.1}% of {n}",
        100.0 * direct / n,
        100.0 * through / n
    );
    assert!(
        through >= 0.99 * n,
        "headless through tollgate: {through} of {n}\n{}",
        node.logs()
    );
    assert!(
        through >= direct,
        "headless: {through} through tollgate, {direct} direct"
    );
    // The dead pod is put aside after its first failures: a third of the first attempts
    // would need a retry if it were not.
    let retries = r.get("tollgate_retries");
    eprintln!("headless: {retries} retries for {n} requests");
    assert!(
        retries <= 0.1 * n,
        "the dead pod was not put aside: {retries} retries for {n} requests"
    );

    // Scale: a pod added under steady load, then one removed.
    node.set_headless(&PODS[1..3]);
    let dir2 = dir.clone();
    let scaler = std::thread::spawn(move || {
        // The load starts, then the fourth pod joins, then the second leaves.
        let until = Instant::now() + Duration::from_secs(20);
        while !dir2.join("load.started").exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_secs(3));
        write_hosts(&[PODS[1], PODS[2], PODS[3]]);
        std::fs::write(dir2.join("added.at"), "").unwrap();
        std::thread::sleep(Duration::from_secs(8));
        write_hosts(&[PODS[2], PODS[3]]);
        std::fs::write(dir2.join("removed.at"), "").unwrap();
    });
    let r = node.load("scale");
    scaler.join().unwrap();
    let n = r.get("requests");
    eprintln!("scale: {r:?}");
    assert_eq!(
        r.get("tollgate_ok"),
        n,
        "no request failed while pods came and went"
    );
    let added = r.get("added_after_ms");
    assert!(
        (0.0..=6_500.0).contains(&added),
        "the new pod took its first request {added} ms after it was added (the names are followed every 5 s)"
    );
    assert_eq!(
        r.get("removed_late"),
        0.0,
        "the removed pod took requests more than 6.5 s after it was removed"
    );
}

/// The harm matrix's rows about Services, run by the lab in namespaces of its own; the
/// last two with a real kube-apiserver (scripts/kube.sh builds it).
const HARM_ROWS: [&str; 7] = [
    "clusterip-dead-pod",
    "headless-dead-first",
    "headless-scale-up",
    "headless-scale-down",
    "discovered-dead-pod",
    "discovered-scale",
    "dual-stack-name",
];

#[test]
fn the_harm_rows_about_services_do_no_harm() {
    if !can_run() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = Command::new(common::binary())
        .args(["lab", "--scenario", "harm", "--json", "--rows"])
        .arg(HARM_ROWS.join(","))
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let rows = v["rows"].as_array().unwrap();
    let keys: Vec<&str> = rows.iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!(keys, HARM_ROWS);
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let mut success = BTreeMap::new();
    for row in rows {
        let key = row["key"].as_str().unwrap();
        if key.starts_with("discovered-") && !ci && !row["skipped"].is_null() {
            eprintln!("SKIP {key}: {}", row["skipped"]);
            continue;
        }
        assert!(row["skipped"].is_null(), "{key}: {}", row["skipped"]);
        let columns = row["columns"].as_array().unwrap();
        let share = |i: usize| columns[i]["success_rate"].as_f64().unwrap();
        eprintln!(
            "{key}: direct {:.1}%, through tollgate {:.1}%, {}",
            100.0 * share(0),
            100.0 * share(1),
            row["verdict"]
        );
        assert_ne!(row["verdict"], "WORSE", "{key}: {row}");
        success.insert(key, share(1));
    }
    assert_eq!(out.status.code(), Some(0), "no row WORSE");
    assert!(success["clusterip-dead-pod"] >= 0.9, "{success:?}");
    assert!(success["headless-dead-first"] >= 0.99, "{success:?}");
    // A refused ::1 moves the attempt to the IPv4 address at once, costing no retry.
    assert!(success["dual-stack-name"] >= 0.99, "{success:?}");
    assert_eq!(
        success["headless-scale-down"], 1.0,
        "no request failed through tollgate while a pod left"
    );
    assert_eq!(success["headless-scale-up"], 1.0, "{success:?}");
    if let Some(s) = success.get("discovered-dead-pod") {
        assert!(*s >= 0.99, "{success:?}");
    }
    if let Some(s) = success.get("discovered-scale") {
        assert_eq!(
            *s, 1.0,
            "no request failed while pods came and went: {success:?}"
        );
    }
}

fn write_hosts(pods: &[&str]) {
    let mut text = String::from("127.0.0.1 localhost\n");
    for p in pods {
        text.push_str(&format!("{p} {HEADLESS}\n"));
    }
    std::fs::write(hosts_dir().join("hosts"), text).unwrap();
}

/// Whether a TCP connect to `addr` inside the namespace succeeds.
fn probe_in_ns(ns: &str, addr: &str) -> bool {
    let (host, port) = addr.split_once(':').unwrap();
    ok(Command::new("ip").args([
        "netns",
        "exec",
        ns,
        "bash",
        "-c",
        &format!("exec 3<>/dev/tcp/{host}/{port}"),
    ]))
}

/// A process of the test, run by it inside the namespace (`TOLLGATE_SVC_ROLE`): `apps`
/// (the pods' apps, living at most [`LIFETIME`]) or `load` (one run, printing its
/// report).
#[test]
#[ignore = "a process of the Services test, started by it inside a network namespace"]
fn service_process() {
    let role = std::env::var(ROLE).expect("run by the Services test");
    let dir = PathBuf::from(std::env::var("TOLLGATE_SVC_DIR").unwrap());
    std::thread::spawn(|| {
        std::thread::sleep(LIFETIME);
        std::process::exit(0);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match role.as_str() {
        "apps" => rt.block_on(apps(&dir)),
        "load" => {
            let mode = std::env::var("TOLLGATE_SVC_MODE").unwrap();
            rt.block_on(load(&mode, &dir));
        }
        other => panic!("unknown role {other}"),
    }
}

/// Every pod's app but the first's: each answers 200 with its own address.
async fn apps(dir: &Path) {
    let mut servers = Vec::new();
    for pod in &PODS[1..] {
        let l = tokio::net::TcpListener::bind((*pod, APP_PORT))
            .await
            .unwrap();
        let me = pod.to_string();
        servers.push(common::Upstream::serve(l, move |_req| {
            let me = me.clone();
            async move { common::respond(200, me) }
        }));
    }
    std::fs::write(dir.join("apps.ready"), "").unwrap();
    tokio::time::sleep(LIFETIME).await;
}

/// One call, on a connection of its own: the status and the body.
async fn call(to: SocketAddr, host: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(to).await.ok()?;
        let req = format!("GET /pay HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text.get(9..12)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .ok()
        .flatten()
}

/// The headless name's addresses now, one of them at random, as a client without
/// tollgate calling a headless Service does.
async fn resolve_one(name: &str) -> Option<SocketAddr> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, SVC_PORT))
        .await
        .ok()?
        .collect();
    (!addrs.is_empty()).then(|| addrs[fastrand::usize(..addrs.len())])
}

const RATE: u64 = 20;
const REQUESTS: u64 = 200;

async fn load(mode: &str, dir: &Path) {
    let tollgate: SocketAddr = "127.0.0.1:15001".parse().unwrap();
    let vip: SocketAddr = format!("{VIP}:80").parse().unwrap();
    if mode == "scale" {
        return scale(dir, tollgate).await;
    }
    let host = match mode {
        "clusterip" => "payments-vip",
        _ => HEADLESS,
    };
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
    for _ in 0..REQUESTS {
        tick.tick().await;
        let direct_to = match mode {
            "clusterip" => Some(vip),
            _ => resolve_one(HEADLESS).await,
        };
        tasks.spawn(async move {
            let direct = match direct_to {
                Some(to) => call(to, host).await,
                None => None,
            };
            let through = call(tollgate, host).await;
            (
                direct.is_some_and(|(s, _)| s == 200),
                through.is_some_and(|(s, _)| s == 200),
            )
        });
    }
    let (mut d, mut t) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let (direct, through) = r.unwrap();
        d += u32::from(direct);
        t += u32::from(through);
    }
    // After libtest's own words on the line.
    println!();
    println!("REPORT requests {REQUESTS}");
    println!("REPORT direct_ok {d}");
    println!("REPORT tollgate_ok {t}");
    if mode == "headless" {
        println!("REPORT tollgate_retries {}", retries("headless").await);
    }
}

/// The client's tollgate's retries for `upstream` so far, from its metrics.
async fn retries(upstream: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let admin: SocketAddr = "127.0.0.1:15090".parse().unwrap();
    let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut text))
        .await
        .expect("the metrics within 10 s")
        .unwrap();
    let label = format!("upstream=\"{upstream}\"");
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("tollgate_retries_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    assert!(
        !values.is_empty(),
        "no tollgate_retries_total for {upstream}:\n{text}"
    );
    values.iter().sum()
}

/// Steady load through tollgate while the headless name gains a pod and loses one:
/// when the new pod took its first request, and whether the removed one took any
/// later than the names are followed.
async fn scale(dir: &Path, tollgate: SocketAddr) {
    let total = 20 * RATE;
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
    let mut tasks = tokio::task::JoinSet::new();
    std::fs::write(dir.join("load.started"), "").unwrap();
    let started = Instant::now();
    for _ in 0..total {
        tick.tick().await;
        tasks.spawn(async move {
            let r = call(tollgate, HEADLESS).await;
            (Instant::now(), r)
        });
    }
    let mut ok = 0;
    let mut first_new: Option<Instant> = None;
    let mut last_removed: Option<Instant> = None;
    while let Some(r) = tasks.join_next().await {
        let (at, r) = r.unwrap();
        let Some((status, body)) = r else { continue };
        if status == 200 {
            ok += 1;
        }
        if body == PODS[3] {
            first_new = Some(first_new.map_or(at, |f| f.min(at)));
        }
        if body == PODS[1] {
            last_removed = Some(last_removed.map_or(at, |l| l.max(at)));
        }
    }
    let mtime = |f: &str| {
        std::fs::metadata(dir.join(f))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .map(|ago| Instant::now() - ago)
    };
    let added = mtime("added.at").expect("the pod was added during the load");
    let removed = mtime("removed.at").expect("a pod was removed during the load");
    let added_after = first_new.map_or(-1.0, |f| {
        f.saturating_duration_since(added).as_millis() as f64
    });
    let removed_late = last_removed.is_some_and(|l| l > removed + Duration::from_millis(6_500));
    println!();
    println!("REPORT requests {total}");
    println!("REPORT tollgate_ok {ok}");
    println!("REPORT added_after_ms {added_after}");
    println!("REPORT removed_late {}", u8::from(removed_late));
    println!("REPORT seconds {}", started.elapsed().as_secs());
}
