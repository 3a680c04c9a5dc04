#!/usr/bin/env bash
# Builds tollgate's two images with podman from deploy/Dockerfile, on local bases (no
# registry needed), and reports what it built:
#   localhost/tollgate:VERSION           the sidecar (target `runtime`, the default)
#   localhost/tollgate-iptables:VERSION  the capture init container (target `iptables`)
# The binary is built outside the image (Debian's rustc is too old for this crate, and
# no toolchain can be fetched into a container here): target/release/tollgate, built
# now unless up to date, or $TOLLGATE_BINARY. The bases are made once with debootstrap
# (deploy/podman/lib.sh) and kept for the next run; `deploy/podman/image.sh --clean`
# removes everything this script and play.sh leave.
#
# Prints the image's size, and checks what the manifests rely on: `--version` runs,
# the user is 65532, it starts with a read-only root and serves /readyz, and the
# iptables image has the tool.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
. deploy/podman/lib.sh

fail() { printf 'FAIL  %s\n' "$*" >&2; exit 1; }
pass() { printf 'PASS  %s\n' "$*"; }

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
IMAGE=localhost/tollgate:$VERSION
IPTABLES_IMAGE=localhost/tollgate-iptables:$VERSION

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-image.XXXXXX")
CONTAINERS=()
cleanup() {
  local c
  for c in "${CONTAINERS[@]}"; do podman rm -f "$c" >/dev/null 2>&1 || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

reason=$(podman_ready) || fail "$reason"
podman_conf "$WORK"

if [ "${1:-}" = --clean ]; then
  podman pod rm -af >/dev/null 2>&1 || true
  for i in "$IMAGE" "$IPTABLES_IMAGE" localhost/tollgate-play-app:latest "$PLAY_BASE" "$RUNTIME_BASE" "$DEBIAN_BASE"; do
    podman rmi -f "$i" >/dev/null 2>&1 || true
  done
  podman image prune -f >/dev/null 2>&1 || true
  echo "removed the images and bases of deploy/podman"
  exit 0
fi

# The release binary, built now unless up to date (after `cargo bench --no-run`, as in
# scripts/test.sh, it is: the bench profile is the release one), or $TOLLGATE_BINARY.
if [ -n "${TOLLGATE_BINARY:-}" ]; then
  BIN=$TOLLGATE_BINARY
else
  BIN=$(readlink -m "${CARGO_TARGET_DIR:-target}")/release/tollgate
  start=$SECONDS
  cargo build --release --locked --quiet --bin tollgate --bin tollgate-proxy || fail "cargo build --release failed"
  [ "$((SECONDS - start))" -lt 5 ] || echo "built $BIN in $((SECONDS - start)) s"
fi
PROXY_BIN=$(dirname "$BIN")/tollgate-proxy
"$BIN" --version >/dev/null || fail "$BIN does not run"
"$PROXY_BIN" --version >/dev/null || fail "$PROXY_BIN does not run (it is built with tollgate)"

start=$SECONDS
debian_base "$WORK" || fail "could not make the Debian base $DEBIAN_BASE"
runtime_base "$WORK" "$BIN" || fail "could not make the runtime base $RUNTIME_BASE"
echo "bases ready in $((SECONDS - start)) s: $DEBIAN_BASE, $RUNTIME_BASE"

# The build context: the binary and the default config, nothing else.
CTX=$WORK/context
mkdir -p "$CTX/config"
# Without its line tables (kept in the build for profiles; a backtrace still names
# functions): a fifth of the size.
strip --strip-debug -o "$CTX/tollgate" "$BIN" || fail "strip --strip-debug $BIN failed"
strip --strip-debug -o "$CTX/tollgate-proxy" "$PROXY_BIN" || fail "strip --strip-debug $PROXY_BIN failed"
cp config/tollgate.toml "$CTX/config/"
build() { # TARGET TAG
  podman build --quiet -f deploy/Dockerfile --target "$1" \
    --build-arg BINARY=prebuilt --build-arg BUILD_BASE="$DEBIAN_BASE" \
    --build-arg RUNTIME_BASE="$RUNTIME_BASE" -t "$2" "$CTX" >"$WORK/build-$1.log" 2>&1 \
    || { tail -n 30 "$WORK/build-$1.log" >&2; fail "podman build --target $1 failed"; }
}
start=$SECONDS
build runtime "$IMAGE"
build iptables "$IPTABLES_IMAGE"
echo "images built in $((SECONDS - start)) s"

size() { podman image inspect --format '{{.Size}}' "$1"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
bin_size=$(stat -c %s "$CTX/tollgate")
echo "image $IMAGE: $(mib "$(size "$IMAGE")") (the binary: $(mib "$bin_size"))"
echo "image $IPTABLES_IMAGE: $(mib "$(size "$IPTABLES_IMAGE")")"

version=$(podman run --rm --read-only --entrypoint tollgate "$IMAGE" --version)
echo "podman run --rm --read-only --entrypoint tollgate $IMAGE --version: $version"
[ "$version" = "tollgate $VERSION" ] || fail "the image says '$version', not 'tollgate $VERSION'"
user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
[ "$user" = 65532:65532 ] || fail "the image's user is '$user', not 65532:65532"
entry=$(podman image inspect --format '{{json .Config.Entrypoint}}' "$IMAGE")
[ "$entry" = '["tollgate","run"]' ] || fail "the image's entrypoint is $entry"
pass "$IMAGE: tollgate $VERSION, user 65532:65532, entrypoint tollgate run"

# It starts as the manifests start it: read-only root, every capability dropped, its
# default config; /readyz answers. (The admin port is on loopback in the default config,
# so the check runs inside the container's network namespace.)
cid=$(podman run -d --read-only --cap-drop=ALL --security-opt=no-new-privileges "$IMAGE")
CONTAINERS+=("$cid")
pid=$(podman inspect --format '{{.State.Pid}}' "$cid")
ok=
for _ in $(seq 1 80); do
  if nsenter -t "$pid" -n curl -fsS --max-time 1 -o /dev/null http://127.0.0.1:15090/readyz 2>/dev/null; then ok=1; break; fi
  sleep 0.25
done
[ -n "$ok" ] || { podman logs "$cid" >&2; fail "the image did not become ready (/readyz) within 20 s"; }
# `tollgate run` handed the process over to the server alone, beside it in the image.
exe=$(readlink "/proc/$pid/exe")
[ "$exe" = /usr/local/bin/tollgate-proxy ] || fail "the image's tollgate run is $exe, not /usr/local/bin/tollgate-proxy"
podman stop -t 20 "$cid" >/dev/null
code=$(podman inspect --format '{{.State.ExitCode}}' "$cid")
[ "$code" = 0 ] || fail "tollgate in the image exited $code on SIGTERM, not 0"
pass "$IMAGE runs read-only with every capability dropped, serves /readyz, exits 0 on SIGTERM"

podman run --rm --entrypoint iptables "$IPTABLES_IMAGE" --version >/dev/null \
  || fail "$IPTABLES_IMAGE has no iptables"
podman run --rm "$IPTABLES_IMAGE" --dry-run >/dev/null \
  || fail "$IPTABLES_IMAGE: tollgate iptables --dry-run failed"
pass "$IPTABLES_IMAGE: iptables and tollgate iptables run"
