#!/usr/bin/env bash
# What building ragline needs from the system beyond Rust: cmake, a C/C++ compiler and the
# OpenSSL, curl and zlib headers, with which the `kafka` feature builds librdkafka from source.
# Installs the missing ones with apt-get when run as root on Debian/Ubuntu; otherwise prints
# the command to run and fails. Does nothing when everything is there.
#
#   scripts/build-deps.sh
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
command -v pkg-config >/dev/null || need+=(pkg-config)
for pkg in libssl-dev libcurl4-openssl-dev zlib1g-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing the build's system packages: ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "ragline's build needs: ${need[*]} (librdkafka, for the kafka feature, is built from source)" >&2
  echo "install them: sudo apt-get install ${need[*]}" >&2
  echo "(or build without Kafka: cargo build --release --no-default-features --features pdf,docx,postgres,nats,serve,parquet,object-store)" >&2
  exit 1
fi
