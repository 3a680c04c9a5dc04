#!/usr/bin/env bash
# What exactly once costs a POST: the same POSTs through one inbound tollgate with
# `[inbound.dedupe]` on, unkeyed (no store touched), keyed with the memory store, and
# keyed with a Redis store (one redis-server on loopback), in alternating rounds of one
# run, against nginx as the app. Prints the median of the rounds' p50 and p99 latency
# and req/s for each, and the keyed ones' added latency beside the unkeyed.
#
#   scripts/bench/dedupe.sh [--tollgate PATH] [--rounds N] [--seconds S] [--connections C]
#
# Every key is new (a run id, the wrk thread and a counter), so each keyed POST is a
# first arrival: a claim, the app's answer kept, the claim completed (two store round
# trips with Redis). Needs nginx, redis-server and wrk (Debian packages; installed when
# missing, as root). Loopback only; everything it starts, it stops.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOLLGATE_BIN=""
ROUNDS=3
SECONDS_EACH=10
CONNS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --tollgate) TOLLGATE_BIN="${2:?}"; shift 2 ;;
    --rounds) ROUNDS="${2:?}"; shift 2 ;;
    --seconds) SECONDS_EACH="${2:?}"; shift 2 ;;
    --connections) CONNS="${2:?}"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done

need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
if [ -z "$TOLLGATE_BIN" ]; then
  (cd "$ROOT" && cargo build --release --quiet --bin tollgate)
  TOLLGATE_BIN="$ROOT/target/release/tollgate"
fi

WORK="$(mktemp -d /tmp/tollgate-dedupe-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

read -r APP REDIS TG_R ADMIN_R TG_M ADMIN_M <<<"$(python3 "$ROOT/scripts/free-ports.py" 6)"
cat >"$WORK/nginx.conf" <<EOF
daemon off;
worker_processes 1;
error_log $WORK/nginx.err warn;
pid $WORK/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  server { listen 127.0.0.1:$APP; location / { return 200 "booked\n"; } }
}
EOF
"$NGINX" -c "$WORK/nginx.conf" -p "$WORK" &
PIDS+=($!)
redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >"$WORK/redis.out" 2>&1 &
PIDS+=($!)

# tollgate inbound with dedupe on STORE, its listener on port TG.
tollgate_with() { # STORE TG ADMIN NAME
  cat >"$WORK/$4.toml" <<EOF
[runtime]
worker_threads = 1
[listener]
addr = "127.0.0.1:0"
[admin]
addr = "127.0.0.1:$3"
[inbound]
addr = "127.0.0.1:$2"
app = "127.0.0.1:$APP"
[inbound.dedupe]
store = "$1"
EOF
  "$TOLLGATE_BIN" run --config "$WORK/$4.toml" 2>"$WORK/$4.log" &
  PIDS+=($!)
}
tollgate_with "redis://127.0.0.1:$REDIS/0" "$TG_R" "$ADMIN_R" redis
tollgate_with memory "$TG_M" "$ADMIN_M" memory
for port in "$ADMIN_R" "$ADMIN_M"; do
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null || { echo "tollgate did not start" >&2; cat "$WORK"/*.log >&2; exit 1; }
done

cat >"$WORK/keyed.lua" <<'EOF'
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
local n = 0
local run = os.time()
function request()
  n = n + 1
  return wrk.format("POST", "/pay", { ["idempotency-key"] = string.format('"%d-%d-%d"', run, id, n) }, "order")
end
EOF
cat >"$WORK/plain.lua" <<'EOF'
function request()
  return wrk.format("POST", "/pay", {}, "order")
end
EOF

# to_ms VALUE: wrk's latency (us, ms or s) in milliseconds.
to_ms() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /[^m]s$/) n *= 1000; printf "%.3f", n }'; }
declare -A P50 P99 RPS
one() { # NAME PORT SCRIPT
  local out
  out=$(wrk -t1 -c"$CONNS" -d"${SECONDS_EACH}s" --latency -s "$WORK/$3.lua" "http://127.0.0.1:$2/pay")
  P50[$1]+="$(to_ms "$(echo "$out" | awk '$1 == "50%" { print $2 }')") "
  P99[$1]+="$(to_ms "$(echo "$out" | awk '$1 == "99%" { print $2 }')") "
  RPS[$1]+="$(echo "$out" | awk '/Requests\/sec/ { print $2 }') "
}
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r of $ROUNDS" >&2
  one unkeyed "$TG_R" plain
  one keyed-memory "$TG_M" keyed
  one keyed-redis "$TG_R" keyed
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
printf '\n%-14s %10s %10s %10s\n' "POST" "p50 ms" "p99 ms" "req/s"
base50=$(echo "${P50[unkeyed]}" | median)
base99=$(echo "${P99[unkeyed]}" | median)
for k in unkeyed keyed-memory keyed-redis; do
  p50=$(echo "${P50[$k]}" | median)
  p99=$(echo "${P99[$k]}" | median)
  printf '%-14s %10s %10s %10s   (+%s ms p50, +%s ms p99)\n' "$k" "$p50" "$p99" "$(echo "${RPS[$k]}" | median)" \
    "$(awk -v a="$p50" -v b="$base50" 'BEGIN { printf "%.3f", a - b }')" \
    "$(awk -v a="$p99" -v b="$base99" 'BEGIN { printf "%.3f", a - b }')"
done
echo "(medians of $ROUNDS rounds, ${SECONDS_EACH}s each, $CONNS connections, wrk -t1; nginx as the app)"
