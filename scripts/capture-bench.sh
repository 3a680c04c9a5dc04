#!/usr/bin/env bash
# Transparent capture: what it adds to a request's latency, and what a sidecar restart
# does to the traffic it captures.
#
# Two network namespaces joined by a veth pair on a private /30 (10.213.78.0/30), as in
# tests/it/pods.rs: the client pod (wrk, and tollgate running as uid 2201) and the server
# pod (nginx answering a 3-byte body on 10.213.78.2:8080). The same GET is measured
#
#   direct    wrk -> 10.213.78.2:8080, no rules in the client pod
#   explicit  wrk -> 127.0.0.1:15001 with Host: b (the app pointed at tollgate)
#   capture   wrk -> 10.213.78.2:8080 with `tollgate iptables` rules in the client pod
#
# in paired rounds (the three modes one after the other in each round, so they share the
# machine's state), and the medians over the rounds are printed, with each mode's
# latency as a ratio to direct. Then the restart: wrk through capture while tollgate
# gets SIGTERM and is started again; wrk's errors and the time nothing listened.
#
#   scripts/capture-bench.sh                        # 3 rounds of 5 s, 8 connections
#   scripts/capture-bench.sh --rounds 5 --duration 10 --conns 32
#
# Needs root (namespaces, iptables). Installs wrk, nginx, iptables and iproute2 from
# Debian when missing. Builds target/release/tollgate when missing. Removes the
# namespaces (and with them the link and the rules) and stops every process on exit,
# also on failure; removes leftovers of an earlier run first. Every wait is bounded.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS=3
DURATION=5
CONNS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "capture-bench: $*" >&2; exit 1; }
log() { echo "capture-bench: $*" >&2; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces and iptables)"

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || missing+=(iptables)
command -v ip >/dev/null || [ -x /usr/sbin/ip ] || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PATH=$PATH:/usr/sbin

TG="$(cd "$ROOT" && readlink -m "${CARGO_TARGET_DIR:-target}")/release/tollgate"
if [ ! -x "$TG" ]; then
  log "building tollgate (cargo build --release) ..."
  (cd "$ROOT" && cargo build --release --bin tollgate >&2) || die "cargo build --release failed"
fi

NS_A=tg-bench-a
NS_B=tg-bench-b
IP_A=10.213.78.1
IP_B=10.213.78.2
UID_A=2201
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-capture-bench.XXXXXX")
chmod 755 "$TMP"
PIDS=()

