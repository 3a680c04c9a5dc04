//! `tollgate iptables`: the NAT rules that capture a pod's traffic for its sidecar, as a
//! mesh's init container sets them, so the app needs no proxy settings.
//!
//! Outbound: every TCP connection the pod opens is redirected to the outbound listener,
//! except tollgate's own (by its UID: what it sends to the real destination must not
//! come back to it), loopback traffic (the app talking to its sidecar, or to itself),
//! and the listed ports. Inbound: every TCP connection to the pod is redirected to
//! `[inbound].addr`, except the admin port (probes and Prometheus reach it directly)
//! and the listed ports.
//!
//! The rules live in chains of their own, jumped to from `OUTPUT` and `PREROUTING` of
//! the `nat` table, for IPv4 and, where `ip6tables` exists, IPv6. Applying is
//! idempotent: the chains are created when missing and flushed, then filled; the jumps
//! are added only when missing. `--clean` removes the jumps and the chains. It uses
//! `iptables` as Debian ships it (the nft backend): one tool whose rules every
//! Kubernetes node and CNI understands, and which `iptables-save` shows plainly.

use std::process::Command;

/// The UID the sidecar runs as, which the capture rules spare: tollgate's own, as
/// `tollgate inject` and the manifests in deploy/ set it, never a common image default
/// (65532 is distroless's "nonroot": an app running as it would not be captured).
pub const SIDECAR_UID: u32 = 15000;

/// Arguments of `tollgate iptables`.
#[derive(clap::Args, Debug, Clone)]
pub struct IptablesArgs {
    /// The UID tollgate runs as: its own connections are not redirected. By default
    /// tollgate's own, 15000, as `tollgate inject` runs it (never an image's default user,
    /// which apps run as too).
    #[arg(long, default_value_t = SIDECAR_UID)]
    pub uid: u32,
    /// The outbound listener's port (`[listener].addr`).
    #[arg(long, default_value_t = 15001)]
    pub outbound_port: u16,
    /// The inbound listener's port (`[inbound].addr`); 0: inbound connections are left
    /// alone (a pod whose tollgate has no inbound side).
    #[arg(long, default_value_t = 15006)]
    pub inbound_port: u16,
    /// The admin port, never redirected inbound.
    #[arg(long, default_value_t = 15090)]
    pub admin_port: u16,
    /// Destination ports the pod's connections reach directly (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub exclude_outbound_ports: Vec<u16>,
    /// Ports of the pod reached directly from outside (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub exclude_inbound_ports: Vec<u16>,
    /// Print the commands instead of running them.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove the rules instead of installing them.
    #[arg(long)]
    pub clean: bool,
}

/// tollgate's chains in the `nat` table.
pub const OUTBOUND_CHAIN: &str = "TOLLGATE_OUTPUT";
pub const INBOUND_CHAIN: &str = "TOLLGATE_INBOUND";

/// One step: the arguments of an `iptables` (or `ip6tables`) command, and whether it
/// runs only when a check says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Run it.
    Run(Vec<String>),
    /// Create a chain unless it exists.
    NewChain(String),
    /// Add a rule unless an identical one is there (`-C` first).
    Ensure(Vec<String>),
    /// Delete a rule while there is one (`-C` first).
    DeleteAll(Vec<String>),
    /// Flush and delete a chain if it exists.
    DropChain(String),
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// The rule that lets TCP to `port` pass, unredirected.
fn spare(port: &str) -> [&str; 6] {
    ["-p", "tcp", "--dport", port, "-j", "RETURN"]
}

