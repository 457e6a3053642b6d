#!/usr/bin/env bash
# Time PDF text extraction with pypdfium2 and pypdf, file by file, single-threaded, each file
# under a timeout; optionally dump pypdfium2's text as the reference for word-F1 checks.
#
#   scripts/bench-pdf-peers.sh PATH... [--dump DIR] [--json] [--timeout S] [--password PW]...
#   scripts/bench-pdf-peers.sh target/doc-corpus/pdf tests/fixtures/docs --dump target/pdf-peers
#
# PATH is a PDF or a folder (searched recursively). Runs scripts/bench-pdf-peers.py in the docs
# venv (scripts/docs-venv.sh: pinned pypdfium2, pypdf, cryptography; made on first use). See
# scripts/bench-pdf-peers.py --help for the output and the dump format.
# target/doc-corpus comes from scripts/fetch-doc-corpus.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$("$ROOT/scripts/docs-venv.sh")
exec "$PY" "$ROOT/scripts/bench-pdf-peers.py" "$@"
