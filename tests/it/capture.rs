//! `tollgate iptables` in a network namespace of the test's own: it installs the
//! capture rules, installing twice changes nothing, and `--clean` leaves nothing.
//! Needs root and iptables; skipped, loudly, without them. The namespace is removed
//! whatever happens.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Command;

/// A network namespace, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Option<Self> {
        let name = format!("tg-{tag}-{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Netns(name))
    }

    /// Runs a command inside the namespace; its stdout, and whether it succeeded.
    fn run(&self, argv: &[&str]) -> (String, bool) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(argv)
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
            out.status.success(),
        )
    }

    /// The `nat` table's rules, as iptables-save writes them (counters left out).
    fn nat(&self, tool: &str) -> String {
        let (out, ok) = self.run(&[tool, "-t", "nat", "-S"]);
        assert!(ok, "{out}");
        out
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn can_run() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let iptables = Command::new("iptables")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !root || !iptables {
        let msg = format!(
            "SKIP tests/it/capture.rs: needs root and iptables (root: {root}, iptables: {iptables})"
        );
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{msg}: under CI this fails"
        );
        eprintln!("{msg}");
    }
    root && iptables
}

#[test]
fn the_capture_rules_install_idempotently_and_clean_up() {
    if !can_run() {
        return;
    }
    let Some(ns) = Netns::new("capture") else {
        eprintln!("SKIP tests/it/capture.rs: cannot create a network namespace");
        return;
    };
    let bin = common::binary();
    let bin = bin.to_str().unwrap();
    let install = [
        bin,
        "iptables",
        "--uid",
        "1337",
        "--exclude-outbound-ports",
        "5432",
        "--exclude-inbound-ports",
        "9100",
    ];
    let (out, ok) = ns.run(&install);
    assert!(ok, "{out}");
    let first = ns.nat("iptables");
    for want in [
        "-A OUTPUT -p tcp -j TOLLGATE_OUTPUT",
        "-A PREROUTING -p tcp -j TOLLGATE_INBOUND",
        "-A TOLLGATE_OUTPUT -m owner --uid-owner 1337 -j RETURN",
        "-A TOLLGATE_OUTPUT -d 127.0.0.0/8 -j RETURN",
        "-A TOLLGATE_OUTPUT -p tcp -m tcp --dport 5432 -j RETURN",
        "-A TOLLGATE_OUTPUT -p tcp -j REDIRECT --to-ports 15001",
        "-A TOLLGATE_INBOUND -p tcp -m tcp --dport 15090 -j RETURN",
        "-A TOLLGATE_INBOUND -p tcp -m tcp --dport 9100 -j RETURN",
        "-A TOLLGATE_INBOUND -p tcp -j REDIRECT --to-ports 15006",
    ] {
        assert!(first.contains(want), "{want:?} not in:\n{first}");
    }
    // Twice: nothing changes, nothing is duplicated.
    let (out, ok) = ns.run(&install);
    assert!(ok, "{out}");
    assert_eq!(ns.nat("iptables"), first);
    // IPv6 as well, where the namespace has it.
    let v6 = ns.nat("ip6tables");
    assert!(
        v6.contains("-A TOLLGATE_OUTPUT -d ::1/128 -j RETURN"),
        "{v6}"
    );

    // The dry run prints and changes nothing.
    let (printed, ok) = ns.run(&[bin, "iptables", "--clean", "--dry-run"]);
    assert!(ok, "{printed}");
    assert!(
        printed.contains("iptables -t nat -X TOLLGATE_OUTPUT"),
        "{printed}"
    );
    assert_eq!(ns.nat("iptables"), first);

    let (out, ok) = ns.run(&[bin, "iptables", "--clean"]);
    assert!(ok, "{out}");
    let cleaned = ns.nat("iptables");
    assert!(!cleaned.contains("TOLLGATE"), "{cleaned}");
    // Cleaning what is already clean is no error.
    let (out, ok) = ns.run(&[bin, "iptables", "--clean"]);
    assert!(ok, "{out}");

    // A pod without an inbound side: its outbound captured, its callers left alone.
    let (out, ok) = ns.run(&[bin, "iptables", "--inbound-port", "0"]);
    assert!(ok, "{out}");
    let outbound_only = ns.nat("iptables");
    assert!(
        outbound_only.contains("-A TOLLGATE_OUTPUT -p tcp -j REDIRECT --to-ports 15001"),
        "{outbound_only}"
    );
    assert!(
        !outbound_only.contains("-A PREROUTING -p tcp -j TOLLGATE_INBOUND")
            && !outbound_only.contains("-A TOLLGATE_INBOUND"),
        "{outbound_only}"
    );
    let (out, ok) = ns.run(&[bin, "iptables", "--clean"]);
    assert!(ok, "{out}");
    assert!(!ns.nat("iptables").contains("TOLLGATE"));
}
