# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with bench.sh
# Sourced by scripts/bench.sh --fixed-rate, after the backends are up: each target of each
# cell offered the same open-loop rate, and the proxy's own CPU time per request.
#
# At saturation on a small machine the load generator and the backend share a core and
# may be what limits a run, so req/s alone cannot rank the proxies. At a rate every
# target sustains, each one answers the same requests in the same time, and the CPU time
# its processes spend on them (utime + stime of the whole process tree, from
# /proc/PID/stat) is the cost of a request, whatever limits the load side. Each round
# runs every target once at the fixed rate and, unless --no-saturation, once at
# saturation with the cell's own load (the matrix's run), so both figures share the
# host's state. Uses bench.sh's configs, ports, functions and cleanup.
#
# One line per fixed-rate run in $RATE_RAW:
#   cell target round offered achieved p50_ms p99_ms requests non2xx errors
#   cpu_us_per_req cpu_percent csw_per_req backend_us_per_req noisy
# (cpu_us_per_req, cpu_percent and csw_per_req are -1 for direct: there is no proxy).

# The rate a cell is offered when --rate is not given, in requests per second: about
# half of the slowest target's rate at saturation on the 2-CPU development machine, so
# that every target sustains it with room for a busy host, while the proxy still works
# hard enough for its CPU time to be read with 10 ms ticks to better than 1 %.
rate_default() {
  case "$1" in
    get|c2000|cores2|inbound) echo 16000 ;;
    h2c) echo 16000 ;;
    tls) echo 8000 ;;
    body16k) echo 8000 ;;
    body256k) echo 1000 ;;
    *) die "no default rate for cell '$1'" ;;
  esac
}

# Voluntary and involuntary context switches, summed over process trees and all their
# threads (/proc/PID/task/TID/status).
ctxsw_tree() {
  local total=0 p root n
  for root in "$@"; do
    for p in $(proc_tree "$root"); do
      n="$(cat "/proc/$p/task/"*/status 2>/dev/null |
        awk '/^(non)?voluntary_ctxt_switches:/ { s += $2 } END { print s + 0 }')"
      total=$(( total + ${n:-0} ))
    done
  done
  echo "$total"
}

# The clients (connections) h2load opens for a load: $1 kind, $2 connections or streams.
rate_clients() {
  if [ "$1" = h2 ] && [ "$2" -ge "$H2_CONNS" ]; then echo "$H2_CONNS"; else echo "$2"; fi
}

# A rate rounded down to whole requests per second per client (at least one): h2load
# takes its --rps per client, and a fraction is not what it sends. $1 rate, $2 clients.
rate_align() {
  local per=$(( $1 / $2 ))
  [ "$per" -ge 1 ] || per=1
  echo $(( per * $2 ))
}

# Starts an open-loop load at a fixed rate in the background (pid in LOAD_PID):
# h2load --rps, which sends each client's requests on a timer whether or not the
# earlier answers are back (up to its streams per connection: 1 over HTTP/1.1).
# $1 load kind: get | post16k | post256k | h2; $2 port; $3 connections (h1) or streams
# (h2: over H2_CONNS connections); $4 requests per second in all, a multiple of the
# clients (rate_align); $5 seconds; $6 output.
start_rate_load() {
  local kind="$1" port="$2" conns="$3" rate="$4" secs="$5" out="$6" c m
  local -a extra=()
  c="$(rate_clients "$kind" "$conns")"
  case "$kind" in
    h2)
      m=$(( (conns + c - 1) / c ))
      extra=(-d "$WORK/body-64" -H 'content-type: application/grpc' -H 'te: trailers') ;;
    *)
      m=1
      extra=(--h1)
      case "$kind" in
        post16k) extra+=(-d "$WORK/body-16384" -H 'content-type: application/octet-stream') ;;
        post256k) extra+=(-d "$WORK/body-262144" -H 'content-type: application/octet-stream') ;;
      esac ;;
  esac
  # Bounded: h2load has been seen to wait for ever for clients that never started
  # (c2000); the run is then left out, with h2load's output.
  timeout -k 5 $(( secs + 30 )) taskset -c "$LOAD_CPUS" "$H2LOAD" -t1 -c"$c" -m"$m" --rps="$(( rate / c ))" -D "$secs" "${extra[@]}" \
    --log-file "$out.log" "http://127.0.0.1:$port/" > "$out" 2>&1 &
  LOAD_PID=$!
}

