#!/usr/bin/env bash
# The soak: tollgate (release build) under mixed load for MINUTES (default 10) while its
# upstream flaps and its config is rewritten, watching for anything that grows.
#
#   scripts/soak.sh [MINUTES]
#
# - upstreams (scripts/soak/upstream.py): one flapping between healthy, failing (503,
#   half with Retry-After) and down (connection refused), each phase 15-30 s; one
#   always up. Upstream `api` has both endpoints (retries can go to the good one),
#   `solo` only the flapping one.
# - load: scripts/soak/load.py (HTTP/1.1: GETs, POSTs with bodies, slow responses,
#   oversized bodies, abandoned requests, connection churn); h2c GETs and POSTs from
#   h2load (apt-get install -y nghttp2-client), else curl in a loop; and wrk
#   (scripts/soak/mixed.lua, apt-get install -y wrk) when installed.
# - the config file is rewritten (write and rename) every 20 s, alternating two
#   versions (retry and budget settings, an extra upstream added and removed).
# - every 30 s: RSS, open file descriptors, threads, tollgate_upstream_connections,
#   established sockets (ss). Reported at start, end and after the load stops, with
#   request totals, reloads, and the warnings and errors tollgate logged.
#
# Needs python3, curl and ss; h2load and wrk optional. Exits 1 when tollgate died, did not drain
# cleanly, or the descriptors or connections left after the load stopped look leaked.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes="${1:-10}"
seconds=$(( minutes * 60 ))
target_dir="${CARGO_TARGET_DIR:-target}"
work="$(mktemp -d "${TMPDIR:-/tmp}/tollgate-soak.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

step() { printf '\n==> %s\n' "$*"; }

step "building tollgate (release)"
cargo build --release --quiet --bin tollgate
bin="$target_dir/release/tollgate"

read -r port admin flap stable <<<"$(python3 scripts/free-ports.py 4)"
config="$work/tollgate.toml"

