#!/usr/bin/env bash
# Load matrix: tollgate against a direct connection and the proxies that can do the same
# job (nginx, HAProxy, Pingora), cell by cell: small GETs, h2c (gRPC-shaped), TLS to the
# upstream, request bodies, many connections, two cores, and a second hop. In each cell
# the targets run in alternating rounds on the same pinned core(s), and the medians and
# tollgate's ratios paired by round are reported, with CPU per request and RSS. Also
# tollgate's idle RSS and its RSS with 1,000 client connections open.
#
#   scripts/bench.sh                     # the whole matrix, about 15 minutes
#   scripts/bench.sh --cells get,h2c     # some cells only
#   scripts/bench.sh --quick             # a smoke run (1 round of 2 s per cell)
#   scripts/bench.sh --json              # the results as JSON on stdout
#   scripts/bench.sh --count             # instructions and syscalls per request (get, h2c)
#   scripts/bench.sh --fixed-rate        # CPU per request at a fixed rate (get, h2c, c2000)
#
# See docs/benchmarks.md for what is measured and how to read it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH_DIR="$ROOT/scripts/bench"
# The command line as typed: arguments quoted only where the shell needs it.
ORIG_CMD="$0"
for a in "$@"; do
  case "$a" in
    *[!A-Za-z0-9_./,:=+-]*|'') ORIG_CMD="$ORIG_CMD $(printf '%q' "$a")" ;;
    *) ORIG_CMD="$ORIG_CMD $a" ;;
  esac
done

# Each cell has its own rounds and duration (see cells.sh), picked so that the whole
# matrix runs in about 15 minutes on a 2-CPU machine; --rounds and --duration set them
# for every cell. Many short rounds rather than a few long ones: the host's speed
# drifts over tens of seconds, so runs next to each other compare better.
ROUNDS_OPT=""
DURATION_OPT=""
WARMUP_OPT=""
CONNS=64
C2000_CONNS=2000
H2_STREAMS=64
H2_CONNS=4
RSS_CONNS=1000
RSS_DURATION=5
PROXY_CPU=0
LOAD_CPU=1
JSON=0
OUT_DIR=""
TOLLGATE_BIN="${TOLLGATE_BIN:-}"
COMPARE_BIN=""
INBOUND_EXTRA=""
TARGETS="direct,tollgate,tollgate-noretry,tollgate-inbound,nginx,haproxy,pingora"
CELLS=""
INSTALL=1
WAIT_QUIET=0
COUNT=0
FIXED_RATE=0
RATE_OPT=""
RATE_SAT=1
TARGETS_SET=0
MEMORY=1
NOISE_PCT=5   # a run is flagged noisy when other tasks took more than this share of a core

