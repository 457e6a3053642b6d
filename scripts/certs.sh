#!/usr/bin/env bash
# Test certificates made with openssl: a CA, a server certificate it signed for this machine
# (DNS localhost, IP 127.0.0.1) and a client certificate it signed, for the TLS tests of the
# broker (scripts/nats.sh) and the database (scripts/postgres.sh).
#
#   scripts/certs.sh DIR     make DIR/{ca,server,client}.{crt,key} unless DIR/ca.crt exists;
#                            prints DIR
#
# Keys are unencrypted EC P-256 (what rustls and both servers take); the certificates last a
# year. Test material only: never point a real deployment at these.
set -euo pipefail

DIR=${1:?usage: scripts/certs.sh DIR}
mkdir -p "$DIR"
cd "$DIR"
if [ -f ca.crt ] && [ -f server.crt ] && [ -f client.crt ]; then
  pwd
  exit 0
fi
command -v openssl >/dev/null || { echo "scripts/certs.sh needs openssl (apt-get install openssl)" >&2; exit 1; }

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -sha256 -days 365 -subj "/CN=ragline test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.crt 2>/dev/null

sign() {
  local name=$1 cn=$2 ext=$3
  key "$name.key"
  openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr" 2>/dev/null
  printf '%s\n' "$ext" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 \
    -sha256 -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

sign server localhost "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1"
sign client ragline "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
chmod 644 ./*.crt
chmod 600 ./*.key
pwd
