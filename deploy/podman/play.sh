#!/usr/bin/env bash
# The pod for real: tollgate's images built (deploy/podman/image.sh) and its manifests
# played with `podman kube play`, its pods on a network of their own:
#
#   payments  the callee: tests/fixtures/inject/payments-injected.yaml, what
#             `tollgate inject --plain --capture` writes for a payments Deployment
#             (its ConfigMap skeleton, the capture init container, its probes moved
#             to the admin port); its app is deploy/podman/app.py;
#   checkout  the caller: deploy/kubernetes/configmap.yaml with
#             deployment-capture.yaml (the capture variant), then
#             deployment-plain-sidecar.yaml (the plain sidecar); its app container
#             is the manifests' own stand-in image, idle, so the test makes the calls;
#   cart      an injected pod as inject writes it today: deploy/podman/cart.yaml, a
#             Redis-backed service, put through `tollgate inject --plain --capture`
#             as the test runs; its app is deploy/podman/app.py, with redis-cli;
#   redis-cart  its Redis (Debian's redis-server), which inject leaves alone.
#
# podman is not Kubernetes: deploy/podman/adapt.py plays each Deployment's pod as a
# Pod, with the native sidecar as a plain one (podman 4.3 has none) and hostAliases
# standing in for the Services (and for the names inject keeps as the app wrote them,
# such as ledger.finance.svc). What is only validated offline is listed in
# deploy/README.md ("The pod for real").
#
# Checks: inject's cart: REDIS_ADDR=redis-cart:6379 is no upstream and 6379 is not
# captured; from cart's app, redis-cli's PING, SET and GET reach Redis untouched, on
# 6379 (excluded from capture) and on 16379 (captured, passed through by cart's
# sidecar); a 503 of payments' app is retried by cart's sidecar (2 attempts), and
# payments' inbound side sees both. From checkout's app with no proxy settings (capture), a call reaches
# payments' app through both sidecars; a 503 is retried in checkout's sidecar only;
# the deadline crosses; the same call through the plain sidecar's http_proxy; both
# pods' /readyz and payments' app probe as podman's health check runs it (through
# the admin port's /probe/8080/healthz); a real Prometheus scrapes both pods through
# the shipped tollgate-pods relabelling (static targets with the labels pod discovery
# gives) with the shipped rules loaded; and SIGTERM drains: /readyz turns 503, the
# request in flight finishes, tollgate exits 0.
#
# podman, runc and debootstrap are installed from Debian's archive when missing, and the
# apps' base gets redis-server from it once. Skipped, loudly (a SKIP line and exit code
# 77), where podman cannot run: it cannot be installed, this is not root, no Debian base
# can be made (debootstrap and redis-server need Debian's archive), or no container runs (no user namespaces, a runtime that fails on this
# kernel); and with TOLLGATE_PODMAN=0. TOLLGATE_PODMAN=require turns every skip into a
# failure. Every wait is bounded; the pods, the network and the images built are
# removed at the end (the local bases are kept for the next run:
# deploy/podman/image.sh --clean removes them). Prints its run time.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
. deploy/podman/lib.sh

PASSED=0
pass() { PASSED=$((PASSED + 1)); printf 'PASS  %s\n' "$*"; }
exec 3>&2
fail() { printf '\nFAIL  %s\n' "$*" >&3; exit 1; }
skip() {
  [ "${TOLLGATE_PODMAN:-}" = require ] && fail "TOLLGATE_PODMAN=require, but: $*"
  printf '\nSKIP  deploy/podman/play.sh: %s\n' "$*" >&3
  printf 'SKIP  NOT TESTED: the image build, podman run and the podman kube play test of the pods\n' >&3
  exit 77
}

if [ "${TOLLGATE_PODMAN:-1}" = 0 ]; then
  skip "TOLLGATE_PODMAN=0: the image is not built and the pods are not played"
