# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with bench.sh
# Sourced by scripts/bench.sh: runs one cell of the matrix. Starts the cell's targets,
# warms each up, then runs them in turn, round after round (so a slow minute of a
# shared machine hits every target rather than one), and stops them. Each run appends
# one line to $RAW:
#   cell target round rps p50_ms p99_ms requests cpu_us_per_req cpu_percent
#   core_us_per_req non2xx socket_errors noisy other_proxy_cpu_pct other_load_cpu_pct rss_kib
# (cpu_us_per_req, cpu_percent and rss_kib are -1 where there is no proxy: direct).

RESTARTS=""

# A process that went away between runs (a crash, or a signal from outside) is reported
# with its exit status, restarted, and named in the report.
ensure_backend() {
  local rc=0
  if ! kill -0 "$BACKEND_PID" 2>/dev/null; then
    wait "$BACKEND_PID" 2>/dev/null || rc=$?
    log "  WARNING: the backend (pid $BACKEND_PID) exited with status $rc between runs; restarting it. Its log:"
    tail -n 20 "$WORK/backend.log" >&2 || true
    RESTARTS="${RESTARTS:+$RESTARTS, }backend (exit status $rc)"
    start_backend
  fi
  if ! kill -0 "$H2_BACKEND_PID" 2>/dev/null; then
    rc=0
    wait "$H2_BACKEND_PID" 2>/dev/null || rc=$?
    log "  WARNING: the h2c backend (pid $H2_BACKEND_PID) exited with status $rc between runs; restarting it. Its log:"
    tail -n 20 "$WORK/h2-backend.log" >&2 || true
    RESTARTS="${RESTARTS:+$RESTARTS, }h2c backend (exit status $rc)"
    start_h2_backend
  fi
}

ensure_target() {  # $1 cell, $2 target
  local p rc=0 dead=""
  for p in ${T_PIDS[$2]}; do kill -0 "$p" 2>/dev/null || dead=$p; done
  [ -n "$dead" ] || return 0
  wait "$dead" 2>/dev/null || rc=$?
  log "  WARNING: $1-$2 (pid $dead) exited with status $rc between runs; restarting it. Its log:"
  tail -n 20 "$WORK/$1-$2.log" >&2 || true
  RESTARTS="${RESTARTS:+$RESTARTS, }$1-$2 (exit status $rc)"
  stop_target "$2"
  start_target "$1" "$2"
}

cpu_count() { local -a a; IFS=, read -r -a a <<<"$1"; echo "${#a[@]}"; }