usage() {
  cat <<'EOF'
usage: scripts/bench.sh [options]

  --cells LIST         comma-separated cells to run (default: all):
                         get       small GET, 1 core, wrk -c64: direct, tollgate (and with
                                   retries off), nginx, HAProxy, Pingora; then tollgate's memory
                         h2c       gRPC-shaped POSTs over h2c, h2load 64 streams on 4
                                   connections: direct, tollgate, nginx (grpc_pass), HAProxy
                         tls       plain HTTP in, TLS 1.3 to the upstream, wrk -c64: tollgate,
                                   nginx, HAProxy, Pingora
                         body16k   16 KiB POST bodies, wrk -c64: direct, tollgate, nginx, HAProxy
                         body256k  256 KiB POST bodies, the same
                         c2000     small GET over 2,000 connections: direct, tollgate, nginx, HAProxy
                         cores2    2 workers against 1 on two CPUs: tollgate, nginx, HAProxy
                         inbound   caller tollgate -> inbound tollgate -> backend against one
                                   hop (a two-hop outbound chain while the binary has no [inbound])
  --rounds N           rounds for every cell (default: per cell, 4 to 8)
  --duration SECONDS   length of each measured run, every cell (default: per cell, 3 or 4)
  --connections N      wrk connections of the -c64 cells (default 64)
  --many-connections N wrk connections of the c2000 cell (default 2000)
  --quick              smoke run: 1 round of 2 s per cell, 1 s warm-up, 2 s memory load
  --json               print the results as JSON on stdout (progress goes to stderr)
  --out DIR            keep the configs, logs, raw outputs, table and JSON in DIR
  --tollgate PATH      the tollgate binary (default: $TOLLGATE_BIN, else
                       target/release/tollgate, built with cargo if missing)
  --compare PATH       a second tollgate binary, run as target tollgate-b right after
                       tollgate in every cell that runs tollgate, with the ratio
                       tollgate/tollgate-b: two builds compared paired by round (a wrapper
                       script that execs a binary with other settings works too)
  --targets LIST       comma-separated subset of: direct,tollgate,tollgate-noretry,
                       tollgate-log,tollgate-inbound,nginx,haproxy,pingora (each cell runs
                       those of its targets that are listed; tollgate-log, in the get cell
                       and only when listed, has the access log on; tollgate-inbound is the
                       inbound side alone in front of the backend, in the inbound cell)
  --proxy-cpu N        the core the proxy under test runs on (default 0)
  --load-cpu N         the core the load generator and the backend share (default 1)
  --rss-connections N  client connections for tollgate's memory measurement (default 1000)
  --no-memory          skip tollgate's memory measurement
  --wait-quiet SECONDS before each measured run, wait up to this long for the machine
                       to be quiet: no compiler running, under 10% CPU busy (default 0:
                       do not wait; noisy runs are flagged either way)
  --count              instead of the load comparison: each proxy's user-space
                       instructions (valgrind --tool=callgrind, 8 connections or streams)
                       and system calls (strace -c, the cell's own load) per request, over
                       one --duration run each (default 3 s), for the cells of --cells
                       (default: get and h2c); figures the host's noise does not move
  --fixed-rate         instead of the load comparison: every target of a cell offered the
                       same open-loop rate (h2load --rps; over HTTP/1.1 with --h1), and the
                       proxy's own CPU time per request (utime+stime of all its processes),
                       context switches, the achieved rate and errors; 3 rounds of 5 s
                       (--rounds, --duration), medians, tollgate/nginx and tollgate/haproxy,
                       and req/s at saturation from the same rounds. Cells of --cells
                       (default: get, h2c, c2000), targets direct, tollgate, nginx, haproxy
                       and pingora when already built (default). Rates per cell: 16000 req/s
                       (get, h2c, c2000, cores2, inbound), 8000 (tls, body16k), 1000
                       (body256k); lowered for the cell when a target falls short of it
  --rate R             the rate of every cell in req/s (implies --fixed-rate)
  --no-saturation      with --fixed-rate: skip the runs at saturation
  --inbound-extra FILE TOML appended to the [inbound] section of the tollgate-inbound and
                       tollgate-chain targets, e.g. an [inbound.dedupe] table, to count what
                       it costs a request that does not use it
  --no-install         do not apt-get install missing packages
  -h, --help           this text
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --cells) CELLS="${2:?"$1 needs a value"}"; shift 2 ;;
    --duration) DURATION_OPT="${2:?"$1 needs a value"}"; shift 2 ;;
    --rounds) ROUNDS_OPT="${2:?"$1 needs a value"}"; shift 2 ;;
    --connections) CONNS="${2:?"$1 needs a value"}"; shift 2 ;;
    --many-connections) C2000_CONNS="${2:?"$1 needs a value"}"; shift 2 ;;
    --quick) DURATION_OPT=2; ROUNDS_OPT=1; WARMUP_OPT=1; RSS_DURATION=2; shift ;;
    --json) JSON=1; shift ;;
    --out) OUT_DIR="${2:?"$1 needs a value"}"; shift 2 ;;
    --tollgate) TOLLGATE_BIN="${2:?"$1 needs a value"}"; shift 2 ;;
    --compare) COMPARE_BIN="${2:?"$1 needs a value"}"; shift 2 ;;
    --targets) TARGETS="${2:?"$1 needs a value"}"; TARGETS_SET=1; shift 2 ;;
    --proxy-cpu) PROXY_CPU="${2:?"$1 needs a value"}"; shift 2 ;;
    --load-cpu) LOAD_CPU="${2:?"$1 needs a value"}"; shift 2 ;;
    --rss-connections) RSS_CONNS="${2:?"$1 needs a value"}"; shift 2 ;;
    --no-memory) MEMORY=0; shift ;;
    --wait-quiet) WAIT_QUIET="${2:?"$1 needs a value"}"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --count) COUNT=1; shift ;;
    --fixed-rate) FIXED_RATE=1; shift ;;
    --rate) RATE_OPT="${2:?"$1 needs a value"}"; FIXED_RATE=1; shift 2 ;;
    --no-saturation) RATE_SAT=0; shift ;;
    --inbound-extra) INBOUND_EXTRA="${2:?"$1 needs a value"}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done

