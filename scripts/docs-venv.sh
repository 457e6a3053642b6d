#!/usr/bin/env bash
# Make (or reuse) the virtualenv the PDF/DOCX scripts run in, with the pinned packages below,
# and print the path of its python on stdout (messages go to stderr).
#
#   PY=$(scripts/docs-venv.sh)
#
# The venv lives in ${RAGLINE_CACHE:-$HOME/.cache/ragline}/venv-docs, outside the repository.
# Idempotent: a stamp file records the pins it was made with; when the pins below change, the
# next call installs them. Used by fetch-doc-corpus.sh, gen-doc-fixtures.sh, bench-pdf-peers.sh.
set -euo pipefail

CACHE=${RAGLINE_CACHE:-$HOME/.cache/ragline}
VENV=$CACHE/venv-docs
PYTHON=${PYTHON:-python3}
# reportlab and python-docx make the fixtures (pillow and lxml pinned too: they touch the bytes
# written); pypdfium2 and pypdf read PDFs back; cryptography lets pypdf open AES-encrypted files.
PINS="reportlab==5.1.0 pillow==13.0.0 python-docx==1.2.0 lxml==6.1.3 pypdfium2==5.15.2 pypdf==7.1.1 cryptography==50.0.2"
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
echo "$VENV/bin/python"
