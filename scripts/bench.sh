#!/usr/bin/env bash
# Load comparison: tollgate against a direct connection, an nginx reverse proxy and
# HAProxy, each pinned to the same single core, in alternating rounds, medians reported.
# Also tollgate's idle RSS and its RSS with 1,000 client connections open.
#
#   scripts/bench.sh                     # 12 rounds of 3 s per target, 64 connections
#   scripts/bench.sh --quick             # a short smoke run (1 round of 3 s)
#   scripts/bench.sh --json              # the results as JSON on stdout
#   scripts/bench.sh --count             # instructions and system calls per request
#
# See docs/benchmarks.md for what is measured and how to read it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPORT_AWK="$ROOT/scripts/bench/report.awk"
ORIG_CMD="$(printf '%q ' "$0" "$@")"
ORIG_CMD="${ORIG_CMD% }"

# Many short rounds rather than a few long ones: the host's speed drifts over tens of
# seconds, so runs next to each other compare better, and a median over 12 paired
# rounds is steadier than one over 3.
DURATION=3
ROUNDS=12
CONNS=64
WARMUP=2
RSS_CONNS=1000
RSS_DURATION=5
PROXY_CPU=0
LOAD_CPU=1
JSON=0
OUT_DIR=""
TOLLGATE_BIN="${TOLLGATE_BIN:-}"
TARGETS="direct,tollgate,tollgate-noretry,nginx,haproxy"
INSTALL=1
WAIT_QUIET=0
COUNT=0
NOISE_PCT=5   # a run is flagged noisy when other tasks took more than this share of a core

usage() {
  cat <<'EOF'
usage: scripts/bench.sh [options]

  --duration SECONDS   length of one measured wrk run (default 3)
  --rounds N           rounds; each round runs every target once (default 12)
  --connections N      wrk keep-alive connections (default 64)
  --quick              smoke run: --duration 3 --rounds 1, 1 s warm-up, 2 s RSS load
  --json               print the results as JSON on stdout (progress goes to stderr)
  --out DIR            keep the configs, logs, raw wrk outputs, table and JSON in DIR
  --tollgate PATH      the tollgate binary (default: $TOLLGATE_BIN, else
                       target/release/tollgate, built with cargo if missing)
  --targets LIST       comma-separated subset of: direct,tollgate,tollgate-noretry,nginx,haproxy,
                       tollgate-inbound (the inbound side in front of the backend, with a
                       fleet retry budget; not in the default list)
  --proxy-cpu N        the core the proxy under test runs on (default 0)
  --load-cpu N         the core wrk and the backend share (default 1)
  --rss-connections N  client connections for the RSS measurement (default 1000)
  --wait-quiet SECONDS before each measured run, wait up to this long for the machine
                       to be quiet: no compiler running, under 10% CPU busy (default 0:
                       do not wait; noisy runs are flagged either way)
  --count              instead of the load comparison: each proxy's user-space
                       instructions (valgrind --tool=callgrind, under wrk -t1 -c8) and
                       system calls (strace -c, under wrk -t1 -c64) per request, over
                       one --duration run each; figures the host's noise does not move
  --no-install         do not apt-get install missing nginx/haproxy/wrk (and, with
                       --count, valgrind and strace)
  -h, --help           this text
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION="${2:?"$1 needs a value"}"; shift 2 ;;
    --rounds) ROUNDS="${2:?"$1 needs a value"}"; shift 2 ;;
    --connections) CONNS="${2:?"$1 needs a value"}"; shift 2 ;;
    --quick) DURATION=3; ROUNDS=1; WARMUP=1; RSS_DURATION=2; shift ;;
    --json) JSON=1; shift ;;
    --out) OUT_DIR="${2:?"$1 needs a value"}"; shift 2 ;;
    --tollgate) TOLLGATE_BIN="${2:?"$1 needs a value"}"; shift 2 ;;
    --targets) TARGETS="${2:?"$1 needs a value"}"; shift 2 ;;
    --proxy-cpu) PROXY_CPU="${2:?"$1 needs a value"}"; shift 2 ;;
    --load-cpu) LOAD_CPU="${2:?"$1 needs a value"}"; shift 2 ;;
    --rss-connections) RSS_CONNS="${2:?"$1 needs a value"}"; shift 2 ;;
    --wait-quiet) WAIT_QUIET="${2:?"$1 needs a value"}"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --count) COUNT=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done

