#!/usr/bin/env bash
# Deployment checks, runnable from anywhere (scripts/deps.sh installs what they need):
#   1. the Dockerfile lints clean (hadolint) and says what the manifests rely on;
#   2. the Kubernetes manifests validate offline against the Kubernetes schemas
#      (kubernetes-validate, --strict), the PodMonitor CRD and the cross-file
#      consistency are checked by deploy/check_manifests.py, `tollgate check
#      --strict` passes the ConfigMap's tollgate.toml (the exposed admin
#      port, which the NetworkPolicy covers), and tollgate itself loads it;
#   3. promtool checks the Prometheus config and rules and runs the rule unit tests;
#      every alert's runbook_url resolves to a heading of the docs (check_rules.py);
#   4. end to end: tollgate in front of a loopback upstream that always succeeds and
#      one that always fails with 503, scraped by a real Prometheus (on a free
#      loopback port, with deploy/prometheus/rules.yml loaded), driven with curl;
#      the metrics and recording rules must show exactly the retries made, every
#      query of the Grafana dashboard (deploy/grafana/tollgate.json) must return data,
#      and the scraped text must pass `promtool check metrics`;
#   5. `tollgate inject` on tests/fixtures/inject's manifests: its outputs validated
#      and checked as the shipped manifests are;
#   6. the pod for real (deploy/podman/play.sh): the image built by podman from
#      deploy/Dockerfile and run, and the pods played with `podman kube play`; skipped
#      loudly where podman cannot run.
# Only 127.0.0.1 is used (and, in 6, a podman network of its own); every process started here is stopped on exit; every wait
# is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PASSED=0
pass() { PASSED=$((PASSED + 1)); printf 'PASS  %s\n' "$*"; }
# fd 3: the real stderr, for failures raised inside a redirected wait_until.
exec 3>&2
fail() { printf '\nFAIL  %s\n' "$*" >&3; exit 1; }
step() { printf '\n--> %s\n' "$*"; }

for tool in python3 curl cargo promtool prometheus hadolint; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (run scripts/deps.sh, as root to install it)"
done
python3 -c 'import kubernetes_validate, yaml' 2>/dev/null \
  || fail "python3 modules kubernetes_validate and yaml are missing (run scripts/deps.sh, as root to install them)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-deploy-test.XXXXXX")
PIDS=()

# running PID: the process exists and has not exited (an exited child stays a
# zombie until it is waited for, and kill -0 still succeeds on a zombie).
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) } # the state letter follows the command name in parentheses
  [[ $stat != [ZX]* ]]
}
exited() { ! running "$1"; }

