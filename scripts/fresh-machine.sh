#!/usr/bin/env bash
# The README's test command on a bare Debian machine: how the project checks that what
# README.md says under "Run it" is true for someone who has nothing but Rust.
#
#   scripts/fresh-machine.sh [--timeout SECONDS] [--keep-log DIR]
#
# As root, on a Debian machine (debootstrap is installed with apt when missing):
#   1. builds a minimal Debian root in the system's temp dir
#      (`debootstrap --variant=minbase bookworm`, from DEBIAN_MIRROR or this machine's first
#      Debian mirror, with this machine's apt sources);
#   2. mounts this machine's Rust into it read-only at the same places (rustup's
#      ~/.rustup and ~/.cargo/bin; the rest of the chroot's ~/.cargo is its own, empty:
#      Cargo's download cache starts empty), and /proc, /sys, /dev, a tmpfs on /run
#      (the capture and two-pod tests make network namespaces there);
#   3. copies in a fresh `git clone` of the commit checked out here (uncommitted
#      changes are not in it), as /root/tollgate;
#   4. as an unprivileged user, runs scripts/test.sh there, which must stop within a
#      minute, before building anything, saying what to install;
#   5. as root, runs exactly what the README says, `scripts/test.sh`, from the clone's
#      root, with a clean environment (TOLLGATE_FUZZ_SECONDS and H2SPEC are passed
#      through when set: shorter trials, or an h2spec binary, copied in);
#   6. checks that `git status --porcelain` in the clone is empty and that the run left
#      nothing in the clone outside target/, and reports the time, the disk (du of
#      target/, of fuzz/target if any, of Cargo's cache) and what is left in /tmp.
# Every mount, every process left in the chroot and the directory are removed at the
# end, also on failure or interrupt; the run is bounded by --timeout (4 hours by
# default). The log and the summary are kept in target/fresh-machine/ (or --keep-log).
# Needs about 15 GB free in the temp dir. Not part of scripts/test.sh: it takes as long
# as a whole test run plus the Debian installs.
#
# The host's extra CA certificates (/usr/local/share/ca-certificates, as on a network
# that inspects TLS) are copied into the chroot's, where Debian's ca-certificates
# picks them up: downloads work there as they do on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TIMEOUT=14400
LOG_DIR=$ROOT/target/fresh-machine
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) TIMEOUT=${2:?"$1 needs a value"}; shift 2 ;;
    --keep-log) LOG_DIR=${2:?"$1 needs a value"}; shift 2 ;;
    -h | --help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done

