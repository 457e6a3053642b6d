#!/usr/bin/env bash
# Make (or reuse) the virtualenv the reference scripts run in: sentence-transformers (with
# transformers and torch) computes the vectors ragline is checked against, numpy and scipy
# compare them (scripts/reference-embeddings.py, reference-sts.py, reference-beir.py,
# st-server.py), and torch with safetensors converts weights (scripts/gpu-prepare.sh).
# Prints the path of its python on stdout (messages go to stderr).
#
#   PY=$(scripts/reference-venv.sh)
#
# Everything comes from PyPI. PyPI has no CPU-only torch for x86_64 Linux (those wheels live
# on PyTorch's own index, which cannot be reached here), so torch brings its nvidia-* CUDA
# libraries and triton: about 3 GB to download (5.8 GB installed), once; it runs on the CPU
# all the same. torch (2.15.0+cu132) and sentence-transformers match the versions recorded in
# tests/fixtures/parity/reference.json.
#
# The venv lives in ${RAGLINE_CACHE:-$HOME/.cache/ragline}/venv-reference, outside the
# repository; a stamp records the pins, and a change of pins reinstalls.
set -euo pipefail

CACHE=${RAGLINE_CACHE:-$HOME/.cache/ragline}
VENV=$CACHE/venv-reference
PYTHON=${PYTHON:-python3}
PINS="torch==2.15.0 transformers==5.25.0 sentence-transformers==6.2.0 numpy==2.4.6 scipy==1.17.1"
STAMP=$VENV/.ragline-pins

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the virtualenv $VENV" >&2
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV" >&2
fi
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$PINS" ]; then
  echo "installing into $VENV: $PINS (torch and its CUDA libraries are large: minutes)" >&2
  # shellcheck disable=SC2086  # PINS is a list of words
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $PINS >&2
  echo "$PINS" >"$STAMP"
fi
echo "$VENV/bin/python"
