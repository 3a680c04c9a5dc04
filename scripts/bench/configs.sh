# shellcheck shell=bash disable=SC2034,SC2153  # variables shared with bench.sh
# Sourced by scripts/bench.sh: the config files of the backend and of every proxy, in
# each of the shapes the cells need (HTTP/1.1, h2c, TLS to the upstream, one or two
# workers). Each writer prints the config on stdout.

# Connections a proxy may be asked to hold: the many-connections cell's clients and as
# many upstream connections. The backend may hold the pools of every proxy of a cell
# at once, and a direct run's clients. Within the open file limit.
MOST_CONNS=$(( C2000_CONNS > RSS_CONNS ? C2000_CONNS : RSS_CONNS ))
PROXY_CONNS=$(( MOST_CONNS * 2 + 2048 ))
BACKEND_CONNS=$(( MOST_CONNS * 6 + 2048 ))
if [ "$NOFILE" != unlimited ]; then
  [ "$BACKEND_CONNS" -le $(( NOFILE - 1024 )) ] || BACKEND_CONNS=$(( NOFILE - 1024 ))
  [ "$PROXY_CONNS" -le $(( NOFILE - 1024 )) ] || PROXY_CONNS=$(( NOFILE - 1024 ))
fi
NGINX_USER=""
[ "$(id -u)" -ne 0 ] || NGINX_USER="user root;"
TLS_NAME="backend.bench"

# A CA and a server certificate for backend.bench (ECDSA P-256), in $WORK/tls.
make_certs() {
  local d="$WORK/tls"
  mkdir -p "$d"
  {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -subj "/CN=tollgate bench CA" -keyout "$d/ca.key" -out "$d/ca.pem" &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj "/CN=$TLS_NAME" -keyout "$d/server.key" -out "$d/server.csr" &&
    printf 'subjectAltName=DNS:%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' \
      "$TLS_NAME" > "$d/server.ext" &&
    openssl x509 -req -days 2 -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" \
      -CAcreateserial -extfile "$d/server.ext" -out "$d/server.pem"
  } > "$d/openssl.log" 2>&1 || { cat "$d/openssl.log" >&2; die "openssl could not make the TLS certificates"; }
}

nginx_common() {  # $1: name, $2: worker processes, $3: connections per worker
  local d="$WORK/$1" conns="${3:-$PROXY_CONNS}"
  mkdir -p "$d"
  cat <<EOF
$NGINX_USER
daemon off;
master_process on;
worker_processes ${2:-1};
worker_rlimit_nofile $(( conns + 512 ));
pid $d/nginx.pid;
error_log $WORK/$1.log warn;
events { worker_connections $conns; }
http {
  access_log off;
  keepalive_timeout 75s;
  keepalive_requests 10000000;
  client_max_body_size 0;
  client_body_temp_path $d/client_body;
  proxy_temp_path $d/proxy;
  fastcgi_temp_path $d/fastcgi;
  uwsgi_temp_path $d/uwsgi;
  scgi_temp_path $d/scgi;
EOF
}

# The backend: one nginx worker answering "ok" on three listeners: HTTP/1.1 (at once,
# from the rewrite phase), HTTP/1.1 for request bodies, and TLS 1.3. The body listener
# reads the whole body before it answers, as an application does: `mirror` makes nginx
# read it first, then the static file handler refuses the POST (405) and error_page
# turns that into the 200. (Answering before the body is read makes nginx as a proxy
# close the client connection.) The h2c backend is nghttpd: see h2_backend_cmd.
backend_conf() {
  nginx_common backend 1 "$BACKEND_CONNS"
  cat <<EOF
  server {
    listen 127.0.0.1:$BACKEND_PORT;
    location / { default_type text/plain; return 200 "ok"; }
  }
  server {
    listen 127.0.0.1:$BACKEND_BODY_PORT;
    client_body_buffer_size 512k;
    location / {
      mirror /mirror;
      root $WORK/backend-docs;
      rewrite ^ /ok.txt break;
      error_page 405 =200 @ok;
    }
    location = /mirror { internal; return 204; }
    location @ok { default_type text/plain; return 200 "ok"; }
  }
  server {
    listen 127.0.0.1:$BACKEND_TLS_PORT ssl;
    ssl_protocols TLSv1.3;
    ssl_certificate $WORK/tls/server.pem;
    ssl_certificate_key $WORK/tls/server.key;
    location / { default_type text/plain; return 200 "ok"; }
  }
}
EOF
}

# The h2c backend: nghttpd (the nghttp2 project's server, one thread), answering every
# request with "ok" and a gRPC-shaped end (grpc-status 0 in the trailers). Chosen over
# nginx's HTTP/2 listener because it is some four times faster on one core, so the load
# side stays far above what a proxy of the cell can do, and because nginx 1.22 refuses
# an HTTP/2 request that carries a Host field beside :authority (400, "duplicate host
# header"), which some proxies send.
h2_backend_cmd() {
  mkdir -p "$WORK/h2-backend"
  printf ok > "$WORK/h2-backend/index.html"
  H2_BACKEND_CMD=("$NGHTTPD" --no-tls -a 127.0.0.1 -d "$WORK/h2-backend" --trailer 'grpc-status: 0' "$BACKEND_H2_PORT")
}