for v in duration:DURATION rounds:ROUNDS connections:CONNS rss-connections:RSS_CONNS \
  proxy-cpu:PROXY_CPU load-cpu:LOAD_CPU wait-quiet:WAIT_QUIET; do
  name="${v#*:}"
  val="${!name}"
  case "$val" in ''|*[!0-9]*) echo "bench.sh: --${v%%:*} must be a whole number, got '$val'" >&2; exit 2 ;; esac
done
IFS=, read -r -a TARGET_LIST <<<"$TARGETS"
[ "${#TARGET_LIST[@]}" -gt 0 ] || { echo "bench.sh: --targets is empty" >&2; exit 2; }
for t in "${TARGET_LIST[@]}"; do
  case "$t" in
    direct|tollgate|tollgate-noretry|tollgate-inbound|nginx|haproxy) ;;
    *) echo "bench.sh: unknown target '$t' (known: direct,tollgate,tollgate-noretry,tollgate-inbound,nginx,haproxy)" >&2; exit 2 ;;
  esac
done
[ "$DURATION" -ge 1 ] && [ "$ROUNDS" -ge 1 ] && [ "$CONNS" -ge 1 ] || {
  echo "bench.sh: --duration, --rounds and --connections must be at least 1" >&2; exit 2; }

log() { printf '%s\n' "$*" >&2; }
die() { printf 'bench.sh: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- prerequisites

NPROC="$(nproc)"
[ "$NPROC" -ge 2 ] || die "needs at least 2 CPUs (one for the proxy, one for wrk and the backend); this machine has $NPROC"
[ "$PROXY_CPU" -lt "$NPROC" ] && [ "$LOAD_CPU" -lt "$NPROC" ] && [ "$PROXY_CPU" -ne "$LOAD_CPU" ] ||
  die "--proxy-cpu and --load-cpu must be two different CPUs below $NPROC"

need_pkgs=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_pkgs+=(nginx-light)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need_pkgs+=(haproxy)
command -v wrk >/dev/null 2>&1 || need_pkgs+=(wrk)
command -v taskset >/dev/null 2>&1 || need_pkgs+=(util-linux)
if [ "$COUNT" -eq 1 ]; then
  command -v valgrind >/dev/null 2>&1 || need_pkgs+=(valgrind)
  command -v strace >/dev/null 2>&1 || need_pkgs+=(strace)
fi
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  [ "$INSTALL" -eq 1 ] || die "missing: ${need_pkgs[*]} (run without --no-install, or install them)"
  command -v apt-get >/dev/null 2>&1 || die "missing ${need_pkgs[*]} and no apt-get to install them"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing ${need_pkgs[*]} ..."
  # The packages' own services are neither needed nor used: everything below runs in the
  # foreground with its own config. A failed service start must not fail the install.
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_pkgs[@]}" >&2 ||
    { $SUDO apt-get update -q >&2 && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_pkgs[@]}" >&2; } ||
    die "could not install ${need_pkgs[*]}"
fi
export PATH="$PATH:/usr/sbin:/sbin"
NGINX="$(command -v nginx)"
HAPROXY="$(command -v haproxy)"
WRK="$(command -v wrk)"

# wrk with 1,000 connections, tollgate with 1,000 client and up to 1,000 upstream
# connections: each needs a file descriptor. Raise the soft limit (and the hard one
# when root) for this script and everything it starts.
want_nofile=$(( RSS_CONNS * 3 + 1024 ))
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
if [ "$NOFILE" != unlimited ] && [ "$NOFILE" -lt $(( RSS_CONNS * 2 + 256 )) ]; then
  die "open file limit is $NOFILE (hard $(ulimit -Hn)); $RSS_CONNS connections need about $(( RSS_CONNS * 2 + 256 )). Raise it (ulimit -Hn, or run as root) or pass a smaller --rss-connections"
fi

# ---------------------------------------------------------------- tollgate binary

if [ -z "$TOLLGATE_BIN" ]; then
  TOLLGATE_BIN="$(cd "$ROOT" && readlink -m "${CARGO_TARGET_DIR:-target}")/release/tollgate"
  if [ ! -x "$TOLLGATE_BIN" ]; then
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
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$HOLDER_PID" ]; then kill "$HOLDER_PID" 2>/dev/null || true; fi
  local p
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

