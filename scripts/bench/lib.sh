# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with bench.sh
# Sourced by scripts/bench.sh: the functions every cell uses. Ports, readiness, processes,
# CPU and memory accounting, the machine's noise, and the load generators with their
# parsers. Uses bench.sh's settings (WORK, PIDS, WAIT_QUIET, LOAD_CPUS, ...).

log() { printf '%s\n' "$*" >&2; }
die() { printf 'bench.sh: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- ports

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

# ---------------------------------------------------------------- readiness

# The status code of one GET over HTTP/1.1, through bash's /dev/tcp (no curl needed);
# 000 on failure.
http_status() {
  local port="$1" host="${2:-backend}" line="" fd
  if { exec {fd}<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
    { printf 'GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host" >&"$fd"; } 2>/dev/null || true
    read -r -t 3 -u "$fd" line 2>/dev/null || true
    exec {fd}>&-
  fi
  line="${line#HTTP/1.? }"
  printf '%s' "${line:0:3}" | tr -cd '0-9' | sed 's/^$/000/'
}

# The same over HTTP/2 with prior knowledge (h2c), with h2load: 200 or 000.
h2_status() {
  local out
  out="$(timeout 5 "$H2LOAD" -n1 -c1 -t1 "http://127.0.0.1:$1/" 2>/dev/null || true)"
  case "$out" in *"status codes: 1 2xx"*) echo 200 ;; *) echo 000 ;; esac
}

# Waits (bounded) until a target answers 200. $4: h1 (default) or h2; $5: tries of
# 0.1 s (valgrind needs many more than a plain start).
wait_ready() {
  local name="$1" port="$2" pids="$3" kind="${4:-h1}" tries="${5:-100}" p code=000
  for _ in $(seq 1 "$tries"); do
    for p in $pids; do
      kill -0 "$p" 2>/dev/null || { log "$name exited at start; its log:"; tail -n 30 "$WORK/$name.log" >&2 || true; die "$name did not start"; }
    done
    if [ "$kind" = h2 ]; then code="$(h2_status "$port")"; else code="$(http_status "$port")"; fi
    [ "$code" = 200 ] && return 0
    sleep 0.1
  done
  log "$name log:"; tail -n 30 "$WORK/$name.log" >&2 || true
  die "$name on 127.0.0.1:$port did not answer 200 (last status $code)"
}

# ---------------------------------------------------------------- processes

# Starts a command pinned to a CPU list, in the background, logging to $WORK/NAME.log.
start() {  # $1 name, $2 cpu list, rest: command
  local name="$1" cpus="$2"; shift 2
  taskset -c "$cpus" "$@" >> "$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
  PID="$!"
}

# Stops one process started with `start` and waits for it (bounded).
stop_one() {
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# A process and its children (nginx master + workers).
proc_tree() {
  local pid="$1" c
  echo "$pid"
  # shellcheck disable=SC2013  # the children files hold space-separated numbers
  for c in $(cat "/proc/$pid/task/"*/children 2>/dev/null); do proc_tree "$c"; done
}

# Clock ticks summed over process trees (all threads included): utime + stime
# (`cpu_ticks`), or stime alone (`sys_ticks`: the kernel's share, its system calls and the
# softirq work for packets that lands on the process's own time). $1: 1 for stime alone.
tree_ticks() {
  local kernel="$1" total=0 p root line rest
  local -a f
  shift
  for root in "$@"; do
    for p in $(proc_tree "$root"); do
      [ -r "/proc/$p/stat" ] || continue
      read -r line < "/proc/$p/stat" || continue
      rest="${line##*) }"
      read -r -a f <<<"$rest"
      if [ "$kernel" = 1 ]; then
        total=$(( total + f[12] ))
      else
        total=$(( total + f[11] + f[12] ))
      fi
    done
  done
  echo "$total"
}

cpu_ticks() { tree_ticks 0 "$@"; }
sys_ticks() { tree_ticks 1 "$@"; }

status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null; }

# VmRSS in KiB, summed over process trees.
rss_tree() {
  local total=0 p root kb
  for root in "$@"; do
    for p in $(proc_tree "$root"); do
      kb="$(status_kb "$p" VmRSS)"
      total=$(( total + ${kb:-0} ))
    done
  done
  echo "$total"
}

# Ticks of a CPU list from /proc/stat: spent in tasks (user+nice+system) plus stolen
# by the hypervisor (steal: a virtual CPU that did not run), busy in all (tasks, irq,
# softirq, steal), and total. $1: a comma-separated list of CPU numbers.
core_ticks() {
  local name user nice sys idle iow irq sirq steal _ task=0 busy=0 total=0
  while read -r name user nice sys idle iow irq sirq steal _; do
    case ",$1," in
      *",${name#cpu},"*)
        [ "$name" != cpu ] || continue
        task=$(( task + user + nice + sys + steal ))
        busy=$(( busy + user + nice + sys + irq + sirq + steal ))
        total=$(( total + user + nice + sys + idle + iow + irq + sirq + steal )) ;;
    esac
  done < /proc/stat
  echo "$task $busy $total"
}