# The union of two CPU lists, when they overlap (else empty).
cpus_overlap() {
  local c
  for c in ${1//,/ }; do case ",$2," in *",$c,"*) echo "$1,$2"; return ;; esac; done
}

# One measured run of one target. $1 cell, $2 target, $3 round.
measure_run() {
  local cell="$1" t="$2" r="$3" out="$WORK/load-$1-$2-$3.txt" has="" noisy=0 union
  local -a pids
  local c0=0 c1=0 b0 b1 w0 w1 p0task p0busy p0total p1task p1busy p1total l0task l0total l1task l1total
  local t0 t1 rss=-1 rps p50 p99 reqs non2xx serr cpu_us util core_us other0 other1 flag util_s
  wait_quiet
  ensure_backend
  [ "$t" = direct ] || ensure_target "$cell" "$t"
  compiler_running && noisy=1
  read -r -a pids <<<"${T_PIDS[$t]}"
  [ "${#pids[@]}" -eq 0 ] || has=1
  union="$(cpus_overlap "$C_PROXY_CPUS" "$C_LOAD_CPUS")"
  [ -z "$has" ] || c0="$(cpu_ticks "${pids[@]}")"
  b0="$(cpu_ticks "$BACKEND_PID" "$H2_BACKEND_PID")"
  w0="$(child_ticks)"
  read -r p0task p0busy p0total < <(core_ticks "$C_PROXY_CPUS")
  read -r l0task _ l0total < <(core_ticks "${union:-$C_LOAD_CPUS}")
  t0="$(date +%s%N)"
  start_load "$C_LOAD" "${T_PORT[$t]}" "$C_CONNS" "$C_DURATION" "$out"
  # Memory in the middle of the run, all the target's processes together.
  sleep "$(awk -v d="$C_DURATION" 'BEGIN { print d / 2 }')"
  [ -z "$has" ] || rss="$(rss_tree "${pids[@]}")"
  wait "$LOAD_PID" || true
  t1="$(date +%s%N)"
  read -r p1task p1busy p1total < <(core_ticks "$C_PROXY_CPUS")
  read -r l1task _ l1total < <(core_ticks "${union:-$C_LOAD_CPUS}")
  w1="$(child_ticks)"
  b1="$(cpu_ticks "$BACKEND_PID" "$H2_BACKEND_PID")"
  [ -z "$has" ] || c1="$(cpu_ticks "${pids[@]}")"
  compiler_running && noisy=1
  read -r rps p50 p99 reqs non2xx serr < <(parse_load "$C_LOAD" "$out")
  if [ "$reqs" -eq 0 ]; then
    log "  WARNING: no request to $t completed in round $r; the run is left out. The load generator said:"
    tail -n 20 "$out" >&2
    RESTARTS="${RESTARTS:+$RESTARTS, }$cell-$t (no request completed in round $r)"
    return 0
  fi
  # Proxy CPU per request (process utime+stime), its CPU share over the run, and the
  # busy time of the proxy's cores per request (kernel softirq work included).
  # "other": the share of each CPU set that went to tasks not part of the benchmark,
  # or to the hypervisor (steal); over both sets together when they overlap.
  read -r cpu_us util core_us other0 other1 < <(awk -v c="$(( c1 - c0 ))" -v hz="$CLK_TCK" -v n="$reqs" \
    -v kb="$(( p1busy - p0busy ))" -v wall="$(( t1 - t0 ))" -v has="$has" -v shared="${union:+1}" \
    -v o0="$(( p1task - p0task - (c1 - c0) ))" -v t0="$(( p1total - p0total ))" \
    -v o1="$(( l1task - l0task - (b1 - b0) - (w1 - w0) ))" -v t1="$(( l1total - l0total ))" -v oc="$(( c1 - c0 ))" 'BEGIN {
      cpu = c / hz * 1e6 / n
      util = c / hz / (wall / 1e9) * 100
      if (has != 1) { cpu = -1; util = -1 }
      if (shared == 1) { o1 -= oc; o0 = o1; t0 = t1 }
      if (o0 < 0) o0 = 0
      if (o1 < 0) o1 = 0
      printf "%.2f %.1f %.2f %.1f %.1f\n", cpu, util, kb / hz * 1e6 / n, (t0 > 0 ? o0 / t0 * 100 : 0), (t1 > 0 ? o1 / t1 * 100 : 0) }')
  # direct uses only the load CPUs: what runs on the proxy's does not disturb it.
  local o0eff="$other0"
  [ -n "$has" ] || o0eff=0
  awk -v a="$o0eff" -v b="$other1" -v lim="$NOISE_PCT" 'BEGIN { exit !(a > lim || b > lim) }' && noisy=1
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$cell" "$t" "$r" "$rps" "$p50" "$p99" "$reqs" "$cpu_us" "$util" "$core_us" "$non2xx" "$serr" "$noisy" "$other0" "$other1" "$rss" >> "$RAW"
  flag=""; [ "$noisy" = 0 ] || flag="  NOISY"
  util_s="$util%"; [ -n "$has" ] || util_s="-"
  log "$(printf '  %-17s %9.0f req/s  p50 %7.3f ms  p99 %7.3f ms  CPU %6s  RSS %6s  non-2xx %s  errors %s  other load: %s%%, %s%%%s' \
    "$t" "$rps" "$p50" "$p99" "$util_s" "$( [ "$rss" -lt 0 ] && echo - || echo "$(( rss / 1024 ))M")" "$non2xx" "$serr" "$other0" "$other1" "$flag")"
}

run_cell() {
  local cell="$1" t r started
  cell_define "$cell"
  if [ "${#C_TARGETS[@]}" -eq 0 ]; then
    log ""; log "SKIP cell $cell: none of its targets is selected (--targets $TARGETS)"
    SKIPS+=("cell $cell: none of its targets selected")
    return 0
  fi
  started=$SECONDS
  LOAD_CPUS=$C_LOAD_CPUS
  WRK_THREADS=$(cpu_count "$C_LOAD_CPUS")
  log ""
  log "== cell $cell: $C_TITLE"
  [ -z "$C_NOTE" ] || log "   NOTE: $C_NOTE"
  log "   ${C_ROUNDS} round(s) of ${C_DURATION}s after ${C_WARMUP}s of warm-up; targets: ${C_TARGETS[*]}; proxy on CPU $C_PROXY_CPUS, load on CPU $C_LOAD_CPUS"
  for t in "${C_TARGETS[@]}"; do start_target "$cell" "$t"; done
  for t in "${C_TARGETS[@]}"; do
    start_load "$C_LOAD" "${T_PORT[$t]}" "$C_CONNS" "$C_WARMUP" "$WORK/warmup-$cell-$t.txt"
    wait "$LOAD_PID" || true
  done
  for r in $(seq 1 "$C_ROUNDS"); do
    log "  round $r/$C_ROUNDS"
    for t in "${C_TARGETS[@]}"; do
      measure_run "$cell" "$t" "$r"
      sleep 0.5
    done
  done
  [ "$cell" != get ] || [ "$MEMORY" = 0 ] || measure_memory
  for t in "${C_TARGETS[@]}"; do stop_target "$t"; done
  # Anything tollgate logged at warn or above while under load.
  local f n warn=0
  for f in "$WORK/$cell"-tollgate*.log; do
    [ -e "$f" ] || continue
    n="$(grep -ciE '"level":"(WARN|ERROR)"|  WARN |  ERROR | WARN | ERROR ' "$f" || true)"
    warn=$(( warn + n ))
  done
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$cell" "$C_TITLE" "$C_NOTE" "$C_ROUNDS" "$C_DURATION" \
    "$C_PROXY_CPUS" "$C_LOAD_CPUS" "$C_RATIOS" "${C_TARGETS[*]}" "$warn" "$(( SECONDS - started ))" >> "$CELLS_TSV"
  log "   cell $cell took $(( SECONDS - started ))s"
}