# A stable copy: the binary in target/ may be rebuilt while this runs.
cp "$TOLLGATE_BIN" "$WORK/tollgate"
TG="$WORK/tollgate"
# What was measured: the version, and for the in-tree binary the commit it was built
# from (+dirty when src/ or Cargo.* differ from it).
TOLLGATE_REV="$("$TG" --version 2>/dev/null | awk '{ print $NF }')"
[ -n "$TOLLGATE_REV" ] || TOLLGATE_REV=unknown
if [ "$(readlink -f "$TOLLGATE_BIN")" = "$(cd "$ROOT" && readlink -f "${CARGO_TARGET_DIR:-target}/release/tollgate")" ] &&
  rev="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null)"; then
  [ -z "$(cd "$ROOT" && git status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null)" ] || rev="$rev+dirty"
  TOLLGATE_REV="$TOLLGATE_REV ($rev)"
else
  TOLLGATE_REV="$TOLLGATE_REV ($TOLLGATE_BIN)"
fi
TOLLGATE_BUILT="$(date -u -r "$TOLLGATE_BIN" '+%Y-%m-%dT%H:%M:%SZ' 2>/dev/null || echo unknown)"

# ---------------------------------------------------------------- helpers

# Free TCP ports on 127.0.0.1: outside the kernel's ephemeral range (where the
# thousands of client and upstream connections of a run take their local ports),
# not in use now, not handed out before.
read -r EPH_LO EPH_HI < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || { EPH_LO=32768; EPH_HI=60999; }
if [ "$EPH_LO" -gt 12000 ]; then
  PORT_LO=$(( EPH_LO > 30000 ? EPH_LO - 20000 : 10000 )); PORT_HI=$(( EPH_LO - 1 ))
else
  PORT_LO=$(( EPH_HI + 1 )); PORT_HI=65535
