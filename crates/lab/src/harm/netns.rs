//! The harm rows about Kubernetes Services as they are, in network namespaces of the
//! lab's own: a node's shape, with three pods (four in the scale rows) each an app behind
//! a real tollgate `[inbound]` sidecar, and a client pod whose app calls the Service
//! straight (direct) or through its own tollgate at its defaults (`Host: payments`).
//!
//! Two namespaces joined by a veth pair: the pods' (each pod an address in a /30 of its
//! own on the link; the first pod's app is dead, so its sidecar answers `502
//! app-unreachable`) and the client's, where kube-proxy's rules live as on a node (a
//! ClusterIP: iptables DNAT of a virtual IP, `statistic --mode random`, one rule per pod;
//! the VIP is in another /30 of the link that no process holds) and where the headless
//! name resolves to the pods' addresses (the namespace's hosts file, which `ip netns
//! exec` mounts over /etc/hosts, rewritten in place to scale).
//!
//! With discovery (`discovered-*`), etcd and a real kube-apiserver ([`super::kube`]) run
//! in the client's namespace too, and the client pod's tollgate watches the Service's
//! EndpointSlices there.
//!
//! The lab stays in the namespace it was started in, so what runs inside is a process of
//! its own, the same tollgate binary each time: the sidecars and the client's tollgate
//! (`tollgate run`), etcd and kube-apiserver, and the parts of [`super::netns_parts`]
//! (the pods' apps and the client pod's app), which print what they counted and got;
//! [`super::netns_row`] runs a row on the node this file makes.
//!
//! Needs root, `ip` and `iptables` (and the API server's binaries, with discovery);
//! without them the rows are skipped and say why. The namespaces (with the link and the
//! rules), the hosts file, the row's files and every process are removed when the row's
//! `Node` is dropped, also on an error or a panic, and on Ctrl-C; a row begins by
//! removing what a killed run may have left (the processes still in the namespaces, by
//! their ids, then the namespaces).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use super::kube;
use super::rows::{Row, Shape};
use crate::LabError;

/// The client pod's namespace, with kube-proxy's rules and the headless name.
pub(super) const CLIENT_NS: &str = "tg-harm-c";
/// The server pods' namespace.
pub(super) const PODS_NS: &str = "tg-harm-p";
const VETH_C: &str = "tg-harm-c0";
const VETH_P: &str = "tg-harm-p0";
/// The link's /30s: the client's end, and the pod's.
const LINKS: [(&str, &str); 4] = [
    ("10.213.90.1", "10.213.90.2"),
    ("10.213.90.5", "10.213.90.6"),
    ("10.213.90.9", "10.213.90.10"),
    ("10.213.90.13", "10.213.90.14"),
];
/// The pods, by the pod's end of each link: the first one's app is dead.
pub(super) const PODS: [&str; 4] = ["10.213.90.2", "10.213.90.6", "10.213.90.10", "10.213.90.14"];
/// The Service's virtual IP, in a /30 of the link's own (10.213.90.16/30), held by
/// nobody; the client's end of that /30 is where connections to it leave from.
pub(super) const VIP: &str = "10.213.90.18";
const VIP_LINK: &str = "10.213.90.17/30";
const VIP_NET: &str = "10.213.90.16/30";
pub(super) const VIP_PORT: u16 = 80;
/// Each pod's sidecar (`[inbound]`), as a Service's targetPort; its app behind it.
pub(super) const SVC_PORT: u16 = 8080;
pub(super) const APP_PORT: u16 = 9090;
pub(super) const HEADLESS: &str = "payments-headless";
/// A name of the dual-stack row: `::1` first, where nothing listens, then a pod's IPv4
/// address (the hosts file of the client's namespace, as a pod's `localhost` of both
/// families names its own loopback).
pub(super) const DUAL: &str = "payments-dual";
/// The client's tollgate, in its namespace.
pub(super) const CALLER: &str = "127.0.0.1:15001";
pub(super) const ADMIN: &str = "127.0.0.1:15090";

/// Says which part of a row a lab process is, and the row and seed it serves.
pub(super) const PART: &str = "TOLLGATE_HARM_NETNS_PART";
pub(super) const ROW: &str = "TOLLGATE_HARM_NETNS_ROW";
pub(super) const SEED: &str = "TOLLGATE_HARM_NETNS_SEED";
/// The row's files (the API's certificate and kubeconfig), and the API's token.
pub(super) const DIR: &str = "TOLLGATE_HARM_NETNS_DIR";
pub(super) const TOKEN: &str = "TOLLGATE_HARM_NETNS_TOKEN";