stop_pid() { # PID: SIGTERM, wait up to 10 s, then SIGKILL
  local pid=$1 i
  if running "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      running "$pid" || break
      sleep 0.1
    done
  fi
  if running "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  wait "$pid" 2>/dev/null || true
}
# forget PID: after waiting for it ourselves, so that cleanup never signals a
# process id that the system may have handed to another process since.
forget() {
  local keep=() p
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

cleanup() {
  local rc=$? pid
  for pid in "${PIDS[@]}"; do stop_pid "$pid"; done
  if [ "$rc" -ne 0 ]; then
    for log in "$TMP"/*.log; do
      [ -s "$log" ] || continue
      printf '\n--- last lines of %s ---\n' "$(basename "$log")" >&3
      tail -n 20 "$log" >&3
    done
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# N free loopback ports, distinct.
free_ports() { python3 "$ROOT/scripts/free-ports.py" "$1"; }

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

http_ok() { curl -fsS --max-time 2 -o /dev/null "$1"; }
alive() { running "$1" || fail "$2 exited early (see its log below)"; }
# ready NAME PID URL: the process still runs and URL answers 2xx. Fails the test at
# once if the process has exited.
ready() { alive "$2" "$1"; http_ok "$3"; }

# ---------------------------------------------------------------------------
step "Dockerfile"
hadolint deploy/Dockerfile || fail "hadolint found problems in deploy/Dockerfile"
# What the Kubernetes manifests rely on, in the final stage.
final_stage=$(awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' deploy/Dockerfile)
for want in 'USER 65532:65532' 'EXPOSE 15001 15006 15090' 'ENTRYPOINT ["tollgate", "run"]' \
  'TOLLGATE_CONFIG=/etc/tollgate/tollgate.toml' 'COPY --from=binary /usr/bin/sleep /bin/sleep' \
  'COPY --from=binary /out/tollgate /usr/local/bin/tollgate' 'FROM ${RUNTIME_BASE} AS runtime' \
  'COPY --from=binary /out/tollgate-proxy /usr/local/bin/tollgate-proxy'; do
  grep -qF -- "$want" <<<"$final_stage" || fail "deploy/Dockerfile final stage lacks: $want"
done
grep -q 'cargo build --release --locked' deploy/Dockerfile || fail "deploy/Dockerfile must build with --locked"
# The capture init container's image: a stage named iptables with the tool and tollgate.
iptables_stage=$(awk '/^FROM /{on = / AS iptables$/} on' deploy/Dockerfile)
for want in 'apt-get install -y --no-install-recommends iptables' 'COPY --from=binary /out/tollgate /usr/local/bin/tollgate' \
  'ENTRYPOINT ["tollgate", "iptables"]'; do
  grep -qF -- "$want" <<<"$iptables_stage" || fail "deploy/Dockerfile's iptables stage lacks: $want"
done
# The bases are build arguments: their defaults pinned by digest, and no FROM names an
# image but through them (or a stage of this file).
unpinned=$(grep '^ARG [A-Z_]*_BASE=' deploy/Dockerfile | grep -v '@sha256:[0-9a-f]\{64\}$' || true)
[ -z "$unpinned" ] || fail "deploy/Dockerfile has a base image not pinned by digest: $unpinned"
[ "$(grep -c '^ARG [A-Z_]*_BASE=' deploy/Dockerfile)" = 2 ] || fail "deploy/Dockerfile should take BUILD_BASE and RUNTIME_BASE"
stray=$(grep '^FROM ' deploy/Dockerfile | grep -v -E '^FROM \$\{(BUILD_BASE|RUNTIME_BASE|BINARY)\} AS [a-z]+$' || true)
[ -z "$stray" ] || fail "deploy/Dockerfile has a FROM that is not one of its base arguments: $stray"
for ignored in target/ .git/; do
  grep -qx "$ignored" .dockerignore || fail ".dockerignore must exclude $ignored"
done
# One license everywhere: Cargo.toml, the image's label, and the LICENSE file's text.
license=$(sed -n 's/^license = "\(.*\)"$/\1/p' Cargo.toml)
[ "$license" = Apache-2.0 ] || fail "Cargo.toml's license is '$license'; LICENSE and the image label say Apache-2.0"
grep -qF "org.opencontainers.image.licenses=\"$license\"" deploy/Dockerfile \
  || fail "deploy/Dockerfile's licenses label is not $license"
head -n 5 LICENSE | grep -q 'Apache License' && head -n 5 LICENSE | grep -q 'Version 2.0, January 2004' \
  && grep -q 'END OF TERMS AND CONDITIONS' LICENSE || fail "LICENSE is not the full Apache License 2.0 text"
pass "Dockerfile lints clean (hadolint) and has the user, ports, entrypoint and config path the manifests use, the iptables target of the capture init container, and its bases as pinned build arguments; LICENSE, Cargo.toml and the image agree (Apache-2.0)"

# ---------------------------------------------------------------------------
step "Kubernetes manifests"
K=deploy/kubernetes
read -r K8S_OLDEST K8S_NEWEST < <(python3 - <<'EOF'
import os, kubernetes_validate
d = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
vs = sorted({tuple(int(x) for x in n[1:].split("-")[0].split(".")) for n in os.listdir(d) if n.startswith("v")})
print(".".join(map(str, vs[0])), ".".join(map(str, vs[-1])))
EOF
)
validate() { # VERSION FILES...
  local v=$1
  shift
  python3 -m kubernetes_validate --strict --quiet --kubernetes-version "$v" "$@" \
    || fail "kubernetes-validate --strict (Kubernetes $v) rejected: $*"
}
# The native sidecar (an init container with restartPolicy: Always) needs 1.29+.
# So does the capture variant (the same native sidecar, after a `tollgate iptables`
# init container).
validate 1.29.0 $K/configmap.yaml $K/deployment-native-sidecar.yaml $K/deployment-capture.yaml \
  $K/networkpolicy.yaml $K/service.yaml $K/rbac.yaml
validate "$K8S_NEWEST" $K/configmap.yaml $K/deployment-native-sidecar.yaml $K/deployment-plain-sidecar.yaml \
  $K/deployment-capture.yaml $K/networkpolicy.yaml $K/service.yaml $K/rbac.yaml
# The plain sidecar is for older clusters: it must validate against the oldest schema too.
validate "$K8S_OLDEST" $K/configmap.yaml $K/deployment-plain-sidecar.yaml $K/networkpolicy.yaml $K/service.yaml \
  $K/rbac.yaml
pass "manifests valid: ConfigMap, the three Deployments (native, plain, capture), NetworkPolicy, Service, the discovery RBAC (kubernetes-validate --strict against $K8S_OLDEST, 1.29.0 and $K8S_NEWEST)"

# The PodMonitor is a CRD kubernetes-validate has no schema for: check_manifests.py
# checks its structure, and how all the objects fit together.
python3 deploy/check_manifests.py $K --extract-config "$TMP/configmap.toml" \
  || fail "deploy/check_manifests.py found problems in $K"
pass "PodMonitor well-formed; manifests consistent with each other and with the ConfigMap's tollgate.toml; the admin port admitted only from Prometheus (NetworkPolicy); the Service's targetPort is the inbound port, the app's port off it; the capture init container runs first with NET_ADMIN only, tollgate's UID and the config's ports"

step "build tollgate"
# --locked as in the Dockerfile: a stale Cargo.lock would break the image build too.
cargo build --locked --quiet || fail "cargo build --locked failed"
TOLLGATE=$(readlink -m "${CARGO_TARGET_DIR:-target}")/debug/tollgate
[ -x "$TOLLGATE" ] || fail "no binary at $TOLLGATE"

step "the capture init container's arguments, as tollgate iptables reads them"
mapfile -t IPT_ARGS < <(python3 -c '
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]
print("\n".join(next(c for c in spec["initContainers"] if c["name"] == "tollgate-iptables")["args"]))' \
  $K/deployment-capture.yaml)
"$TOLLGATE" iptables "${IPT_ARGS[@]}" --dry-run >"$TMP/iptables.out" 2>&1 \
  || { cat "$TMP/iptables.out" >&3; fail "tollgate iptables refuses the init container's args: ${IPT_ARGS[*]}"; }
for want in '-A TOLLGATE_OUTPUT -m owner --uid-owner 15000 -j RETURN' \
  '-A TOLLGATE_OUTPUT -p tcp -j REDIRECT --to-ports 15001' \
  '-A TOLLGATE_INBOUND -p tcp --dport 15090 -j RETURN' \
  '-A TOLLGATE_INBOUND -p tcp -j REDIRECT --to-ports 15006'; do
  grep -qF -- "$want" "$TMP/iptables.out" || fail "tollgate iptables --dry-run with the init container's args lacks: $want"
done
pass "the capture init container's args (${IPT_ARGS[*]}) give the rules the ConfigMap needs (tollgate iptables --dry-run)"

step "tollgate check --strict on the ConfigMap's config"
# Exit 0 = valid without warnings, 3 = valid with warnings (--strict), 1 = invalid.
# The admin port listens on 0.0.0.0 (Prometheus scrapes the pod IP, the kubelet probes
# it) and is no warning: it serves /config on loopback only, and networkpolicy.yaml
# admits only the scraper to it.
CHECK_RC=0
"$TOLLGATE" check --strict --config "$TMP/configmap.toml" >"$TMP/check.out" 2>&1 || CHECK_RC=$?
sed 's/^/    /' "$TMP/check.out"
[ "$CHECK_RC" = 0 ] || fail "tollgate check --strict does not pass the ConfigMap's tollgate.toml (exit $CHECK_RC)"
pass "tollgate check --strict passes the ConfigMap's tollgate.toml"

step "tollgate loads the ConfigMap's config, and reloads it the way the kubelet updates it"
# Same config, with the listener and admin moved to free loopback ports, laid out as
# the kubelet lays out a ConfigMap volume (the key is a symlink through the "..data"
# symlink to a timestamped directory; an update writes a new directory and swaps
# "..data" atomically). Started the way the image starts it (TOLLGATE_CONFIG, the
# manifests' args). No request is sent: its endpoints are cluster DNS names.
read -r CM_LISTEN CM_ADMIN CM_INBOUND < <(free_ports 3)
CM_DIR=$TMP/etc-tollgate
mkdir -p "$CM_DIR/..2024_01_01_00_00_00.000000001"
sed -e "s/^addr = \"127.0.0.1:15001\"/addr = \"127.0.0.1:$CM_LISTEN\"/" \
  -e "s/^addr = \"0.0.0.0:15090\"/addr = \"127.0.0.1:$CM_ADMIN\"/" \
  -e "s/^addr = \"0.0.0.0:15006\"/addr = \"127.0.0.1:$CM_INBOUND\"/" \
  "$TMP/configmap.toml" >"$CM_DIR/..2024_01_01_00_00_00.000000001/tollgate.toml"
grep -q "127.0.0.1:$CM_ADMIN" "$CM_DIR/..2024_01_01_00_00_00.000000001/tollgate.toml" \
  || fail "could not move the ConfigMap's admin.addr"
grep -q "127.0.0.1:$CM_INBOUND" "$CM_DIR/..2024_01_01_00_00_00.000000001/tollgate.toml" \
  || fail "could not move the ConfigMap's inbound.addr"
ln -s ..2024_01_01_00_00_00.000000001 "$CM_DIR/..data"
ln -s ..data/tollgate.toml "$CM_DIR/tollgate.toml"
# configmap_update NAME: a new version of the config from stdin, swapped in as the kubelet does.
configmap_update() {
  mkdir "$CM_DIR/$1"
  cat >"$CM_DIR/$1/tollgate.toml"
  chmod -R a+rX "$CM_DIR/$1"
  ln -s "$1" "$CM_DIR/..data_tmp"
  mv -T "$CM_DIR/..data_tmp" "$CM_DIR/..data"
}
# As root, run it as the manifests do: uid/gid 65532, no capabilities, no new privileges.
AS_POD_USER=()
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  chmod -R a+rX "$TMP"
  AS_POD_USER=(setpriv --reuid=65532 --regid=65532 --clear-groups --no-new-privs
    --inh-caps=-all --bounding-set=-all)
fi
TOLLGATE_CONFIG="$CM_DIR/tollgate.toml" RUST_LOG=info \
  "${AS_POD_USER[@]}" "$TOLLGATE" run --log-format json >"$TMP/tollgate-configmap.log" 2>&1 &
CM_PID=$!
PIDS+=("$CM_PID")
wait_until 20 "tollgate (ConfigMap config) /readyz" \
  ready "tollgate (ConfigMap config)" "$CM_PID" "http://127.0.0.1:$CM_ADMIN/readyz"
# effective KEY...: a value from tollgate's GET /config.
effective() {
  curl -fsS --max-time 2 "http://127.0.0.1:$CM_ADMIN/config" | python3 -c '
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1:]:
    v = v[k]
print(json.dumps(v, sort_keys=True))' "$@"
}
[ "$(effective upstreams | python3 -c 'import json,sys; print(",".join(sorted(json.load(sys.stdin))))')" = inventory,payments ] \
  || fail "the ConfigMap's upstreams (inventory, payments) are not in tollgate's effective config"
[ "$(effective upstreams payments max_inflight)" = 500 ] || fail "payments.max_inflight is not 500 in /config"
[ "$(effective inbound max_inflight)" = '"adaptive"' ] || fail "the ConfigMap's [inbound] is not in tollgate's effective config"
curl -s --max-time 2 -o /dev/null "http://127.0.0.1:$CM_INBOUND/" \
  || fail "the ConfigMap's inbound side does not answer on its port"
pass "tollgate serves the ConfigMap's tollgate.toml$([ ${#AS_POD_USER[@]} -eq 0 ] || echo ' as uid 65532 without capabilities') (/readyz 200, both upstreams and the inbound side loaded)"

# reloads RESULT: tollgate_config_reloads_total{result=RESULT}.
reloads() {
  curl -fsS --max-time 2 "http://127.0.0.1:$CM_ADMIN/metrics" \
    | awk -v r="tollgate_config_reloads_total{result=\"$1\"}" '$1 == r {print $2}'
}
reloads_are() { [ "$(reloads ok)" = "$1" ] && [ "$(reloads error)" = "$2" ]; }
# tollgate_config_last_reload_successful: 1 while the newest file is in force.
last_reload_ok() {
  curl -fsS --max-time 2 "http://127.0.0.1:$CM_ADMIN/metrics" \
    | awk '$1 == "tollgate_config_last_reload_successful" {print $2}'
}
[ "$(last_reload_ok)" = 1 ] || fail "tollgate_config_last_reload_successful is not 1 after the start"
sed 's/^max_inflight = 500$/max_inflight = 400/' "$CM_DIR/..data/tollgate.toml" \
  | configmap_update ..2024_01_01_00_01_00.000000002
wait_until 20 "a reload after the ConfigMap update (reloads ok=1 error=0)" reloads_are 1 0
[ "$(effective upstreams payments max_inflight)" = 400 ] || fail "the reloaded config is not in effect (/config)"
{ cat "$CM_DIR/..data/tollgate.toml"; printf '\n[upstreams.payments.typo]\nretires = 3\n'; } \
  | configmap_update ..2024_01_01_00_02_00.000000003
wait_until 20 "the invalid update to be refused (reloads ok=1 error=1)" reloads_are 1 1
[ "$(effective upstreams payments max_inflight)" = 400 ] || fail "an invalid update changed the effective config"
[ "$(last_reload_ok)" = 0 ] || fail "tollgate_config_last_reload_successful is not 0 while the newest file is refused"
http_ok "http://127.0.0.1:$CM_ADMIN/readyz" || fail "tollgate is not ready after refusing an invalid config"
pass "ConfigMap-style updates through the directory mount: a valid one is reloaded, an invalid one refused (old config kept, tollgate_config_last_reload_successful 0)"

kill -TERM "$CM_PID"
# No request is in flight, so the drain is immediate; allow its drain_timeout (20 s) anyway.
wait_until 30 "tollgate (ConfigMap config) to exit after SIGTERM" exited "$CM_PID"
CM_RC=0
wait "$CM_PID" || CM_RC=$?
forget "$CM_PID"
[ "$CM_RC" -eq 0 ] || fail "tollgate exited $CM_RC on SIGTERM (expected 0 after a clean drain)"
pass "tollgate exits 0 on SIGTERM"

# ---------------------------------------------------------------------------
step "tollgate inject on the three manifests of tests/fixtures/inject, checked offline"
# Each output as the cluster would get it: validated against the Kubernetes schemas
# (a native sidecar from 1.29 on; a plain one against the oldest schema too), checked
# by check_manifests.py --injected, and each ConfigMap's tollgate.toml by
# `tollgate check --strict`. The payments manifest was injected already (inject leaves
# it as it is; deploy/podman/play.sh runs it).
F=tests/fixtures/inject
inject_case() { # NAME SCHEMAS FLAGS... -- FILE
  local name=$1 schemas=$2 dir=$TMP/inject-$1 v
  shift 2
  local flags=()
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  mkdir -p "$dir"
  "$TOLLGATE" inject "${flags[@]}" "$2" >"$dir/out.yaml" 2>"$dir/notes" \
    || { cat "$dir/notes" >&3; fail "tollgate inject ${flags[*]} $2 failed"; }
  for v in $schemas; do validate "$v" "$dir/out.yaml"; done
  python3 deploy/check_manifests.py "$dir" --injected >"$dir/check.out" 2>&1 \
    || { cat "$dir/check.out" >&3; fail "check_manifests.py --injected: tollgate inject ${flags[*]} $2"; }
  python3 -c '
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "ConfigMap" and "tollgate.toml" in d.get("data", {}):
        open(sys.argv[2], "w").write(d["data"]["tollgate.toml"])' "$dir/out.yaml" "$dir/tollgate.toml"
  "$TOLLGATE" check --strict --config "$dir/tollgate.toml" >"$dir/check-strict.out" 2>&1 \
    || { cat "$dir/check-strict.out" >&3; fail "tollgate check --strict: the ConfigMap of tollgate inject ${flags[*]} $2"; }
  printf '    %-34s %s\n' "inject ${flags[*]:-} $(basename "$2")" "$(grep -c '^kind:' "$dir/out.yaml") documents: valid ($schemas), consistent, check --strict clean"
}
inject_case storefront "1.29.0 $K8S_NEWEST" -- $F/storefront.yaml
inject_case storefront-plain-capture "$K8S_OLDEST 1.29.0 $K8S_NEWEST" --plain --capture -- $F/storefront.yaml
inject_case ledger "1.29.0 $K8S_NEWEST" -- $F/ledger.yaml
inject_case ledger-capture "1.29.0 $K8S_NEWEST" --capture -- $F/ledger.yaml
inject_case payments "$K8S_OLDEST 1.29.0 $K8S_NEWEST" --plain --capture -- $F/payments-injected.yaml
cmp -s "$TMP/inject-payments/out.yaml" $F/payments-injected.yaml \
  || fail "tollgate inject changed payments-injected.yaml, which has tollgate already"
pass "tollgate inject: the storefront (several containers, every kind of probe), the ledger StatefulSet (with and without capture, native and plain) and the injected payments: valid, consistent, their configs clean"

# ---------------------------------------------------------------------------
step "Prometheus config and rules (promtool)"
P=deploy/prometheus
if promtool check config $P/prometheus.yml >"$TMP/promtool-config.out" 2>&1; then
  cat "$TMP/promtool-config.out"
elif grep -q 'kubernetes_sd_configs not found' "$TMP/promtool-config.out"; then
  # Debian's Prometheus is built without Kubernetes discovery. Check everything
  # else, with the pod discovery swapped for static targets carrying the same
  # __meta_kubernetes_* labels (the relabelling is then checked as written).
  echo "note: this promtool has no kubernetes_sd (Debian build); checking prometheus.yml with"
  echo "      pod discovery replaced by equivalent static targets"
  python3 deploy/prom_config.py offline $P/prometheus.yml "$TMP/prometheus-offline.yml"
  promtool check config "$TMP/prometheus-offline.yml" || fail "promtool check config failed"
else
  cat "$TMP/promtool-config.out" >&2
  fail "promtool check config $P/prometheus.yml failed"
fi
pass "promtool check config"
promtool check rules $P/rules.yml || fail "promtool check rules failed"
pass "promtool check rules"
promtool test rules $P/rules_test.yml || fail "promtool test rules failed"
pass "promtool rules tests passed"
python3 deploy/check_rules.py $P/rules.yml "$ROOT" || fail "deploy/check_rules.py found problems in $P/rules.yml"
pass "every alert has a runbook_url that resolves to a section of the docs"

# ---------------------------------------------------------------------------
step "end to end: tollgate + Prometheus on loopback"
N=40 # requests to each upstream, one of them a warm-up
read -r LISTEN ADMIN PROM INBOUND < <(free_ports 4)

python3 deploy/e2e_upstream.py 200 "$TMP/ok.port" >"$TMP/upstream-ok.log" 2>&1 &
PIDS+=("$!")
python3 deploy/e2e_upstream.py 503 "$TMP/failing.port" >"$TMP/upstream-failing.log" 2>&1 &
PIDS+=("$!")
wait_until 10 "the test upstreams" test -s "$TMP/ok.port" -a -s "$TMP/failing.port"
OK_PORT=$(cat "$TMP/ok.port")
FAILING_PORT=$(cat "$TMP/failing.port")

# The budget window is 1m so that the amplification gauge still covers all the
# traffic while Prometheus scrapes; the budget allows every retry.
cat >"$TMP/tollgate.toml" <<EOF
[listener]
addr = "127.0.0.1:$LISTEN"
drain_timeout = "2s"

[admin]
addr = "127.0.0.1:$ADMIN"

[upstreams.ok]
authorities = ["ok"]
endpoints = ["127.0.0.1:$OK_PORT"]

[upstreams.ok.budget]
window = "1m"

[upstreams.failing]
authorities = ["failing"]
endpoints = ["127.0.0.1:$FAILING_PORT"]

[upstreams.failing.retry]
max_attempts = 3
backoff_base = "1ms"
backoff_max = "10ms"

[upstreams.failing.budget]
ratio = 1.0
min_per_sec = 100
window = "1m"

# The inbound side in front of the "ok" upstream, as if it were this tollgate's app.
# Its fleet budget admits no retry at all, so every retry sent to it is rejected.
[inbound]
addr = "127.0.0.1:$INBOUND"
app = "127.0.0.1:$OK_PORT"
max_inflight = "adaptive"

[inbound.retries]
ratio = 0.0
min_per_sec = 0
window = "1m"
EOF
"$TOLLGATE" run --config "$TMP/tollgate.toml" >"$TMP/tollgate.log" 2>&1 &
TG_PID=$!
PIDS+=("$TG_PID")
wait_until 20 "tollgate /readyz" ready tollgate "$TG_PID" "http://127.0.0.1:$ADMIN/readyz"
alive "$TG_PID" tollgate

# request HOST N: send N requests through the listener; every answer must be as expected.
# Each to a target of its own: the same request again within 2 s of a failure would be
# the app's own retry (sent once, as a retry).
request() {
  local host=$1 n=$2 i got want
  case $host in
    ok) want='200 1 -' ;;
    failing) want='503 3 attempts-exhausted' ;;
  esac
  for ((i = 1; i <= n; i++)); do
    got=$(curl -sS --max-time 10 -o /dev/null -H "Host: $host" \
      -w '%{http_code} %header{x-tollgate-attempts} %header{x-tollgate-outcome}' \
      "http://127.0.0.1:$LISTEN/e2e/$n-$i") || fail "curl to upstream $host failed"
    got=$(awk '{print $1, ($2 == "" ? "-" : $2), ($3 == "" ? "-" : $3)}' <<<"$got")
    [ "$got" = "$want" ] || fail "upstream $host: got '$got' (status attempts outcome), want '$want'"
  done
}

# inbound FIRST RETRIES: first attempts and retries (x-tollgate-attempt: 2) through
# the inbound side; first attempts reach the app (200), retries are rejected (503
# retry-rejected).
inbound() {
  local first=$1 retries=$2 i got
  for ((i = 1; i <= first; i++)); do
    got=$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$INBOUND/in/$i") \
      || fail "curl to the inbound side failed"
    [ "$got" = 200 ] || fail "inbound first attempt: got $got, want 200"
  done
  for ((i = 1; i <= retries; i++)); do
    got=$(curl -sS --max-time 10 -o /dev/null -H 'x-tollgate-attempt: 2' \
      -w '%{http_code} %header{x-tollgate-outcome}' "http://127.0.0.1:$INBOUND/in/r$i") \
      || fail "curl to the inbound side failed"
    [ "$got" = '503 retry-rejected' ] || fail "inbound retry: got '$got', want '503 retry-rejected'"
  done
}

# One request each before Prometheus starts: every series the test reads then exists
# (at its warm-up value) in Prometheus's first scrape, so rate() sees all the rest.
request ok 1
request failing 1
inbound 1 1

python3 deploy/prom_config.py e2e $P/prometheus.yml "$TMP/prometheus.yml" \
  --rules "$ROOT/$P/rules.yml" --admin "127.0.0.1:$ADMIN" --app-port "$LISTEN"
promtool check config "$TMP/prometheus.yml" >/dev/null || fail "the generated e2e Prometheus config is invalid"
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$PROM" --log.level=warn >"$TMP/prometheus.log" 2>&1 &
PROM_PID=$!
PIDS+=("$PROM_PID")
PROM_URL=http://127.0.0.1:$PROM
wait_until 60 "Prometheus /-/ready" ready prometheus "$PROM_PID" "$PROM_URL/-/ready"

# query EXPR: print each result as "VALUE LABELS" (one line per series).
query() {
  curl -fsS --max-time 5 -G "$PROM_URL/api/v1/query" --data-urlencode "query=$1" | python3 -c '
import json, sys
for r in json.load(sys.stdin)["data"]["result"]:
    m = r["metric"]
    print(r["value"][1], ",".join(f"{k}={m[k]}" for k in sorted(m)))'
}
# value EXPR: the single value of EXPR, or nothing.
value() { query "$1" | awk 'NR == 1 && !seen {v = $1} {n++} END {if (n == 1) print v}'; }
# equals EXPR WANT [TOLERANCE]
equals() { python3 -c 'import sys; v, w, t = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]); sys.exit(0 if v and abs(float(v) - w) <= t else 1)' "$(value "$1")" "$2" "${3:-0}"; }
# expect SECONDS EXPR WANT [TOLERANCE]: poll until EXPR has one value WANT, or fail.
expect() {
  local secs=$1 expr=$2 want=$3 tol=${4:-0} deadline=$((SECONDS + $1))
  until equals "$expr" "$want" "$tol"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      fail "after ${secs}s, $expr is '$(query "$expr" | tr '\n' ';')', want $want (±$tol)"
    fi
    sleep 1
  done
  pass "$expr = $want$([ "$tol" = 0 ] || echo " (±$tol)")"
}

# The simulated pod discovery: one scraped target (the annotated pod, its two ports
# collapsed into one), the unannotated and the finished pods dropped.
expect 60 'count(up)' 1
expect 30 'up{job="tollgate",namespace="e2e",pod="e2e-scraped",app="e2e-app"}' 1
# The warm-up is in the first scrapes; now the rest of the traffic.
expect 30 'sum(tollgate_requests_total{upstream="failing"})' 1
request ok $((N - 1))
request failing $((N - 1))
inbound 9 3
pass "traffic: $N requests to each upstream; ok answered 200 after 1 attempt, failing 503 after 3 attempts (attempts-exhausted); 10 first attempts and 4 retries through the inbound side, the retries rejected"

expect 60 'sum(tollgate_requests_total{upstream="ok"})' "$N"
expect 60 'sum(tollgate_requests_total{upstream="failing",code="503",outcome="attempts-exhausted"})' "$N"
expect 30 'tollgate_amplification{upstream="failing"}' 3
expect 30 'tollgate_amplification{upstream="ok"}' 1
expect 30 'sum(tollgate_retries_total{upstream="failing"})' $((2 * N))
expect 30 'sum(tollgate_retries_total{upstream="failing",reason="503"})' $((2 * N))
expect 30 'sum(tollgate_attempts_total{upstream="failing",result="5xx"})' $((3 * N))
expect 30 'sum(tollgate_retries_denied_total{upstream="failing",reason="budget"})' 0
expect 30 'sum(tollgate_retries_denied_total{upstream="failing",reason="attempts"})' "$N"
# Recording rules from rules.yml, evaluated by Prometheus every second, carry the
# labels the pod relabelling set.
expect 30 'tollgate:amplification:ratio_rate5m{namespace="e2e",app="e2e-app",upstream="failing"}' 3 0.001
expect 30 'tollgate:amplification:ratio_rate5m{namespace="e2e",app="e2e-app",upstream="ok"}' 1 0.001
expect 30 'tollgate:retry:ratio_rate5m{namespace="e2e",app="e2e-app",upstream="failing"}' 2 0.001
# The inbound side: first attempts reached the app, retries were refused by the fleet
# budget; the recording rules see 12 requests for 9 first attempts after the warm-up.
expect 60 'sum(tollgate_inbound_requests_total{kind="first",code="200",outcome="ok"})' 10
expect 30 'sum(tollgate_inbound_requests_total{kind="retry",code="503",outcome="retry-rejected"})' 4
expect 30 'tollgate_inbound_denied_total{reason="retry-budget",job="tollgate",app="e2e-app"}' 4
expect 30 'tollgate_inbound_retry_budget_available{app="e2e-app"}' 0
expect 30 'tollgate:inbound_amplification:ratio_rate5m{namespace="e2e",app="e2e-app"}' 1.3333 0.001
expect 30 'tollgate:inbound_retries_rejected:ratio_rate5m{namespace="e2e",app="e2e-app"}' 0.25 0.001
# The build and process metrics, through the same relabelling.
expect 30 'tollgate_build_info{job="tollgate",namespace="e2e",app="e2e-app"}' 1
expect 30 'count(process_start_time_seconds{job="tollgate",app="e2e-app"} > time() - 600)' 1
expect 30 'count(process_open_fds{job="tollgate",app="e2e-app"} > 0)' 1

# The Grafana dashboard: every panel's query, as Grafana sends it for this pod
# (namespace e2e, app e2e-app), must parse and return data.
python3 deploy/check_dashboard.py deploy/grafana/tollgate.json "$PROM_URL" \
  --var namespace=e2e --var app=e2e-app --rate-interval 5m --wait 30 \
  || fail "a panel of deploy/grafana/tollgate.json returns no data (above)"
pass "Grafana dashboard: every panel query of deploy/grafana/tollgate.json returns data from the real Prometheus"

# The exposition itself, as Prometheus's own linter reads it, after all that traffic
# (histograms, every outcome and denial series present).
curl -fsS --max-time 5 "http://127.0.0.1:$ADMIN/metrics" >"$TMP/metrics.txt" \
  || fail "could not scrape tollgate's /metrics"
promtool check metrics <"$TMP/metrics.txt" >"$TMP/promtool-metrics.out" 2>&1 \
  || { cat "$TMP/promtool-metrics.out" >&3; fail "promtool check metrics found problems in tollgate's /metrics"; }
[ -s "$TMP/promtool-metrics.out" ] \
  && { cat "$TMP/promtool-metrics.out" >&3; fail "promtool check metrics reported problems in tollgate's /metrics"; }
pass "promtool check metrics: tollgate's /metrics ($(grep -vc '^#' "$TMP/metrics.txt") samples) lints clean"
alive "$TG_PID" tollgate
pass "prometheus end-to-end passed"

# ---------------------------------------------------------------------------
step "the pod for real: the images built by podman, the manifests played (deploy/podman/play.sh)"
# Its own time budget (about a minute with the Debian base kept from an earlier run,
# about four on a first run, which makes the base with debootstrap). Skipped loudly where podman
# cannot run here; TOLLGATE_PODMAN=require makes that a failure, TOLLGATE_PODMAN=0
# skips it.
# The image holds the release binary: built here, outside the budget (in
# scripts/test.sh, `cargo bench --no-run` has built it already: the bench profile is
# the release one, so this takes a second).
PODMAN_BUDGET=${TOLLGATE_PODMAN_BUDGET:-480}
SKIPPED=
rc=0
if [ "${TOLLGATE_PODMAN:-1}" != 0 ]; then
  start=$SECONDS
  cargo build --release --locked --quiet --bin tollgate || fail "cargo build --release failed"
  echo "the release binary, up to date in $((SECONDS - start)) s"
fi
timeout --kill-after=20 "$PODMAN_BUDGET" deploy/podman/play.sh || rc=$?
case $rc in
  0) pass "deploy/podman/play.sh: the image built and run, the pods played, every check passed" ;;
  77)
    SKIPPED=" (SKIPPED: the podman image and pod tests, see SKIP above)"
    # For scripts/test.sh's list of what this machine did not check.
    [ -z "${TOLLGATE_SKIPS:-}" ] || echo "deploy/podman/play.sh (podman; its SKIP line says why): the image and the pods NOT tested" >>"$TOLLGATE_SKIPS"
    printf '\n!!!!  SKIPPED: deploy/podman/play.sh (SKIP above): the image and the pods were NOT tested  !!!!\n' >&3
    ;;
  124 | 137) fail "deploy/podman/play.sh took more than its budget of $PODMAN_BUDGET s" ;;
  *) fail "deploy/podman/play.sh failed (exit $rc, above)" ;;
esac

printf '\ndeploy/test.sh: %d passed, 0 failed%s\n' "$PASSED" "$SKIPPED"