fi
declare -A TAKEN=()
mark_taken() {
  local f hex local_addr
  for f in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$f" ] || continue
    while read -r _ local_addr _; do
      hex="${local_addr##*:}"
      case "$hex" in *[!0-9A-Fa-f]*|'') continue ;; esac
      TAKEN[$((16#$hex))]=1
    done < <(tail -n +2 "$f")
  done
}
mark_taken
NEXT_PORT=$(( PORT_LO + RANDOM % ((PORT_HI - PORT_LO) / 2 + 1) ))
free_port() {
  while [ -n "${TAKEN[$NEXT_PORT]:-}" ]; do
    NEXT_PORT=$(( NEXT_PORT + 1 ))
    [ "$NEXT_PORT" -le "$PORT_HI" ] || NEXT_PORT=$PORT_LO
  done
  TAKEN[$NEXT_PORT]=1
  PORT="$NEXT_PORT"
}

# The status code of one GET, over bash's /dev/tcp (no curl needed); 000 on failure.
http_status() {
  local port="$1" host="${2:-backend}" line="" fd
  if { exec {fd}<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
    printf 'GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host" >&"$fd" 2>/dev/null || true
    read -r -t 3 -u "$fd" line 2>/dev/null || true
    exec {fd}>&-
  fi
  line="${line#HTTP/1.? }"
  printf '%s' "${line:0:3}" | tr -cd '0-9' | sed 's/^$/000/'
}

wait_ready() {
  local name="$1" port="$2" pid="$3" i code
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || { log "$name exited at start; its log:"; cat "$WORK/$name.log" >&2 || true; die "$name did not start"; }
    code="$(http_status "$port")"
    [ "$code" = 200 ] && return 0
    sleep 0.1
  done
  log "$name log:"; cat "$WORK/$name.log" >&2 || true
  die "$name on 127.0.0.1:$port did not answer 200 (last status $code)"
}

# A process and its children (nginx master + worker).
proc_tree() {
  local pid="$1" c
  echo "$pid"
  for c in $(cat "/proc/$pid/task/"*/children 2>/dev/null); do proc_tree "$c"; done
}

# utime + stime in clock ticks, summed over a process tree (all threads included).
cpu_ticks() {
  local total=0 p line rest
  local -a f
  for p in $(proc_tree "$1"); do
    [ -r "/proc/$p/stat" ] || continue
    read -r line < "/proc/$p/stat" || continue
    rest="${line##*) }"
    read -r -a f <<<"$rest"
    total=$(( total + f[11] + f[12] ))
  done
  echo "$total"
}

# Ticks of one CPU from /proc/stat: spent in tasks (user+nice+system) plus stolen by
# the hypervisor (steal: a virtual CPU that did not run), busy in all (tasks, irq,
# softirq, steal), and total.
core_ticks() {
  local cpu="$1" name user nice sys idle iow irq sirq steal _
  while read -r name user nice sys idle iow irq sirq steal _; do
    if [ "$name" = "cpu$cpu" ]; then
      echo "$(( user + nice + sys + steal )) $(( user + nice + sys + irq + sirq + steal )) $(( user + nice + sys + idle + iow + irq + sirq + steal ))"
      return
    fi
  done < /proc/stat
}

# CPU ticks of this script's waited-for children (cutime + cstime): wrk, mostly.
child_ticks() {
  local line rest
  local -a f
  read -r line < "/proc/$$/stat"
  rest="${line##*) }"
  read -r -a f <<<"$rest"
  echo $(( f[13] + f[14] ))
}

status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null; }

compiler_running() { pgrep -x rustc >/dev/null 2>&1 || pgrep -x cc1 >/dev/null 2>&1 || pgrep -x cc1plus >/dev/null 2>&1; }

# Percent of all CPUs busy over one second (between runs our own processes are idle).
machine_busy() {
  local a b c d e f g h t1 i1
  read -r _ a b c d e f g h _ < /proc/stat
  t1=$(( a + b + c + d + e + f + g + h )); i1=$(( d + e ))
  sleep 1
  read -r _ a b c d e f g h _ < /proc/stat
  echo $(( 100 - 100 * (d + e - i1) / (a + b + c + d + e + f + g + h - t1 + 1) ))
}

# With --wait-quiet: before a measured run, wait up to that many seconds for the
# machine to be quiet (no compiler running, under 10 % of the CPUs busy) for 3 s.
wait_quiet() {
  [ "$WAIT_QUIET" -gt 0 ] || return 0
  local deadline=$(( SECONDS + WAIT_QUIET )) said=0 quiet=0
  while [ "$SECONDS" -lt "$deadline" ]; do
    if compiler_running || [ "$(machine_busy)" -ge 10 ]; then
      quiet=0
      [ "$said" = 1 ] || { log "  (waiting up to ${WAIT_QUIET}s for the machine to be quiet)"; said=1; }
      sleep 1
    else
      quiet=$(( quiet + 1 ))
      [ "$quiet" -lt 3 ] || return 0
    fi
  done
  log "  (still busy after ${WAIT_QUIET}s; measuring anyway)"
}

CLK_TCK="$(getconf CLK_TCK)"

# ---------------------------------------------------------------- configs

free_port; BACKEND_PORT=$PORT
free_port; NGINX_PORT=$PORT
free_port; HAPROXY_PORT=$PORT
free_port; TG_MAIN=$PORT
free_port; TG_ADMIN=$PORT
free_port; TG_LISTEN=$PORT
free_port; TGN_MAIN=$PORT
free_port; TGN_ADMIN=$PORT
free_port; TGN_LISTEN=$PORT
free_port; RSS_MAIN=$PORT
free_port; RSS_ADMIN=$PORT
free_port; RSS_LISTEN=$PORT
free_port; TGI_MAIN=$PORT
free_port; TGI_ADMIN=$PORT
free_port; TGI_LISTEN=$PORT

NGINX_USER=""
[ "$(id -u)" -ne 0 ] || NGINX_USER="user root;"

nginx_common() {  # $1: name
  local d="$WORK/$1"
  mkdir -p "$d"
  cat <<EOF
$NGINX_USER
daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile $(( RSS_CONNS * 4 + 4096 ));
pid $d/nginx.pid;
error_log $WORK/$1.log warn;
events { worker_connections $(( RSS_CONNS * 4 + 2048 )); }
EOF
}

nginx_http_common() {  # $1: name
  local d="$WORK/$1"
  cat <<EOF
  access_log off;
  keepalive_timeout 75s;
  keepalive_requests 10000000;
  client_body_temp_path $d/client_body;
  proxy_temp_path $d/proxy;
  fastcgi_temp_path $d/fastcgi;
  uwsgi_temp_path $d/uwsgi;
  scgi_temp_path $d/scgi;
EOF
}

{
  nginx_common backend
  echo "http {"
  nginx_http_common backend
  cat <<EOF
  server {
    listen 127.0.0.1:$BACKEND_PORT;
    location / { default_type text/plain; return 200 "ok"; }
  }
}
EOF
} > "$WORK/backend.conf"

{
  nginx_common nginx
  echo "http {"
  nginx_http_common nginx
  cat <<EOF
  upstream backend {
    server 127.0.0.1:$BACKEND_PORT;
    keepalive 512;
    keepalive_requests 10000000;
    keepalive_timeout 60s;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
} > "$WORK/nginx.conf"

cat > "$WORK/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn $(( RSS_CONNS * 4 + 2048 ))

defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  timeout http-request 5s
  timeout http-keep-alive 60s

frontend fe
  bind 127.0.0.1:$HAPROXY_PORT
  default_backend be

backend be
  server backend 127.0.0.1:$BACKEND_PORT
EOF

tollgate_conf() {  # $1 main port, $2 admin port, $3 listen port, $4 retries on (1/0)
  cat <<EOF
[runtime]
worker_threads = 1

[listener]
addr = "127.0.0.1:$1"

[admin]
addr = "127.0.0.1:$2"

[upstreams.backend]
authorities = ["backend"]
listen = "127.0.0.1:$3"
endpoints = ["127.0.0.1:$BACKEND_PORT"]
protocol = "http1"
EOF
  if [ "$4" = 1 ]; then
    cat <<EOF

[upstreams.backend.retry]
max_attempts = 3

[upstreams.backend.budget]
ratio = 0.1
EOF
  fi
}
tollgate_conf "$TG_MAIN" "$TG_ADMIN" "$TG_LISTEN" 1 > "$WORK/tollgate.toml"
tollgate_conf "$TGN_MAIN" "$TGN_ADMIN" "$TGN_LISTEN" 0 > "$WORK/tollgate-noretry.toml"
tollgate_conf "$RSS_MAIN" "$RSS_ADMIN" "$RSS_LISTEN" 1 > "$WORK/tollgate-rss.toml"
# The inbound side alone, in front of the backend as its app (the default, fixed
# max_inflight: the adaptive limit would hold wrk's closed loop back once tollgate's
# own core is the bottleneck, and the figures would count refusals).
cat > "$WORK/tollgate-inbound.toml" <<EOF
[runtime]
worker_threads = 1

[listener]
addr = "127.0.0.1:$TGI_MAIN"

[admin]
addr = "127.0.0.1:$TGI_ADMIN"

[inbound]
addr = "127.0.0.1:$TGI_LISTEN"
app = "127.0.0.1:$BACKEND_PORT"

[inbound.retries]
ratio = 0.1
EOF

"$TG" check --config "$WORK/tollgate.toml" > "$WORK/check.log" 2>&1 || {
  cat "$WORK/check.log" >&2; die "tollgate check rejected the benchmark config"; }

# ---------------------------------------------------------------- machine

CPU_MODEL="$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
[ -n "$CPU_MODEL" ] || CPU_MODEL="$(uname -m)"
KERNEL="$(uname -sr)"
NGINX_VER="$( { "$NGINX" -v 2>&1 || true; } | sed 's/.*nginx\///')"
HAPROXY_VER="$( { "$HAPROXY" -v 2>&1 || true; } | awk 'NR == 1 { print $3 }')"
WRK_VER="$( { "$WRK" -v 2>&1 || true; } | awk 'NR == 1 { print $2 }')"
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"

log "== tollgate load comparison"
log "command:  $ORIG_CMD"
log "machine:  $NPROC CPUs, $CPU_MODEL, $KERNEL, load average $LOAD_BEFORE"
log "software: tollgate $TOLLGATE_REV, built $TOLLGATE_BUILT; nginx $NGINX_VER, haproxy $HAPROXY_VER, wrk $WRK_VER"
log "pinning:  proxy under test on CPU $PROXY_CPU alone; wrk and the backend share CPU $LOAD_CPU"
log "load:     wrk -t1 -c$CONNS -d${DURATION}s --latency, $ROUNDS round(s), median reported"
log "limits:   ulimit -n $NOFILE"
log "work dir: $WORK"
if compiler_running; then
  log "WARNING: a compiler (rustc/cc1) is running: it competes for the same CPUs and the figures will be noisy"
fi

# ---------------------------------------------------------------- start everything

start() {  # $1 name, $2 cpu, rest: command
  local name="$1" cpu="$2"; shift 2
  taskset -c "$cpu" "$@" >> "$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
  PID="$!"
}

start backend "$LOAD_CPU" "$NGINX" -e "$WORK/backend.log" -p "$WORK/backend" -c "$WORK/backend.conf"
BACKEND_PID=$PID
wait_ready backend "$BACKEND_PORT" "$BACKEND_PID"

declare -A T_PORT=() T_PID=()
T_PORT[direct]=$BACKEND_PORT
# The command line of a proxy target (in T_CMD) and its port.
target_cmd() {
  local t="$1"
  case "$t" in
    tollgate)
      T_CMD=(env RUST_LOG=info "$TG" run --config "$WORK/tollgate.toml"); T_PORT[$t]=$TG_LISTEN ;;
    tollgate-noretry)
      T_CMD=(env RUST_LOG=info "$TG" run --config "$WORK/tollgate-noretry.toml"); T_PORT[$t]=$TGN_LISTEN ;;
    tollgate-inbound)
      T_CMD=(env RUST_LOG=info "$TG" run --config "$WORK/tollgate-inbound.toml"); T_PORT[$t]=$TGI_LISTEN ;;
    nginx)
      T_CMD=("$NGINX" -e "$WORK/nginx.log" -p "$WORK/nginx" -c "$WORK/nginx.conf"); T_PORT[$t]=$NGINX_PORT ;;
    haproxy)
      T_CMD=("$HAPROXY" -db -f "$WORK/haproxy.cfg"); T_PORT[$t]=$HAPROXY_PORT ;;
    *) die "unknown target '$t' (known: direct,tollgate,tollgate-noretry,tollgate-inbound,nginx,haproxy)" ;;
  esac
}
start_target() {
  local t="$1"
  [ "$t" != direct ] || return 0
  target_cmd "$t"
  start "$t" "$PROXY_CPU" "${T_CMD[@]}"
  T_PID[$t]=$PID
  wait_ready "$t" "${T_PORT[$t]}" "${T_PID[$t]}"
}