# CPU ticks of this script's waited-for children (cutime + cstime): the load generators.
child_ticks() {
  local line rest
  local -a f
  read -r line < "/proc/$$/stat"
  rest="${line##*) }"
  read -r -a f <<<"$rest"
  echo $(( f[13] + f[14] ))
}

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

# ---------------------------------------------------------------- load generators

# The body files and wrk scripts of the POST loads, written once.
write_load_files() {
  head -c 64 /dev/zero | tr '\0' 'x' > "$WORK/body-64"
  local size
  for size in 16384 262144; do
    cat > "$WORK/post-$size.lua" <<EOF
wrk.method = "POST"
wrk.body = string.rep("x", $size)
wrk.headers["Content-Type"] = "application/octet-stream"
EOF
  done
}

# Starts the load of a cell in the background (pid in LOAD_PID), pinned to the load
# CPUs. $1 load kind: get | post16k | post256k | h2; $2 port; $3 connections (wrk) or
# streams (h2: spread over H2_CONNS connections); $4 seconds; $5 output file.
start_load() {
  local kind="$1" port="$2" conns="$3" secs="$4" out="$5"
  local -a script=()
  case "$kind" in
    post16k) script=(-s "$WORK/post-16384.lua") ;;
    post256k) script=(-s "$WORK/post-262144.lua") ;;
  esac
  if [ "$kind" = h2 ]; then
    local c=$H2_CONNS
    [ "$conns" -ge "$c" ] || c=$conns
    taskset -c "$LOAD_CPUS" "$H2LOAD" -t1 -c"$c" -m"$(( (conns + c - 1) / c ))" -D "$secs" \
      -d "$WORK/body-64" -H 'content-type: application/grpc' -H 'te: trailers' \
      --log-file "$out.log" "http://127.0.0.1:$port/" > "$out" 2>&1 &
  else
    taskset -c "$LOAD_CPUS" "$WRK" -t"$WRK_THREADS" -c"$conns" -d"$secs"s --latency \
      "${script[@]}" "http://127.0.0.1:$port/" > "$out" 2>&1 &
  fi
  LOAD_PID=$!
}

# Parses one load output into: rps p50_ms p99_ms requests non2xx socket_errors.
parse_load() {  # $1 kind, $2 output file
  if [ "$1" = h2 ]; then parse_h2load "$2"; else parse_wrk "$2"; fi
}

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

# h2load prints no percentiles: they come from its per-request log (--log-file: start
# time, status, microseconds to the end of the response).
parse_h2load() {
  local p50 p99
  read -r p50 p99 < <(awk -F'\t' '{ print $3 }' "$1.log" 2>/dev/null | sort -n | awk '
    { v[NR] = $1 }
    END {
      if (NR == 0) { print "0 0"; exit }
      i50 = int(NR * 0.50); if (i50 < 1) i50 = 1
      i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
      printf "%.3f %.3f\n", v[i50] / 1000, v[i99] / 1000
    }')
  awk -v p50="$p50" -v p99="$p99" '
    /^finished in/ { gsub(/,/, ""); rps = $4 }
    /^requests:/ { gsub(/,/, ""); done = $6; errored = $12; timeout = $14 }
    /^status codes:/ { gsub(/,/, ""); non2xx = $5 + $7 + $9 }
    END { printf "%s %.3f %.3f %d %d %d\n", rps + 0, p50, p99, done + 0, non2xx, errored + timeout }
  ' "$1"
}