write_config() { # $1: a or b
  local attempts=3 ratio=0.1 extra=""
  if [ "$1" = b ]; then
    attempts=2; ratio=0.2
    extra="[upstreams.extra]
authorities = [\"extra\"]
endpoints = [\"127.0.0.1:$stable\"]"
  fi
  cat > "$config.tmp" <<EOF
# soak config, version $1
[listener]
addr = "127.0.0.1:$port"
drain_timeout = "5s"
[admin]
addr = "127.0.0.1:$admin"

[upstreams.api]
authorities = ["api"]
endpoints = ["127.0.0.1:$flap", "127.0.0.1:$stable"]
protocol = "http1"
request_timeout = "2s"
attempt_timeout = "1s"
[upstreams.api.retry]
max_attempts = $attempts
[upstreams.api.budget]
ratio = $ratio

[upstreams.solo]
authorities = ["solo"]
endpoints = ["127.0.0.1:$flap"]
protocol = "http1"
request_timeout = "2s"
attempt_timeout = "1s"
[upstreams.solo.retry]
max_attempts = 2
[upstreams.solo.budget]

$extra
EOF
  mv "$config.tmp" "$config"
}

metrics() { curl -s "http://127.0.0.1:$admin/metrics"; }
gauge() { # $1: series; prints its value or 0
  metrics | awk -v s="$1" 'index($0, s" ") == 1 { print $2; found=1 } END { if (!found) print 0 }'
}
sample() { # one CSV line
  local rss fds threads api solo estab
  rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$tg/status")
  fds=$(ls "/proc/$tg/fd" | wc -l)
  threads=$(awk '/^Threads:/ { print $2 }' "/proc/$tg/status")
  api=$(gauge 'tollgate_upstream_connections{upstream="api"}')
  solo=$(gauge 'tollgate_upstream_connections{upstream="solo"}')
  estab=$(ss -Htnp state established 2>/dev/null | grep -c "pid=$tg," || true)
  echo "$(date +%s),$rss,$fds,$threads,$api,$solo,$estab"
}
show() { # $1: label, $2: CSV line
  IFS=, read -r _ rss fds threads api solo estab <<< "$2"
  printf '%-22s RSS %6d KiB  fds %5d  threads %3d  upstream connections api %s solo %s  established sockets %s\n' \
    "$1" "$rss" "$fds" "$threads" "$api" "$solo" "$estab"
}

step "starting upstreams (flapping :$flap, stable :$stable) and tollgate (:$port, admin :$admin)"
python3 scripts/soak/upstream.py "$flap" "$stable" > "$work/upstream.log" 2>&1 &
pids+=($!)
write_config a
RUST_LOG=info "$bin" run --config "$config" 2> "$work/tollgate.log" &
tg=$!
pids+=("$tg")
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$admin/readyz" > /dev/null && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$admin/readyz" > /dev/null || { echo "tollgate did not start"; cat "$work/tollgate.log"; exit 1; }

step "load for ${minutes} min (work dir: $work)"
load_pids=()
python3 scripts/soak/load.py "127.0.0.1:$port" "$seconds" 16 > "$work/load.json" 2> "$work/load.err" &
load_pid=$!; load_pids+=("$load_pid")
if command -v h2load > /dev/null; then
  head -c 16384 /dev/urandom > "$work/body.bin"
  h2load -D "$seconds" -c 2 -m 8 --rps 100 -H ':authority: api' \
    "http://127.0.0.1:$port/h2" > "$work/h2load-get.txt" 2>&1 &
  load_pids+=($!)
  h2load -D "$seconds" -c 1 -m 4 --rps 25 -d "$work/body.bin" -H ':authority: api' \
    "http://127.0.0.1:$port/h2/echo" > "$work/h2load-post.txt" 2>&1 &
  load_pids+=($!)
else
  # One connection at a time: curl 7.88 fails parallel transfers with prior knowledge.
  ( end=$(( $(date +%s) + seconds ))
    while [ "$(date +%s)" -lt "$end" ]; do
      urls=(); for i in $(seq 32); do urls+=("http://127.0.0.1:$port/h2/$i"); done
      curl -s --http2-prior-knowledge -H 'Host: api' \
        -o /dev/null -w '%{http_code}\n' --max-time 5 "${urls[@]}" || true
    done > "$work/h2.codes" 2>/dev/null ) &
  load_pids+=($!)
fi
if command -v wrk > /dev/null; then
  wrk -t1 -c8 -d"${seconds}s" -s scripts/soak/mixed.lua "http://127.0.0.1:$port/" > "$work/wrk.txt" 2>&1 &
  load_pids+=($!)
else
  echo "(wrk not installed: HTTP/1.1 load from load.py only)" > "$work/wrk.txt"
fi
pids+=("${load_pids[@]}")
( version=b
  while kill -0 "$load_pid" 2>/dev/null; do
    sleep 20
    write_config "$version"
    if [ "$version" = a ]; then version=b; else version=a; fi
  done ) &
pids+=($!)

echo "time,rss_kib,fds,threads,conns_api,conns_solo,established" > "$work/samples.csv"
sleep 5
start=$(sample); echo "$start" >> "$work/samples.csv"; show "start (under load)" "$start"
end_at=$(( $(date +%s) + seconds - 10 ))
while [ "$(date +%s)" -lt "$end_at" ]; do
  sleep 30
  kill -0 "$tg" 2>/dev/null || { echo "tollgate died"; tail -50 "$work/tollgate.log"; exit 1; }
  s=$(sample); echo "$s" >> "$work/samples.csv"; show "$(( ($(date +%s) - ${start%%,*}) / 60 )) min" "$s"
done
last=$(sample); echo "$last" >> "$work/samples.csv"; show "end (under load)" "$last"
for p in "${load_pids[@]}"; do wait "$p" || true; done
sleep 8
quiet=$(sample); echo "$quiet" >> "$work/samples.csv"; show "after the load stopped" "$quiet"

step "requests (tollgate_requests_total, by upstream, code and outcome)"
metrics | grep '^tollgate_requests_total' | sed 's/^tollgate_requests_total//' | sort
step "attempts, retries and reloads"
metrics | grep -E '^tollgate_(attempts_total|retries_total|retries_denied_total|config_reloads_total)' | sort
step "clients"
echo "load.py: $(cat "$work/load.json")"
for f in "$work"/h2load-*.txt; do
  [ -f "$f" ] && grep -E '^(requests|status codes):' "$f" | sed "s/^/$(basename "$f" .txt): /"
done
[ -f "$work/h2.codes" ] && echo "h2c (curl): $(sort "$work/h2.codes" | uniq -c | tr '\n' ' ')"
grep -E 'requests in|Requests/sec|Non-2xx|Socket errors' "$work/wrk.txt" | sed 's/^/wrk: /' || cat "$work/wrk.txt"

step "what tollgate logged"
for level in ERROR WARN; do
  echo "$level: $(grep -c " $level " "$work/tollgate.log" || true)"
done
grep -E ' (ERROR|WARN) ' "$work/tollgate.log" | sed -E 's/^[^ ]+ +//' | cut -c1-160 | sort | uniq -c | sort -rn | head -15 || true

step "drain"
kill -TERM "$tg"
code=0; wait "$tg" || code=$?
echo "tollgate exited with $code"

step "verdict"
IFS=, read -r _ rss0 fds0 _ _ _ _ <<< "$start"
IFS=, read -r _ rss1 fds1 _ _ _ _ <<< "$last"
IFS=, read -r _ _ fds2 _ capi csolo estab2 <<< "$quiet"
echo "RSS start $rss0 KiB, end $rss1 KiB; fds start $fds0, end $fds1, after the load $fds2"
status=0
[ "$code" -eq 0 ] || { echo "FAIL: tollgate did not exit 0 after SIGTERM"; status=1; }
# Idle pooled connections may stay (one per endpoint per concurrent request at most);
# anything beyond the load's own concurrency is a leak.
if [ "$fds2" -gt $(( fds0 + 64 )) ]; then echo "FAIL: file descriptors grew ($fds0 -> $fds2)"; status=1; fi
if [ "$rss1" -gt $(( rss0 * 2 + 20480 )) ]; then echo "FAIL: RSS more than doubled ($rss0 -> $rss1 KiB)"; status=1; fi
[ "$status" -eq 0 ] && echo "OK: nothing grew without bound"
echo "samples: $work/samples.csv; logs: $work/"
exit "$status"