if [ "$COUNT" -eq 1 ]; then
  . "$ROOT/scripts/bench/count.sh"
  exit 0
fi

for t in "${TARGET_LIST[@]}"; do start_target "$t"; done

# A process that went away between runs (a crash, or a signal from outside) is reported
# with its exit status, restarted, and counted in the report.
RESTARTS=""
ensure_running() {  # $1 name, $2 pid
  local rc=0
  kill -0 "$2" 2>/dev/null && return 0
  wait "$2" 2>/dev/null || rc=$?
  log "  WARNING: $1 (pid $2) exited with status $rc between runs; restarting it. Its log:"
  tail -n 20 "$WORK/$1.log" >&2 || true
  RESTARTS="${RESTARTS:+$RESTARTS, }$1 (exit status $rc)"
  if [ "$1" = backend ]; then
    start backend "$LOAD_CPU" "$NGINX" -e "$WORK/backend.log" -p "$WORK/backend" -c "$WORK/backend.conf"
    BACKEND_PID=$PID
    wait_ready backend "$BACKEND_PORT" "$BACKEND_PID"
  else
    start_target "$1"
  fi
}

# ---------------------------------------------------------------- load

# Parse one wrk --latency output into: rps p50_ms p99_ms requests non2xx socket_errors
parse_wrk() {
  awk '
    function ms(v) {
      if (v ~ /us$/) return substr(v, 1, length(v) - 2) / 1000
      if (v ~ /ms$/) return substr(v, 1, length(v) - 2) + 0
      if (v ~ /m$/)  return substr(v, 1, length(v) - 1) * 60000
      if (v ~ /s$/)  return substr(v, 1, length(v) - 1) * 1000
      return v + 0
    }
    /^ +50%/ { p50 = ms($2) }
    /^ +99%/ { p99 = ms($2) }
    / requests in / { req = $1 }
    /^Requests\/sec:/ { rps = $2 }
    /Non-2xx or 3xx responses:/ { non2xx = $NF }
    /Socket errors:/ { gsub(/,/, ""); serr = $4 + $6 + $8 + $10 }
    END { printf "%s %.3f %.3f %s %d %d\n", rps + 0, p50, p99, req + 0, non2xx, serr }
  ' "$1"
}

