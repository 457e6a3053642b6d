#!/usr/bin/env bash
# The Python package's tests: builds ./python into a virtualenv of its own (with pytest and the
# real langchain-core, langchain-text-splitters and llama-index-core from PyPI), then runs
# python/tests against the real model and the `ragline` commands. Called by scripts/test.sh;
# arguments go to pytest. `scripts/test-python.sh venv` only makes the virtualenv (CI does it
# while the lints run).
#
# The extension is built with cargo's dev profile (opt-level 3 for ragline and its
# dependencies, as the tests' build) and the test build's features (`failpoints`) into
# $CARGO_TARGET_DIR, so it links the ragline library `cargo test --features failpoints`
# compiled instead of building it again; `pip install ./python` on its own builds the
# release profile without test features.
#
# The venv lives in ${RAGLINE_CACHE:-$HOME/.cache/ragline}/venv-python; a stamp records the
# pins, and a change of pins reinstalls.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CACHE=${RAGLINE_CACHE:-$HOME/.cache/ragline}
VENV=$CACHE/venv-python
PYTHON=${PYTHON:-python3}
PINS="pytest==9.2.0 numpy==2.4.6 langchain-core==1.8.3 langchain-text-splitters==1.1.3 llama-index-core==0.14.25 tqdm==4.70.1 maturin==1.16.0"
STAMP=$VENV/.ragline-pins
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the virtualenv $VENV" >&2
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV" >&2
fi
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$PINS" ]; then
  echo "installing into $VENV: $PINS" >&2
  # shellcheck disable=SC2086  # PINS is a list of words
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $PINS >&2
  echo "$PINS" >"$STAMP"
fi
[ "${1:-}" = venv ] && exit 0

[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh
started=$SECONDS
# maturin from the venv (--no-build-isolation: not a fresh build environment every run).
PATH="$VENV/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev --features ragline/failpoints" "$VENV/bin/pip" install --quiet \
  --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
echo "python: the package built and installed in $((SECONDS - started))s" >&2
# The cargo binary too, so the tests compare the console script with it.
RAGLINE_BIN=${RAGLINE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/ragline}
[ -x "$RAGLINE_BIN" ] || RAGLINE_BIN=
export RAGLINE_BIN
cd python/tests
PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pytest -q "$@"
