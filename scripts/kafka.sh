#!/usr/bin/env bash
# A real Apache Kafka 4 broker in KRaft mode (no ZooKeeper) for the Kafka source and sink, their
# tests and benchmarks: the broker's own jars from Maven Central (org.apache.kafka:kafka_2.13
# and kafka-tools with their dependencies, through `mvn dependency:copy-dependencies`), run on
# the machine's Java 17.
#
#   scripts/kafka.sh start [--cluster 3]  install if needed, start one node (or a three-node
#                                         cluster: each node a broker and a controller); prints
#                                         the bootstrap address (127.0.0.1:PORT[,...])
#   scripts/kafka.sh stop [--kill] [--wipe]
#                                         stop (SIGTERM; --kill is SIGKILL, a crash; --wipe
#                                         removes the data, so the next start is a new cluster)
#   scripts/kafka.sh kill NODE            SIGKILL one node (1, 2 or 3)
#   scripts/kafka.sh restart NODE         start a killed node again
#   scripts/kafka.sh topic NAME PARTITIONS [REPLICAS]
#                                         create a topic (nothing if it exists)
#   scripts/kafka.sh tool CLASS ARGS...   run one of Kafka's tools by class, e.g.
#                                         org.apache.kafka.tools.consumer.ConsoleConsumer
#   scripts/kafka.sh url                  the plaintext bootstrap address
#   scripts/kafka.sh secure-url           the SASL_SSL listener's address and the query a
#                                         kafka:// URL needs (SCRAM-SHA-512, the test CA)
#   scripts/kafka.sh password             the SCRAM/PLAIN test user's password
#   scripts/kafka.sh install              fetch the jars only
#   scripts/kafka.sh status
#
# Each node has three listeners on 127.0.0.1: PLAINTEXT on $RAGLINE_KAFKA_PORT + i - 1 (default
# 49092), SASL_SSL (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN over TLS, user `ragline`) on that
# + 10, and SSL with client certificates required on that + 20; the controller's on that + 100.
# The TLS material is scripts/certs.sh's test CA and certificates (PEM, which Kafka reads
# as is). Everything lives under $RAGLINE_KAFKA_DIR (default /var/tmp/ragline-kafka): the jars,
# each node's data (kept across a stop and start), configs, logs and pid files; the jars
# are in /var/tmp/ragline-kafka/libs-VERSION ($RAGLINE_KAFKA_LIBS), shared by every cluster.
set -euo pipefail

VERSION=4.4.0
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
DIR=${RAGLINE_KAFKA_DIR:-/var/tmp/ragline-kafka}
# The jars are shared by every $RAGLINE_KAFKA_DIR (a second cluster fetches nothing).
LIBS=${RAGLINE_KAFKA_LIBS:-/var/tmp/ragline-kafka/libs-$VERSION}
CERTS=$DIR/tls
PORT=${RAGLINE_KAFKA_PORT:-49092}
USER_NAME=ragline
HEAP=${RAGLINE_KAFKA_HEAP:-512m}