# shellcheck source=scripts/bench/lib.sh
. "$BENCH_DIR/lib.sh"
# shellcheck source=scripts/bench/cells.sh
. "$BENCH_DIR/cells.sh"

for v in duration:DURATION_OPT rounds:ROUNDS_OPT connections:CONNS many-connections:C2000_CONNS \
  rss-connections:RSS_CONNS proxy-cpu:PROXY_CPU load-cpu:LOAD_CPU wait-quiet:WAIT_QUIET rate:RATE_OPT; do
  name="${v#*:}"
  val="${!name}"
  [ -n "$val" ] || continue
  case "$val" in *[!0-9]*) echo "bench.sh: --${v%%:*} must be a whole number, got '$val'" >&2; exit 2 ;; esac
done
if [ "${DURATION_OPT:-1}" -lt 1 ] || [ "${ROUNDS_OPT:-1}" -lt 1 ] || [ "$CONNS" -lt 1 ] || [ "$C2000_CONNS" -lt 1 ]; then
  echo "bench.sh: --duration, --rounds, --connections and --many-connections must be at least 1" >&2; exit 2
fi
[ "${RATE_OPT:-1}" -ge 1 ] || { echo "bench.sh: --rate must be at least 1" >&2; exit 2; }
if [ "$FIXED_RATE" -eq 1 ]; then
  [ "$COUNT" -eq 0 ] || { echo "bench.sh: --count and --fixed-rate are two modes: pick one" >&2; exit 2; }
  [ "$JSON" -eq 0 ] || { echo "bench.sh: --fixed-rate prints a table only (--out DIR keeps its raw TSV)" >&2; exit 2; }
  [ "$TARGETS_SET" -eq 1 ] || TARGETS="direct,tollgate,nginx,haproxy,pingora"
fi
IFS=, read -r -a TARGET_LIST <<<"$TARGETS"
[ "${#TARGET_LIST[@]}" -gt 0 ] || { echo "bench.sh: --targets is empty" >&2; exit 2; }
for t in "${TARGET_LIST[@]}"; do
  case ",$KNOWN_TARGETS," in *",$t,"*) ;; *) echo "bench.sh: unknown target '$t' (known: $KNOWN_TARGETS)" >&2; exit 2 ;; esac
done
if [ -z "$CELLS" ]; then
  if [ "$COUNT" -eq 1 ]; then CELLS="get,h2c"; elif [ "$FIXED_RATE" -eq 1 ]; then CELLS="get,h2c,c2000"; else CELLS="$ALL_CELLS"; fi
