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
# Everything a run writes goes under target/ (CARGO_TARGET_DIR), never into fuzz/:
# the build in target/fuzz/, cargo-fuzz itself (when it is not on PATH) in
# target/tools/. The seed corpus (fuzz/corpus/TARGET) is read, never written: what a
# run discovers goes to target/fuzz/corpus-work/TARGET, so later runs start from it. A
# crash leaves its input in target/fuzz/artifacts/TARGET/ and makes the script exit 1
# after every target has run; reproduce it with the command the script prints,
#   cargo fuzz run --sanitizer none -a --target-dir target/fuzz TARGET target/fuzz/artifacts/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
sanitizer="${FUZZ_SANITIZER:-none}"
cargo_fuzz_version="0.13.2"
target_dir=$(readlink -m "${CARGO_TARGET_DIR:-target}")
fuzz_dir="$target_dir/fuzz"
export PATH="$target_dir/tools/bin:$PATH"

step() { printf '\n==> %s\n' "$*"; }

if ! cargo fuzz --version >/dev/null 2>&1; then
  step "installing cargo-fuzz $cargo_fuzz_version into ${target_dir#"$PWD"/}/tools"
  cargo install cargo-fuzz --locked --version "$cargo_fuzz_version" --root "$target_dir/tools"
fi

# cargo fuzz builds without --locked: a stale fuzz/Cargo.lock would be rewritten.
host=$(rustc -vV | awk '$1 == "host:" {print $2}')
cargo fetch --locked --quiet --target "$host" --manifest-path fuzz/Cargo.toml \
  || { echo "fuzz/Cargo.lock is not up to date: run \`cargo update --workspace --manifest-path fuzz/Cargo.toml\` and commit it" >&2; exit 1; }

flags=(--sanitizer "$sanitizer" --debug-assertions --target-dir "$fuzz_dir")

step "building the fuzz targets"
started=$(date +%s)
cargo fuzz build "${flags[@]}"
echo "built in $(( $(date +%s) - started ))s"

# The targets run as built, not through `cargo fuzz run`, which would make
# fuzz/artifacts/ in the source tree.
failed=()
for target in $(cargo fuzz list); do
  step "fuzzing $target for ${seconds}s"
  work="$fuzz_dir/corpus-work/$target"
  artifacts="$fuzz_dir/artifacts/$target"
  mkdir -p "$work" "$artifacts"
  [ -d "fuzz/corpus/$target" ] || { echo "no seed corpus fuzz/corpus/$target" >&2; exit 1; }
  args=(-artifact_prefix="$artifacts/" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048
    -print_final_stats=1)
  if [ -f "fuzz/dict/$target.dict" ]; then
    args+=(-dict="fuzz/dict/$target.dict")
  fi
  # libFuzzer's REDUCE lines (one per smaller input found for a feature already
  # covered) are thousands a minute and say nothing a reader needs: left out of the log.
  rc=0
  "$fuzz_dir/$host/release/$target" "${args[@]}" "$work" "fuzz/corpus/$target" 2>&1 \
    | grep --line-buffered -v -E '^#[0-9]+[[:space:]]+REDUCE ' || rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    failed+=("$target")
    for crash in "$artifacts"/*; do
      [ -e "$crash" ] || continue
      echo "reproduce: cargo fuzz run ${flags[*]} $target ${crash#"$PWD"/}"
    done
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  step "crashes found in: ${failed[*]} (inputs in ${fuzz_dir#"$PWD"/}/artifacts/)"
  ls -lR "$fuzz_dir/artifacts/" 2>/dev/null || true
  exit 1
fi
step "no crashes in $(( $(date +%s) - started ))s"
