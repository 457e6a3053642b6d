"""Records for the Kafka tests and benchmarks, through confluent-kafka (librdkafka's Python
client): produce documents, updates and tombstones; consume a topic; time a plain consumer.

    python scripts/kafka-records.py produce BROKERS TOPIC --count N [--start S] [--version V]
        [--partitions P] [--tombstones K] [--words W] [--bad B]
        N JSON documents {"text", "title", "n", "version"} keyed doc-S..doc-(S+N-1) (K of them,
        from S, as tombstones instead; B records that are not JSON, keyed bad-0..)
    python scripts/kafka-records.py create BROKERS TOPIC PARTITIONS [REPLICAS]
    python scripts/kafka-records.py consume BROKERS TOPIC
        every record of the topic as a JSON line {"key", "value"} (value null for a tombstone),
        until the end offsets seen at the start
    python scripts/kafka-records.py plain-consumer BROKERS TOPIC
        read the whole topic once with a plain consumer (json.loads of each value); prints
        {"records": N, "seconds": S, "per_second": R}
"""

import argparse
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

WORDS = (
    "retrieval index vector chunk embedding model token search hybrid keyword document source "
    "partition offset broker topic consumer producer schema record stream batch latency memory"
).split()


def text_of(n, version, words):
    return " ".join(WORDS[(n * 7 + i * 3 + version) % len(WORDS)] for i in range(words)) + f" {n} v{version}."


def produce(a):
    p = Producer({"bootstrap.servers": a.brokers, "linger.ms": 20, "enable.idempotence": True,
                  "compression.type": "none"})
    for i in range(a.count):
        n = a.start + i
        key = f"doc-{n}"
        if i < a.tombstones:
            value = None
        else:
            value = json.dumps({"text": text_of(n, a.version, a.words), "title": f"Doc {n}",
                                "n": n, "version": a.version})
        while True:
            try:
                p.produce(a.topic, key=key, value=value)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    for b in range(a.bad):
        p.produce(a.topic, key=f"bad-{b}", value=b"{not json")
    left = p.flush(60)
    if left:
        sys.exit(f"{left} records not delivered")


def create(a):
    admin = AdminClient({"bootstrap.servers": a.brokers})
    fs = admin.create_topics([NewTopic(a.topic, num_partitions=a.partitions,
                                       replication_factor=a.replicas)])
    for f in fs.values():
        try:
            f.result(30)
        except Exception as e:  # an existing topic is fine
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise


def ends(c, topic):
    meta = c.list_topics(topic, timeout=30)
    parts = meta.topics[topic].partitions
    out = {}
    for p in parts:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        out[p] = (lo, hi)
    return out


def read_all(a, each):
    c = Consumer({"bootstrap.servers": a.brokers, "group.id": f"check-{uuid.uuid4()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    marks = ends(c, a.topic)
    left = {p: hi for p, (lo, hi) in marks.items() if hi > lo}
    c.assign([TopicPartition(a.topic, p, marks[p][0]) for p in left])
    n = 0
    idle = 0
    while left:
        msgs = c.consume(1000, 1.0)
        if not msgs:
            idle += 1
            if idle > 30:
                sys.exit(f"no records for 30 s; left: {left}")
            continue
        idle = 0
        for m in msgs:
            if m.error():
                continue
            each(m)
            n += 1
            if m.offset() + 1 >= left.get(m.partition(), 0):
                left.pop(m.partition(), None)
    c.close()
    return n


def consume(a):
    out = sys.stdout

    def each(m):
        v = m.value()
        out.write(json.dumps({"key": m.key().decode() if m.key() else None,
                              "value": json.loads(v) if v is not None else None}) + "\n")

    read_all(a, each)


def plain_consumer(a):
    t = time.perf_counter()
    n = read_all(a, lambda m: json.loads(m.value()) if m.value() is not None else None)
    s = time.perf_counter() - t
    print(json.dumps({"records": n, "seconds": round(s, 3), "per_second": round(n / s, 1)}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("produce")
    p.add_argument("brokers")
    p.add_argument("topic")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--tombstones", type=int, default=0)
    p.add_argument("--words", type=int, default=12)
    p.add_argument("--bad", type=int, default=0)
    p = sub.add_parser("create")
    p.add_argument("brokers")
    p.add_argument("topic")
    p.add_argument("partitions", type=int)
    p.add_argument("replicas", type=int, nargs="?", default=1)
    for name in ("consume", "plain-consumer"):
        p = sub.add_parser(name)
        p.add_argument("brokers")
        p.add_argument("topic")
    a = ap.parse_args()
    {"produce": produce, "create": create, "consume": consume,
     "plain-consumer": plain_consumer}[a.cmd](a)


if __name__ == "__main__":
    main()