fi
IFS=, read -r -a CELL_LIST <<<"$CELLS"
[ "${#CELL_LIST[@]}" -gt 0 ] || { echo "bench.sh: --cells is empty" >&2; exit 2; }
for c in "${CELL_LIST[@]}"; do
  case ",$ALL_CELLS," in *",$c,"*) ;; *) echo "bench.sh: unknown cell '$c' (known: $ALL_CELLS)" >&2; exit 2 ;; esac
done
COUNT_CELLS=("${CELL_LIST[@]}")
has_cell() { case ",$CELLS," in *",$1,"*) return 0 ;; esac; return 1; }
has_target() { case ",$TARGETS," in *",$1,"*) return 0 ;; esac; return 1; }

# ---------------------------------------------------------------- prerequisites

NPROC="$(nproc)"
[ "$NPROC" -ge 2 ] || die "needs at least 2 CPUs (one for the proxy, one for the load and the backend); this machine has $NPROC"
if [ "$PROXY_CPU" -ge "$NPROC" ] || [ "$LOAD_CPU" -ge "$NPROC" ] || [ "$PROXY_CPU" -eq "$LOAD_CPU" ]; then
  die "--proxy-cpu and --load-cpu must be two different CPUs below $NPROC"
fi

# Installs Debian packages (through sudo when not root), unless --no-install.
install_pkgs() {
  [ "$INSTALL" -eq 1 ] || { log "missing: $* (run without --no-install, or install them)"; return 1; }
  command -v apt-get >/dev/null 2>&1 || { log "missing $* and no apt-get to install them"; return 1; }
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log "installing $* ..."
  # The packages' own services are neither needed nor used: everything here runs in the
  # foreground with its own config. A failed service start must not fail the install.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2 ||
    { $sudo apt-get update -q >&2 && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2; }
}

export PATH="$PATH:/usr/sbin:/sbin"
need_pkgs=()
command -v nginx >/dev/null 2>&1 || need_pkgs+=(nginx-light)
command -v haproxy >/dev/null 2>&1 || need_pkgs+=(haproxy)
command -v wrk >/dev/null 2>&1 || need_pkgs+=(wrk)
command -v h2load >/dev/null 2>&1 || need_pkgs+=(nghttp2-client)
command -v nghttpd >/dev/null 2>&1 || need_pkgs+=(nghttp2-server)
command -v openssl >/dev/null 2>&1 || need_pkgs+=(openssl)
command -v taskset >/dev/null 2>&1 || need_pkgs+=(util-linux)
command -v pgrep >/dev/null 2>&1 || need_pkgs+=(procps)
if [ "$COUNT" -eq 1 ]; then
  command -v valgrind >/dev/null 2>&1 || need_pkgs+=(valgrind)
  command -v strace >/dev/null 2>&1 || need_pkgs+=(strace)
fi
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  install_pkgs "${need_pkgs[@]}" || die "could not install ${need_pkgs[*]}"
fi
# The script itself and whatever it starts unpinned (its samplers of CPU time and memory,
# their subshells) stay off the proxy's CPU: only the proxy under test runs there. Measured
# with `perf sched` on the proxy's CPU before this: the script's own processes ran there
# for 340 ms of a one-minute cell, up to 7 ms at a time, in the middle of rounds.
taskset -pc "$LOAD_CPU" $$ >/dev/null || die "could not keep this script on CPU $LOAD_CPU"
NGINX="$(command -v nginx)"
HAPROXY="$(command -v haproxy)"
WRK="$(command -v wrk)"
H2LOAD="$(command -v h2load)"
NGHTTPD="$(command -v nghttpd)"

# wrk with 2,000 connections, a proxy with 2,000 client and up to 2,000 upstream
# connections, and the backend with the pools of every proxy of a cell: each needs a
# file descriptor. Raise the soft limit (and the hard one when root) for this script
# and everything it starts.
most_conns=$(( C2000_CONNS > RSS_CONNS ? C2000_CONNS : RSS_CONNS ))
want_nofile=$(( most_conns * 12 + 4096 ))
[ "$want_nofile" -ge 65536 ] || want_nofile=65536
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$want_nofile" ]; then
  ulimit -Hn "$want_nofile" 2>/dev/null || true
