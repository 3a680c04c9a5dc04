#!/usr/bin/env bash
# The request reader, differentially: a table of malformed and ambiguous HTTP/1.1
# requests (smuggling classics, line endings, Host, targets, lengths, chunk lines) sent
# raw to tollgate, nginx and HAProxy, each in front of a recording upstream. One line
# per case with each peer's verdict; fails when tollgate forwards what nginx or HAProxy
# refuses as malformed, or forwards anything not clean and normalised. See
# scripts/differential.py for the rules. Installs nginx and HAProxy from Debian if
# missing. Takes a few seconds.
#
#   scripts/differential.sh [--tollgate PATH] [--no-install]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOLLGATE_BIN=""
INSTALL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tollgate) TOLLGATE_BIN="${2:?"$1 needs a value"}"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done

need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$INSTALL" = 1 ]; then
    echo "==> installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends "${need[@]}" ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; }; } >/dev/null
  else
    echo "missing: ${need[*]}" >&2
    exit 2
  fi
fi

if [ -z "$TOLLGATE_BIN" ]; then
  (cd "$ROOT" && cargo build --quiet --bin tollgate)
  target_dir="${CARGO_TARGET_DIR:-target}"
  case "$target_dir" in /*) ;; *) target_dir="$ROOT/$target_dir" ;; esac
  TOLLGATE_BIN="$target_dir/debug/tollgate"
fi

exec python3 "$ROOT/scripts/differential.py" "$TOLLGATE_BIN" \
  "$(command -v nginx || echo /usr/sbin/nginx)" "$(command -v haproxy || echo /usr/sbin/haproxy)"
