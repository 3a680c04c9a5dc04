# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with bench.sh
# Sourced by scripts/bench.sh --count, after the backend is up: for each proxy target of
# each counted cell, the user-space instructions and the system calls it spends per
# request. Unlike req/s, these do not move with the host's load, so two builds (or two
# proxies) compare exactly. Uses bench.sh's configs, ports, functions and cleanup.

# callgrind_each OPTION PIDS: callgrind_control OPTION PID for each of PIDS; true if any
# of them is a callgrind that answered. callgrind_control is always given the
# processes' ids: without one it zeroes and dumps every callgrind on the machine, other
# people's included.
callgrind_each() {
  local p ok=1
  for p in $2; do callgrind_control "$1" "$p" > /dev/null 2>&1 && ok=0; done
  return "$ok"
}

requests_of() { parse_load "$1" "$2" | awk '{ print $4 }'; }

# One cell: callgrind and strace for each one-process proxy target.
count_cell() {
  local cell="$1" t instr cg_pid cg_pids cg_reqs st_pid st_reqs calls per_req detail p
  local -a pids
  cell_define "$cell"
  LOAD_CPUS=$C_LOAD_CPUS
  WRK_THREADS=$(cpu_count "$C_LOAD_CPUS")
  log ""
  log "== $cell: $C_TITLE (instructions and system calls per request, ${COUNT_DURATION}s each)"
  printf '\n%s: %s\n' "$cell" "$C_TITLE" >> "$COUNT_TABLE"
  printf '%-18s %14s %12s   %s\n' target "instr/req" "syscalls/req" "system calls per request" >> "$COUNT_TABLE"
  for t in "${C_TARGETS[@]}"; do
    [ "$t" != direct ] || continue
    case "$t" in *-chain) log "SKIP --count for $t: it runs as two processes"; continue ;; esac
    target_prepare "$cell" "$t"

    # Instructions: callgrind, counters zeroed after a warm-up and dumped after the run,
    # so start-up and shutdown are left out. Every process of the target is counted
    # (nginx's master and worker). 8 connections (h2c: 8 streams): under callgrind a
    # proxy runs some 50 times slower.
    log "$t under callgrind ..."
    start "$cell-$t-callgrind" "$C_PROXY_CPUS" valgrind --tool=callgrind --trace-children=yes \
      --callgrind-out-file="$WORK/callgrind-$cell-$t.%p" "${T_CMD[@]}"
    cg_pid=$PID
    wait_ready "$cell-$t-callgrind" "${T_PORT[$t]}" "$cg_pid" "${T_KIND[$t]}" 600
    start_load "$C_LOAD" "${T_PORT[$t]}" 8 2 "$WORK/count-warm-$cell-$t.txt"
    wait "$LOAD_PID" || true
    cg_pids="$(proc_tree "$cg_pid")"
    callgrind_each -z "$cg_pids" || die "callgrind_control -z failed"
    start_load "$C_LOAD" "${T_PORT[$t]}" 8 "$COUNT_DURATION" "$WORK/count-cg-$cell-$t.txt"
    wait "$LOAD_PID" || true
    callgrind_each -d "$cg_pids" || die "callgrind_control -d failed"
    stop_one "$cg_pid"
    instr="$(cat "$WORK/callgrind-$cell-$t".*.1 2>/dev/null | awk '/^summary:/ { s += $2 } END { print s + 0 }')"
    cg_reqs="$(requests_of "$C_LOAD" "$WORK/count-cg-$cell-$t.txt")"
    [ "${cg_reqs:-0}" -gt 0 ] || die "$cell-$t answered no request under callgrind"

    # System calls: strace -c on every process of the target, during a normal run.
    log "$t under strace ..."
    start_target "$cell" "$t"
    pids=()
    for p in $(proc_tree "${T_PIDS[$t]}"); do pids+=(-p "$p"); done
    start_load "$C_LOAD" "${T_PORT[$t]}" "$C_CONNS" 2 "$WORK/count-warm2-$cell-$t.txt"
    wait "$LOAD_PID" || true
    strace -c -f -o "$WORK/strace-$cell-$t.txt" "${pids[@]}" 2>/dev/null &
    st_pid=$!
    sleep 1
    start_load "$C_LOAD" "${T_PORT[$t]}" "$C_CONNS" "$COUNT_DURATION" "$WORK/count-st-$cell-$t.txt"
    wait "$LOAD_PID" || true
    kill -INT "$st_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$st_pid" 2>/dev/null || break; sleep 0.1; done
    wait "$st_pid" 2>/dev/null || true
    stop_target "$t"
    st_reqs="$(requests_of "$C_LOAD" "$WORK/count-st-$cell-$t.txt")"
    [ "${st_reqs:-0}" -gt 0 ] || die "$cell-$t answered no request under strace"
    # strace -c: "% time seconds usecs/call calls [errors] syscall", then a total line.
    calls="$(awk -v n="$st_reqs" '$1 ~ /^[0-9.]+$/ && $NF != "total" { printf "%s %.2f\n", $NF, $4 / n }' \
      "$WORK/strace-$cell-$t.txt" | sort -k2 -rn)"
    per_req="$(printf '%s\n' "$calls" | awk '{ s += $2 } END { printf "%.2f", s }')"
    detail="$(printf '%s\n' "$calls" | awk '$2 >= 0.05 { printf "%s%s %s", (k++ ? ", " : ""), $1, $2 }')"
    printf '%-18s %14.0f %12s   %s\n' "$t" "$(( instr / cg_reqs ))" "$per_req" "$detail" >> "$COUNT_TABLE"
  done
}

COUNT_TABLE="$WORK/count.txt"
: > "$COUNT_TABLE"
COUNT_DURATION=${DURATION_OPT:-3}
for cell in "${COUNT_CELLS[@]}"; do
  case "$cell" in
    get|h2c|tls|body16k|body256k|c2000|inbound) count_cell "$cell" ;;
    *) log "SKIP --count for cell $cell: its targets run as more than one process or on more than one core"
       printf '\n%s: not counted (more than one process or core per target)\n' "$cell" >> "$COUNT_TABLE" ;;
  esac
done
log ""
cat "$COUNT_TABLE"
