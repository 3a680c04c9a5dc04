# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with bench.sh
# Sourced by scripts/bench.sh: the cells of the matrix. Each cell is one job (a load
# shape and what the proxy does with it) and the peers that can do that job; every
# target of a cell is started, run in alternating rounds, and stopped before the next
# cell. This file says what each cell runs; bench.sh measures it.

ALL_CELLS="get,h2c,tls,body16k,body256k,c2000,cores2,inbound"
KNOWN_TARGETS="direct,tollgate,tollgate-noretry,tollgate-log,tollgate-inbound,nginx,haproxy,pingora"

# The second CPU of the two-core cell and the load CPUs beside it: on a machine with
# four CPUs or more, two for the proxy and the rest of the pair for the load; on two
# CPUs the proxy's second worker has to share the load's core.
cores2_cpus() {
  local c extra="" load_extra=""
  for c in $(seq 0 $(( NPROC - 1 ))); do
    if [ "$c" -eq "$PROXY_CPU" ] || [ "$c" -eq "$LOAD_CPU" ]; then continue; fi
    if [ -z "$extra" ]; then extra=$c; elif [ -z "$load_extra" ]; then load_extra=$c; fi
  done
  if [ -n "$extra" ]; then
    CORES2_PROXY="$PROXY_CPU,$extra"
    CORES2_LOAD="$LOAD_CPU${load_extra:+,$load_extra}"
    CORES2_SHARED=0
  else
    CORES2_PROXY="$PROXY_CPU,$LOAD_CPU"
    CORES2_LOAD="$LOAD_CPU"
    CORES2_SHARED=1
  fi
}

# What `tollgate check` said about [inbound]: its first line that names it.
inbound_refusal() {
  { grep -m1 ': inbound' "$WORK/inbound-probe.log" | sed 's/^[^ ]*: //'; } 2>/dev/null || echo "refused"
}

# Whether the binary accepts an [inbound] section: `tollgate check` on a small config.
inbound_supported() {
  local f="$WORK/inbound-probe.toml"
  { tollgate_conf 1 2 3 "127.0.0.1:$BACKEND_PORT" http1 1 1 0; tollgate_inbound_section 4; } > "$f"
  "$TG" check --config "$f" > "$WORK/inbound-probe.log" 2>&1
}

