# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with bench.sh
# Sourced by scripts/bench.sh: tollgate's memory, measured on a fresh process (retries
# and budget on, one worker thread, pinned like the proxies): idle, with RSS_CONNS idle
# keep-alive connections parked on it, and under RSS_CONNS busy connections. Sets the
# RSS_* and HELD_* figures the report prints.

RSS_IDLE=""; RSS_HELD=""; HELD_OPEN=0; HELD_OK=0; RSS_BUSY=""; RSS_PEAK=""; RSS_AFTER=""
RSS_RPS=0; RSS_P99=0; RSS_REQS=0; RSS_NON2XX=0; RSS_SERR=0

measure_memory() {
  local main admin listen pid fifo ready wrk_bg
  log ""
  log "memory: a fresh tollgate (retries + budget), idle, then $RSS_CONNS connections"
  wait_quiet
  free_port; main=$PORT; free_port; admin=$PORT; free_port; listen=$PORT
  tollgate_conf "$main" "$admin" "$listen" "127.0.0.1:$BACKEND_PORT" http1 1 1 0 > "$WORK/tollgate-rss.toml"
  start tollgate-rss "$PROXY_CPU" env RUST_LOG=info "$TG" run --config "$WORK/tollgate-rss.toml"
  pid=$PID
  wait_ready tollgate-rss "$listen" "$pid"
  sleep 1
  RSS_IDLE="$(status_kb "$pid" VmRSS)"

  # RSS_CONNS idle keep-alive connections, each having sent one request and read its
  # answer (bash /dev/tcp sockets, held open by a background shell until released).
  fifo="$WORK/release"
  ready="$WORK/holder.ready"
  rm -f "$fifo" "$ready"
  mkfifo "$fifo"
  (
    ok=0
    fds=()
    for _ in $(seq 1 "$RSS_CONNS"); do
      exec {fd}<>"/dev/tcp/127.0.0.1/$listen" || break
      fds+=("$fd")
      printf 'GET / HTTP/1.1\r\nHost: backend\r\n\r\n' >&"$fd"
    done
    for fd in "${fds[@]}"; do
      line=""
      read -r -t 5 -u "$fd" line || true
      case "$line" in "HTTP/1.1 200"*) ok=$(( ok + 1 )) ;; esac
    done
    echo "${#fds[@]} $ok" > "$ready"
    read -r _ < "$fifo"
  ) 2>"$WORK/holder.log" &
  HOLDER_PID=$!
  for _ in $(seq 1 300); do [ -s "$ready" ] && break; sleep 0.1; done
  read -r HELD_OPEN HELD_OK < "$ready" || { HELD_OPEN=0; HELD_OK=0; }
  sleep 0.5
  RSS_HELD="$(status_kb "$pid" VmRSS)"
  echo > "$fifo"
  wait "$HOLDER_PID" 2>/dev/null || true
  HOLDER_PID=""
  sleep 1

  # RSS_CONNS busy keep-alive connections: wrk -c RSS_CONNS; VmHWM is the peak.
  LOAD_CPUS=$LOAD_CPU
  start_load get "$listen" "$RSS_CONNS" "$RSS_DURATION" "$WORK/wrk-rss.txt"
  wrk_bg=$LOAD_PID
  sleep "$(( RSS_DURATION / 2 + 1 ))"
  RSS_BUSY="$(status_kb "$pid" VmRSS)"
  wait "$wrk_bg" || true
  RSS_PEAK="$(status_kb "$pid" VmHWM)"
  read -r RSS_RPS _ RSS_P99 RSS_REQS RSS_NON2XX RSS_SERR < <(parse_wrk "$WORK/wrk-rss.txt")
  sleep 1
  RSS_AFTER="$(status_kb "$pid" VmRSS)"
  stop_one "$pid"
  log "$(printf '  idle %s KiB; %s idle connections (%s answered 200) %s KiB; %s busy connections %s KiB, peak (VmHWM) %s KiB; after close %s KiB' \
    "$RSS_IDLE" "$HELD_OPEN" "$HELD_OK" "$RSS_HELD" "$RSS_CONNS" "$RSS_BUSY" "$RSS_PEAK" "$RSS_AFTER")"
  log "$(printf '  under wrk -c%s: %.0f req/s, p99 %.3f ms, %s requests, non-2xx %s, socket errors %s' \
    "$RSS_CONNS" "$RSS_RPS" "$RSS_P99" "$RSS_REQS" "$RSS_NON2XX" "$RSS_SERR")"
}
