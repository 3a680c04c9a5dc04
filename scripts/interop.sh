#!/usr/bin/env bash
# Interop: tollgate's HTTP/1.1 on both sides against real peers over loopback.
#
#   scripts/interop.sh [--tollgate PATH] [--no-install]
#
# In front of tollgate, as the app's side: nginx (proxy_pass with HTTP/1.0 and
# Connection: close, its default, and HTTP/1.1 with a keep-alive pool), HAProxy (HTTP
# mode, keep-alive), and curl (HTTP/1.0, HEAD, Expect: 100-continue, chunked uploads).
# Behind it, as upstreams: nginx (small and 1 MiB responses, 404s) and the soak's
# Python upstream (reads Content-Length and chunked bodies, answers with their size).
# Every case checks the status and the exact bytes; a summary line per case, and the
# script exits 1 if any failed. Installs nginx, haproxy and curl from Debian if missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOLLGATE_BIN=""
INSTALL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tollgate) TOLLGATE_BIN="${2:?"$1 needs a value"}"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done

step() { printf '\n==> %s\n' "$*"; }

need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$INSTALL" = 1 ]; then
    step "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends "${need[@]}" ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; }; } >/dev/null
  else
    echo "missing: ${need[*]}" >&2
    exit 2
  fi
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
HAPROXY="$(command -v haproxy || echo /usr/sbin/haproxy)"