# Sets the cell's settings: C_TITLE, C_LOAD (get | post16k | post256k | h2), C_CONNS,
# C_ROUNDS, C_DURATION, C_WARMUP, C_TARGETS, C_RATIOS (pairs A/B: A's figures over B's,
# paired by round), C_PROXY_CPUS, C_LOAD_CPUS, C_NOTE.
cell_define() {
  local cell="$1" rounds=5 duration=3 warmup=1 t
  local -a targets
  C_LOAD="get"; C_CONNS=$CONNS; C_NOTE=""
  C_PROXY_CPUS=$PROXY_CPU; C_LOAD_CPUS=$LOAD_CPU
  case "$cell" in
    get)
      rounds=8; warmup=2
      C_TITLE="small GET, 1 core: wrk -c$CONNS"
      targets=(direct tollgate tollgate-noretry tollgate-log nginx haproxy pingora)
      C_RATIOS="tollgate/direct tollgate/haproxy tollgate/nginx tollgate/pingora tollgate/tollgate-noretry" ;;
    h2c)
      C_LOAD=h2; C_CONNS=$H2_STREAMS
      C_TITLE="h2c, gRPC-shaped POST (64 B body, grpc-status trailer), 1 core: h2load $H2_STREAMS streams over $H2_CONNS connections"
      targets=(direct tollgate nginx haproxy)
      C_RATIOS="tollgate/direct tollgate/haproxy tollgate/nginx" ;;
    tls)
      C_TITLE="TLS 1.3 to the upstream (verified, SNI), plain HTTP/1.1 in, 1 core: wrk -c$CONNS"
      targets=(tollgate nginx haproxy pingora)
      C_RATIOS="tollgate/haproxy tollgate/nginx tollgate/pingora" ;;
    body16k|body256k)
      C_LOAD="post${cell#body}"
      C_TITLE="${cell#body} POST bodies, 1 core: wrk -c$CONNS"
      targets=(direct tollgate nginx haproxy)
      C_RATIOS="tollgate/direct tollgate/haproxy tollgate/nginx" ;;
    c2000)
      rounds=4; duration=4; warmup=2; C_CONNS=$C2000_CONNS
      C_TITLE="many connections, small GET, 1 core: wrk -c$C2000_CONNS"
      targets=(direct tollgate nginx haproxy)
      C_RATIOS="tollgate/direct tollgate/haproxy tollgate/nginx" ;;
    cores2)
      cores2_cpus
      C_PROXY_CPUS=$CORES2_PROXY; C_LOAD_CPUS=$CORES2_LOAD
      C_TITLE="two cores: 2 workers against 1, the proxy on CPUs $CORES2_PROXY, small GET: wrk -c$CONNS"
      targets=(tollgate-1w tollgate-2w nginx-1w nginx-2w haproxy-1w haproxy-2w)
      C_RATIOS="tollgate-2w/tollgate-1w nginx-2w/nginx-1w haproxy-2w/haproxy-1w tollgate-2w/nginx-2w tollgate-2w/haproxy-2w tollgate-1w/nginx-1w tollgate-1w/haproxy-1w"
      [ "$CORES2_SHARED" = 0 ] || C_NOTE="this machine has $NPROC CPUs: the second worker shares CPU $LOAD_CPU with wrk and the backend, so the scaling factor is a lower bound; it needs 4 CPUs to mean what it says" ;;
    inbound)
      if [ "$INBOUND" = 1 ]; then
        C_TITLE="the inbound hop: app -> caller tollgate -> inbound tollgate -> backend, against one hop; both on 1 core: wrk -c$CONNS"
        C_NOTE="tollgate-chain = caller tollgate -> callee tollgate's [inbound] -> backend; tollgate-inbound = the inbound side alone in front of the backend"
      else
        C_TITLE="two-hop chain (stand-in for the inbound hop): caller tollgate -> second tollgate as a plain outbound proxy -> backend, against one hop; both on 1 core: wrk -c$CONNS"
        C_NOTE="the binary does not accept [inbound] (tollgate check: $(inbound_refusal)): tollgate-chain is the two-hop outbound chain, not the inbound side"
      fi
      targets=(direct tollgate tollgate-chain)
      C_RATIOS="tollgate-chain/tollgate tollgate/direct"
      if [ "$INBOUND" = 1 ]; then
        targets=(direct tollgate tollgate-inbound tollgate-chain)
        C_RATIOS="$C_RATIOS tollgate-inbound/direct tollgate-inbound/tollgate"
      fi ;;
    *) die "unknown cell '$cell' (known: $ALL_CELLS)" ;;
  esac
  C_ROUNDS=${ROUNDS_OPT:-$rounds}
  C_DURATION=${DURATION_OPT:-$duration}
  C_WARMUP=${WARMUP_OPT:-$warmup}
  C_TARGETS=()
  for t in "${targets[@]}"; do
    case ",$TARGETS," in *",${t%-[12]w},"*|*",${t%-chain},"*) ;; *) continue ;; esac
    [ "$t" != pingora ] || [ -n "$PINGORA_BIN" ] || continue
    C_TARGETS+=("$t")
    # The build it is compared with (--compare) runs right after it.
    if [ "$t" = tollgate ] && [ -n "$TG_B" ]; then
      C_TARGETS+=(tollgate-b)
      C_RATIOS="$C_RATIOS tollgate/tollgate-b"
    fi
  done
}

# The upstream a proxy of this cell speaks to: port, tollgate protocol, proxy mode.
cell_upstream() {
  case "$1" in
    h2c) UP_PORT=$BACKEND_H2_PORT; UP_PROTO=h2c; UP_MODE=h2c; UP_TLS=0 ;;
    tls) UP_PORT=$BACKEND_TLS_PORT; UP_PROTO=http1; UP_MODE=tls; UP_TLS=1 ;;
    body16k|body256k) UP_PORT=$BACKEND_BODY_PORT; UP_PROTO=http1; UP_MODE=h1; UP_TLS=0 ;;
    *) UP_PORT=$BACKEND_PORT; UP_PROTO=http1; UP_MODE=h1; UP_TLS=0 ;;
  esac
}

