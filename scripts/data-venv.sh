#!/usr/bin/env bash
# Make (or reuse) the virtualenv the data-tool checks run in: pyarrow and DuckDB read ragline's
# Parquet files back; psycopg's binary COPY with pgvector's adapter is the bulk-load reference,
# numpy builds its rows; the official `openai` client calls `ragline serve`; confluent-kafka
# (librdkafka's Python client) produces and consumes the Kafka tests' records.
# Prints the path of its python on stdout (messages go to stderr).
#
#   PY=$(scripts/data-venv.sh)
#
# The venv lives in ${RAGLINE_CACHE:-$HOME/.cache/ragline}/venv-data, outside the repository;
# a stamp records the pins, and a change of pins reinstalls.
set -euo pipefail

CACHE=${RAGLINE_CACHE:-$HOME/.cache/ragline}
VENV=$CACHE/venv-data
PYTHON=${PYTHON:-python3}
PINS="pyarrow==26.0.1 duckdb==2.0.1 psycopg[binary]==3.3.9 pgvector==0.5.1 numpy==2.4.6 openai==3.57.0 confluent-kafka==2.16.2"
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
