#!/usr/bin/env bash
# Regenerate the PDF/DOCX fixtures in tests/fixtures/docs/ (each with NAME.expected.json, the
# text an extractor should find) and check them by reading them back with pypdfium2, pypdf and
# python-docx.
#
#   scripts/gen-doc-fixtures.sh [--out DIR]
#
# Runs scripts/gen-doc-fixtures.py --check in the docs venv (scripts/docs-venv.sh: pinned
# reportlab, python-docx, pypdfium2, pypdf; made on first use, needs PyPI then). The output is
# byte-for-byte the same on every run, so a diff after regenerating means the generator changed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$("$ROOT/scripts/docs-venv.sh")
exec "$PY" "$ROOT/scripts/gen-doc-fixtures.py" --check "$@"