/// The steps that install the rules (for one address family: `loopback` is its
/// loopback network).
pub fn install(a: &IptablesArgs, loopback: &str) -> Vec<Step> {
    let mut steps = vec![
        Step::NewChain(OUTBOUND_CHAIN.into()),
        Step::NewChain(INBOUND_CHAIN.into()),
        Step::Run(args(&["-t", "nat", "-F", OUTBOUND_CHAIN])),
        Step::Run(args(&["-t", "nat", "-F", INBOUND_CHAIN])),
    ];
    let out = |rule: &[&str]| {
        let mut v = args(&["-t", "nat", "-A", OUTBOUND_CHAIN]);
        v.extend(rule.iter().map(|s| s.to_string()));
        Step::Run(v)
    };
    let uid = a.uid.to_string();
    steps.push(out(&["-m", "owner", "--uid-owner", &uid, "-j", "RETURN"]));
    steps.push(out(&["-d", loopback, "-j", "RETURN"]));
    for p in &a.exclude_outbound_ports {
        steps.push(out(&spare(&p.to_string())));
    }
    let to_out = a.outbound_port.to_string();
    steps.push(out(&["-p", "tcp", "-j", "REDIRECT", "--to-ports", &to_out]));
    let inb = |rule: &[&str]| {
        let mut v = args(&["-t", "nat", "-A", INBOUND_CHAIN]);
        v.extend(rule.iter().map(|s| s.to_string()));
        Step::Run(v)
    };
    steps.push(Step::Ensure(args(&[
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "tcp",
        "-j",
        OUTBOUND_CHAIN,
    ])));
    if a.inbound_port == 0 {
        // No inbound side: callers reach the pod's ports as without tollgate (a jump
        // left by an earlier run leads to the chain, now empty).
        return steps;
    }
    let mut spared = vec![a.admin_port];
    spared.extend(&a.exclude_inbound_ports);
    for p in spared {
        steps.push(inb(&spare(&p.to_string())));
    }
    let to_in = a.inbound_port.to_string();
    steps.push(inb(&["-p", "tcp", "-j", "REDIRECT", "--to-ports", &to_in]));
    steps.push(Step::Ensure(args(&[
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-p",
        "tcp",
        "-j",
        INBOUND_CHAIN,
    ])));
    steps
}

/// The steps that remove the rules.
pub fn clean() -> Vec<Step> {
    vec![
        Step::DeleteAll(args(&[
            "-t",
            "nat",
            "-D",
            "OUTPUT",
            "-p",
            "tcp",
            "-j",
            OUTBOUND_CHAIN,
        ])),
        Step::DeleteAll(args(&[
            "-t",
            "nat",
            "-D",
            "PREROUTING",
            "-p",
            "tcp",
            "-j",
            INBOUND_CHAIN,
        ])),
        Step::DropChain(OUTBOUND_CHAIN.into()),
        Step::DropChain(INBOUND_CHAIN.into()),
    ]
}