fi
if [ "$(ulimit -Hn)" = unlimited ] || [ "$(ulimit -Hn)" -ge "$want_nofile" ]; then
  ulimit -Sn "$want_nofile"
else
  ulimit -Sn "$(ulimit -Hn)"
fi
NOFILE="$(ulimit -Sn)"
if [ "$NOFILE" != unlimited ] && [ "$NOFILE" -lt $(( most_conns * 6 + 256 )) ]; then
  die "open file limit is $NOFILE (hard $(ulimit -Hn)); $most_conns connections through a cell of proxies need about $(( most_conns * 6 + 256 )). Raise it (ulimit -Hn, or run as root) or pass smaller --many-connections and --rss-connections"
fi

# ---------------------------------------------------------------- tollgate binary

if [ -z "$TOLLGATE_BIN" ]; then
  TOLLGATE_BIN="$(cd "$ROOT" && readlink -m "${CARGO_TARGET_DIR:-target}")/release/tollgate"
  if [ ! -x "$TOLLGATE_BIN" ] || [ ! -x "$(dirname "$TOLLGATE_BIN")/tollgate-proxy" ]; then
    log "building tollgate (cargo build --release) ..."
    (cd "$ROOT" && cargo build --release >&2) || die "cargo build --release failed"
  fi
fi
[ -x "$TOLLGATE_BIN" ] || die "no tollgate binary at $TOLLGATE_BIN"

# ---------------------------------------------------------------- work dir, cleanup

WORK="$(mktemp -d "${TMPDIR:-/tmp}/tollgate-bench.XXXXXX")"
chmod 755 "$WORK"
PIDS=()
HOLDER_PID=""
SKIPS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$HOLDER_PID" ]; then kill "$HOLDER_PID" 2>/dev/null || true; fi
  local p
  # A load generator still running (the script was stopped in the middle of a run): only
  # while it is one of this shell's jobs, so that a reused process id is never hit.
  if [ -n "${LOAD_PID:-}" ]; then
    for p in $(jobs -p); do [ "$p" != "$LOAD_PID" ] || kill -TERM "$p" 2>/dev/null || true; done
  fi
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [ -n "$OUT_DIR" ]; then
    mkdir -p "$OUT_DIR" && cp -r "$WORK"/. "$OUT_DIR"/ && log "kept configs, logs and raw outputs in $OUT_DIR"
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A stable copy: the binary in target/ may be rebuilt while this runs. With it the
# server alone, tollgate-proxy, when it is beside it: `tollgate run` hands over to it, as
# it does where both are installed (a build from before the split has none).
copy_tollgate() { # BIN DIR: copies BIN (and its tollgate-proxy) into DIR, prints the copy
  mkdir -p "$2"
  cp "$1" "$2/tollgate"
  if [ -x "$(dirname "$1")/tollgate-proxy" ]; then cp "$(dirname "$1")/tollgate-proxy" "$2/"; fi
  echo "$2/tollgate"
}
TG="$(copy_tollgate "$TOLLGATE_BIN" "$WORK/a")"
TG_B=""
if [ -n "$COMPARE_BIN" ]; then
  [ -x "$COMPARE_BIN" ] || die "--compare: no executable at $COMPARE_BIN"
  TG_B="$(copy_tollgate "$COMPARE_BIN" "$WORK/b")"
fi
# What was measured: the version, and for the in-tree binary the commit it was built
# from (+dirty when src/ or Cargo.* differ from it).
TOLLGATE_REV="$("$TG" --version 2>/dev/null | awk '{ print $NF }')"
[ -n "$TOLLGATE_REV" ] || TOLLGATE_REV=unknown
if [ "$(readlink -f "$TOLLGATE_BIN")" = "$(cd "$ROOT" && readlink -f "${CARGO_TARGET_DIR:-target}/release/tollgate")" ] &&
  rev="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)"; then
  [ -z "$(cd "$ROOT" && git status --porcelain -- src crates Cargo.toml Cargo.lock 2>/dev/null)" ] || rev="$rev+dirty"
  TOLLGATE_REV="$TOLLGATE_REV ($rev)"
