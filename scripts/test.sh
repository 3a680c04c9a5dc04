#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, unit and integration tests,
# the README's first run, benches compile, interop with nginx and HAProxy, the
# differential test of the request reader against them, h2spec, fuzzing, deployment
# checks. Run from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings

step "cargo test"
cargo test --quiet

step "scripts/first-run.sh (the README's first run prints what the README shows)"
scripts/first-run.sh

step "cargo bench --no-run (the benches compile)"
cargo bench --no-run --quiet

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
  step "deploy/test.sh (Kubernetes manifests, Prometheus rules, Prometheus end to end)"
  deploy/test.sh
fi

step "all tests passed"