/// How a step reads as a command line.
pub fn describe(tool: &str, step: &Step) -> String {
    let line = |v: &[String]| format!("{tool} {}", v.join(" "));
    match step {
        Step::Run(v) => line(v),
        Step::NewChain(c) => format!("{tool} -t nat -N {c}  # unless it exists"),
        Step::Ensure(v) => format!("{}  # unless already there", line(v)),
        Step::DeleteAll(v) => format!("{}  # while there is one", line(v)),
        Step::DropChain(c) => format!("{tool} -t nat -F {c}; {tool} -t nat -X {c}  # if it exists"),
    }
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot run {tool}: {source} (install iptables; the init container needs it)")]
    Spawn {
        tool: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
}

/// What `tool a...` printed and how it ended.
fn output(tool: &str, a: &[String]) -> Result<std::process::Output, CaptureError> {
    Command::new(tool)
        .args(a)
        .output()
        .map_err(|source| CaptureError::Spawn {
            tool: tool.into(),
            source,
        })
}

fn run(tool: &str, a: &[String]) -> Result<bool, CaptureError> {
    Ok(output(tool, a)?.status.success())
}

fn must(tool: &str, a: &[String]) -> Result<(), CaptureError> {
    let out = output(tool, a)?;
    if out.status.success() {
        return Ok(());
    }
    Err(CaptureError::Failed {
        command: format!("{tool} {}", a.join(" ")),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// `v` with its action (`-A`, `-D`) replaced by a check (`-C`).
fn as_check(v: &[String]) -> Vec<String> {
    v.iter()
        .map(|s| match s.as_str() {
            "-A" | "-D" => "-C".to_string(),
            _ => s.clone(),
        })
        .collect()
}

/// Runs the steps with `tool`.
pub fn apply(tool: &str, steps: &[Step]) -> Result<(), CaptureError> {
    for step in steps {
        match step {
            Step::Run(v) => must(tool, v)?,
            Step::NewChain(c) => {
                if !run(tool, &args(&["-t", "nat", "-L", c, "-n"]))? {
                    must(tool, &args(&["-t", "nat", "-N", c]))?;
                }
            }
            Step::Ensure(v) => {
                if !run(tool, &as_check(v))? {
                    must(tool, v)?;
                }
            }
            Step::DeleteAll(v) => {
                // Bounded: a rule is deleted once per loop, and there are only so many.
                for _ in 0..64 {
                    if !run(tool, &as_check(v))? {
                        break;
                    }
                    must(tool, v)?;
                }
            }
            Step::DropChain(c) => {
                if run(tool, &args(&["-t", "nat", "-L", c, "-n"]))? {
                    must(tool, &args(&["-t", "nat", "-F", c]))?;
                    must(tool, &args(&["-t", "nat", "-X", c]))?;
                }
            }
        }
    }
    Ok(())
}

/// Whether a tool can be run at all.
fn available(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `tollgate iptables`: returns the process exit code (0 done or printed, 2 on error).
pub fn main(a: IptablesArgs) -> i32 {
    let families = [("iptables", "127.0.0.0/8"), ("ip6tables", "::1/128")];
    let mut out = String::new();
    for (tool, loopback) in families {
        let steps = if a.clean {
            clean()
        } else {
            install(&a, loopback)
        };
        if a.dry_run {
            for s in &steps {
                out.push_str(&describe(tool, s));
                out.push('\n');
            }
            continue;
        }
        if tool == "ip6tables" && !available(tool) {
            continue;
        }
        if let Err(e) = apply(tool, &steps) {
            eprintln!("tollgate iptables: {e}");
            return 2;
        }
    }
    if a.dry_run {
        tollgate_core::print::stdout(&out);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: IptablesArgs,
    }

    fn parse(argv: &[&str]) -> IptablesArgs {
        let mut v = vec!["tollgate"];
        v.extend_from_slice(argv);
        Cli::try_parse_from(v)
            .map(|c| c.a)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn by_default_the_uid_spared_is_the_sidecars_own_not_an_images_default() {
        let a = parse(&[]);
        let text: Vec<String> = install(&a, "127.0.0.0/8")
            .iter()
            .map(|s| describe("iptables", s))
            .collect();
        let text = text.join("\n");
        assert!(
            text.contains("-A TOLLGATE_OUTPUT -m owner --uid-owner 15000 -j RETURN"),
            "{text}"
        );
        assert!(
            !text.contains("65532"),
            "distroless's nonroot is spared: {text}"
        );
    }

    #[test]
    fn an_inbound_port_of_0_leaves_inbound_connections_alone() {
        let text: Vec<String> = install(&parse(&["--inbound-port", "0"]), "127.0.0.0/8")
            .iter()
            .map(|s| describe("iptables", s))
            .collect();
        let text = text.join("\n");
        assert!(
            text.contains("-A TOLLGATE_OUTPUT -p tcp -j REDIRECT --to-ports 15001"),
            "{text}"
        );
        assert!(!text.contains("-A TOLLGATE_INBOUND"), "{text}");
        assert!(!text.contains("PREROUTING"), "{text}");
    }

    #[test]
    fn the_rules_spare_tollgate_loopback_the_admin_port_and_the_listed_ports() {
        let a = parse(&["--uid", "1337", "--exclude-outbound-ports", "5432,6379"]);
        let lines: Vec<String> = install(&a, "127.0.0.0/8")
            .iter()
            .map(|s| describe("iptables", s))
            .collect();
        let text = lines.join("\n");
        for want in [
            "-A TOLLGATE_OUTPUT -m owner --uid-owner 1337 -j RETURN",
            "-A TOLLGATE_OUTPUT -d 127.0.0.0/8 -j RETURN",
            "-A TOLLGATE_OUTPUT -p tcp --dport 5432 -j RETURN",
            "-A TOLLGATE_OUTPUT -p tcp --dport 6379 -j RETURN",
            "-A TOLLGATE_OUTPUT -p tcp -j REDIRECT --to-ports 15001",
            "-A TOLLGATE_INBOUND -p tcp --dport 15090 -j RETURN",
            "-A TOLLGATE_INBOUND -p tcp -j REDIRECT --to-ports 15006",
            "-A OUTPUT -p tcp -j TOLLGATE_OUTPUT  # unless already there",
            "-A PREROUTING -p tcp -j TOLLGATE_INBOUND  # unless already there",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        // Every RETURN comes before the REDIRECT of its chain.
        let redirect = lines
            .iter()
            .position(|l| l.contains("TOLLGATE_OUTPUT -p tcp -j REDIRECT"));
        let last_return = lines
            .iter()
            .rposition(|l| l.contains("-A TOLLGATE_OUTPUT") && l.ends_with("RETURN"));
        assert!(last_return < redirect);
    }

    #[test]
    fn a_check_is_the_rule_with_its_action_replaced() {
        let v = args(&["-t", "nat", "-A", "OUTPUT", "-j", "X"]);
        assert_eq!(
            as_check(&v),
            args(&["-t", "nat", "-C", "OUTPUT", "-j", "X"])
        );
    }
}
