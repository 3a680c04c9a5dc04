#!/usr/bin/env bash
# The delayed-ACK wait of an app whose Nagle holds a request body back until its head is
# acknowledged (Python `requests` through `http_proxy` writes head and body apart): time
# per POST through tollgate, against the same POST written in one piece.
#
#   scripts/bench-quickack.sh [ROUNDS]      (default 50 POSTs of each kind)
#
# Starts a loopback backend (python3 http.server) and the debug tollgate (cargo run) on
# free ports, sends ROUNDS POSTs on one keep-alive connection with Nagle on, head and
# body in two writes, then ROUNDS with head and body in one, and prints the median time
# of each. With the head acknowledged at once (`TCP_QUICKACK`) the two are within a
# fraction of a millisecond; without it the split POST waits for the kernel's delayed
# ACK, about 40 ms each. Timing only shows this, so it is a bench, not a test
# (tests/it/quickack.rs counts the calls instead).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-50}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

read -r APP TG ADMIN < <(python3 - <<'PY'
import socket
ports = []
socks = []
for _ in range(3):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s); ports.append(s.getsockname()[1])
print(*ports)
PY
)

python3 - "$APP" >"$work/app.log" 2>&1 <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        # One write: the backend's own Nagle must not be what is measured.
        self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
pids+=($!)

cat >"$work/tollgate.toml" <<TOML
[listener]
addr = "127.0.0.1:$TG"
[admin]
addr = "127.0.0.1:$ADMIN"
[upstreams.app]
authorities = ["app"]
endpoints = ["127.0.0.1:$APP"]
TOML
cargo build --quiet
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
"$target_dir/debug/tollgate" run --config "$work/tollgate.toml" 2>"$work/tollgate.log" &
pids+=($!)

python3 - "$TG" "$ROUNDS" <<'PY'
import socket, statistics, sys, time
port, rounds = int(sys.argv[1]), int(sys.argv[2])
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", port)).close(); break
    except OSError:
        time.sleep(0.05)
head = b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\n\r\n"
body = b"hello"
def run(split):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        if split:
            s.sendall(head); s.sendall(body)
        else:
            s.sendall(head + body)
        got = b""
        while not got.endswith(b"ok"):
            got += s.recv(4096)
        times.append(time.perf_counter() - t)
    s.close()
    return statistics.median(times) * 1000
one, two = run(False), run(True)
print(f"head and body in one write:  {one:6.2f} ms median per POST")
print(f"head, then body (Nagle on):  {two:6.2f} ms median per POST")
PY