# nginx as a reverse proxy of the cell's upstream (UP_PORT, see cell_upstream).
# $1 name, $2 port, $3 mode: h1 | h2c | tls, $4 workers.
nginx_proxy_conf() {
  local name="$1" port="$2" mode="$3"
  nginx_common "$name" "${4:-1}"
  cat <<EOF
  upstream backend {
    server 127.0.0.1:$UP_PORT;
    keepalive $PROXY_CONNS;
    keepalive_requests 10000000;
    keepalive_timeout 60s;
  }
EOF
  case "$mode" in
    h1) cat <<EOF
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_request_buffering off;
    }
  }
}
EOF
    ;;
    h2c) cat <<EOF
  server {
    listen 127.0.0.1:$port http2;
    location / { grpc_pass grpc://backend; }
  }
}
EOF
    ;;
    tls) cat <<EOF
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass https://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_request_buffering off;
      proxy_ssl_protocols TLSv1.3;
      proxy_ssl_server_name on;
      proxy_ssl_name $TLS_NAME;
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate $WORK/tls/ca.pem;
      proxy_ssl_session_reuse on;
    }
  }
}
EOF
    ;;
    *) die "nginx_proxy_conf: unknown mode $mode" ;;
  esac
}

# HAProxy in front of the cell's upstream (UP_PORT). $1 port, $2 mode: h1 | h2c | tls, $3 threads.
haproxy_conf() {
  local port="$1" mode="$2" bind_opt="" server
  case "$mode" in
    h1) server="server backend 127.0.0.1:$UP_PORT" ;;
    h2c) bind_opt=" proto h2"; server="server backend 127.0.0.1:$UP_PORT proto h2" ;;
    tls) server="server backend 127.0.0.1:$UP_PORT ssl verify required ca-file $WORK/tls/ca.pem sni str($TLS_NAME) verifyhost $TLS_NAME ssl-min-ver TLSv1.3" ;;
    *) die "haproxy_conf: unknown mode $mode" ;;
  esac
  cat <<EOF
global
  nbthread ${3:-1}
  maxconn $(( MOST_CONNS + 1024 ))
  # Idle upstream connections are closed once HAProxy's file descriptors pass 25 % of
  # its limit (the default): under 2,000 connections that is most of its pool, and it
  # opens a new upstream connection for most requests. Keep the pool.
  tune.pool-high-fd-ratio 90
  tune.pool-low-fd-ratio 80

defaults
  mode http
  maxconn $(( MOST_CONNS + 1024 ))
  option http-keep-alive
  http-reuse always
  timeout connect 1s
  timeout client 30s
  timeout server 30s
  timeout http-request 5s
  timeout http-keep-alive 60s

frontend fe
  bind 127.0.0.1:$port$bind_opt
  default_backend be

backend be
  $server
EOF
}

# tollgate. $1 main port, $2 admin port, $3 listen port (a dedicated port for the
# upstream, so the load needs no Host header), $4 endpoint, $5 protocol, $6 retries
# and budget on (1/0), $7 worker threads, $8 TLS to the upstream (1/0).
tollgate_conf() {
  cat <<EOF
[runtime]
worker_threads = ${7:-1}

[listener]
addr = "127.0.0.1:$1"

[admin]
addr = "127.0.0.1:$2"

[upstreams.backend]
authorities = ["backend"]
listen = "127.0.0.1:$3"
endpoints = ["$4"]
protocol = "$5"
max_inflight = $PROXY_CONNS
EOF
  if [ "${8:-0}" = 1 ]; then
    cat <<EOF

[upstreams.backend.tls]
server_name = "$TLS_NAME"
ca_file = "$WORK/tls/ca.pem"
EOF
  fi
  if [ "$6" = 1 ]; then
    cat <<EOF

[upstreams.backend.retry]
max_attempts = 3

[upstreams.backend.budget]
ratio = 0.1
EOF
  fi
}

# The [inbound] section of a tollgate that fronts the backend (the callee's sidecar),
# appended to a tollgate_conf, for a binary that knows [inbound]. $1 inbound port.
tollgate_inbound_section() {
  cat <<EOF

[inbound]
addr = "127.0.0.1:$1"
app = "127.0.0.1:$BACKEND_PORT"
max_inflight = $PROXY_CONNS

[inbound.retries]
ratio = 0.1
EOF
  # --inbound-extra: more of the inbound side's config (an [inbound.dedupe] table).
  [ -z "$INBOUND_EXTRA" ] || cat "$INBOUND_EXTRA"
}
