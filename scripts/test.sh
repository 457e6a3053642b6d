#!/usr/bin/env bash
# The whole test suite: fetches the model if needed, then every unit, property and
# integration test. Tests that read ../shared/data skip with a message where it is absent.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh
# `failpoints` compiles in fault injection (FAILPOINTS=...), which the lifecycle tests use to
# make chosen documents fail; release builds never have it.
cargo test --all-targets --features failpoints "$@"