run_wrk() {  # $1 port, $2 connections, $3 seconds, $4 output file
  taskset -c "$LOAD_CPU" "$WRK" -t1 -c"$2" -d"$3"s --latency "http://127.0.0.1:$1/" > "$4" 2>&1 || true
}

log ""
log "warm-up: ${WARMUP}s per target"
for t in "${TARGET_LIST[@]}"; do
  run_wrk "${T_PORT[$t]}" "$CONNS" "$WARMUP" "$WORK/warmup-$t.txt"
done

RAW="$WORK/rounds.tsv"
: > "$RAW"
for r in $(seq 1 "$ROUNDS"); do
  log ""
  log "round $r/$ROUNDS"
  for t in "${TARGET_LIST[@]}"; do
    wait_quiet
    ensure_running backend "$BACKEND_PID"
    [ "$t" = direct ] || ensure_running "$t" "${T_PID[$t]}"
    noisy=0
    compiler_running && noisy=1
    out="$WORK/wrk-$t-$r.txt"
    pid="${T_PID[$t]:-}"
    c0=0; [ -z "$pid" ] || c0="$(cpu_ticks "$pid")"
    b0="$(cpu_ticks "$BACKEND_PID")"
    w0="$(child_ticks)"
    read -r p0task p0busy p0total < <(core_ticks "$PROXY_CPU")
    read -r l0task _ l0total < <(core_ticks "$LOAD_CPU")
    t0="$(date +%s%N)"
    run_wrk "${T_PORT[$t]}" "$CONNS" "$DURATION" "$out"
    t1="$(date +%s%N)"
    read -r p1task p1busy p1total < <(core_ticks "$PROXY_CPU")
    read -r l1task _ l1total < <(core_ticks "$LOAD_CPU")
    w1="$(child_ticks)"
    b1="$(cpu_ticks "$BACKEND_PID")"
    c1=0; [ -z "$pid" ] || c1="$(cpu_ticks "$pid")"
    compiler_running && noisy=1
    read -r rps p50 p99 reqs non2xx serr < <(parse_wrk "$out")
    if [ "$reqs" -eq 0 ]; then
      log "  WARNING: wrk completed no request to $t in round $r; the run is left out. wrk said:"
      cat "$out" >&2
      RESTARTS="${RESTARTS:+$RESTARTS, }$t (no request completed in round $r)"
      continue
    fi
    # Proxy CPU per request (process utime+stime), its CPU share over the run, and
    # the busy time of the whole proxy core per request (kernel softirq work included).
    # "other": the share of each core that went to tasks not part of the benchmark, or
    # to the hypervisor (steal).
    read -r cpu_us util core_us other0 other1 < <(awk -v c="$(( c1 - c0 ))" -v hz="$CLK_TCK" -v n="$reqs" \
      -v kb="$(( p1busy - p0busy ))" -v wall="$(( t1 - t0 ))" -v has="${pid:+1}" \
      -v o0="$(( p1task - p0task - (c1 - c0) ))" -v t0="$(( p1total - p0total ))" \
      -v o1="$(( l1task - l0task - (b1 - b0) - (w1 - w0) ))" -v t1="$(( l1total - l0total ))" 'BEGIN {
        cpu = c / hz * 1e6 / n
        util = c / hz / (wall / 1e9) * 100
        if (has != 1) { cpu = -1; util = -1 }
        if (o0 < 0) o0 = 0
        if (o1 < 0) o1 = 0
        printf "%.2f %.1f %.2f %.1f %.1f\n", cpu, util, kb / hz * 1e6 / n, (t0 > 0 ? o0 / t0 * 100 : 0), (t1 > 0 ? o1 / t1 * 100 : 0) }')
    # direct uses only the load CPU: what runs on the proxy CPU does not disturb it.
    [ -n "$pid" ] || other0_eff=0
    awk -v a="${other0_eff-$other0}" -v b="$other1" -v lim="$NOISE_PCT" 'BEGIN { exit !(a > lim || b > lim) }' && noisy=1
    unset other0_eff
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
      "$t" "$r" "$rps" "$p50" "$p99" "$reqs" "$cpu_us" "$util" "$core_us" "$non2xx" "$serr" "$noisy" "$other0" "$other1" >> "$RAW"
    flag=""; [ "$noisy" = 0 ] || flag="  NOISY"
    util_s="$util%"; [ -n "$pid" ] || util_s="-"
    log "$(printf '  %-17s %9.0f req/s  p50 %7.3f ms  p99 %7.3f ms  proxy CPU %6s  non-2xx %s  socket errors %s  other load: CPU%s %s%%, CPU%s %s%%%s' \
      "$t" "$rps" "$p50" "$p99" "$util_s" "$non2xx" "$serr" "$PROXY_CPU" "$other0" "$LOAD_CPU" "$other1" "$flag")"
    sleep 1
  done
