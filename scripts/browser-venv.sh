#!/usr/bin/env bash
# Make (or reuse) the virtualenv the browser test drives Chromium from: Playwright's Python
# client (its own browsers are never downloaded: the test runs Debian's `chromium`).
# Prints the path of its python on stdout (messages go to stderr). With `--chromium`, also
# installs Debian's chromium when it is missing (as root, on Debian: what .ci/run does).
#
#   PY=$(scripts/browser-venv.sh [--chromium])
#
# The venv lives in ${RAGLINE_CACHE:-$HOME/.cache/ragline}/venv-browser, outside the
# repository; a stamp records the pins, and a change of pins reinstalls.
set -euo pipefail

CACHE=${RAGLINE_CACHE:-$HOME/.cache/ragline}
VENV=$CACHE/venv-browser
PYTHON=${PYTHON:-python3}
PINS="playwright==1.65.3"
STAMP=$VENV/.ragline-pins

if [ "${1:-}" = --chromium ] && ! command -v chromium >/dev/null; then
  echo "installing Debian's chromium" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >&2
fi
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
echo "$VENV/bin/python"
