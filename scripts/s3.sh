#!/usr/bin/env bash
# An S3 server for tests and benchmarks: moto's standalone server (`moto[server]` from PyPI,
# the S3 implementation botocore's own tests use), with boto3 beside it in the same
# virtualenv for scripts that fill or read buckets.
#
#   scripts/s3.sh start      install if needed, start; prints the endpoint (http://127.0.0.1:PORT)
#   scripts/s3.sh stop
#   scripts/s3.sh url        the endpoint of the running server
#   scripts/s3.sh python     install if needed; print the virtualenv's python (boto3 inside)
#   scripts/s3.sh status
#
# Everything lives under $RAGLINE_S3_DIR (default /var/tmp/ragline-s3): the virtualenv, the
# log and the pid file. The server listens on 127.0.0.1:$RAGLINE_S3_PORT (default 42250) and
# keeps its buckets in memory: a stop forgets them. Clients use any access key (moto checks
# none): `AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1`.
set -euo pipefail

VERSION=5.2.6
DIR=${RAGLINE_S3_DIR:-/var/tmp/ragline-s3}
PORT=${RAGLINE_S3_PORT:-42250}
VENV=$DIR/venv

install() {
  mkdir -p "$DIR"
  if [ ! -x "$VENV/bin/moto_server" ]; then
    echo "installing moto[server]==$VERSION into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "moto[server]==$VERSION" >&2
  fi
}

url() {
  echo "http://127.0.0.1:$PORT"
}

running() {
  local pid
  pid=$(cat "$DIR/moto.pid" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null
}

answers() {
  python3 - "$(url)" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=1).read()
except Exception:
    sys.exit(1)
EOF
}

start() {
  install
  if running && answers; then
    url
    return 0
  fi
  # A server from another run on the port (its pid file gone) is reused.
  if answers; then
    url
    return 0
  fi
  nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >"$DIR/moto.log" 2>&1 &
  echo $! >"$DIR/moto.pid"
  for _ in $(seq 1 100); do
    if answers; then
      url
      return 0
    fi
    if ! running; then
      echo "moto_server exited; its log ($DIR/moto.log):" >&2
      tail -20 "$DIR/moto.log" >&2
      return 1
    fi
    sleep 0.2
  done
  echo "moto_server did not answer on $(url) within 20 s; its log: $DIR/moto.log" >&2
  return 1
}

stop() {
  if running; then
    kill "$(cat "$DIR/moto.pid")"
    for _ in $(seq 1 50); do running || break; sleep 0.1; done
  fi
  rm -f "$DIR/moto.pid"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) url ;;
  python) install; echo "$VENV/bin/python" ;;
  status)
    if running && answers; then echo "running: $(url)"; else echo "not running"; exit 1; fi
    ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
