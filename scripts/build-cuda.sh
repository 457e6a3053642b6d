#!/usr/bin/env bash
# Build the CUDA ragline on a machine without a GPU or an apt CUDA toolkit.
#
#   scripts/build-cuda.sh            # release binary: target/cuda/release/ragline
#   scripts/build-cuda.sh --check    # type-check the cuda code only (minutes, no toolkit)
#
# The toolkit comes from NVIDIA's PyPI wheels (scripts/cuda/setup-cuda13.sh, kept in
# $RAGLINE_CUDA_DIR, default /var/tmp/ragline-cuda13) and the build uses its own target
# folder (target/cuda) so the CPU build stays warm. A cold build of the lean GPU-check binary
# took 11m42s on 2 cores (2026-12-04, wheels included; an earlier note said 45 minutes on
# busier cores); a change to ragline alone rebuilds in about 2 minutes.
#
# --check puts scripts/cuda/typecheck-nvcc first on PATH as `nvcc`: it writes empty kernels,
# so `cargo check` sees all the cuda code without the toolkit. Never ship what it builds. It
# checks in the CPU build's target folder, so the dependencies clippy checked are reused (a
# check makes no binary; the real build above is a release build, whose build scripts run apart).
#
# The binary is for sm_90 (H100/H200: CUDA_COMPUTE_CAP=90). Run it there with the CUDA 13
# libraries on LD_LIBRARY_PATH (see scripts/gpu-check.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "${1:-}" = --check ]; then
  shim=$(mktemp -d)
  trap 'rm -rf "$shim"' EXIT
  cp scripts/cuda/typecheck-nvcc "$shim/nvcc"
  chmod +x "$shim/nvcc"
  PATH="$shim:$PATH" CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90} CUDARC_CUDA_VERSION=13000 \
    CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target} \
    cargo check --features cuda --all-targets
  echo "ok: the cuda feature type-checks"
  exit 0
fi
CUDA_DIR=${RAGLINE_CUDA_DIR:-/var/tmp/ragline-cuda13}
if [ ! -f "$CUDA_DIR/env.sh" ]; then
  scripts/cuda/setup-cuda13.sh "$CUDA_DIR" link
fi
# shellcheck disable=SC1091
source "$CUDA_DIR/env.sh"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/cuda}
# RAGLINE_CUDA_FEATURES: cargo's feature flags (default: the default features plus cuda).
# scripts/gpu-prepare.sh builds the lean binary the GPU check needs (no Postgres, NATS, serve,
# Parquet, PDF or DOCX, plus test-hooks for random-weight models), to fit the 64 MiB carry.
# shellcheck disable=SC2086
cargo build --release ${RAGLINE_CUDA_FEATURES:---features cuda} --bin ragline
bin=$CARGO_TARGET_DIR/release/ragline
# A stripped, gzipped copy to carry to a GPU machine (about 12 MB).
strip -o "$CARGO_TARGET_DIR/ragline-cuda" "$bin"
gzip -9 -f "$CARGO_TARGET_DIR/ragline-cuda"
ls -la "$bin" "$CARGO_TARGET_DIR/ragline-cuda.gz"
echo "ok: $bin (carry $CARGO_TARGET_DIR/ragline-cuda.gz)"