else
  TOLLGATE_REV="$TOLLGATE_REV ($TOLLGATE_BIN)"
fi
TOLLGATE_BUILT="$(date -u -r "$TOLLGATE_BIN" '+%Y-%m-%dT%H:%M:%SZ' 2>/dev/null || echo unknown)"
CLK_TCK="$(getconf CLK_TCK)"

# shellcheck source=scripts/bench/configs.sh
. "$BENCH_DIR/configs.sh"
# shellcheck source=scripts/bench/matrix.sh
. "$BENCH_DIR/matrix.sh"
# shellcheck source=scripts/bench/memory.sh
. "$BENCH_DIR/memory.sh"
# shellcheck source=scripts/bench/pingora.sh
. "$BENCH_DIR/pingora.sh"

# ---------------------------------------------------------------- machine

CPU_MODEL="$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
[ -n "$CPU_MODEL" ] || CPU_MODEL="$(uname -m)"
KERNEL="$(uname -sr)"
NGINX_VER="$( { "$NGINX" -v 2>&1 || true; } | sed 's/.*nginx\///')"
HAPROXY_VER="$( { "$HAPROXY" -v 2>&1 || true; } | awk 'NR == 1 { print $3 }')"
WRK_VER="$( { "$WRK" -v 2>&1 || true; } | awk 'NR == 1 { print $2 }')"
H2LOAD_VER="$( { "$H2LOAD" --version 2>&1 || true; } | awk 'NR == 1 { sub(/.*\//, "", $2); print $2 }')"
PINGORA_VER="not run"
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
STARTED=$SECONDS

if [ "$FIXED_RATE" -eq 1 ]; then log "== tollgate at a fixed rate"; else log "== tollgate load matrix"; fi
log "command:  $ORIG_CMD"
log "machine:  $NPROC CPUs, $CPU_MODEL, $KERNEL, load average $LOAD_BEFORE"
log "software: tollgate $TOLLGATE_REV, built $TOLLGATE_BUILT; nginx $NGINX_VER, haproxy $HAPROXY_VER, wrk $WRK_VER, h2load $H2LOAD_VER"
log "pinning:  proxy under test on CPU $PROXY_CPU alone; the load generator, the backend and this script share CPU $LOAD_CPU"
log "cells:    $CELLS"
log "limits:   ulimit -n $NOFILE"
log "work dir: $WORK"
if compiler_running; then
  log "WARNING: a compiler (rustc/cc1) is running: it competes for the same CPUs and the figures will be noisy"
fi

# ---------------------------------------------------------------- backend, peers

free_port; BACKEND_PORT=$PORT
free_port; BACKEND_H2_PORT=$PORT
free_port; BACKEND_TLS_PORT=$PORT
free_port; BACKEND_BODY_PORT=$PORT
mkdir -p "$WORK/backend-docs"
printf ok > "$WORK/backend-docs/ok.txt"
make_certs
write_load_files
backend_conf > "$WORK/backend.conf"
h2_backend_cmd
start_backend() {
  start backend "$LOAD_CPU" "$NGINX" -e "$WORK/backend.log" -p "$WORK/backend" -c "$WORK/backend.conf"
  BACKEND_PID=$PID
  wait_ready backend "$BACKEND_PORT" "$BACKEND_PID"
}
start_h2_backend() {
  start h2-backend "$LOAD_CPU" "${H2_BACKEND_CMD[@]}"
  H2_BACKEND_PID=$PID
  wait_ready h2-backend "$BACKEND_H2_PORT" "$H2_BACKEND_PID" h2
}
start_backend
start_h2_backend