done

# ---------------------------------------------------------------- memory

log ""
log "memory: a fresh tollgate (retries + budget), idle, then $RSS_CONNS connections"
wait_quiet
start tollgate-rss "$PROXY_CPU" env RUST_LOG=info "$TG" run --config "$WORK/tollgate-rss.toml"
RSS_PID=$PID
wait_ready tollgate-rss "$RSS_LISTEN" "$RSS_PID"
sleep 1
RSS_IDLE="$(status_kb "$RSS_PID" VmRSS)"

# 1,000 idle keep-alive connections, each having sent one request and read its answer
# (bash /dev/tcp sockets, held open by a background shell until released).
FIFO="$WORK/release"
mkfifo "$FIFO"
READY="$WORK/holder.ready"
(
  ok=0
  fds=()
  for _ in $(seq 1 "$RSS_CONNS"); do
    exec {fd}<>"/dev/tcp/127.0.0.1/$RSS_LISTEN" || break
    fds+=("$fd")
    printf 'GET / HTTP/1.1\r\nHost: backend\r\n\r\n' >&"$fd"
  done
  for fd in "${fds[@]}"; do
    line=""
    read -r -t 5 -u "$fd" line || true
    case "$line" in "HTTP/1.1 200"*) ok=$(( ok + 1 )) ;; esac
  done
  echo "${#fds[@]} $ok" > "$READY"
  read -r _ < "$FIFO"
) 2>"$WORK/holder.log" &
HOLDER_PID=$!
for _ in $(seq 1 300); do [ -s "$READY" ] && break; sleep 0.1; done
read -r HELD_OPEN HELD_OK < "$READY" || { HELD_OPEN=0; HELD_OK=0; }
sleep 0.5
RSS_HELD="$(status_kb "$RSS_PID" VmRSS)"
echo > "$FIFO"
wait "$HOLDER_PID" 2>/dev/null || true
HOLDER_PID=""
sleep 1