# The command line of a one-process target (in T_CMD), its port and how to see that
# it is ready (h1 or h2). Writes its config. $1 cell, $2 target.
declare -A T_PORT=() T_PIDS=() T_KIND=()
target_prepare() {
  local cell="$1" t="$2" name="$1-$2" workers=1 retries=1 main admin listen bin="$TG"
  cell_upstream "$cell"
  case "$t" in *-2w) workers=2 ;; esac
  [ "$t" != tollgate-noretry ] || retries=0
  T_KIND[$t]=h1
  [ "$UP_MODE" != h2c ] || T_KIND[$t]=h2
  case "$t" in
    direct)
      T_CMD=(); T_PORT[$t]=$UP_PORT ;;
    tollgate|tollgate-b|tollgate-noretry|tollgate-log|tollgate-1w|tollgate-2w)
      [ "$t" != tollgate-b ] || bin="$TG_B"
      free_port; main=$PORT; free_port; admin=$PORT; free_port; listen=$PORT
      tollgate_conf "$main" "$admin" "$listen" "127.0.0.1:$UP_PORT" "$UP_PROTO" "$retries" "$workers" "$UP_TLS" > "$WORK/$name.toml"
      # The access log on, its lines to the target's log file as a container's go to
      # its log pipe.
      [ "$t" != tollgate-log ] || printf '[access_log]\nenabled = true\n' >> "$WORK/$name.toml"
      "$bin" check --config "$WORK/$name.toml" > "$WORK/$name.check.log" 2>&1 || {
        cat "$WORK/$name.check.log" >&2; die "tollgate check rejected the config of $name ($WORK/$name.toml)"; }
      T_CMD=(env RUST_LOG=info "$bin" run --config "$WORK/$name.toml"); T_PORT[$t]=$listen ;;
    tollgate-inbound)
      free_port; main=$PORT; free_port; admin=$PORT; free_port; listen=$PORT; free_port
      { tollgate_conf "$main" "$admin" "$listen" "127.0.0.1:$BACKEND_PORT" http1 1 1 0
        tollgate_inbound_section "$PORT"; } > "$WORK/$name.toml"
      T_CMD=(env RUST_LOG=info "$TG" run --config "$WORK/$name.toml"); T_PORT[$t]=$PORT ;;
    nginx|nginx-1w|nginx-2w)
      free_port; T_PORT[$t]=$PORT
      nginx_proxy_conf "$name" "$PORT" "$UP_MODE" "$workers" > "$WORK/$name.conf"
      T_CMD=("$NGINX" -e "$WORK/$name.log" -p "$WORK/$name" -c "$WORK/$name.conf") ;;
    haproxy|haproxy-1w|haproxy-2w)
      free_port; T_PORT[$t]=$PORT
      haproxy_conf "$PORT" "$UP_MODE" "$workers" > "$WORK/$name.cfg"
      T_CMD=("$HAPROXY" -db -f "$WORK/$name.cfg") ;;
    pingora)
      free_port; T_PORT[$t]=$PORT
      mkdir -p "$WORK/$name"
      T_CMD=("$PINGORA_BIN" "127.0.0.1:$PORT" "127.0.0.1:$UP_PORT" "$WORK/$name")
      [ "$UP_TLS" = 0 ] || T_CMD+=("$TLS_NAME" "$WORK/tls/ca.pem") ;;
    *) die "target $t does not run as one process" ;;
  esac
}

# Starts a target of a cell pinned to the cell's proxy CPUs, and waits until it answers.
start_target() {  # $1 cell, $2 target
  local cell="$1" t="$2" name="$1-$2" main admin listen inb callee_pid callee_port
  if [ "$t" = tollgate-chain ]; then
    # The callee's sidecar first, then the caller's, whose upstream it is.
    free_port; main=$PORT; free_port; admin=$PORT; free_port; listen=$PORT
    if [ "$INBOUND" = 1 ]; then
      free_port; inb=$PORT
      { tollgate_conf "$main" "$admin" "$listen" "127.0.0.1:$BACKEND_PORT" http1 1 1 0
        tollgate_inbound_section "$inb"; } > "$WORK/$name-callee.toml"
      callee_port=$inb
    else
      tollgate_conf "$main" "$admin" "$listen" "127.0.0.1:$BACKEND_PORT" http1 1 1 0 > "$WORK/$name-callee.toml"
      callee_port=$listen
    fi
    start "$name-callee" "$C_PROXY_CPUS" env RUST_LOG=info "$TG" run --config "$WORK/$name-callee.toml"
    callee_pid=$PID
    wait_ready "$name-callee" "$callee_port" "$callee_pid"
    free_port; main=$PORT; free_port; admin=$PORT; free_port; listen=$PORT
    tollgate_conf "$main" "$admin" "$listen" "127.0.0.1:$callee_port" http1 1 1 0 > "$WORK/$name.toml"
    start "$name" "$C_PROXY_CPUS" env RUST_LOG=info "$TG" run --config "$WORK/$name.toml"
    T_PIDS[$t]="$PID $callee_pid"; T_PORT[$t]=$listen; T_KIND[$t]=h1
    wait_ready "$name" "$listen" "${T_PIDS[$t]}"
    return 0
  fi
  target_prepare "$cell" "$t"
  if [ "$t" = direct ]; then T_PIDS[$t]=""; return 0; fi
  start "$name" "$C_PROXY_CPUS" "${T_CMD[@]}"
  T_PIDS[$t]=$PID
  wait_ready "$name" "${T_PORT[$t]}" "$PID" "${T_KIND[$t]}"
}

stop_target() {
  local p
  for p in ${T_PIDS[$1]}; do stop_one "$p"; done
  T_PIDS[$1]=""
}