fi
reason=$(podman_install) || skip "$reason"
reason=$(podman_ready) || skip "$reason"
for tool in python3 curl prometheus promtool; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (run deploy/ci-deps.sh)"
done
STARTED=$SECONDS

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-play.XXXXXX")
podman_conf "$WORK"
NET=tollgate-play
SUBNET=10.213.78.0/24
PAYMENTS_IP=10.213.78.10
CHECKOUT_IP=10.213.78.11
PLAIN_IP=10.213.78.12
REDIS_IP=10.213.78.13
CART_IP=10.213.78.14
# Nothing listens there: ledger (payments' upstream) is not played, but its name must
# resolve as the cluster's DNS would resolve it.
LEDGER_IP=10.213.78.20
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
APP_IMAGE=localhost/tollgate-play-app:latest
BIN=${TOLLGATE_BINARY:-$(readlink -m "${CARGO_TARGET_DIR:-target}")/release/tollgate}
PROM_PID=

down() { # the pods of the adapted manifests, the network
  local f
  for f in "$WORK"/*.pod.yaml; do
    [ -e "$f" ] && podman kube down "$f" >/dev/null 2>&1 || true
  done
  podman pod rm -f payments checkout cart redis-cart >/dev/null 2>&1 || true
  podman network rm -f "$NET" >/dev/null 2>&1 || true
}
cleanup() {
  local rc=$? i
  if [ "$rc" -ne 0 ]; then
    for c in payments-tollgate payments-payments checkout-tollgate checkout-app cart-tollgate cart-cart \
      redis-cart-redis; do
      podman logs --tail 15 "$c" >"$WORK/$c.log" 2>&1 || continue
      printf '\n--- last lines of %s ---\n' "$c" >&3
      cat "$WORK/$c.log" >&3
    done
  fi
  if [ -n "$PROM_PID" ]; then kill "$PROM_PID" 2>/dev/null || true; wait "$PROM_PID" 2>/dev/null || true; fi
  down
  for i in "$APP_IMAGE" curlimages/curl:8.11.1 registry.example.com/shop/payments:3.2.0 \
    registry.example.com/shop/cart:1.4.0 registry.example.com/shop/redis:7.0 \
    "localhost/tollgate:$VERSION" "localhost/tollgate-iptables:$VERSION"; do
    podman rmi -f "$i" >/dev/null 2>&1 || true
  done
  podman image prune -f >/dev/null 2>&1 || true
  rm -rf "$WORK"
  printf 'deploy/podman/play.sh: %s s\n' "$((SECONDS - STARTED))"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_until SECONDS DESCRIPTION COMMAND...: poll every 0.25 s.
wait_until() {
  local secs=$1 what=$2 deadline
  shift 2
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${secs}s waiting for: $what"
    sleep 0.25
  done
}
status_of() { curl -s --max-time 2 -o /dev/null -w '%{http_code}' "$1" || true; }
is_status() { [ "$(status_of "$2")" = "$1" ]; }
# in_app POD ARGS...: curl run in POD's app container (the pod's network namespace,
# the app's UID); prints the body, then a last line "STATUS ATTEMPTS OUTCOME".
in_app() {
  local pod=$1
  shift
  in_container "$pod-app" "$@"
}
in_container() { # CONTAINER ARGS...: as in_app
  local c=$1
  shift
  podman exec "$c" curl -sS --max-time 10 \
    -w '\n%{http_code} %header{x-tollgate-attempts} %header{x-tollgate-outcome}\n' "$@"
}
# metric URL SERIES: a sample's value from Prometheus text (0 when absent).
metric() {
  curl -fsS --max-time 2 "$1" | awk -v s="$2" '$1 == s {v = $2} END {print v == "" ? 0 : v}'
}
# metric_sum URL NAME LABEL...: the sum of NAME's samples whose labels include every
# LABEL (as written in the series, e.g. kind="retry").
metric_sum() {
  local url=$1 name=$2
  shift 2
  curl -fsS --max-time 2 "$url" | python3 -c '
import sys
name, want = sys.argv[1], sys.argv[2:]
total = 0
for line in sys.stdin:
    series, _, value = line.rpartition(" ")
    if series.split("{")[0] == name and all(w in series for w in want):
        total += float(value)
print(int(total))' "$name" "$@"
}
plus() { awk -v a="$1" -v b="$2" 'BEGIN {print a + b}'; }

step() { printf '\n--> %s\n' "$*"; }

# ---------------------------------------------------------------------------
step "the images (deploy/podman/image.sh)"
t0=$SECONDS
debian_base "$WORK" || skip "no Debian base: debootstrap bookworm from Debian's archive failed (above)"
reason=$(podman_runs "$DEBIAN_BASE") || skip "$reason"
[ "$((SECONDS - t0))" -lt 2 ] || echo "the Debian base $DEBIAN_BASE made (debootstrap) in $((SECONDS - t0)) s"
deploy/podman/image.sh
# The apps' base: the Debian base with Debian's redis-server (and redis-cli), made once
# and kept like the bases (deploy/podman/image.sh --clean removes it). A policy-rc.d
# keeps the package from starting a server while it is built.
if ! have_image "$PLAY_BASE"; then
  t0=$SECONDS
  printf '%s\n' "FROM $DEBIAN_BASE" \
    "RUN printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d \\" \
    " && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \\" \
    " && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /usr/sbin/policy-rc.d" \
    | podman build --quiet -t "$PLAY_BASE" -f - "$WORK" >"$WORK/play-base.log" 2>&1 \
    || { tail -n 20 "$WORK/play-base.log" >&3; skip "no redis-server: apt-get install redis-server from Debian's archive failed (above)"; }
  echo "the apps' base $PLAY_BASE (redis-server from Debian's archive) made in $((SECONDS - t0)) s"
fi
# The app: Python's http.server, as UID 10001 (not tollgate's 15000, which capture
# spares).
cp deploy/podman/app.py "$WORK/app.py"
printf 'FROM %s\nCOPY app.py /app.py\nUSER 10001:10001\nENTRYPOINT ["python3", "/app.py"]\n' "$PLAY_BASE" \
  | podman build --quiet -t "$APP_IMAGE" -f - "$WORK" >/dev/null
# The manifests' images, found locally (imagePullPolicy: IfNotPresent).
for i in registry.example.com/shop/payments:3.2.0 curlimages/curl:8.11.1 \
  registry.example.com/shop/cart:1.4.0 registry.example.com/shop/redis:7.0; do
  podman tag "$APP_IMAGE" "$i"
done
pass "the app image, tagged as the manifests name their app images"

step "the pods"
down
podman network create --subnet "$SUBNET" "$NET" >/dev/null
# play NAME IP FILE: plays FILE's pod at IP on the test's network.
play() {
  podman kube play --network "$NET" --ip "$2" "$3" >"$WORK/play-$1.log" 2>&1 \
    || { cat "$WORK/play-$1.log" >&3; fail "podman kube play of $1 failed"; }
}
python3 deploy/podman/adapt.py "$WORK/payments.pod.yaml" tests/fixtures/inject/payments-injected.yaml \
  --host "ledger.finance.svc=$LEDGER_IP" --pods-json "$WORK/payments.json"
python3 deploy/podman/adapt.py "$WORK/checkout.pod.yaml" deploy/kubernetes/configmap.yaml \
  deploy/kubernetes/deployment-capture.yaml --idle-app --host "payments=$PAYMENTS_IP" \
  --pods-json "$WORK/checkout.json"
t0=$SECONDS
play payments "$PAYMENTS_IP" "$WORK/payments.pod.yaml"
play checkout "$CHECKOUT_IP" "$WORK/checkout.pod.yaml"
wait_until 60 "payments' /readyz" is_status 200 "http://$PAYMENTS_IP:15090/readyz"
wait_until 60 "checkout's /readyz" is_status 200 "http://$CHECKOUT_IP:15090/readyz"
pass "both pods played and ready in $((SECONDS - t0)) s: payments (injected, capture, plain sidecar) at $PAYMENTS_IP, checkout (the capture variant) at $CHECKOUT_IP"
for pod in payments checkout; do
  podman container exists "$pod-tollgate-iptables" \
    && fail "$pod: the capture init container should have run once and gone"
done
for pod in payments checkout; do
  [ "$(podman inspect --format '{{.HostConfig.ReadonlyRootfs}} {{.Config.User}}' "$pod-tollgate")" = "true 15000:15000" ] \
    || fail "$pod's tollgate does not run read-only as 15000, the UID its capture spares"
done
podman inspect --format '{{range .Config.Env}}{{println .}}{{end}}' payments-tollgate | grep -qx 'POD_NAMESPACE=default' \
  || fail "payments' tollgate has no POD_NAMESPACE=default (adapt.py sets it for the downward API's metadata.namespace)"

# ---------------------------------------------------------------------------
step "a call from checkout's app, with no proxy settings: through both sidecars"
PAYMENTS_ADMIN=http://$PAYMENTS_IP:15090/metrics
CHECKOUT_ADMIN=http://$CHECKOUT_IP:15090/metrics
env_proxy=$(podman exec checkout-app sh -c 'env | grep -ci proxy || true')
[ "$env_proxy" = 0 ] || fail "checkout's app has proxy variables in the capture variant"
inbound_first() { metric "$PAYMENTS_ADMIN" 'tollgate_inbound_requests_total{code="200",kind="first",outcome="ok"}'; }
before=$(inbound_first)
out=$(in_app checkout -H 'x-timeout-ms: 1500' http://payments:8080/echo)
[ "$(tail -n 1 <<<"$out")" = "200 1 " ] || fail "the call through capture: $(tail -n 1 <<<"$out") (want 200, 1 attempt, no outcome)"
seen=$(head -n 1 <<<"$out")
deadline=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("x-timeout-ms", "-"))' "$seen")
[ "$(inbound_first)" = "$(awk -v b="$before" 'BEGIN {print b + 1}')" ] \
  || fail "payments' inbound side did not count the call"
[ "$(metric "$CHECKOUT_ADMIN" 'tollgate_requests_total{code="200",outcome="ok",upstream="payments"}')" -ge 1 ] \
  || fail "checkout's sidecar did not count the call to payments"
pass "checkout's app -> capture -> checkout's tollgate (upstream payments) -> capture -> payments' inbound side -> payments' app"
[[ $deadline =~ ^[0-9]+$ ]] && [ "$deadline" -gt 0 ] && [ "$deadline" -le 1500 ] \
  || fail "the deadline did not cross: payments' app got x-timeout-ms '$deadline' for 1500 ms sent"
pass "the deadline crosses both sidecars: 1500 ms sent, $deadline ms left at payments' app"

step "a 503 is retried in checkout's sidecar, and only there"
retries() { metric "$CHECKOUT_ADMIN" 'tollgate_retries_total{reason="503",upstream="payments"}'; }
inbound_retries() { metric "$PAYMENTS_ADMIN" 'tollgate_inbound_requests_total{code="200",kind="retry",outcome="ok"}'; }
r0=$(retries)
i0=$(inbound_retries)
out=$(in_app checkout 'http://payments:8080/fail-once?key=play')
[ "$(tail -n 1 <<<"$out")" = "200 2 " ] || fail "fail-once: $(tail -n 1 <<<"$out") (want 200 after 2 attempts)"
hits=$(podman exec payments-payments curl -fsS --max-time 2 http://127.0.0.1:8080/stats \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["hits"].get("/fail-once", 0))')
[ "$hits" = 2 ] || fail "payments' app got /fail-once $hits times, not 2: a sidecar retried more than once"
[ "$(retries)" = "$(awk -v b="$r0" 'BEGIN {print b + 1}')" ] || fail "checkout's sidecar did not count its retry"
[ "$(inbound_retries)" = "$(awk -v b="$i0" 'BEGIN {print b + 1}')" ] \
  || fail "payments' inbound side did not see the retry as a retry"
pass "503 then 200: two attempts from checkout's sidecar, the second admitted as a retry by payments' inbound side, which retried nothing (the app saw 2)"

# ---------------------------------------------------------------------------
step "cart, injected now: its Redis untouched by capture, its call to payments retried through both sidecars"
"$BIN" inject --plain --capture deploy/podman/cart.yaml >"$WORK/cart-injected.yaml" 2>"$WORK/inject-cart.err" \
  || { cat "$WORK/inject-cart.err" >&3; fail "tollgate inject --plain --capture deploy/podman/cart.yaml failed"; }
grep -q 'redis-cart' "$WORK/inject-cart.err" \
  || fail "inject said nothing of redis-cart (tollgate.io/inject: \"false\"): $(cat "$WORK/inject-cart.err")"
python3 - "$WORK/cart-injected.yaml" <<'PY' || fail "inject's cart is not what the story needs (above)"
import sys, tomllib, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
config = tomllib.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["tollgate.toml"])
ups = config.get("upstreams", {})
named = {n: u.get("authorities", []) + u.get("endpoints", []) for n, u in ups.items()}
assert any("payments:8080" in v for v in named.values()), f"no upstream for payments:8080: {named}"
assert not any("redis" in n or any("redis" in a for a in v) for n, v in named.items()), f"Redis became an upstream: {named}"
pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"}
init = next(c for c in pods["cart"]["initContainers"] if c["name"] == "tollgate-iptables")
excluded = next(a for a in init["args"] if a.startswith("--exclude-outbound-ports="))
assert "6379" in excluded.split("=", 1)[1].split(","), f"6379 is captured: {init['args']}"
assert [c["name"] for c in pods["redis-cart"]["containers"]] == ["redis", "redis-alt"], "inject touched redis-cart"
PY
pass "inject: cart's payments:8080 is an upstream, REDIS_ADDR=redis-cart:6379 is not and 6379 is excluded from capture; redis-cart (tollgate.io/inject: \"false\") left alone"
python3 deploy/podman/adapt.py "$WORK/redis.pod.yaml" "$WORK/cart-injected.yaml" --pod redis-cart
python3 deploy/podman/adapt.py "$WORK/cart.pod.yaml" "$WORK/cart-injected.yaml" --pod cart \
  --host "payments=$PAYMENTS_IP" --host "redis-cart=$REDIS_IP"
play redis-cart "$REDIS_IP" "$WORK/redis.pod.yaml"
play cart "$CART_IP" "$WORK/cart.pod.yaml"
redis_up() { [ "$(podman exec "$1" redis-cli -p "$2" ping)" = PONG ]; }
wait_until 30 "redis-cart's redis-server on 6379" redis_up redis-cart-redis 6379
wait_until 30 "redis-cart's redis-server on 16379" redis_up redis-cart-redis-alt 16379
wait_until 60 "cart's /readyz" is_status 200 "http://$CART_IP:15090/readyz"
podman container exists cart-tollgate-iptables && fail "cart: the capture init container should have run once and gone"
CART_ADMIN=http://$CART_IP:15090/metrics
passed_through() { metric "$CART_ADMIN" 'tollgate_passthrough_connections_total{direction="outbound"}'; }
# redis_cli PORT ARGS...: redis-cli in cart's app container (captured, the app's UID),
# to redis-cart as the app's REDIS_ADDR names it.
redis_cli() {
  local port=$1
  shift
  podman exec cart-cart redis-cli -h redis-cart -p "$port" "$@" 2>&1
}
p0=$(passed_through)
for port in 6379 16379; do
  out=$(redis_cli "$port" ping)
  [ "$out" = PONG ] || fail "redis-cli -h redis-cart -p $port ping from cart's app: '$out', not PONG"
  out=$(redis_cli "$port" set "cart:play:$port" "two items, port $port")
  [ "$out" = OK ] || fail "redis-cli SET on $port from cart's app: '$out'"
  out=$(redis_cli "$port" get "cart:play:$port")
  [ "$out" = "two items, port $port" ] || fail "redis-cli GET on $port from cart's app: '$out'"
  [ "$(podman exec redis-cart-redis redis-cli -p "$port" get "cart:play:$port" 2>&1)" = "two items, port $port" ] \
    || fail "redis-cart's server on $port does not hold what cart's app set"
done
[ "$(passed_through)" = "$(plus "$p0" 3)" ] \
  || fail "cart's sidecar passed through $(passed_through) - $p0 connections, not 3 (the three redis-cli calls to 16379; 6379 is not captured)"
[ "$(metric_sum "$CART_ADMIN" tollgate_requests_total)" = 0 ] \
  || fail "cart's sidecar counted Redis traffic as HTTP requests"
pass "from cart's app (captured): redis-cli PING -> PONG, SET then GET, on 6379 (excluded from capture) and on 16379 (passed through by cart's sidecar, 3 connections, bytes untouched)"
inbound_all() { metric_sum "$PAYMENTS_ADMIN" tollgate_inbound_requests_total "$@"; }
a0=$(inbound_all)
r0=$(inbound_all 'kind="retry"')
h0=$(podman exec payments-payments curl -fsS --max-time 2 http://127.0.0.1:8080/stats \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["hits"].get("/fail-once", 0))')
out=$(in_container cart-cart 'http://payments:8080/fail-once?key=cart')
[ "$(tail -n 1 <<<"$out")" = "200 2 " ] || fail "cart's call to fail-once: $(tail -n 1 <<<"$out") (want 200 after 2 attempts)"
h1=$(podman exec payments-payments curl -fsS --max-time 2 http://127.0.0.1:8080/stats \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["hits"].get("/fail-once", 0))')
[ "$h1" = "$(plus "$h0" 2)" ] || fail "payments' app got /fail-once $((h1 - h0)) times from cart, not 2"
[ "$(inbound_all)" = "$(plus "$a0" 2)" ] || fail "payments' inbound side saw $(( $(inbound_all) - a0 )) of cart's attempts, not both"
[ "$(inbound_all 'kind="retry"')" = "$(plus "$r0" 1)" ] || fail "payments' inbound side did not see cart's second attempt as a retry"
[ "$(metric "$CART_ADMIN" 'tollgate_retries_total{reason="503",upstream="payments"}')" = 1 ] \
  || fail "cart's sidecar did not count its retry of the 503"
pass "cart's app -> capture -> cart's sidecar (inject's upstream payments): a 503 of payments' app retried, the answer says 2 attempts; payments' inbound side saw both, the second as a retry"

# ---------------------------------------------------------------------------
step "the health checks"
podman healthcheck run payments-payments >/dev/null \
  || fail "podman's health check of payments' app (its livenessProbe, moved to /probe/8080/healthz) failed"
[ "$(podman exec payments-payments curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:15090/probe/8080/healthz)" = 200 ] \
  || fail "/probe/8080/healthz on payments' admin port is not 200"
[ "$(podman exec payments-payments curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:15090/probe/9999/healthz)" = 404 ] \
  || fail "/probe/9999/healthz (a port not in [admin] probes) is not 404"
pass "payments' app probe runs as podman's health check through the admin port (/probe/8080/healthz 200; a port not listed 404)"

# ---------------------------------------------------------------------------
step "Prometheus scrapes both pods through the shipped relabelling, with the shipped rules"
P=deploy/prometheus
read -r PROM_PORT < <(python3 scripts/free-ports.py 1)
python3 deploy/prom_config.py pods $P/prometheus.yml "$WORK/prometheus.yml" \
  --rules "$ROOT/$P/rules.yml" --pods <(python3 -c '
import json, sys
print(json.dumps(json.load(open(sys.argv[1])) + json.load(open(sys.argv[2]))))' "$WORK/payments.json" "$WORK/checkout.json") \
  --pod-ip "payments=$PAYMENTS_IP" --pod-ip "checkout=$CHECKOUT_IP"
promtool check config "$WORK/prometheus.yml" >/dev/null || fail "promtool check config rejects the pods' scrape config"
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
query() { # PROMQL: the values of the result, "labels value" per line
  curl -fsS --max-time 2 "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" \
    | python3 -c 'import json,sys
for r in json.load(sys.stdin)["data"]["result"]:
    m = r["metric"]; print(m.get("app", "-"), m.get("pod", "-"), m.get("namespace", "-"), r["value"][1])'
}
both_up() { [ "$(query 'up{job="tollgate"} == 1' | wc -l)" = 2 ]; }
wait_until 60 "Prometheus to scrape both pods (up == 1)" both_up
up=$(query 'up{job="tollgate"}' | sort)
[ "$up" = $'checkout checkout default 1\npayments payments default 1' ] \
  || fail "the scraped targets are not the two pods with app, pod and namespace: $up"
[ -n "$(query 'tollgate_requests_total{app="checkout",upstream="payments"}')" ] || fail "checkout's outbound series are not scraped"
[ -n "$(query 'tollgate_inbound_requests_total{app="payments"}')" ] || fail "payments' inbound series are not scraped"
rules_ok() {
  curl -fsS --max-time 2 "http://127.0.0.1:$PROM_PORT/api/v1/rules" | python3 -c '
import json, sys
groups = json.load(sys.stdin)["data"]["groups"]
rules = [r for g in groups for r in g["rules"]]
alerts = [r for r in rules if r["type"] == "alerting"]
assert groups and alerts and all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
print(len(groups), len(rules), len(alerts))'
}
wait_until 30 "every rule of rules.yml evaluated without error" rules_ok
read -r ngroups nrules nalerts < <(rules_ok)
pass "Prometheus scrapes both pods (job tollgate, app/pod/namespace from the relabelling), and loads $P/rules.yml: $ngroups groups, $nrules rules ($nalerts alerts), all healthy"

# ---------------------------------------------------------------------------
step "the plain sidecar: the app's http_proxy, through both sidecars"
podman kube down "$WORK/checkout.pod.yaml" >"$WORK/down-checkout.log" 2>&1 || fail "podman kube down of checkout failed: $(tail -n 3 "$WORK/down-checkout.log")"
python3 deploy/podman/adapt.py "$WORK/plain.pod.yaml" deploy/kubernetes/configmap.yaml \
  deploy/kubernetes/deployment-plain-sidecar.yaml --idle-app --host "payments=$PAYMENTS_IP"
play plain "$PLAIN_IP" "$WORK/plain.pod.yaml"
wait_until 60 "the plain sidecar's /readyz" is_status 200 "http://$PLAIN_IP:15090/readyz"
before=$(inbound_first)
out=$(in_app checkout http://payments:8080/echo)
[ "$(tail -n 1 <<<"$out")" = "200 1 " ] || fail "the call through http_proxy: $(tail -n 1 <<<"$out")"
[ "$(inbound_first)" = "$(awk -v b="$before" 'BEGIN {print b + 1}')" ] \
  || fail "payments' inbound side did not count the call through the plain sidecar"
[ "$(metric "http://$PLAIN_IP:15090/metrics" 'tollgate_requests_total{code="200",outcome="ok",upstream="payments"}')" = 1 ] \
  || fail "the plain sidecar did not count the call to payments"
pass "deployment-plain-sidecar.yaml: the app's call through http_proxy reaches payments' app through both sidecars"

# ---------------------------------------------------------------------------
step "SIGTERM drains payments' tollgate"
# A caller of payments sends a 4 s request to the pod (captured to its inbound side),
# as another pod of the cluster would (checkout's sidecar would give up at its
# request_timeout, 2 s, first).
curl -sS --max-time 15 -o /dev/null -w '%{http_code}\n' "http://$PAYMENTS_IP:8080/slow?ms=4000" >"$WORK/slow.out" 2>&1 &
SLOW=$!
app_inflight() {
  [ "$(podman exec payments-payments curl -fsS --max-time 2 http://127.0.0.1:8080/stats \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["inflight"])')" -ge 1 ]
}
wait_until 10 "the slow request to reach payments' app" app_inflight
podman wait payments-tollgate >"$WORK/exit-code" 2>&1 &
WAITER=$!
podman kill --signal TERM payments-tollgate >/dev/null
wait_until 3 "payments' /readyz to turn 503 while it drains" is_status 503 "http://$PAYMENTS_IP:15090/readyz"
wait "$SLOW" || fail "the request in flight at SIGTERM failed: $(cat "$WORK/slow.out")"
[ "$(cat "$WORK/slow.out")" = 200 ] || fail "the request in flight at SIGTERM: $(cat "$WORK/slow.out")"
wait "$WAITER" || true
[ "$(tail -n 1 "$WORK/exit-code")" = 0 ] || fail "payments' tollgate exited $(cat "$WORK/exit-code") after SIGTERM, not 0"
pass "SIGTERM: /readyz 503 at once, the request in flight finished (200), tollgate exited 0"

printf '\n%s passed, 0 failed (deploy/podman/play.sh, %s s)\n' "$PASSED" "$((SECONDS - STARTED))"
