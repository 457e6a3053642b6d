#!/usr/bin/env bash
# RUSTC_WRAPPER for scripts/fuzz.sh (shallow mode): instruments only ragline's own crates for
# libFuzzer's coverage, so the fuzz build reuses every dependency the test build compiled.
# (--deep instruments everything through RUSTFLAGS instead, in a target folder of its own.)
set -euo pipefail
rustc=$1
shift
name=""
prev=""
for arg in "$@"; do
  [ "$prev" = "--crate-name" ] && name=$arg
  prev=$arg
done
case "$name" in
  ragline | ragline_fuzz)
    # shellcheck disable=SC2086 # the flags are words
    exec "$rustc" "$@" $RAGLINE_SANCOV
    ;;
  *) exec "$rustc" "$@" ;;
esac