if [ -z "$TOLLGATE_BIN" ]; then
  step "building tollgate"
  (cd "$ROOT" && cargo build --quiet --bin tollgate)
  target_dir="${CARGO_TARGET_DIR:-target}"
  case "$target_dir" in /*) ;; *) target_dir="$ROOT/$target_dir" ;; esac
  TOLLGATE_BIN="$target_dir/debug/tollgate"
fi

WORK="$(mktemp -d /tmp/tollgate-interop.XXXXXX)"
chmod 755 "$WORK"   # nginx's workers run unprivileged and serve files from here
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

read -r BACKEND ECHO_PORT UNUSED TG ADMIN NGX HAP H2C <<<"$(python3 "$ROOT/scripts/free-ports.py" 8)"

# An nginx config NAME.conf in the work directory, serving HTTP as given on stdin.
nginx_conf() {
  {
    printf 'daemon off;\nworker_processes 1;\nerror_log %s/%s.err warn;\npid %s/%s.pid;\n' \
      "$WORK" "$1" "$WORK" "$1"
    printf 'events { worker_connections 256; }\nhttp {\n  access_log off;\n'
    cat
    printf '}\n'
  } >"$WORK/$1.conf"
}

# Upstreams.
head -c 1048576 /dev/urandom >"$WORK/big.bin"
mkdir -p "$WORK/www"
mv "$WORK/big.bin" "$WORK/www/big.bin"
chmod 755 "$WORK/www"
chmod 644 "$WORK/www/big.bin"
nginx_conf backend <<EOF
  server {
    listen 127.0.0.1:$BACKEND;
    root $WORK/www;
    location = /ok { return 200 "ok\n"; }
    location = /empty { return 204; }
  }
  # HTTP/2 with prior knowledge (h2c), as gRPC servers behind nginx are reached. nginx
  # refuses a request that carries a host field beside :authority.
  server {
    listen 127.0.0.1:$H2C http2;
    location = /ok { return 200 "h2 ok\n"; }
  }
EOF
"$NGINX" -c "$WORK/backend.conf" -p "$WORK" 2>"$WORK/backend.out" &
PIDS+=($!)
python3 "$ROOT/scripts/soak/upstream.py" "$UNUSED" "$ECHO_PORT" --seed 1 >"$WORK/echo.out" 2>&1 &
PIDS+=($!)

cat >"$WORK/tollgate.toml" <<EOF
[runtime]
worker_threads = 1

[listener]
addr = "127.0.0.1:$TG"

[admin]
addr = "127.0.0.1:$ADMIN"

[upstreams.web]
authorities = ["web"]
endpoints = ["127.0.0.1:$BACKEND"]

[upstreams.echo]
authorities = ["echo"]
endpoints = ["127.0.0.1:$ECHO_PORT"]

[upstreams.web2]
authorities = ["web2"]
endpoints = ["127.0.0.1:$H2C"]
protocol = "h2c"
EOF
"$TOLLGATE_BIN" run --config "$WORK/tollgate.toml" 2>"$WORK/tollgate.err" &
PIDS+=($!)

# Peers in front of tollgate.
nginx_conf front <<EOF
  client_max_body_size 16m;
  upstream tg_keep { server 127.0.0.1:$TG; keepalive 8; }
  server {
    listen 127.0.0.1:$NGX;
    # nginx's default towards an upstream: HTTP/1.0, Connection: close.
    location /n10/ { proxy_pass http://127.0.0.1:$TG/; proxy_set_header Host web; }
    location /n10echo/ { proxy_pass http://127.0.0.1:$TG/; proxy_set_header Host echo; }
    # HTTP/1.1 with a keep-alive pool.
    location /n11/ {
      proxy_pass http://tg_keep/; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_set_header Host web;
    }
    location /n11echo/ {
      proxy_pass http://tg_keep/; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_set_header Host echo;
      proxy_request_buffering off;
    }
  }
EOF
"$NGINX" -c "$WORK/front.conf" -p "$WORK" 2>"$WORK/front.out" &
PIDS+=($!)

cat >"$WORK/haproxy.cfg" <<EOF
global
  maxconn 256
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend front
  bind 127.0.0.1:$HAP
  acl echo path_beg /echo
  http-request set-header Host echo if echo
  http-request set-header Host web unless echo
  default_backend tollgate
backend tollgate
  http-reuse always
  server tg 127.0.0.1:$TG
EOF
"$HAPROXY" -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.out" 2>&1 &
PIDS+=($!)

step "waiting for the peers (tollgate :$TG, nginx :$NGX, HAProxy :$HAP)"
for peer in "backend:$BACKEND" "backend:$H2C" "echo.out:$ECHO_PORT" "tollgate:$TG" "front:$NGX" "haproxy.out:$HAP"; do
  port=${peer#*:}
  up=0
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      up=1
      break
    fi
    sleep 0.1
  done
  if [ "$up" = 0 ]; then
    echo "${peer%%:*} did not start listening on :$port; its log:" >&2
    tail -n 20 "$WORK/${peer%%:*}".* 2>/dev/null >&2 || true
    exit 1
  fi
done

failed=0
passed=0
check() { # NAME EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then
    printf '  ok    %s\n' "$1"
    passed=$((passed + 1))
  else
    printf '  FAIL  %s\n        expected: %s\n        got:      %s\n' "$1" "$2" "$3"
    failed=$((failed + 1))
  fi
}
fetch() { # URL [curl args...]: "STATUS BODY-MD5"
  local url=$1
  shift
  local status
  status=$(curl -sS --max-time 20 -o "$WORK/out" -w '%{http_code}' "$@" "$url" || echo "curl-failed")
  echo "$status $(md5sum <"$WORK/out" | cut -d' ' -f1)"
}
md5() { printf '%s' "$1" | md5sum | cut -d' ' -f1; }
many() { # N URL...: curl fetching the URLs in turn on one connection, a status per line
  local args=()
  for url in "${@:2}"; do args+=(-o /dev/null "$url"); done
  curl -sS --max-time 20 -w '%{http_code}\n' -H "$1" "${args[@]}"
}
BIG_MD5=$(md5sum <"$WORK/www/big.bin" | cut -d' ' -f1)
head -c 300000 /dev/urandom >"$WORK/upload.bin"

step "curl to tollgate directly"
check "GET small" "200 $(md5 $'ok\n')" "$(fetch "http://127.0.0.1:$TG/ok" -H 'Host: web')"
check "GET 1 MiB" "200 $BIG_MD5" "$(fetch "http://127.0.0.1:$TG/big.bin" -H 'Host: web')"
check "HTTP/1.0 GET 1 MiB" "200 $BIG_MD5" "$(fetch "http://127.0.0.1:$TG/big.bin" -0 -H 'Host: web')"
check "GET 404 passes through" "404" "$(fetch "http://127.0.0.1:$TG/missing" -H 'Host: web' | cut -d' ' -f1)"
check "204" "204 $(md5 '')" "$(fetch "http://127.0.0.1:$TG/empty" -H 'Host: web')"
check "HEAD 1 MiB: length, no body" "content-length: 1048576" \
  "$(curl -sS --max-time 20 -I -H 'Host: web' "http://127.0.0.1:$TG/big.bin" | tr -d '\r' | grep -i '^content-length' | tr 'A-Z' 'a-z')"
check "POST 300 kB, Expect: 100-continue" "200 $(md5 $'stable POST 300000\n')" \
  "$(fetch "http://127.0.0.1:$TG/up" -H 'Host: echo' -H 'Expect: 100-continue' --data-binary @"$WORK/upload.bin")"
check "POST chunked" "200 $(md5 $'stable POST 300000\n')" \
  "$(fetch "http://127.0.0.1:$TG/up" -H 'Host: echo' -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/upload.bin")"
check "an authority no upstream lists passes through" "200 $(md5 $'ok\n')" \
  "$(fetch "http://127.0.0.1:$TG/ok" -H "Host: 127.0.0.1:$BACKEND")"
check "absolute-form (HTTP_PROXY)" "200 $(md5 $'ok\n')" "$(fetch "http://web/ok" --proxy "http://127.0.0.1:$TG")"
check "h2c upstream (nginx): :authority without host" "200 $(md5 $'h2 ok\n')" \
  "$(fetch "http://127.0.0.1:$TG/ok" -H 'Host: web2')"
check "h2c app, HTTP/1.1-only upstream (nginx): sent as HTTP/1.1" "200 $(md5 $'ok\n') 1" \
  "$(fetch "http://127.0.0.1:$TG/ok" --http2-prior-knowledge -H 'Host: web') $(curl -sS --max-time 20 --http2-prior-knowledge -o /dev/null -D - -H 'Host: web' "http://127.0.0.1:$TG/ok" | tr -d '\r' | grep -i '^x-tollgate-attempts:' | cut -d' ' -f2)"
check "five requests on one connection" "$(printf '200\n200\n200\n200\n200')" \
  "$(many 'Host: web' "http://127.0.0.1:$TG/ok" "http://127.0.0.1:$TG/ok" \
      "http://127.0.0.1:$TG/big.bin" "http://127.0.0.1:$TG/ok" "http://127.0.0.1:$TG/ok")"

step "nginx in front of tollgate"
for v in n10 n11; do
  check "$v GET small" "200 $(md5 $'ok\n')" "$(fetch "http://127.0.0.1:$NGX/$v/ok")"
  check "$v GET 1 MiB" "200 $BIG_MD5" "$(fetch "http://127.0.0.1:$NGX/$v/big.bin")"
  check "$v 404" "404" "$(fetch "http://127.0.0.1:$NGX/$v/missing" | cut -d' ' -f1)"
  check "$v POST 300 kB" "200 $(md5 $'stable POST 300000\n')" \
    "$(fetch "http://127.0.0.1:$NGX/${v}echo/up" --data-binary @"$WORK/upload.bin")"
done
check "n11 chunked upload streamed" "200 $(md5 $'stable POST 300000\n')" \
  "$(fetch "http://127.0.0.1:$NGX/n11echo/up" -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/upload.bin")"
statuses=$(for _ in $(seq 50); do curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$NGX/n11/ok"; done | sort | uniq -c | tr -s ' ')
check "n11 50 requests over the keep-alive pool" " 50 200" "$statuses"

step "HAProxy in front of tollgate"
check "GET small" "200 $(md5 $'ok\n')" "$(fetch "http://127.0.0.1:$HAP/ok")"
check "GET 1 MiB" "200 $BIG_MD5" "$(fetch "http://127.0.0.1:$HAP/big.bin")"
check "HTTP/1.0 GET" "200 $(md5 $'ok\n')" "$(fetch "http://127.0.0.1:$HAP/ok" -0)"
check "POST 300 kB" "200 $(md5 $'stable POST 300000\n')" \
  "$(fetch "http://127.0.0.1:$HAP/echo" --data-binary @"$WORK/upload.bin")"
check "POST chunked" "200 $(md5 $'stable POST 300000\n')" \
  "$(fetch "http://127.0.0.1:$HAP/echo" -H 'Transfer-Encoding: chunked' --data-binary @"$WORK/upload.bin")"
statuses=$(many 'X-Case: reuse' $(for _ in $(seq 20); do echo "http://127.0.0.1:$HAP/ok"; done) | sort | uniq -c | tr -s ' ')
check "20 requests, one client connection, reused server connections" " 20 200" "$statuses"

step "tollgate's log"
if grep -E ' (WARN|ERROR) ' "$WORK/tollgate.err" >/dev/null; then
  grep -E ' (WARN|ERROR) ' "$WORK/tollgate.err" | head -20
  failed=$((failed + 1))
  echo "  FAIL  warnings or errors in tollgate's log"
else
  echo "  ok    no warning or error"
fi

step "$passed passed, $failed failed"
[ "$failed" = 0 ]
