#!/usr/bin/env bash
# Reloads under load, by every kind of writer, as an SRE would try before production.
#
#   scripts/reload-trial.sh [SECONDS] [RATE]
#
# tollgate (release build) serves two upstreams in front of a loopback server that
# always answers 200, while a client sends RATE requests/s (default 500) for SECONDS
# (default 60), spread over both upstreams, and counts every answer. Meanwhile the
# config is rewritten 50 times, in turns, by:
#   - an editor's write and rename (valid),
#   - a write in place (valid),
#   - a Kubernetes ConfigMap update: the `..data` symlink swapped (valid),
#   - a generator writing through a shell redirect, which leaves the file empty for
#     a moment: `(sleep 1; cat good.toml) > tollgate.toml` (valid in the end),
#   - and, every other time, a broken file (a typo, a truncated table, an unknown
#     key) that must be refused while the old config keeps serving.
# At the end it prints the requests answered 200 out of all sent, the answers that
# were not 200, and tollgate_config_reloads_total by result. Exits 1 if any request
# was not answered 200.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
rate="${2:-500}"
target_dir="${CARGO_TARGET_DIR:-target}"
work="$(mktemp -d "${TMPDIR:-/tmp}/tollgate-reload-trial.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n==> %s\n' "$*"; }

step "building tollgate (release)"
cargo build --release --quiet --bin tollgate
bin="$target_dir/release/tollgate"

read -r port admin backend <<<"$(python3 scripts/free-ports.py 3)"

# The config lives where a ConfigMap mount puts it: tollgate.toml -> ..data/tollgate.toml.
mkdir -p "$work/mount/v0"
ln -s v0 "$work/mount/..data"
ln -s ..data/tollgate.toml "$work/mount/tollgate.toml"
config="$work/mount/tollgate.toml"

good() { # $1: a version number, to make each text differ
  cat <<EOF
# reload trial, version $1
[listener]
addr = "127.0.0.1:$port"
[admin]
addr = "127.0.0.1:$admin"
[upstreams.api]
authorities = ["api"]
endpoints = ["127.0.0.1:$backend"]
request_timeout = "$(( 2 + $1 % 3 ))s"
[upstreams.api.retry]
max_attempts = $(( 2 + $1 % 2 ))
[upstreams.api.budget]
ratio = 0.1
[upstreams.web]
authorities = ["web"]
endpoints = ["127.0.0.1:$backend"]
EOF
}

bad() { # $1: which breakage
  case $(( $1 % 3 )) in
    0) good "$1" | sed 's/max_attempts/max_atempts/' ;;
    1) good "$1" | sed 's/^\[upstreams.web\]$/[upstreams.web/' ;;
    2) good "$1"; echo "retries_enabled = true" ;;
  esac
}

good 0 > "$work/mount/v0/tollgate.toml"

python3 - "$backend" > "$work/backend.log" 2>&1 <<'EOF' &
import asyncio, sys
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except Exception:
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()
asyncio.run(main())
EOF
pids+=($!)

RUST_LOG=info "$bin" run --config "$config" > "$work/tollgate.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$admin/readyz" > /dev/null && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$admin/readyz" > /dev/null || { echo "tollgate did not start"; cat "$work/tollgate.log"; exit 1; }

step "load: $rate requests/s for ${seconds}s, 50 rewrites of the config meanwhile"
python3 - "$port" "$rate" "$seconds" > "$work/load.json" <<'EOF' &
import http.client, json, sys, threading, time
port, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
threads = 16
counts, lock = {}, threading.Lock()
start = time.monotonic()
def client(k):
    conn = None
    n = 0
    while True:
        at = start + (n * threads + k) / rate
        if at - start >= seconds:
            return
        delay = at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        host = "api" if n % 2 else "web"
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/x", headers={"Host": host})
            r = conn.getresponse()
            r.read()
            key = str(r.status)
            if r.getheader("connection", "").lower() == "close":
                conn.close(); conn = None
        except Exception as e:
            key = type(e).__name__
            conn = None
        with lock:
            counts[key] = counts.get(key, 0) + 1
        n += 1
ts = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(counts))
EOF
load=$!
pids+=($load)

gap=$(python3 -c "print(max(0.2, $seconds / 50 * 0.9))")
version=1
for i in $(seq 1 50); do
  if (( i % 5 == 0 )); then
    bad "$i" > "$config.new" && mv "$config.new" "$work/mount/..data/tollgate.toml.new" \
      && mv "$work/mount/..data/tollgate.toml.new" "$work/mount/..data/tollgate.toml"
    kind="invalid"
  else
    version=$((version + 1))
    case $(( i % 4 )) in
      0) good "$version" > "$work/mount/..data/tollgate.toml.new"
         mv "$work/mount/..data/tollgate.toml.new" "$work/mount/..data/tollgate.toml"; kind="rename" ;;
      1) good "$version" > "$work/mount/..data/tollgate.toml"; kind="in place" ;;
      2) mkdir -p "$work/mount/v$version"; good "$version" > "$work/mount/v$version/tollgate.toml"
         ln -sfn "v$version" "$work/mount/..data.tmp" && mv -T "$work/mount/..data.tmp" "$work/mount/..data"
         kind="symlink swap" ;;
      3) (sleep 1; good "$version") > "$work/mount/..data/tollgate.toml"; kind="shell redirect" ;;
    esac
  fi
  printf '  rewrite %2d: %s\n' "$i" "$kind"
  sleep "$gap"
done
# The last word is a valid config.
good $((version + 1)) > "$work/mount/..data/tollgate.toml"
wait "$load"

step "results"
sleep 1
counts=$(cat "$work/load.json")
python3 - "$counts" <<'EOF'
import json, sys
c = json.loads(sys.argv[1])
total = sum(c.values())
print(f"requests answered 200: {c.get('200', 0)} of {total}")
others = {k: v for k, v in c.items() if k != "200"}
print(f"anything else: {others or 'none'}")
EOF
curl -sf "http://127.0.0.1:$admin/metrics" | grep '^tollgate_config_reloads_total' | sed 's/^/  /'
echo "  log: $(grep -c 'config reload rejected;' "$work/tollgate.log") refusals, $(grep -c 'config reloaded' "$work/tollgate.log") reloads"
ok=$(python3 -c "import json,sys; c=json.loads(sys.argv[1]); print(int(c.get('200',0)==sum(c.values())))" "$counts")
[ "$ok" = 1 ] || { echo "reload-trial.sh: some requests were not answered 200"; exit 1; }
