#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of untrusted bytes (`ragline::fuzz`), with
# libFuzzer on stable Rust.
#
#   scripts/fuzz.sh TARGET|all SECONDS [--deep]
#
# TARGET: wire, run_record, jsonl, html, markdown, rst, pdf, docx, serve_request, retry_after,
# broker_message
# (all: each in turn, SECONDS each). The corpus starts from tests/fuzz/TARGET/ (seeds, and
# every input that once broke a target) and grows in $RAGLINE_FUZZ_DIR/corpus/TARGET
# (default /var/tmp/ragline-fuzz). An input that crashes, hangs (20 s), or takes more than
# 2 GiB is written to $RAGLINE_FUZZ_DIR/artifacts/TARGET/ and the script exits 1: fix the
# code, then copy the input into tests/fuzz/TARGET/ so the test suite keeps checking it.
#
# Shallow (default): only ragline's own code is instrumented, so the build reuses the test
# build's dependencies (a few minutes). --deep instruments the parsers it calls too
# (html5ever, pulldown-cmark, pdf_oxide, office_oxide, rmp-serde, serde_json), in a target
# folder of its own (a full build): for long runs.
#
# Prints a line per target: runs, executions/s, coverage, corpus size, peak RSS, and what it
# found; the lines are also in $RAGLINE_FUZZ_DIR/summary.tsv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

target=${1:?usage: scripts/fuzz.sh TARGET|all SECONDS [--deep]}
seconds=${2:?usage: scripts/fuzz.sh TARGET|all SECONDS [--deep]}
deep=0
[ "${3:-}" = "--deep" ] && deep=1
DIR=${RAGLINE_FUZZ_DIR:-/var/tmp/ragline-fuzz}
ALL=(wire run_record jsonl html markdown rst pdf docx serve_request retry_after broker_message)
if [ "$target" = all ]; then targets=("${ALL[@]}"); else targets=("$target"); fi

export RAGLINE_SANCOV="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
if [ "$deep" = 1 ]; then
  target_dir=$target_dir-fuzz
  echo "== building ragline-fuzz, everything instrumented (a full build)" >&2
  # An explicit --target keeps RUSTFLAGS off the build scripts and proc macros (host code,
  # which would need the sanitizer's runtime to link), as cargo-fuzz does.
  triple=$(rustc -vV | sed -n 's/^host: //p')
  RUSTFLAGS="$RAGLINE_SANCOV" CARGO_TARGET_DIR=$target_dir \
    cargo build -q --target "$triple" --features fuzzing --bin ragline-fuzz
  bin=$target_dir/$triple/debug/ragline-fuzz
else
  echo "== building ragline-fuzz, ragline's code instrumented" >&2
  # RAGLINE_FUZZ_OPT_LEVEL: ragline's own opt-level (CI's short runs take 1: a faster build).
  opt=()
  [ -z "${RAGLINE_FUZZ_OPT_LEVEL:-}" ] || opt=(--config "profile.dev.package.ragline.opt-level=$RAGLINE_FUZZ_OPT_LEVEL")
  RUSTC_WRAPPER="$ROOT/scripts/fuzz-rustc.sh" CARGO_TARGET_DIR=$target_dir \
    cargo build -q "${opt[@]}" --features fuzzing --bin ragline-fuzz
  bin=$target_dir/debug/ragline-fuzz
fi

mkdir -p "$DIR"
summary=$DIR/summary.tsv
[ -f "$summary" ] || printf 'date\ttarget\tseconds\truns\texec_per_sec\tcoverage\tcorpus\tpeak_rss_mb\tfound\n' > "$summary"
failed=0
for t in "${targets[@]}"; do
  corpus=$DIR/corpus/$t
  artifacts=$DIR/artifacts/$t
  mkdir -p "$corpus" "$artifacts" "tests/fuzz/$t"
  log=$DIR/$t.log
  before=$(find "$artifacts" -type f | wc -l)
  set +e
  RAGLINE_FUZZ_TARGET=$t "$bin" "$corpus" "tests/fuzz/$t" \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -max_len=1048576 -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1
  code=$?
  set -e
  after=$(find "$artifacts" -type f | wc -l)
  stat() { grep -o "^stat::$1:[[:space:]]*[0-9]*" "$log" | grep -o '[0-9]*$' | tail -1; }
  runs=$(stat number_of_executed_units || true)
  speed=$(stat average_exec_per_sec || true)
  rss=$(stat peak_rss_mb || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
  files=$(find "$corpus" -type f | wc -l)
  found=$((after - before))
  what="nothing"
  if [ "$code" != 0 ] || [ "$found" -gt 0 ]; then
    what="$found new artifacts (exit $code): $(grep -m1 -E 'ERROR|deadly signal|timeout|out-of-memory|panicked' "$log" || echo see "$log")"
    failed=1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%F)" "$t" "$seconds" "${runs:-?}" \
    "${speed:-?}" "${cov:-?}" "$files" "${rss:-?}" "$what" >> "$summary"
  printf '%-14s %8s runs %7s/s  cov %6s  corpus %5s  peak %5s MB  found: %s\n' "$t" \
    "${runs:-?}" "${speed:-?}" "${cov:-?}" "$files" "${rss:-?}" "$what"
done
exit $failed