# 1,000 busy keep-alive connections: wrk -c1000; VmHWM is the peak.
run_wrk "$RSS_LISTEN" "$RSS_CONNS" "$RSS_DURATION" "$WORK/wrk-rss.txt" &
wrk_bg=$!
sleep "$(( RSS_DURATION / 2 + 1 ))"
RSS_BUSY="$(status_kb "$RSS_PID" VmRSS)"
wait "$wrk_bg" || true
RSS_PEAK="$(status_kb "$RSS_PID" VmHWM)"
read -r RSS_RPS _ RSS_P99 RSS_REQS RSS_NON2XX RSS_SERR < <(parse_wrk "$WORK/wrk-rss.txt")
sleep 1
RSS_AFTER="$(status_kb "$RSS_PID" VmRSS)"
log "$(printf '  idle %s KiB; %s idle connections (%s answered 200) %s KiB; %s busy connections %s KiB, peak (VmHWM) %s KiB; after close %s KiB' \
  "$RSS_IDLE" "$HELD_OPEN" "$HELD_OK" "$RSS_HELD" "$RSS_CONNS" "$RSS_BUSY" "$RSS_PEAK" "$RSS_AFTER")"
log "$(printf '  under wrk -c%s: %.0f req/s, p99 %.3f ms, %s requests, non-2xx %s, socket errors %s' \
  "$RSS_CONNS" "$RSS_RPS" "$RSS_P99" "$RSS_REQS" "$RSS_NON2XX" "$RSS_SERR")"

# Anything tollgate logged at warn or above while under load.
TG_WARNINGS=0
for f in "$WORK"/tollgate*.log; do
  n="$(grep -ciE '"level":"(WARN|ERROR)"|  WARN |  ERROR | WARN | ERROR ' "$f" || true)"
  TG_WARNINGS=$(( TG_WARNINGS + n ))
done

LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------- report

report() {  # $1: table | json
  awk -F'\t' -v mode="$1" \
    -v cmd="$ORIG_CMD" -v nproc="$NPROC" -v cpu_model="$CPU_MODEL" -v kernel="$KERNEL" \
    -v load_before="$LOAD_BEFORE" -v load_after="$LOAD_AFTER" \
    -v tg_rev="$TOLLGATE_REV" -v tg_built="$TOLLGATE_BUILT" \
    -v nginx_ver="$NGINX_VER" -v haproxy_ver="$HAPROXY_VER" -v wrk_ver="$WRK_VER" \
    -v duration="$DURATION" -v rounds="$ROUNDS" -v conns="$CONNS" \
    -v proxy_cpu="$PROXY_CPU" -v load_cpu="$LOAD_CPU" -v targets="$TARGETS" \
    -v rss_conns="$RSS_CONNS" -v rss_idle="$RSS_IDLE" -v rss_held="$RSS_HELD" \
    -v held_open="$HELD_OPEN" -v held_ok="$HELD_OK" \
    -v rss_busy="$RSS_BUSY" -v rss_peak="$RSS_PEAK" -v rss_after="$RSS_AFTER" \
    -v rss_rps="$RSS_RPS" -v rss_p99="$RSS_P99" -v rss_reqs="$RSS_REQS" \
    -v rss_non2xx="$RSS_NON2XX" -v rss_serr="$RSS_SERR" -v tg_warnings="$TG_WARNINGS" -v noise_pct="$NOISE_PCT" -v restarts="$RESTARTS" \
    -f "$REPORT_AWK" "$RAW"
}

report table > "$WORK/table.txt"
report json > "$WORK/results.json"
if [ "$JSON" -eq 1 ]; then
  cat "$WORK/results.json"
else
  cat "$WORK/table.txt"
fi