INBOUND=0
if has_cell inbound; then
  if inbound_supported; then
    INBOUND=1
    log "inbound:  the binary accepts [inbound]: the inbound cell measures caller -> inbound -> backend"
  else
    log "SKIP inbound side: the binary does not accept [inbound] ($(inbound_refusal)); the inbound cell measures the two-hop outbound chain instead"
    SKIPS+=("the inbound side (no [inbound] in this binary: the inbound cell ran the two-hop outbound chain instead)")
  fi
fi

if has_target pingora && { has_cell get || has_cell tls; }; then
  # The fixed-rate mode takes Pingora when a build of it is there and does not build it.
  PINGORA_BUILD=$(( 1 - FIXED_RATE ))
  ensure_pingora
  [ -z "$PINGORA_BIN" ] || PINGORA_VER="0.9.1 ($(basename "$PINGORA_BIN"))"
fi

if [ "$COUNT" -eq 1 ]; then
  # shellcheck source=scripts/bench/count.sh
  . "$BENCH_DIR/count.sh"
  exit 0
fi
if [ "$FIXED_RATE" -eq 1 ]; then
  RATE_ROUNDS=${ROUNDS_OPT:-3}
  RATE_DURATION=${DURATION_OPT:-5}
  # shellcheck source=scripts/bench/rate.sh
  . "$BENCH_DIR/rate.sh"
  exit 0
fi

# ---------------------------------------------------------------- the matrix

RAW="$WORK/rounds.tsv"
CELLS_TSV="$WORK/cells.tsv"
: > "$RAW"
: > "$CELLS_TSV"
has_target tollgate || MEMORY=0
for cell in "${CELL_LIST[@]}"; do run_cell "$cell"; done

LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------- report

report() {  # $1: table | json
  local skips=""
  [ "${#SKIPS[@]}" -eq 0 ] || skips="$(printf '%s; ' "${SKIPS[@]}")"
  awk -F'\t' -v mode="$1" \
    -v cmd="$ORIG_CMD" -v nproc="$NPROC" -v cpu_model="$CPU_MODEL" -v kernel="$KERNEL" \
    -v load_before="$LOAD_BEFORE" -v load_after="$LOAD_AFTER" \
    -v tg_rev="$TOLLGATE_REV" -v tg_built="$TOLLGATE_BUILT" \
    -v nginx_ver="$NGINX_VER" -v haproxy_ver="$HAPROXY_VER" -v wrk_ver="$WRK_VER" \
    -v h2load_ver="$H2LOAD_VER" -v pingora_ver="$PINGORA_VER" \
    -v proxy_cpu="$PROXY_CPU" -v load_cpu="$LOAD_CPU" -v targets="$TARGETS" \
    -v rss_conns="$RSS_CONNS" -v rss_idle="$RSS_IDLE" -v rss_held="$RSS_HELD" \
    -v held_open="$HELD_OPEN" -v held_ok="$HELD_OK" \
    -v rss_busy="$RSS_BUSY" -v rss_peak="$RSS_PEAK" -v rss_after="$RSS_AFTER" \
    -v rss_rps="$RSS_RPS" -v rss_p99="$RSS_P99" -v rss_reqs="$RSS_REQS" \
    -v rss_non2xx="$RSS_NON2XX" -v rss_serr="$RSS_SERR" -v noise_pct="$NOISE_PCT" \
    -v restarts="$RESTARTS" -v skips="${skips%; }" -v total_secs="$(( SECONDS - STARTED ))" \
    -f "$BENCH_DIR/report.awk" "$CELLS_TSV" "$RAW"
}

report table > "$WORK/table.txt"
report json > "$WORK/results.json"
if [ "$JSON" -eq 1 ]; then
  cat "$WORK/results.json"
else
  cat "$WORK/table.txt"
fi