install() {
  mkdir -p "$DIR"
  if [ -f "$LIBS/.complete" ]; then return 0; fi
  mkdir -p "$(dirname "$LIBS")"
  command -v java >/dev/null || { echo "scripts/kafka.sh needs Java 17+ (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "scripts/kafka.sh needs Maven (apt-get install maven)" >&2; exit 1; }
  echo "fetching Apache Kafka $VERSION's jars from Maven Central into $LIBS" >&2
  local pom=$LIBS.pom
  mkdir -p "$pom"
  cat >"$pom/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.ragline</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$VERSION</version></dependency>
  </dependencies>
</project>
EOF
  rm -rf "$LIBS"
  (cd "$pom" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$LIBS" -DincludeScope=runtime >&2)
  touch "$LIBS/.complete"
}

java_cp() { echo "$LIBS/*"; }

nodes() { cat "$DIR/size" 2>/dev/null || echo 1; }

password() {
  if [ ! -s "$DIR/password" ]; then
    mkdir -p "$DIR"
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DIR/password")
  fi
  cat "$DIR/password"
}

url() {
  local n i out=""
  n=$(nodes)
  for i in $(seq 1 "$n"); do out+="${out:+,}127.0.0.1:$((PORT + i - 1))"; done
  echo "$out"
}

secure_url() {
  local n i out=""
  n=$(nodes)
  for i in $(seq 1 "$n"); do out+="${out:+,}127.0.0.1:$((PORT + 10 + i - 1))"; done
  echo "$out?sasl_mechanism=SCRAM-SHA-512&sasl_user=$USER_NAME&sasl_password_env=RAGLINE_KAFKA_PASSWORD&tls_ca=$CERTS/ca.crt"
}

running() {
  local pid
  pid=$(cat "$DIR/node$1.pid" 2>/dev/null) || return 1
  kill -0 "$pid" 2>/dev/null
}

# node I of N's server.properties
config() {
  local i=$1 n=$2 p=$((PORT + $1 - 1)) voters="" j rf=1 isr=1
  for j in $(seq 1 "$n"); do voters+="${voters:+,}$j@127.0.0.1:$((PORT + 100 + j - 1))"; done
  if [ "$n" -ge 3 ]; then rf=3; isr=2; fi
  local pw
  pw=$(password)
  cat <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$p,SASL_SSL://127.0.0.1:$((p + 10)),SSL://127.0.0.1:$((p + 20)),CONTROLLER://127.0.0.1:$((p + 100))
advertised.listeners=PLAINTEXT://127.0.0.1:$p,SASL_SSL://127.0.0.1:$((p + 10)),SSL://127.0.0.1:$((p + 20))
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$DIR/node$i/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
message.max.bytes=16777216
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$USER_NAME="$pw";
ssl.keystore.type=PEM
ssl.keystore.location=$CERTS/server.pem
ssl.truststore.type=PEM
ssl.truststore.location=$CERTS/ca.crt
listener.name.ssl.ssl.client.auth=required
EOF
}

start_node() {
  local i=$1 n=$2
  running "$i" && return 0
  mkdir -p "$DIR/node$i"
  (umask 077; config "$i" "$n" >"$DIR/node$i/server.properties")
  if [ ! -f "$DIR/node$i/data/meta.properties" ]; then
    local cluster_id
    cluster_id=$(cat "$DIR/cluster-id")
    java -cp "$(java_cp)" kafka.tools.StorageTool format -t "$cluster_id" \
      -c "$DIR/node$i/server.properties" \
      --add-scram "SCRAM-SHA-256=[name=$USER_NAME,password=$(password)]" \
      --add-scram "SCRAM-SHA-512=[name=$USER_NAME,password=$(password)]" >"$DIR/node$i/format.log" 2>&1 || {
      echo "formatting node $i failed:" >&2; cat "$DIR/node$i/format.log" >&2; exit 1; }
  fi
  # shellcheck disable=SC2086
  nohup java -Xms128m -Xmx$HEAP -XX:+UseG1GC -Djava.awt.headless=true \
    -cp "$(java_cp)" kafka.Kafka "$DIR/node$i/server.properties" >"$DIR/node$i.log" 2>&1 &
  echo $! >"$DIR/node$i.pid"
  disown
}

wait_ready() {
  local i=$1 port=$((PORT + $1 - 1)) t
  for t in $(seq 1 600); do
    if ! running "$i"; then
      echo "Kafka node $i exited; its log: $DIR/node$i.log" >&2
      tail -n 30 "$DIR/node$i.log" >&2 || true
      exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "Kafka node $i did not listen on $port in 60 s; its log: $DIR/node$i.log" >&2
  tail -n 30 "$DIR/node$i.log" >&2 || true
  exit 1
}

# Wait until the cluster answers a metadata request through the admin client (the brokers have
# registered with the controller quorum).
wait_cluster() {
  local t
  for t in $(seq 1 60); do
    if java -cp "$(java_cp)" org.apache.kafka.tools.TopicCommand --bootstrap-server "$(url)" \
      --list >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "the Kafka cluster did not answer in 60 s; logs: $DIR/node*.log" >&2
  exit 1
}

certs() {
  "$SCRIPTS/certs.sh" "$CERTS" >/dev/null
  if [ ! -f "$CERTS/server.pem" ]; then
    # Kafka's PEM key store: the PKCS#8 key and the certificate chain in one file.
    (umask 077; cat "$CERTS/server.key" "$CERTS/server.crt" >"$CERTS/server.pem")
  fi
}

cmd=${1:-}
shift || true
case "$cmd" in
  start)
    n=1
    while [ $# -gt 0 ]; do
      case "$1" in
        --cluster) n=${2:?--cluster N}; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
      esac
    done
    install
    certs
    if [ -f "$DIR/size" ] && [ "$(nodes)" != "$n" ]; then
      # Another cluster size: a new cluster.
      for i in $(seq 1 "$(nodes)"); do running "$i" && kill -9 "$(cat "$DIR/node$i.pid")"; done
      sleep 0.5
      rm -rf "$DIR"/node* "$DIR/cluster-id"
    fi
    echo "$n" >"$DIR/size"
    [ -s "$DIR/cluster-id" ] || java -cp "$(java_cp)" kafka.tools.StorageTool random-uuid 2>/dev/null >"$DIR/cluster-id"
    for i in $(seq 1 "$n"); do start_node "$i" "$n"; done
    for i in $(seq 1 "$n"); do wait_ready "$i"; done
    wait_cluster
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
      for _ in $(seq 1 300); do running "$i" || break; sleep 0.1; done
      running "$i" && kill -9 "$(cat "$DIR/node$i.pid")"
    done
    if [ "$wipe" = 1 ]; then rm -rf "$DIR"/node* "$DIR/cluster-id" "$DIR/size"; fi
    ;;
  kill)
    i=${1:?kill NODE}
    running "$i" && kill -s KILL "$(cat "$DIR/node$i.pid")"
    ;;
  restart)
    i=${1:?restart NODE}
    start_node "$i" "$(nodes)"
    wait_ready "$i"
    ;;
  topic)
    name=${1:?topic NAME PARTITIONS [REPLICAS]}
    parts=${2:?topic NAME PARTITIONS [REPLICAS]}
    rf=${3:-$(if [ "$(nodes)" -ge 3 ]; then echo 3; else echo 1; fi)}
    java -cp "$(java_cp)" org.apache.kafka.tools.TopicCommand --bootstrap-server "$(url)" \
      --create --if-not-exists --topic "$name" --partitions "$parts" --replication-factor "$rf" >&2
    ;;
  tool)
    class=${1:?tool CLASS ARGS...}
    shift
    exec java -cp "$(java_cp)" "$class" "$@"
    ;;
  url) url ;;
  secure-url) secure_url ;;
  password) password ;;
  install) install; echo "$LIBS" ;;
  certs) certs; echo "$CERTS" ;;
  status)
    for i in $(seq 1 "$(nodes)"); do
      if running "$i"; then echo "node $i: running on 127.0.0.1:$((PORT + i - 1))"; else echo "node $i: stopped"; fi
    done
    ;;
  *)
    sed -n '2,32p' "$0" >&2
    exit 2
    ;;
esac
