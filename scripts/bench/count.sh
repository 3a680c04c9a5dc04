# Sourced by scripts/bench.sh --count, after the backend is up: for each proxy target,
# the user-space instructions and the system calls it spends per request. Unlike req/s,
# these do not move with the host's load, so two builds (or two proxies) compare
# exactly. Uses bench.sh's configs, ports, helpers and cleanup.

# Stops one process started with `start` and waits for it (bounded).
stop_one() {
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# Like wait_ready, with the patience valgrind needs (a program starts some 50x slower).
wait_ready_slow() {
  local name="$1" port="$2" pid="$3"
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$WORK/$name.log" >&2 || true; die "$name exited at start"; }
    [ "$(http_status "$port")" = 200 ] && return 0
    sleep 0.1
  done
  die "$name on 127.0.0.1:$port did not answer 200 within 60 s"
}

# callgrind_each OPTION PIDS: callgrind_control OPTION PID for each of PIDS; true if
# any of them is a callgrind that answered.
callgrind_each() {
  local p ok=1
  for p in $2; do callgrind_control "$1" "$p" > /dev/null 2>&1 && ok=0; done
  return "$ok"
}

requests_of() { awk '/ requests in /{ print $1 }' "$1"; }

log ""
log "== instructions and system calls per request (${DURATION}s each)"
COUNT_TABLE="$WORK/count.txt"
printf '%-18s %14s %12s   %s\n' target "instr/req" "syscalls/req" "system calls per request" > "$COUNT_TABLE"
for t in "${TARGET_LIST[@]}"; do
  [ "$t" != direct ] || continue
  target_cmd "$t"

  # Instructions: callgrind, counters zeroed after a warm-up and dumped after the run,
  # so start-up and shutdown are left out. Every process of the target is counted
  # (nginx's master and worker). callgrind_control is always given the processes'
  # ids: without one it zeroes and dumps every callgrind on the machine, other
  # people's included.
  log "$t under callgrind ..."
  start "$t-callgrind" "$PROXY_CPU" valgrind --tool=callgrind --trace-children=yes \
    --callgrind-out-file="$WORK/callgrind-$t.%p" "${T_CMD[@]}"
  cg_pid=$PID
  wait_ready_slow "$t-callgrind" "${T_PORT[$t]}" "$cg_pid"
  taskset -c "$LOAD_CPU" "$WRK" -t1 -c8 -d2s "http://127.0.0.1:${T_PORT[$t]}/" > /dev/null 2>&1 || true
  cg_pids="$(proc_tree "$cg_pid")"
  callgrind_each -z "$cg_pids" || die "callgrind_control -z failed"
  taskset -c "$LOAD_CPU" "$WRK" -t1 -c8 -d"$DURATION"s "http://127.0.0.1:${T_PORT[$t]}/" > "$WORK/count-cg-$t.txt" 2>&1 || true
  callgrind_each -d "$cg_pids" || die "callgrind_control -d failed"
  stop_one "$cg_pid"
  instr="$(cat "$WORK"/callgrind-"$t".*.1 2>/dev/null | awk '/^summary:/ { s += $2 } END { print s + 0 }')"
  cg_reqs="$(requests_of "$WORK/count-cg-$t.txt")"
  [ "${cg_reqs:-0}" -gt 0 ] || die "$t answered no request under callgrind"

  # System calls: strace -c on every process of the target, during a normal run.
  log "$t under strace ..."
  start_target "$t"
  pids=()
  for p in $(proc_tree "${T_PID[$t]}"); do pids+=(-p "$p"); done
  taskset -c "$LOAD_CPU" "$WRK" -t1 -c64 -d2s "http://127.0.0.1:${T_PORT[$t]}/" > /dev/null 2>&1 || true
  strace -c -f -o "$WORK/strace-$t.txt" "${pids[@]}" 2>/dev/null &
  st_pid=$!
  sleep 1
  taskset -c "$LOAD_CPU" "$WRK" -t1 -c64 -d"$DURATION"s "http://127.0.0.1:${T_PORT[$t]}/" > "$WORK/count-st-$t.txt" 2>&1 || true
  kill -INT "$st_pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$st_pid" 2>/dev/null || break; sleep 0.1; done
  wait "$st_pid" 2>/dev/null || true
  stop_one "${T_PID[$t]}"
  st_reqs="$(requests_of "$WORK/count-st-$t.txt")"
  [ "${st_reqs:-0}" -gt 0 ] || die "$t answered no request under strace"
  # strace -c: "% time seconds usecs/call calls [errors] syscall", then a total line.
  calls="$(awk -v n="$st_reqs" '$1 ~ /^[0-9.]+$/ && $NF != "total" { printf "%s %.2f\n", $NF, $4 / n }' \
    "$WORK/strace-$t.txt" | sort -k2 -rn)"
  per_req="$(printf '%s\n' "$calls" | awk '{ s += $2 } END { printf "%.2f", s }')"
  detail="$(printf '%s\n' "$calls" | awk '$2 >= 0.05 { printf "%s%s %s", (k++ ? ", " : ""), $1, $2 }')"
  printf '%-18s %14.0f %12s   %s\n' "$t" "$(( instr / cg_reqs ))" "$per_req" "$detail" >> "$COUNT_TABLE"
done
log ""
cat "$COUNT_TABLE"
