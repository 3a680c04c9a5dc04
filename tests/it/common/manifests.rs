//! What the inject tests share: `tollgate inject` run as a user runs it, and the
//! manifests it writes read back as Kubernetes reads them.

use std::io::Write;
use std::process::{Command, Stdio};

use yaml_rust2::Yaml;

/// `tollgate inject ARGS` with `stdin`: (exit code, stdout, stderr).
pub fn inject(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(crate::common::binary())
        .arg("inject")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `tollgate check --strict` on `config` written to a file of its own: (exit code, what
/// it printed on stdout and stderr).
pub fn check_strict(config: &str) -> (Option<i32>, String) {
    let dir = crate::common::tempdir::TempDir::new("inject-check");
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(crate::common::binary())
        .args(["check", "--strict", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

/// The documents, read as Kubernetes reads them (YAML 1.1: `0440` is octal).
pub fn docs(text: &str) -> Vec<Yaml> {
    tollgate_inject::yaml::load(text).unwrap()
}

pub fn kind_named<'a>(docs: &'a [Yaml], kind: &str, name: &str) -> &'a Yaml {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

pub fn container<'a>(list: &'a Yaml, name: &str) -> &'a Yaml {
    list.as_vec()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

pub fn names(list: &Yaml) -> Vec<&str> {
    list.as_vec()
        .map(|l| l.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default()
}