# One fixed-rate run of one target. $1 cell, $2 target, $3 round.
rate_run() {
  local cell="$1" t="$2" r="$3" out="$WORK/rate-$1-$2-$3.txt" has="" noisy=0
  local -a pids
  local c0=0 c1=0 s0=0 s1=0 k0=0 k1=0 b0 b1 t0 t1 rps p50 p99 reqs non2xx errs cpu_us util csw back_us sys_us
  wait_quiet
  ensure_backend
  [ "$t" = direct ] || ensure_target "$cell" "$t"
  compiler_running && noisy=1
  read -r -a pids <<<"${T_PIDS[$t]}"
  [ "${#pids[@]}" -eq 0 ] || has=1
  if [ -n "$has" ]; then c0="$(cpu_ticks "${pids[@]}")"; k0="$(sys_ticks "${pids[@]}")"; s0="$(ctxsw_tree "${pids[@]}")"; fi
  b0="$(cpu_ticks "$BACKEND_PID" "$H2_BACKEND_PID")"
  t0="$(date +%s%N)"
  start_rate_load "$C_LOAD" "${T_PORT[$t]}" "$C_CONNS" "$C_RATE" "$RATE_DURATION" "$out"
  wait "$LOAD_PID" || true
  t1="$(date +%s%N)"
  b1="$(cpu_ticks "$BACKEND_PID" "$H2_BACKEND_PID")"
  if [ -n "$has" ]; then c1="$(cpu_ticks "${pids[@]}")"; k1="$(sys_ticks "${pids[@]}")"; s1="$(ctxsw_tree "${pids[@]}")"; fi
  compiler_running && noisy=1
  read -r rps p50 p99 reqs non2xx errs < <(parse_h2load "$out")
  grep -q '^finished in' "$out" || reqs=0
  if [ "$reqs" -eq 0 ]; then
    log "  WARNING: no request to $t completed at $C_RATE req/s in round $r; the run is left out. h2load said:"
    tail -n 20 "$out" >&2
    RESTARTS="${RESTARTS:+$RESTARTS, }$cell-$t (no request completed at the fixed rate in round $r)"
    return 0
  fi
  read -r cpu_us util csw back_us sys_us < <(awk -v c="$(( c1 - c0 ))" -v s="$(( s1 - s0 ))" -v b="$(( b1 - b0 ))" \
    -v k="$(( k1 - k0 ))" -v hz="$CLK_TCK" -v n="$reqs" -v wall="$(( t1 - t0 ))" -v has="$has" 'BEGIN {
      cpu = c / hz * 1e6 / n; util = c / hz / (wall / 1e9) * 100; csw = s / n; sys = k / hz * 1e6 / n
      if (has != 1) { cpu = -1; util = -1; csw = -1; sys = -1 }
      printf "%.2f %.1f %.3f %.2f %.2f\n", cpu, util, csw, b / hz * 1e6 / n, sys }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$cell" "$t" "$r" "$C_RATE" "$rps" "$p50" "$p99" "$reqs" "$non2xx" "$errs" "$cpu_us" "$util" "$csw" "$back_us" "$noisy" "$sys_us" >> "$RATE_RAW"
  log "$(printf '  %-17s %6s req/s offered, %9.0f achieved  p50 %7.3f ms  p99 %7.3f ms  CPU %7s us/req %6s  csw/req %6s  non-2xx %s  errors %s%s' \
    "$t" "$C_RATE" "$rps" "$p50" "$p99" "$( [ -n "$has" ] && echo "$cpu_us" || echo -)" \
    "$( [ -n "$has" ] && echo "$util%" || echo -)" "$( [ -n "$has" ] && echo "$csw" || echo -)" "$non2xx" "$errs" \
    "$( [ "$noisy" = 0 ] || echo '  NOISY (compiler running)')")"
}

# The achieved rate of a warm-up output over the offered one, in percent; empty when
# h2load did not finish.
achieved_pct() {
  grep -q '^finished in' "$1" || return 0
  parse_h2load "$1" | awk -v o="$2" '{ printf "%d\n", $1 / o * 100 }'
}

