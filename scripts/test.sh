#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, unit and integration tests,
# the README's first run, benches compile, interop with nginx and HAProxy, the
# differential test of the request reader against them, h2spec, fuzzing, deployment
# checks. Run from the repository root.
#
# Before any step it checks every tool the steps need and installs what is missing
# (scripts/deps.sh: Debian packages, the Python package index and the Rust
# package registry, as root; as another user it
# prints what to install and stops), and says what will be SKIPPED on this machine:
# h2spec when it is not there (no registry has it), the capture and two-pod tests
# without root and network namespaces, fuzzing with TOLLGATE_FUZZ_SECONDS=0. The
# skips are said again at the end. It writes only under target/ (and the system's
# temp dir): after a run the work tree is as it was. Outside the tree: kube-apiserver and
# etcd, built once from their Go modules by scripts/kube.sh, are cached under
# ~/.cache/tollgate (TOLLGATE_KUBE_CACHE) for the tests against a real Kubernetes API.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python scripts leave no __pycache__ in the tree.
export PYTHONDONTWRITEBYTECODE=1

started=$SECONDS
step() { printf '\n==> [%dm%02ds] %s\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$*"; }
SKIPPED=()
skip() {
  SKIPPED+=("$1")
  printf '\n!!! SKIP: %s\n' "$1"
}

step "scripts/deps.sh (every tool the run needs; installs what is missing)"
scripts/deps.sh

# What this machine cannot check, said before the run and again after it.
# h2spec, looked for as scripts/h2spec.sh does.
h2spec=${H2SPEC:-}
if [ -z "$h2spec" ] && [ -x ../shared/tools/h2spec ]; then h2spec=../shared/tools/h2spec; fi
if [ -z "$h2spec" ] || [ ! -x "$h2spec" ]; then
  skip "h2spec not found (no package registry has it; set H2SPEC=/path/to/h2spec or put it in ../shared/tools/h2spec): HTTP/2 conformance of the h2c listener will NOT be checked"
fi
# tests/it/capture.rs and tests/it/pods.rs: root and a network namespace of their own.
netns=tollgate-test-$$
if [ "$(id -u)" != 0 ]; then
  skip "not root: tests/it/capture.rs, tests/it/pods.rs and tests/it/services.rs (network namespaces) will pass without checking anything (under CI=true they fail)"
  skip "not root: deploy/podman/play.sh (the image built by podman, its pods played) will NOT run"
else
  # As root, tests/it/capture.rs and tests/it/pods.rs run and would fail at their first
  # namespace: try what they do (add one, run a command in it), and say which fails.
  why=
  if ! out=$(ip netns add "$netns" 2>&1); then
    why="\`ip netns add\` fails ($out): no CAP_SYS_ADMIN, or /var/run/netns not writable?"
  elif ! out=$(ip netns exec "$netns" true 2>&1); then
    why="\`ip netns exec $netns true\` fails ($out): entering a namespace needs setns and a private mount of /sys (a container with seccomp or AppArmor in the way, or /sys read-only?)"
  fi
  ip netns del "$netns" >/dev/null 2>&1 || true
  if [ -n "$why" ]; then
    echo "scripts/test.sh: as root, tests/it/capture.rs and tests/it/pods.rs need network namespaces, and $why; run in a VM or a privileged container, or as another user to skip those two. Nothing has been run." >&2
    exit 1
  fi
fi
if [ "${TOLLGATE_FUZZ_SECONDS:-60}" = 0 ]; then
  skip "TOLLGATE_FUZZ_SECONDS=0: no fuzzing"
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets --quiet -- -D warnings

step "scripts/kube.sh (kube-apiserver and etcd built from their Go modules, cached under ~/.cache/tollgate)"
# The Kubernetes discovery tests run against a real API server. Without Go (>= 1.26) or
# the Go module proxy the build fails: a SKIP here (those tests then skip loudly), a
# failure under CI=true.
if kube_dir=$(scripts/kube.sh | tail -1) && [ -n "$kube_dir" ]; then
  export TOLLGATE_KUBE_BIN_DIR=$kube_dir
  echo "TOLLGATE_KUBE_BIN_DIR=$TOLLGATE_KUBE_BIN_DIR"
elif [ "${CI:-}" = true ]; then
  echo "scripts/test.sh: scripts/kube.sh failed (CI=true: the Kubernetes API tests must run)" >&2
  exit 1
else
  skip "scripts/kube.sh failed (Go >= 1.26 and the Go module proxy needed): the tests against a real Kubernetes API server will NOT run"
fi

step "cargo test"
cargo test --locked --quiet

step "scripts/first-run.sh (the README's first run prints what the README shows)"
scripts/first-run.sh

step "cargo bench --no-run (the benches compile)"
cargo bench --locked --no-run --quiet

step "scripts/interop.sh (nginx and HAProxy in front of tollgate, nginx behind it)"
scripts/interop.sh

step "scripts/differential.sh (malformed requests: tollgate never forwards what nginx or HAProxy refuses)"
scripts/differential.sh

step "scripts/h2spec.sh (HTTP/2 conformance of the h2c listener; SKIP without h2spec)"
scripts/h2spec.sh

if [ "${TOLLGATE_FUZZ_SECONDS:-60}" != 0 ]; then
  step "fuzzing the parsers of untrusted text (${TOLLGATE_FUZZ_SECONDS:-60} s per target; TOLLGATE_FUZZ_SECONDS=0 skips)"
  scripts/fuzz.sh "${TOLLGATE_FUZZ_SECONDS:-60}"
fi

if [ -x deploy/test.sh ]; then
  step "deploy/test.sh (Kubernetes manifests, tollgate inject, Prometheus rules, Prometheus end to end, the image and pods with podman)"
  # A check deploy/test.sh skips (podman cannot run here) is said again at the end.
  TOLLGATE_SKIPS=$(mktemp)
  export TOLLGATE_SKIPS
  deploy/test.sh
  while IFS= read -r line; do SKIPPED+=("$line"); done <"$TOLLGATE_SKIPS"
  rm -f "$TOLLGATE_SKIPS"
fi

elapsed=$((SECONDS - started))
if [ ${#SKIPPED[@]} -eq 0 ]; then
  step "all tests passed in $((elapsed / 60))m$((elapsed % 60))s"
else
  step "all tests passed in $((elapsed / 60))m$((elapsed % 60))s, but ${#SKIPPED[@]} SKIPPED on this machine:"
  printf '!!! SKIP: %s\n' "${SKIPPED[@]}"
fi