remove_namespaces() {
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
}
stop_pid() { # PID: SIGTERM, up to 10 s, then SIGKILL
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$? p
  for p in "${PIDS[@]}"; do stop_pid "$p"; done
  remove_namespaces
  if [ "$rc" -ne 0 ]; then
    for f in "$TMP"/*.log; do
      [ -s "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }
    done
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_until SECONDS WHAT COMMAND...
wait_until() {
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${secs}s waiting for: $what"
    sleep 0.05
  done
}
in_a() { ip netns exec "$NS_A" "$@"; }
in_b() { ip netns exec "$NS_B" "$@"; }

remove_namespaces
ip netns add "$NS_A"
ip netns add "$NS_B"
ip -n "$NS_A" link set lo up
ip -n "$NS_B" link set lo up
ip link add tg-bench-a0 netns "$NS_A" type veth peer name tg-bench-b0 netns "$NS_B"
ip -n "$NS_A" addr add "$IP_A/30" dev tg-bench-a0
ip -n "$NS_B" addr add "$IP_B/30" dev tg-bench-b0
ip -n "$NS_A" link set tg-bench-a0 up
ip -n "$NS_B" link set tg-bench-b0 up

cat >"$TMP/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $TMP/nginx.pid;
error_log $TMP/nginx.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $TMP/nginx-body;
  proxy_temp_path $TMP/nginx-proxy;
  fastcgi_temp_path $TMP/nginx-fastcgi;
  uwsgi_temp_path $TMP/nginx-uwsgi;
  scgi_temp_path $TMP/nginx-scgi;
  keepalive_requests 1000000;
  server {
    listen $IP_B:8080;
    location / { return 200 "ok\n"; }
  }
}
EOF
# Background processes run through `ip netns exec` itself (not the in_* functions),
# which execs: $! is then the process, not a subshell, and can be signalled.
ip netns exec "$NS_B" taskset -c 1 nginx -c "$TMP/nginx.conf" -p "$TMP" >"$TMP/nginx.out.log" 2>&1 &
PIDS+=("$!")

cat >"$TMP/tollgate.toml" <<EOF
[listener]
addr = "127.0.0.1:15001"
drain_timeout = "5s"
[admin]
addr = "127.0.0.1:15090"
[upstreams.b]
authorities = ["b"]
endpoints = ["$IP_B:8080"]
[upstreams.b.budget]
ratio = 0.1
min_per_sec = 10
EOF
chmod 644 "$TMP/tollgate.toml"

TG_PID=
start_tollgate() {
  ip netns exec "$NS_A" taskset -c 1 setpriv --reuid=$UID_A --regid=$UID_A --clear-groups \
    "$TG" run --config "$TMP/tollgate.toml" >>"$TMP/tollgate.log" 2>&1 &
  TG_PID=$!
  PIDS+=("$TG_PID")
}
ready() { in_a curl -fsS --noproxy '*' --max-time 1 -o /dev/null http://127.0.0.1:15090/readyz; }
start_tollgate
wait_until 20 "tollgate /readyz" ready
wait_until 20 "nginx in the server pod" in_a curl -fsS --noproxy '*' --max-time 1 -o /dev/null "http://$IP_B:8080/"

rules_on() { in_a "$TG" iptables --uid $UID_A >/dev/null; }
rules_off() { in_a "$TG" iptables --clean >/dev/null; }

# wrk_run MODE: one run; prints "rps p50_us p99_us errors".
wrk_run() {
  local url=http://$IP_B:8080/ hdr=()
  case $1 in
    direct) rules_off ;;
    explicit) rules_off; url=http://127.0.0.1:15001/; hdr=(-H "Host: b") ;;
    capture) rules_on ;;
  esac
  in_a taskset -c 0 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "${hdr[@]}" "$url" >"$TMP/wrk.out" 2>&1 \
    || die "wrk failed: $(cat "$TMP/wrk.out")"
  python3 - "$TMP/wrk.out" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
def us(v):
    n, u = re.match(r"([\d.]+)(us|ms|s)", v).groups()
    return float(n) * {"us": 1, "ms": 1e3, "s": 1e6}[u]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
p50 = us(re.search(r"\s50%\s+(\S+)", t).group(1))
p99 = us(re.search(r"\s99%\s+(\S+)", t).group(1))
m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
errs = sum(map(int, m.groups())) if m else 0
n = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
errs += int(n.group(1)) if n else 0
print(rps, p50, p99, errs)
EOF
}

log "latency: $ROUNDS rounds x 3 modes x ${DURATION}s, $CONNS connections"
: >"$TMP/results"
for ((r = 1; r <= ROUNDS; r++)); do
  for mode in direct explicit capture; do
    echo "$r $mode $(wrk_run $mode)" >>"$TMP/results"
  done
done
rules_off

python3 - "$TMP/results" "$CONNS" "$DURATION" "$ROUNDS" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
conns, dur, rounds = sys.argv[2:5]
by = {}
for r, mode, rps, p50, p99, errs in rows:
    by.setdefault(mode, []).append((int(r), float(rps), float(p50), float(p99), int(errs)))
def med(mode, i):
    return statistics.median(x[i] for x in by[mode])
# Ratios paired by round (each round's mode over the same round's direct), then the median.
def ratio(mode, i):
    d = {x[0]: x[i] for x in by["direct"]}
    return statistics.median(x[i] / d[x[0]] for x in by[mode])
print(f"GET of a 3-byte body, wrk -t1 -c{conns}, {rounds} paired rounds of {dur} s, medians; ratio = paired by round, to direct")
print()
print("| mode | req/s | p50 latency | p99 latency | p50 ÷ direct | p99 ÷ direct | errors |")
print("|---|---:|---:|---:|---:|---:|---:|")
for mode in ["direct", "explicit", "capture"]:
    print(f"| {mode} | {med(mode, 1):,.0f} | {med(mode, 2):.0f} µs | {med(mode, 3):.0f} µs | "
          f"{ratio(mode, 2):.2f} | {ratio(mode, 3):.2f} | {sum(x[4] for x in by[mode])} |")
EOF

# ---------------------------------------------------------------------------
log "restart: wrk through capture for 8 s, tollgate restarted at 2 s"
rules_on
ip netns exec "$NS_A" taskset -c 0 wrk -t1 -c"$CONNS" -d8s --latency "http://$IP_B:8080/" >"$TMP/wrk-restart.out" 2>&1 &
WRK_PID=$!
PIDS+=("$WRK_PID")
sleep 1.5
# New connections, one request each, one after the other, across the restart: what an
# app that connects now sees.
(
  for ((i = 0; i < 300; i++)); do
    in_a curl -s -o /dev/null --noproxy '*' --max-time 2 -w '%{http_code} %{exitcode}\n' "http://$IP_B:8080/" || true
  done
) >"$TMP/probes.out" 2>/dev/null &
PROBES_PID=$!
PIDS+=("$PROBES_PID")
sleep 0.5
t0=$(date +%s%N)
kill -TERM "$TG_PID"
for ((i = 0; i < 200; i++)); do kill -0 "$TG_PID" 2>/dev/null || break; sleep 0.01; done
kill -0 "$TG_PID" 2>/dev/null && die "tollgate did not exit within 2 s of SIGTERM"
wait "$TG_PID" || true
t1=$(date +%s%N)
start_tollgate
wait_until 20 "the restarted tollgate /readyz" ready
t2=$(date +%s%N)
wait "$WRK_PID" || true
wait "$PROBES_PID" || true
starts=$(grep -c 'tollgate is serving' "$TMP/tollgate.log" || true)
[ "$starts" = 2 ] || die "tollgate started $starts times, not 2 (see its log)"
python3 - "$TMP/wrk-restart.out" $(( (t1 - t0) / 1000000 )) $(( (t2 - t1) / 1000000 )) "$TMP/probes.out" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
stop_ms, start_ms = int(sys.argv[2]), int(sys.argv[3])
reqs = re.search(r"(\d+) requests in", t).group(1)
m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
c, r, w, to = m.groups() if m else (0, 0, 0, 0)
n = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
print()
print(f"Restart under load (capture, {reqs} requests in 8 s): SIGTERM to exit {stop_ms} ms "
      f"(in-flight requests drained), exit to ready again {start_ms} ms.")
print(f"wrk saw: connect errors {c}, read errors {r}, write errors {w}, timeouts {to}, "
      f"non-2xx {n.group(1) if n else 0}.")
probes = [l.split() for l in open(sys.argv[4]) if l.strip()]
ok = sum(1 for code, _ in probes if code == "200")
refused = sum(1 for code, rc in probes if rc == "7")
other = len(probes) - ok - refused
print(f"New connections across the restart (curl, one request each, {len(probes)} in a row): "
      f"{ok} answered 200, {refused} refused at once (curl exit 7), {other} other.")
EOF