/// How long the parts may take to be ready.
pub(super) const READY_WAIT: Duration = Duration::from_secs(30);

fn quiet(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Ok when a row of `shape` can run here; else why not.
pub fn can_run(shape: Shape) -> Result<(), String> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let ip = quiet(Command::new("ip").arg("-V"));
    let iptables = quiet(Command::new("iptables").arg("--version"));
    if root && ip && iptables {
        if discovered(shape) {
            kube::bin_dir()?;
        }
        Ok(())
    } else {
        Err(format!(
            "needs root, `ip` and `iptables` to make network namespaces (root: {root}, ip: {ip}, iptables: {iptables})"
        ))
    }
}

/// The processes of the node there is, by name: a static so that Ctrl-C reaches them.
static CHILDREN: Mutex<Vec<(String, Child)>> = Mutex::new(Vec::new());

fn children() -> std::sync::MutexGuard<'static, Vec<(String, Child)>> {
    CHILDREN.lock().unwrap_or_else(|p| p.into_inner())
}

/// On Ctrl-C, removes the node there is and exits (130), as the signal would have.
pub fn clean_up_on_interrupt() {
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop_children();
            remove();
            let _ = std::fs::remove_dir_all(node_dir());
            std::process::exit(130);
        }
    });
}

fn stop_children() {
    for (_, mut c) in children().drain(..) {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The row's files: configs, logs, the API's.
fn node_dir() -> PathBuf {
    std::env::temp_dir().join(format!("tollgate-harm-netns-{}", std::process::id()))
}

fn hosts_dir() -> PathBuf {
    PathBuf::from(format!("/etc/netns/{CLIENT_NS}"))
}

/// Removes the namespaces, whatever is left in them, and the hosts file. Deleting a
/// namespace deletes its end of the link and its rules; its processes are stopped first
/// (they would keep it alive).
fn remove() {
    for ns in [CLIENT_NS, PODS_NS] {
        if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                quiet(Command::new("kill").args(["-KILL", pid]));
            }
        }
        quiet(Command::new("ip").args(["netns", "del", ns]));
    }
    let _ = std::fs::remove_dir_all(hosts_dir());
}