say() { printf '\n### %s\n' "$*"; }
die() { printf '\nfresh-machine: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot and mounts need it)"
for tool in git chroot mount umount timeout; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
RUSTUP_DIR=${RUSTUP_HOME:-$HOME/.rustup}
CARGO_BIN=${CARGO_HOME:-$HOME/.cargo}/bin
[ -d "$RUSTUP_DIR/toolchains" ] && [ -x "$CARGO_BIN/cargo" ] \
  || die "no rustup toolchain here ($RUSTUP_DIR, $CARGO_BIN/cargo): the chroot borrows this machine's Rust"
if ! command -v debootstrap >/dev/null; then
  echo "fresh-machine: installing debootstrap (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; } \
    || die "could not install debootstrap"
fi
COMMIT=$(git rev-parse HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "fresh-machine: note: uncommitted changes here are not tested (the clone is of $COMMIT)"
fi

mkdir -p "$LOG_DIR"
LOG=$LOG_DIR/run.log
SUMMARY=$LOG_DIR/summary.txt
: >"$LOG"
: >"$SUMMARY"
DIR=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-fresh.XXXXXX")
chmod 755 "$DIR"
started=$SECONDS

# Processes whose root is the chroot (services a package started, anything a step
# left behind): ours, and in the way of unmounting.
chroot_pids() {
  local p r
  for p in /proc/[0-9]*; do
    r=$(readlink "$p/root" 2>/dev/null) || continue
    case "$r" in "$DIR" | "$DIR"/*) echo "${p#/proc/}" ;; esac
  done
}
cleanup() {
  local rc=$? pids i
  trap - EXIT INT TERM
  pids=$(chroot_pids)
  if [ -n "$pids" ]; then
    echo "fresh-machine: stopping what is still running in the chroot: $(echo $pids)"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      [ -n "$(chroot_pids)" ] || break
      sleep 0.2
    done
    pids=$(chroot_pids)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  fi
  # Deepest first: everything mounted under the chroot, the namespaces' included.
  if grep -q " $DIR[/ ]" /proc/self/mounts; then
    umount -R "$DIR" 2>/dev/null || true
    while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(awk -v d="$DIR" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | sort -r)
  fi
  if grep -q " $DIR[/ ]" /proc/self/mounts; then
    echo "fresh-machine: mounts left under $DIR, not removing it:" >&2
    grep " $DIR[/ ]" /proc/self/mounts >&2
  else
    rm -rf --one-file-system "$DIR"
  fi
  echo "fresh-machine: exit $rc after $(((SECONDS - started) / 60))m$(((SECONDS - started) % 60))s; log $LOG, summary $SUMMARY"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# tick NAME: the time since the start, in the summary.
tick() { printf '%-40s %dm%02ds\n' "$1" $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) | tee -a "$SUMMARY"; }

# The mirror: DEBIAN_MIRROR, or the first Debian mirror in this machine's apt sources.
host_mirror() {
  {
    grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'
  } | grep -v -- '-security' | head -n 1
}
MIRROR=${DEBIAN_MIRROR:-$(host_mirror)}
[ -n "$MIRROR" ] || die "no Debian mirror in this machine's apt sources; set DEBIAN_MIRROR=URL"
say "debootstrap --variant=minbase bookworm $DIR $MIRROR"
timeout 1800 debootstrap --variant=minbase bookworm "$DIR" "$MIRROR" >>"$LOG" 2>&1 \
  || { tail -n 30 "$LOG" >&2; die "debootstrap failed"; }
tick "debootstrap"
BASE_DU=$(du -sh -x "$DIR" | awk '{print $1}')
# The chroot's apt reads what this machine's apt reads (its mirrors, updates and
# security suites).
rm -f "$DIR/etc/apt/sources.list"
[ ! -f /etc/apt/sources.list ] || cp /etc/apt/sources.list "$DIR/etc/apt/sources.list"
mkdir -p "$DIR/etc/apt/sources.list.d"
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ ! -f "$f" ] || cp "$f" "$DIR/etc/apt/sources.list.d/"
done
cp /etc/resolv.conf "$DIR/etc/resolv.conf"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$DIR/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$DIR/usr/local/share/ca-certificates/"
fi

say "mounts: /proc /sys /dev /run, Rust read-only"
mount -t proc proc "$DIR/proc"
mount --rbind /sys "$DIR/sys" && mount --make-rslave "$DIR/sys"
mount --rbind /dev "$DIR/dev" && mount --make-rslave "$DIR/dev"
mount -t tmpfs -o mode=755 tmpfs "$DIR/run"
# bind_ro SRC DST: SRC at DST, read-only.
bind_ro() {
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mount -o remount,bind,ro "$2"
}
bind_ro "$RUSTUP_DIR" "$DIR/root/.rustup"
bind_ro "$CARGO_BIN" "$DIR/root/.cargo/bin"

say "git clone of $COMMIT into /root/tollgate"
git clone --quiet --no-hardlinks "$ROOT" "$DIR/root/tollgate"
git -C "$DIR/root/tollgate" checkout --quiet --detach "$COMMIT"
H2SPEC_IN=()
if [ -n "${H2SPEC:-}" ]; then
  cp "$H2SPEC" "$DIR/usr/local/bin/h2spec"
  H2SPEC_IN=(H2SPEC=/usr/local/bin/h2spec)
fi
FUZZ_IN=()
[ -z "${TOLLGATE_FUZZ_SECONDS:-}" ] || FUZZ_IN=(TOLLGATE_FUZZ_SECONDS="$TOLLGATE_FUZZ_SECONDS")

# chroot_cmd USER: the command line that runs scripts/test.sh in USER's clone, in bash
# as a login of USER has it after rustup's installer (~/.cargo/bin first on PATH), with
# nothing of this environment (set in CMD).
chroot_cmd() {
  local user=$1 home=/root
  [ "$user" = root ] || home=/home/$user
  CMD=(chroot --userspec="$user:$user" "$DIR" /usr/bin/env -i HOME="$home" USER="$user" LOGNAME="$user"
    LANG=C.UTF-8 TERM=dumb
    PATH="$home/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    "${H2SPEC_IN[@]}" "${FUZZ_IN[@]}" /bin/bash -c "cd $home/tollgate && scripts/test.sh")
}
# The clone of another user, read by root's git.
git_as() { git -c safe.directory='*' -C "$@"; }

say "as a user: scripts/test.sh must stop at once, saying what to install"
chroot "$DIR" useradd --create-home --shell /bin/bash tester
bind_ro "$RUSTUP_DIR" "$DIR/home/tester/.rustup"
bind_ro "$CARGO_BIN" "$DIR/home/tester/.cargo/bin"
chroot "$DIR" chown tester:tester /home/tester/.cargo
git -c init.defaultBranch=main clone --quiet --no-hardlinks "$DIR/root/tollgate" "$DIR/home/tester/tollgate"
chroot "$DIR" chown -R tester:tester /home/tester/tollgate
chroot_cmd tester
user_rc=0
t0=$SECONDS
timeout -k 10 120 "${CMD[@]}" >"$LOG_DIR/user.log" 2>&1 || user_rc=$?
cat "$LOG_DIR/user.log"
[ "$user_rc" != 0 ] || die "as a user without the tools, scripts/test.sh did not stop"
[ "$user_rc" != 124 ] || die "as a user without the tools, scripts/test.sh did not stop within 120 s"
grep -q 'Nothing has been run' "$LOG_DIR/user.log" || die "as a user, scripts/test.sh stopped without saying what to install"
[ -z "$(git_as "$DIR/home/tester/tollgate" status --porcelain --ignored)" ] \
  || die "as a user, scripts/test.sh wrote into the tree: $(git_as "$DIR/home/tester/tollgate" status --porcelain --ignored)"
tick "user run stopped (exit $user_rc, $((SECONDS - t0))s)"

say "as root: scripts/test.sh (the whole output: $LOG)"
chroot_cmd root
t0=$SECONDS
set +e
timeout -k 60 "$TIMEOUT" "${CMD[@]}" 2>&1 | tee -a "$LOG"
run_rc=${PIPESTATUS[0]}
set -e
tick "scripts/test.sh exit $run_rc ($(((SECONDS - t0) / 60))m$(((SECONDS - t0) % 60))s)"

say "what the run left"
CLONE=$DIR/root/tollgate
{
  echo "commit: $COMMIT"
  echo "TOLLGATE_FUZZ_SECONDS: ${TOLLGATE_FUZZ_SECONDS:-unset (60)}"
  echo "git status --porcelain:"
  git -C "$CLONE" status --porcelain | sed 's/^/  /'
  echo "ignored files outside target/:"
  git -C "$CLONE" status --porcelain --ignored | grep '^!!' | grep -v '^!! target/$' | sed 's/^/  /' || true
  echo "disk:"
  du -sh "$CLONE/target" "$CLONE/fuzz/target" "$DIR/root/.cargo" 2>/dev/null | sed "s|$DIR||; s/^/  /"
  for d in "$CLONE/target"/*/; do du -sh "$d"; done 2>/dev/null | sed "s|$DIR||; s/^/    /"
  echo "left in /tmp:"
  find "$DIR/tmp" -mindepth 1 -maxdepth 1 | sed "s|$DIR||; s/^/  /"
  echo "in /root besides .cargo, .rustup, tollgate:"
  find "$DIR/root" -mindepth 1 -maxdepth 1 ! -name .cargo ! -name .rustup ! -name tollgate ! -name .bashrc ! -name .profile | sed "s|$DIR||; s/^/  /"
  # Without the borrowed Rust, which is the host's.
  for m in "$DIR/root/.rustup" "$DIR/root/.cargo/bin" "$DIR/home/tester/.rustup" "$DIR/home/tester/.cargo/bin"; do
    umount "$m" 2>/dev/null || true
  done
  echo "disk of the whole chroot after the run: $(du -sh -x "$DIR" | awk '{print $1}') (after debootstrap: $BASE_DU)"
} | tee -a "$SUMMARY"

[ "$run_rc" = 0 ] || die "scripts/test.sh failed in the fresh machine (exit $run_rc; log $LOG)"
[ -z "$(git -C "$CLONE" status --porcelain)" ] || die "the run left the tree dirty (above)"
echo "fresh-machine: scripts/test.sh passed on a bare Debian bookworm"
