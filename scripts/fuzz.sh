#!/usr/bin/env bash
# Fuzzes tollgate's parsers of untrusted text with cargo-fuzz (libFuzzer): the config
# parser, the deadline headers, HTTP/1.1 requests from the app and responses from
# upstreams, and Retry-After / grpc-retry-pushback-ms. Each target
# runs for SECONDS (default 60). Run from anywhere; needs a Rust toolchain, a C++
# compiler (libFuzzer is built from source) and the Rust package registry.
#
#   scripts/fuzz.sh [SECONDS]
#
# Works on a stable toolchain: without nightly there is no AddressSanitizer, so the
# targets are built with `--sanitizer none`, with debug assertions and overflow checks
# on (`-a`). Safe Rust needs no ASan to catch what matters here: panics, overflows,
# failed properties, hangs (-timeout) and runaway memory (-rss_limit_mb). With a
# nightly toolchain, FUZZ_SANITIZER=address adds ASan.
#
# The seed corpus (fuzz/corpus/TARGET) is read, never written: what a run discovers
# goes to fuzz/corpus-work/TARGET (ignored by git), so later runs start from it.
# A crash leaves its input in fuzz/artifacts/TARGET/ and makes the script exit 1 after
# every target has run; reproduce it with
#   cargo fuzz run --sanitizer none -a TARGET fuzz/artifacts/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
sanitizer="${FUZZ_SANITIZER:-none}"
cargo_fuzz_version="0.13.2"

step() { printf '\n==> %s\n' "$*"; }

if ! cargo fuzz --version >/dev/null 2>&1; then
  step "installing cargo-fuzz $cargo_fuzz_version"
  cargo install cargo-fuzz --locked --version "$cargo_fuzz_version"
fi

flags=(--sanitizer "$sanitizer" --debug-assertions)

step "building the fuzz targets"
started=$(date +%s)
cargo fuzz build "${flags[@]}"
echo "built in $(( $(date +%s) - started ))s"

failed=()
for target in $(cargo fuzz list); do
  step "fuzzing $target for ${seconds}s"
  work="fuzz/corpus-work/$target"
  mkdir -p "$work" "fuzz/corpus/$target"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
  if [ -f "fuzz/dict/$target.dict" ]; then
    args+=(-dict="fuzz/dict/$target.dict")
  fi
  if ! cargo fuzz run "${flags[@]}" "$target" "$work" "fuzz/corpus/$target" -- "${args[@]}"; then
    failed+=("$target")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  step "crashes found in: ${failed[*]} (inputs in fuzz/artifacts/)"
  ls -l fuzz/artifacts/ 2>/dev/null || true
  exit 1
fi
step "no crashes in $(( $(date +%s) - started ))s"