fn must(cmd: &mut Command) -> Result<(), LabError> {
    let out = cmd
        .output()
        .map_err(|e| LabError::Setup(format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LabError::Setup(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn ip(args: &[&str]) -> Result<(), LabError> {
    must(Command::new("ip").args(args))
}

/// The namespaces, the link, the rules, the hosts file and the processes of one row:
/// all removed when dropped.
pub(super) struct Node {
    pub(super) dir: PathBuf,
}

impl Node {
    pub(super) fn create(shape: Shape) -> Result<Node, LabError> {
        remove();
        stop_children();
        let dir = node_dir();
        // From here on, whatever fails is removed by the drop.
        let node = Node { dir };
        std::fs::create_dir_all(&node.dir).map_err(|e| LabError::Setup(e.to_string()))?;
        for ns in [CLIENT_NS, PODS_NS] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&[
            "link", "add", VETH_C, "netns", CLIENT_NS, "type", "veth", "peer", "name", VETH_P,
            "netns", PODS_NS,
        ])?;
        for (client_end, pod_end) in LINKS {
            let c = format!("{client_end}/30");
            let p = format!("{pod_end}/30");
            ip(&["-n", CLIENT_NS, "addr", "add", &c, "dev", VETH_C])?;
            ip(&["-n", PODS_NS, "addr", "add", &p, "dev", VETH_P])?;
        }
        ip(&["-n", CLIENT_NS, "addr", "add", VIP_LINK, "dev", VETH_C])?;
        for (ns, dev) in [(CLIENT_NS, VETH_C), (PODS_NS, VETH_P)] {
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        // A connection to the VIP leaves from the client's end of the VIP's /30: the
        // pods answer it over the link.
        ip(&["-n", PODS_NS, "route", "add", VIP_NET, "dev", VETH_P])?;
        // kube-proxy's rules for a ClusterIP Service of the first three pods: each
        // connection to the VIP goes to one of them at random.
        let n = 3;
        for (i, pod) in PODS[..n].iter().enumerate() {
            let port = VIP_PORT.to_string();
            let mut rule = vec![
                "netns", "exec", CLIENT_NS, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", VIP,
                "-p", "tcp", "--dport", &port,
            ];
            let p = format!("{:.5}", 1.0 / (n - i) as f64);
            if i + 1 < n {
                rule.extend(["-m", "statistic", "--mode", "random", "--probability", &p]);
            }
            let to = format!("{pod}:{SVC_PORT}");
            rule.extend(["-j", "DNAT", "--to-destination", &to]);
            ip(&rule)?;
        }
        std::fs::create_dir_all(hosts_dir()).map_err(|e| LabError::Setup(e.to_string()))?;
        let first: &[&str] = match shape {
            Shape::HeadlessScaleUp => &PODS[1..3],
            Shape::HeadlessScaleDown => &PODS[1..4],
            Shape::ClusterIpDeadPod
            | Shape::HeadlessDeadFirst
            | Shape::DiscoveredDeadPod
            | Shape::DiscoveredScale
            | Shape::DualStackName => &PODS[..3],
        };
        set_headless(first)?;
        Ok(node)
    }

    /// Starts `argv` in `ns`, its stderr (and its stdout, unless piped) into a log.
    fn spawn(
        &self,
        ns: &str,
        name: &str,
        argv: &[&str],
        env: &[(&str, String)],
        piped: bool,
    ) -> Result<(Option<ChildStdin>, Option<ChildStdout>), LabError> {
        let setup = |e: std::io::Error| LabError::Setup(format!("start {name}: {e}"));
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).map_err(setup)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).args(argv);
        if piped {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        } else {
            cmd.stdin(Stdio::null())
                .stdout(log.try_clone().map_err(setup)?);
        }
        cmd.stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(setup)?;
        let pipes = (child.stdin.take(), child.stdout.take());
        children().push((name.to_string(), child));
        Ok(pipes)
    }

    /// A part of the row: this binary as `tollgate lab --scenario harm`.
    pub(super) fn spawn_part(
        &self,
        ns: &str,
        part: &str,
        row: &Row,
        seed: u64,
        token: &str,
    ) -> Result<(ChildStdin, Receiver<String>), LabError> {
        let exe = std::env::current_exe().map_err(|e| LabError::Setup(e.to_string()))?;
        let exe = exe.to_string_lossy().into_owned();
        let env = [
            (PART, part.to_string()),
            (ROW, row.key.to_string()),
            (SEED, seed.to_string()),
            (DIR, self.dir.to_string_lossy().into_owned()),
            (TOKEN, token.to_string()),
            ("RUST_LOG", "warn".to_string()),
        ];
        let argv = [exe.as_str(), "lab", "--scenario", "harm"];
        match self.spawn(ns, part, &argv, &env, true)? {
            (Some(stdin), Some(stdout)) => Ok((stdin, lines(stdout))),
            _ => Err(LabError::Setup(format!("{part}: no pipes"))),
        }
    }

    pub(super) fn spawn_tollgate(
        &self,
        ns: &str,
        name: &str,
        config: &str,
    ) -> Result<(), LabError> {
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).map_err(|e| LabError::Setup(e.to_string()))?;
        let exe = std::env::current_exe().map_err(|e| LabError::Setup(e.to_string()))?;
        let exe = exe.to_string_lossy().into_owned();
        let path = path.to_string_lossy().into_owned();
        let argv = [exe.as_str(), "run", "--config", path.as_str()];
        self.spawn(ns, name, &argv, &[("RUST_LOG", "warn".to_string())], false)?;
        Ok(())
    }

    /// etcd and kube-apiserver in the client's namespace, with the files they read;
    /// the API's token.
    pub(super) fn start_api(&self) -> Result<String, LabError> {
        let bin = kube::bin_dir().map_err(LabError::Setup)?;
        let token = kube::write_files(&self.dir).map_err(LabError::Setup)?;
        for (name, args) in [
            ("etcd", kube::etcd_args(&self.dir)),
            ("kube-apiserver", kube::apiserver_args(&self.dir)),
        ] {
            let program = bin.join(name).to_string_lossy().into_owned();
            let mut argv = vec![program.as_str()];
            argv.extend(args.iter().map(String::as_str));
            self.spawn(CLIENT_NS, name, &argv, &[], false)?;
        }
        Ok(token)
    }

    /// Waits, at most `within`, until `file` is there.
    pub(super) fn wait_file(&self, file: &std::path::Path, within: Duration) -> bool {
        let until = std::time::Instant::now() + within;
        while !file.is_file() {
            if std::time::Instant::now() > until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        true
    }

    /// Stops one process (a pod going away).
    pub(super) fn stop(&self, name: &str) {
        let mut all = children();
        if let Some(i) = all.iter().position(|(n, _)| n == name) {
            let (_, mut c) = all.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// What went wrong, with the end of every log.
    pub(super) fn failure(&self, what: &str) -> LabError {
        let mut out = what.to_string();
        let mut logs: Vec<_> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("\n--- {}\n", log.display()));
            out.push_str(&lines[lines.len().saturating_sub(15)..].join("\n"));
        }
        LabError::Setup(out)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        stop_children();
        remove();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The headless name resolves to `pods`, in this order. Written in place: `ip netns
/// exec` mounts this very file over /etc/hosts.
pub(super) fn set_headless(pods: &[&str]) -> Result<(), LabError> {
    let mut text = String::from("127.0.0.1 localhost\n");
    for p in pods {
        text.push_str(&format!("{p} {HEADLESS}\n"));
    }
    text.push_str(&format!("::1 {DUAL}\n{} {DUAL}\n", PODS[1]));
    std::fs::write(hosts_dir().join("hosts"), text).map_err(|e| LabError::Setup(e.to_string()))
}

/// A child's stdout, line by line, until it ends.
fn lines(out: ChildStdout) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits, at most `within`, for the line `word`; the lines before it are dropped.
pub(super) fn wait_for(rx: &Receiver<String>, word: &str, within: Duration) -> bool {
    let until = std::time::Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.trim() == word => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

pub(super) fn sidecar_config(pod: &str) -> String {
    format!(
        "[listener]\naddr = \"{pod}:15001\"\n[admin]\naddr = \"{pod}:15090\"\n\
         [inbound]\naddr = \"{pod}:{SVC_PORT}\"\napp = \"{pod}:{APP_PORT}\"\n"
    )
}

/// The client's tollgate: one upstream, `payments`, at the lab's defaults (empty
/// `[retry]` and `[budget]`), naming the Service as the app would.
pub(super) fn caller_config(shape: Shape, dir: &std::path::Path) -> String {
    let endpoints = match shape {
        Shape::ClusterIpDeadPod => format!("endpoints = [\"{VIP}:{VIP_PORT}\"]\n"),
        Shape::HeadlessDeadFirst | Shape::HeadlessScaleUp | Shape::HeadlessScaleDown => {
            format!("endpoints = [\"{HEADLESS}:{SVC_PORT}\"]\n")
        }
        Shape::DualStackName => format!("endpoints = [\"{DUAL}:{APP_PORT}\"]\n"),
        Shape::DiscoveredDeadPod | Shape::DiscoveredScale => format!(
            "discovery = \"kubernetes\"\nservice = \"{}.{}\"\nport = \"{}\"\n",
            kube::SERVICE,
            kube::NAMESPACE,
            kube::PORT_NAME
        ),
    };
    let kubernetes = if discovered(shape) {
        format!(
            "[kubernetes]\nkubeconfig = \"{}\"\n",
            dir.join("kubeconfig").display()
        )
    } else {
        String::new()
    };
    format!(
        "[listener]\naddr = \"{CALLER}\"\n[admin]\naddr = \"{ADMIN}\"\n{kubernetes}\
         [upstreams.payments]\nauthorities = [\"payments\"]\n{endpoints}\
         [upstreams.payments.retry]\n[upstreams.payments.budget]\n"
    )
}

pub(super) fn discovered(shape: Shape) -> bool {
    matches!(shape, Shape::DiscoveredDeadPod | Shape::DiscoveredScale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_config_the_rows_run_is_valid() {
        let shapes = [
            Shape::ClusterIpDeadPod,
            Shape::HeadlessDeadFirst,
            Shape::HeadlessScaleUp,
            Shape::HeadlessScaleDown,
            Shape::DiscoveredDeadPod,
            Shape::DiscoveredScale,
            Shape::DualStackName,
        ];
        let dir = std::path::Path::new("/tmp");
        let mut texts: Vec<String> = shapes.iter().map(|s| caller_config(*s, dir)).collect();
        texts.extend(PODS.iter().map(|p| sidecar_config(p)));
        for text in texts {
            tollgate_core::config::parse("harm.toml", &text, std::path::Path::new("."))
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
    }
}
