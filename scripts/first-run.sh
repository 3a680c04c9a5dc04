#!/usr/bin/env bash
# The README's first run, as written, so that it cannot go stale.
#
#   scripts/first-run.sh [--update]
#
# Takes the two blocks that follow the markers in README.md's "Run it":
#   <!-- first-run: setup -->       shell commands, run as they are;
#   <!-- first-run: transcript -->  "$ COMMAND" lines, each followed by its output.
# Runs the setup, then every transcript command, in one bash, from the repository
# root (the debug binary through `cargo run`), and compares what they print with
# the transcript. Only what really varies is tolerated: the values of the Date,
# Last-Modified and Server headers (the clock, the file's time, the Python
# version), and the ports: 8080, 15001 and 15090 are replaced by free loopback
# ports before running and put back in the output. With --update the transcript in
# README.md is rewritten from this run instead.
#
# The proxy variables of the calling environment are removed (they would send the
# commands' curl elsewhere). Every process the commands start is stopped on exit,
# and the whole run is bounded (FIRST_RUN_TIMEOUT seconds, 300 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
README=$ROOT/README.md

UPDATE=0
case "${1:-}" in
  "") ;;
  --update) UPDATE=1 ;;
  -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
  *) echo "unknown option: $1" >&2; exit 2 ;;
esac

for tool in cargo curl python3; do
  command -v "$tool" >/dev/null || { echo "first-run.sh: $tool is not installed" >&2; exit 1; }
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-first-run.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# block MARKER: the lines of the fenced block after the line "<!-- first-run: MARKER -->".
block() {
  awk -v marker="<!-- first-run: $1 -->" '
    $0 == marker { found = 1; next }
    found == 1 && /^```/ { found = 2; next }
    found == 2 && /^```/ { exit }
    found == 2 { print }
  ' "$README"
}
block setup >"$TMP/setup.sh"
block transcript >"$TMP/expected.txt"
[ -s "$TMP/setup.sh" ] || { echo "first-run.sh: no setup block in README.md" >&2; exit 1; }
grep -q '^\$ ' "$TMP/expected.txt" || { echo "first-run.sh: no transcript in README.md" >&2; exit 1; }

# The README's ports, and free ones to run on.
README_PORTS=(8080 15001 15090)
read -r -a PORTS < <(python3 "$ROOT/scripts/free-ports.py" ${#README_PORTS[@]})
to_free=() to_readme=()
for i in "${!README_PORTS[@]}"; do
  to_free+=(-e "s/\\b${README_PORTS[$i]}\\b/${PORTS[$i]}/g")
  to_readme+=(-e "s/\\b${PORTS[$i]}\\b/${README_PORTS[$i]}/g")
done

# One bash script: the setup (its output to a log), then each transcript command,
# echoed as the README shows it and run on the free ports, stdout and stderr
# together. On exit it stops whatever the commands left running.
{
  echo 'set -u'
  printf 'cd %q\n' "$ROOT"
  echo 'trap '\''for p in $(jobs -p); do kill "$p" 2>/dev/null; done; wait'\'' EXIT'
  echo '{'
  sed "${to_free[@]}" "$TMP/setup.sh"
  printf '} >%q 2>&1\n' "$TMP/setup.log"
  grep '^\$ ' "$TMP/expected.txt" | cut -c3- | while IFS= read -r cmd; do
    printf 'printf "%%s\\n" %q\n' "\$ $cmd"
    printf '{ %s\n} 2>&1\n' "$(sed "${to_free[@]}" <<<"$cmd")"
  done
} >"$TMP/run.sh"

# mktemp in the commands creates its directory under $TMP, removed on exit.
rc=0
env -u http_proxy -u HTTP_PROXY -u https_proxy -u HTTPS_PROXY -u all_proxy -u ALL_PROXY \
  -u no_proxy -u NO_PROXY TMPDIR="$TMP" \
  timeout "${FIRST_RUN_TIMEOUT:-300}" bash "$TMP/run.sh" >"$TMP/actual.raw" || rc=$?
tr -d '\r' <"$TMP/actual.raw" | sed "${to_readme[@]}" >"$TMP/actual.txt"

# A port the setup found taken: what answered was not the demo.
if grep -q 'is taken' "$TMP/setup.log"; then
  echo "first-run.sh: a port the first run needs was taken:" >&2
  grep 'is taken' "$TMP/setup.log" | sed "${to_readme[@]}" >&2
  exit 1
fi

if [ "$rc" -ne 0 ]; then
  echo "first-run.sh: the commands exited $rc (124: timed out); output so far:" >&2
  cat "$TMP/actual.txt" >&2
  echo "--- setup log ---" >&2
  cat "$TMP/setup.log" >&2
  exit 1
fi

if [ "$UPDATE" = 1 ]; then
  python3 - "$README" "$TMP/actual.txt" <<'EOF'
import sys
readme, actual = sys.argv[1], open(sys.argv[2]).read()
lines = open(readme).read().split("\n")
start = lines.index("<!-- first-run: transcript -->")
open_fence = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
close_fence = next(i for i in range(open_fence + 1, len(lines)) if lines[i].startswith("```"))
lines[open_fence + 1:close_fence] = actual.rstrip("\n").split("\n")
open(readme, "w").write("\n".join(lines))
EOF
  echo "first-run.sh: README.md transcript updated"
  exit 0
fi

# What varies from run to run, masked on both sides.
mask() { sed -E 's/^(date|last-modified|server): .*/\1: .../I' "$1"; }
if ! diff -u --label 'README.md (transcript)' --label 'this run' \
  <(mask "$TMP/expected.txt") <(mask "$TMP/actual.txt"); then
  echo "first-run.sh: the README's first run prints something else now (above);" >&2
  echo "  fix the code or the README, or run scripts/first-run.sh --update if the change is intended" >&2
  echo "--- setup log ---" >&2
  cat "$TMP/setup.log" >&2
  exit 1
fi
echo "first-run.sh: README.md's first run prints what it shows ($(grep -c '^\$ ' "$TMP/expected.txt") commands)"