rate_cell() {
  local cell="$1" t r pct low=100 slow="" started clients
  cell_define "$cell"
  if [ "${#C_TARGETS[@]}" -eq 0 ]; then
    log ""; log "SKIP cell $cell: none of its targets is selected (--targets $TARGETS)"
    SKIPS+=("cell $cell: none of its targets selected")
    return 0
  fi
  started=$SECONDS
  clients="$(rate_clients "$C_LOAD" "$C_CONNS")"
  C_RATE="$(rate_align "${RATE_OPT:-$(rate_default "$cell")}" "$clients")"
  C_OFFERED=$C_RATE
  LOAD_CPUS=$C_LOAD_CPUS
  WRK_THREADS=$(cpu_count "$C_LOAD_CPUS")
  log ""
  log "== cell $cell: $C_TITLE"
  [ -z "$C_NOTE" ] || log "   NOTE: $C_NOTE"
  log "   fixed rate $C_RATE req/s (h2load --rps), ${RATE_ROUNDS} round(s) of ${RATE_DURATION}s; targets: ${C_TARGETS[*]}; proxy on CPU $C_PROXY_CPUS, load on CPU $C_LOAD_CPUS"
  for t in "${C_TARGETS[@]}"; do start_target "$cell" "$t"; done
  # Warm-up at the fixed rate, at least 2 s. A target that falls short of it (under 95 %)
  # would be measured at another rate than its peers: the cell's rate is then lowered,
  # once, to 90 % of the slowest target's, and the report says so.
  for t in "${C_TARGETS[@]}"; do
    start_rate_load "$C_LOAD" "${T_PORT[$t]}" "$C_CONNS" "$C_RATE" "$(( C_WARMUP > 2 ? C_WARMUP : 2 ))" "$WORK/rate-warmup-$cell-$t.txt"
    wait "$LOAD_PID" || true
    pct="$(achieved_pct "$WORK/rate-warmup-$cell-$t.txt" "$C_RATE")"
    if [ -z "$pct" ]; then
      log "   WARNING: h2load did not finish the warm-up of $t; it said:"
      tail -n 5 "$WORK/rate-warmup-$cell-$t.txt" >&2
    elif [ "$pct" -lt "$low" ]; then
      low=$pct; slow=$t
    fi
    if [ "$RATE_SAT" = 1 ]; then
      start_load "$C_LOAD" "${T_PORT[$t]}" "$C_CONNS" "$C_WARMUP" "$WORK/warmup-$cell-$t.txt"
      wait "$LOAD_PID" || true
    fi
  done
  if [ "$low" -lt 95 ]; then
    C_RATE="$(rate_align $(( C_RATE * low * 90 / 10000 )) "$clients")"
    log "   $slow achieved $low% of $C_OFFERED req/s in its warm-up: the cell runs at $C_RATE req/s instead"
    SKIPS+=("cell $cell: $slow achieved $low% of $C_OFFERED req/s in its warm-up, so the cell ran at $C_RATE req/s")
  fi
  for r in $(seq 1 "$RATE_ROUNDS"); do
    log "  round $r/$RATE_ROUNDS"
    for t in "${C_TARGETS[@]}"; do
      rate_run "$cell" "$t" "$r"
      sleep 0.5
    done
    if [ "$RATE_SAT" = 1 ]; then
      log "  round $r/$RATE_ROUNDS at saturation (${C_DURATION}s each)"
      for t in "${C_TARGETS[@]}"; do
        measure_run "$cell" "$t" "$r"
        sleep 0.5
      done
    fi
  done
  for t in "${C_TARGETS[@]}"; do stop_target "$t"; done
  local load="h2load --h1 -c$clients"
  [ "$C_LOAD" != h2 ] || load="h2load -c$clients -m$(( (C_CONNS + clients - 1) / clients ))"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$cell" "$C_TITLE; at the fixed rate: $load --rps=$(( C_RATE / clients ))" "$C_OFFERED" "$C_RATE" "$RATE_ROUNDS" \
    "$RATE_DURATION" "$C_DURATION" "${C_TARGETS[*]}" "$C_CONNS" "$(( SECONDS - started ))" >> "$RATE_CELLS"
  log "   cell $cell took $(( SECONDS - started ))s"
}

RATE_RAW="$WORK/rate-rounds.tsv"
RATE_CELLS="$WORK/rate-cells.tsv"
RAW="$WORK/rounds.tsv"
: > "$RATE_RAW"
: > "$RATE_CELLS"
: > "$RAW"
head -c 16384 /dev/zero | tr '\0' 'x' > "$WORK/body-16384"
head -c 262144 /dev/zero | tr '\0' 'x' > "$WORK/body-262144"
for cell in "${CELL_LIST[@]}"; do rate_cell "$cell"; done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

skips=""
[ "${#SKIPS[@]}" -eq 0 ] || skips="$(printf '%s; ' "${SKIPS[@]}")"
awk -F'\t' -v cmd="$ORIG_CMD" -v nproc="$NPROC" -v cpu_model="$CPU_MODEL" -v kernel="$KERNEL" \
  -v load_before="$LOAD_BEFORE" -v load_after="$LOAD_AFTER" -v tg_rev="$TOLLGATE_REV" -v tg_built="$TOLLGATE_BUILT" \
  -v nginx_ver="$NGINX_VER" -v haproxy_ver="$HAPROXY_VER" -v h2load_ver="$H2LOAD_VER" \
  -v wrk_ver="$WRK_VER" -v pingora_ver="$PINGORA_VER" -v proxy_cpu="$PROXY_CPU" -v load_cpu="$LOAD_CPU" \
  -v sat="$RATE_SAT" -v restarts="$RESTARTS" -v skips="${skips%; }" -v total_secs="$(( SECONDS - STARTED ))" \
  -f "$BENCH_DIR/rate-report.awk" "$RATE_CELLS" "$RATE_RAW" "$RAW" > "$WORK/rate-table.txt"
log ""
cat "$WORK/rate-table.txt"
