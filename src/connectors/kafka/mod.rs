//! A Kafka topic as a source: `kafka://HOST:9092/TOPIC[,TOPIC]?group=NAME` reads the documents
//! other systems publish (see [`record`] for their shapes) with a consumer group whose committed
//! offsets say where the next run starts.
//!
//! A run reads every partition of its topics from the group's committed offset (the earliest
//! when the group has none) up to the end offsets it saw when it started; with `--follow`, each
//! pass does the same, so a pass ends and its documents are settled while new records wait
//! for the next. The offsets are committed only once the run is accounted for (every document
//! indexed, failed or dropped, and the index finished); a run that stops first, or a process
//! killed at any point, commits nothing, and the next run reads those records again, which the
//! incremental index recognises (an unchanged document is neither chunked again nor embedded).
//!
//! Records for one document inside one run: the newest wins. Within a batch the older ones are
//! superseded; one for a document this run already published in an earlier batch stops its
//! partition there (its offset is the one committed), so the next run or `--follow` pass
//! starts with it: a document is published once a run, and its newest version is kept.
//!
//! The topic is a stream of changes, not the whole source: a document is gone when a record
//! says so (a tombstone, Debezium's `op = d`), and is then deleted from the index.
//!
//! One ingest per group at a time: the run assigns itself every partition (no rebalances in
//! the middle of a run); librdkafka fetches the partitions side by side, and the records of a
//! batch are read on every core.

pub mod record;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use rustc_hash::{FxHashMap, FxHashSet};
use serde_json::Value;

use super::{version_key, Connector, ConnectorError, KnownIndex, Settlement};
use crate::document::Document;
use crate::publisher::Publisher;
use crate::queue::kafka::{when_ready, Context, KafkaUrl, CONNECT_WAIT};
use record::{Fields, Format, Said, Unreadable};

/// Records read before a batch is published (fewer when the topic has no more for now): large,
/// so that a topic's history of one document mostly falls in one batch, whose newest record
/// wins; bounded by count and by bytes.
const BATCH: usize = 50_000;
const BATCH_BYTES: usize = 32 << 20;
/// How long one poll waits for records.
const POLL: Duration = Duration::from_millis(100);

/// A topic URL, read.
#[derive(Clone, Debug)]
pub struct KafkaSource {
    url: KafkaUrl,
    pub group: String,
    fields: Fields,
}

impl KafkaSource {
    /// Read `kafka://HOST:PORT[,HOST:PORT]/TOPIC[,TOPIC]?settings`; `index` (the index the
    /// documents go to) names the default group, so two indexes fed from one topic each get
    /// every record.
    pub fn parse(url: &str, index: &str) -> Result<KafkaSource, ConnectorError> {
        let url = KafkaUrl::parse(url, &|v| std::env::var(v).ok())
            .map_err(|e| ConnectorError::Config(e.to_string()))?;
        let bad = |why: String| ConnectorError::Config(format!("`{}`: {why}", url.shown));
        if url.topics.is_empty() {
            return Err(bad(
                "name the topic to read after the brokers: kafka://HOST:9092/TOPIC".into(),
            ));
        }
        let mut group = None;
        let mut fields = Fields::default();
        for (key, value) in &url.others {
            let field = || -> Result<String, ConnectorError> {
                if value.is_empty() {
                    return Err(bad(format!("`{key}=` names no field")));
                }
                Ok(value.clone())
            };
            match key.as_str() {
                "group" => {
                    if value.is_empty() || value.len() > 200 || value.chars().any(char::is_control)
                    {
                        return Err(bad(format!("group `{value}`: give a name")));
                    }
                    group = Some(value.clone());
                }
                "format" => {
                    fields.format = match value.as_str() {
                        "json" => Format::Json,
                        "text" => Format::Text,
                        "debezium" => Format::Debezium,
                        _ => {
                            return Err(bad(format!(
                                "format `{value}`: use json, text or debezium"
                            )))
                        }
                    }
                }
                "id" => fields.id = Some(field()?),
                "text" => fields.text = field()?,
                "title" => fields.title = field()?,
                _ => {
                    return Err(bad(format!(
                        "unknown setting `{key}` (group, format, id, text, title, sasl_mechanism, \
                         sasl_user, sasl_password_env, tls, tls_ca, tls_cert, tls_key)"
                    )))
                }
            }
        }
        let group = group.unwrap_or_else(|| {
            format!(
                "ragline-{}",
                &version_key(&[index, &url.topics.join(",")])[..16]
            )
        });
        Ok(KafkaSource { url, group, fields })
    }

    /// The URL without secrets.
    pub fn shown(&self) -> &str {
        &self.url.shown
    }

    /// A consumer of the group that commits only when told.
    fn consumer(&self) -> Result<(BaseConsumer<Context>, Context), ConnectorError> {
        let context = Context::default();
        let consumer: BaseConsumer<Context> = self
            .url
            .client
            .config()
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            .create_with_context(context.clone())
            .map_err(|e| ConnectorError::Config(format!("{}: {e}", self.url.shown)))?;
        Ok((consumer, context))
    }

    /// Every partition of the topics: where the group stands and where the topic ends now.
    fn partitions(
        &self,
        consumer: &BaseConsumer<Context>,
        context: &Context,
    ) -> Result<Vec<Partition>, ConnectorError> {
        let failed = |what: String, e: &dyn std::fmt::Display| {
            // librdkafka says why (a failed authentication) through its error callback, which
            // a consumer serves when polled.
            for _ in 0..20 {
                if context.last_error().is_some() {
                    break;
                }
                let _ = consumer.poll(Duration::from_millis(100));
            }
            ConnectorError::Source(format!(
                "{}: {what}: {}",
                self.url.shown,
                context.explain(e)
            ))
        };
        let mut out = Vec::new();
        let mut all = TopicPartitionList::new();
        for topic in &self.url.topics {
            let meta = consumer
                .fetch_metadata(Some(topic), CONNECT_WAIT)
                .map_err(|e| failed("cannot reach the brokers".into(), &e))?;
            let t = meta
                .topics()
                .iter()
                .find(|t| t.name() == topic)
                .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                .ok_or_else(|| {
                    ConnectorError::Source(format!(
                        "{}: the brokers have no topic `{topic}`: create it, or name another",
                        self.url.shown
                    ))
                })?;
            for p in t.partitions() {
                let (low, high) =
                    when_ready(|| consumer.fetch_watermarks(topic, p.id(), CONNECT_WAIT))
                        .map_err(|e| failed(format!("offsets of {topic}/{}", p.id()), &e))?;
                all.add_partition(topic, p.id());
                out.push(Partition {
                    topic: topic.clone(),
                    id: p.id(),
                    low,
                    end: high,
                    start: low,
                });
            }
        }
        let committed = when_ready(|| consumer.committed_offsets(all.clone(), CONNECT_WAIT))
            .map_err(|e| failed(format!("the offsets of group `{}`", self.group), &e))?;
        for e in committed.elements() {
            if let Offset::Offset(n) = e.offset() {
                if let Some(p) = out
                    .iter_mut()
                    .find(|p| p.topic == e.topic() && p.id == e.partition())
                {
                    p.start = n.max(p.low);
                }
            }
        }
        Ok(out)
    }
}

/// One partition of a run: the group's offset at the start, and the end the run reads to.
#[derive(Clone, Debug)]
struct Partition {
    topic: String,
    id: i32,
    low: i64,
    start: i64,
    end: i64,
}

/// What a run settles once it is over.
#[derive(Default)]
struct Held {
    /// Per partition, the offset to commit: the next record the group has not finished.
    next: BTreeMap<(String, i32), i64>,
    records: u64,
    superseded: u64,
    /// Partitions stopped at a second version of a document this run already published.
    stopped: u64,
    /// Records behind the committed offsets once this run's are committed.
    lag: i64,
}

/// What the connector and its settlement share: the consumer, kept past the connector's run
/// until its offsets are committed.
struct Session {
    consumer: BaseConsumer<Context>,
    context: Context,
    held: Held,
}

/// Consumes a topic.
pub struct KafkaConnector {
    source: KafkaSource,
    max_bytes: u64,
    session: Arc<Mutex<Option<Session>>>,
}

impl KafkaConnector {
    pub fn new(url: &str, index: &str, max_bytes: u64) -> Result<Self, ConnectorError> {
        Ok(KafkaConnector {
            source: KafkaSource::parse(url, index)?,
            max_bytes,
            session: Arc::default(),
        })
    }
}

impl Connector for KafkaConnector {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn whole_source(&self) -> bool {
        false
    }

    fn deletes_gone(&self) -> bool {
        true
    }

    fn know(&mut self, _index: &KnownIndex) {}

    fn settlement(&mut self) -> Option<Box<dyn Settlement>> {
        Some(Box::new(KafkaSettlement {
            shown: self.source.url.shown.clone(),
            group: self.source.group.clone(),
            session: Arc::clone(&self.session),
        }))
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        let (consumer, context) = self.source.consumer()?;
        let partitions = self.source.partitions(&consumer, &context)?;
        let mut assign = TopicPartitionList::new();
        let mut ends = FxHashMap::default();
        let topics: Vec<Arc<str>> = self
            .source
            .url
            .topics
            .iter()
            .map(|t| t.as_str().into())
            .collect();
        for p in partitions.iter().filter(|p| p.start < p.end) {
            assign
                .add_partition_offset(&p.topic, p.id, Offset::Offset(p.start))
                .map_err(|e| ConnectorError::Source(e.to_string()))?;
            let topic = topics
                .iter()
                .find(|t| ***t == *p.topic)
                .expect("a topic of the URL");
            ends.insert((Arc::clone(topic), p.id), p.end);
            publisher.announce((p.end - p.start) as u64);
        }
        let mut held = Held::default();
        if !ends.is_empty() {
            consumer
                .assign(&assign)
                .map_err(|e| ConnectorError::Source(format!("{}: {e}", self.source.url.shown)))?;
            let mut read = Read {
                source: &self.source,
                max_bytes: self.max_bytes,
                publisher,
                consumer: &consumer,
                ends,
                topics,
                held: &mut held,
                published: Default::default(),
            };
            read.run()?;
        }
        held.lag = lag(&consumer, &partitions, &held);
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(Session {
            consumer,
            context,
            held,
        });
        Ok(())
    }
}

/// The records behind the group once `held`'s offsets are committed, as the topic ends now.
fn lag(consumer: &BaseConsumer<Context>, partitions: &[Partition], held: &Held) -> i64 {
    partitions
        .iter()
        .map(|p| {
            let at = held
                .next
                .get(&(p.topic.clone(), p.id))
                .copied()
                .unwrap_or(p.start);
            let end = consumer
                .fetch_watermarks(&p.topic, p.id, Duration::from_secs(5))
                .map_or(p.end, |(_, h)| h);
            (end - at).max(0)
        })
        .sum()
}

/// One run's reading of the topics.
struct Read<'a> {
    source: &'a KafkaSource,
    max_bytes: u64,
    publisher: &'a Publisher,
    consumer: &'a BaseConsumer<Context>,
    /// The partitions still to read, with the offset each one's reading ends at.
    ends: FxHashMap<(Arc<str>, i32), i64>,
    /// The topics' names, shared by every record's key.
    topics: Vec<Arc<str>>,
    held: &'a mut Held,
    /// The documents this run published, by a 64-bit hash of their id (two ids of the same
    /// hash, one in 10^10 at a million documents, would only stop a partition early).
    published: FxHashSet<u64>,
}

/// A record taken from a partition.
struct Taken {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    /// What it says, or why it says nothing.
    said: Result<Said, Unreadable>,
}

impl Read<'_> {
    fn run(&mut self) -> Result<(), ConnectorError> {
        let mut batch: Vec<RawRecord> = Vec::new();
        let mut bytes = 0usize;
        let mut last_progress = Instant::now();
        while !self.ends.is_empty() {
            if self.publisher.signal().is_stopped() {
                return Ok(());
            }
            match self.consumer.poll(POLL) {
                Some(Ok(m)) => {
                    last_progress = Instant::now();
                    let Some(tp) = self.key(m.topic(), m.partition()) else {
                        continue;
                    };
                    let Some(&end) = self.ends.get(&tp) else {
                        continue;
                    };
                    if m.offset() >= end {
                        self.finish_partition(&tp);
                        continue;
                    }
                    let r = RawRecord::of(&m, Arc::clone(&tp.0), self.max_bytes);
                    bytes += r.value.as_ref().map_or(0, Vec::len);
                    batch.push(r);
                    if m.offset() + 1 >= end {
                        self.finish_partition(&tp);
                    }
                    if batch.len() >= BATCH || bytes >= BATCH_BYTES {
                        self.publish(&mut batch)?;
                        bytes = 0;
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!("{}: {e}", self.source.url.shown);
                }
                None => {
                    if !batch.is_empty() {
                        self.publish(&mut batch)?;
                        bytes = 0;
                    }
                    // A partition whose last offsets hold no record (compacted away, a
                    // transaction's marker) ends where the consumer's position passes its end.
                    self.finish_passed();
                    if last_progress.elapsed() > Duration::from_secs(60) && !self.ends.is_empty() {
                        return Err(ConnectorError::Source(format!(
                            "{}: no records for 60 s from {} partitions that have some to read",
                            self.source.url.shown,
                            self.ends.len()
                        )));
                    }
                }
            }
        }
        if !batch.is_empty() {
            self.publish(&mut batch)?;
        }
        Ok(())
    }

    /// A partition's key, with the topic's shared name.
    fn key(&self, topic: &str, partition: i32) -> Option<(Arc<str>, i32)> {
        let t = self.topics.iter().find(|t| ***t == *topic)?;
        Some((Arc::clone(t), partition))
    }

    /// Stop reading a partition (it reached the run's end).
    fn finish_partition(&mut self, tp: &(Arc<str>, i32)) {
        if self.ends.remove(tp).is_some() {
            let mut l = TopicPartitionList::new();
            l.add_partition(&tp.0, tp.1);
            let _ = self.consumer.pause(&l);
        }
    }

    /// The partitions whose position has passed the run's end.
    fn finish_passed(&mut self) {
        let Ok(positions) = self.consumer.position() else {
            return;
        };
        for e in positions.elements() {
            let Some(tp) = self.key(e.topic(), e.partition()) else {
                continue;
            };
            if let (Offset::Offset(at), Some(&end)) = (e.offset(), self.ends.get(&tp)) {
                if at >= end {
                    self.held.next.insert((tp.0.to_string(), tp.1), end);
                    self.finish_partition(&tp);
                }
            }
        }
    }

    /// A batch of records: read on every core, the newest per document kept, published in
    /// order.
    fn publish(&mut self, batch: &mut Vec<RawRecord>) -> Result<(), ConnectorError> {
        let fields = &self.source.fields;
        // Drained, so the batch keeps its capacity for the next one.
        let taken: Vec<Taken> = batch.par_drain(..).map(|r| r.read(fields)).collect();
        let mut last: FxHashMap<&str, usize> = FxHashMap::default();
        for (i, t) in taken.iter().enumerate() {
            if let Some(id) = said_id(&t.said) {
                last.insert(id, i);
            }
        }
        // Which records to publish, and where each partition stands after them.
        let mut publish = vec![false; taken.len()];
        let mut next: FxHashMap<(&str, i32), i64> = FxHashMap::default();
        let mut stopped: FxHashSet<(&str, i32)> = FxHashSet::default();
        for (i, t) in taken.iter().enumerate() {
            let tp = (&*t.topic, t.partition);
            if stopped.contains(&tp) {
                continue;
            }
            let id = said_id(&t.said);
            if id.is_some_and(|id| self.published.contains(&id_hash(id))) {
                // A second version of a document this run published: the partition stops
                // here, for the next run.
                next.insert(tp, t.offset);
                stopped.insert(tp);
                continue;
            }
            next.insert(tp, t.offset + 1);
            self.held.records += 1;
            match id {
                Some(id) if last.get(id) != Some(&i) => self.held.superseded += 1,
                _ => {
                    if let Some(id) = id {
                        self.published.insert(id_hash(id));
                    }
                    publish[i] = true;
                }
            }
        }
        self.held.stopped += stopped.len() as u64;
        let stopped: Vec<(Arc<str>, i32)> = stopped
            .into_iter()
            .filter_map(|(t, p)| self.key(t, p))
            .collect();
        for ((topic, partition), offset) in next {
            self.held
                .next
                .insert((topic.to_string(), partition), offset);
        }
        drop(last);
        for tp in &stopped {
            self.finish_partition(tp);
        }
        for (t, go) in taken.into_iter().zip(publish) {
            if go {
                self.publish_one(t)?;
            }
        }
        Ok(())
    }

    /// One record's document, deletion or failure, published.
    fn publish_one(&self, t: Taken) -> Result<(), ConnectorError> {
        let source = format!(
            "kafka://{}/{}#{}:{}",
            self.source.url.client.brokers, t.topic, t.partition, t.offset
        );
        let at = || format!("record {}:{} of {}", t.partition, t.offset, t.topic);
        let p = self.publisher;
        match t.said {
            Err(ref e) => {
                let id = e
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("kafka:{}:{}:{}", t.topic, t.partition, t.offset));
                p.publish_failed(
                    &id,
                    Some(&source),
                    "read",
                    &format!("{}: {}", at(), e.reason),
                );
            }
            Ok(Said::Deleted { ref id }) => p.publish_gone(
                id,
                Some(&source),
                "read",
                &format!("deleted: {} is a tombstone or a delete", at()),
            ),
            Ok(Said::Document {
                ref id, ref text, ..
            }) if text.trim().is_empty() => {
                p.publish_dropped(id, Some(&source), "read", &format!("{}: empty text", at()));
            }
            Ok(Said::Document {
                id,
                text,
                title,
                metadata,
            }) => {
                let at = Position {
                    topic: t.topic,
                    partition: t.partition,
                    offset: t.offset,
                    timestamp: t.timestamp,
                };
                p.publish(document(id, text, title, metadata, at, source))?;
            }
        }
        Ok(())
    }
}

/// Where a record sat.
struct Position {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
}

/// The document of a record.
fn document(
    id: String,
    text: String,
    title: Option<String>,
    metadata: serde_json::Map<String, Value>,
    at: Position,
    source: String,
) -> Document {
    // The version: the content with what the record says of it, not where it sat on the topic.
    let said = serde_json::to_string(&metadata).expect("a JSON map encodes: this is a bug");
    let content_hash = version_key(&[
        blake3::hash(text.as_bytes()).to_hex().as_str(),
        &said,
        title.as_deref().unwrap_or(""),
    ]);
    let mut doc = Document::new(id, text);
    doc.fields.title = title;
    doc.content_hash = Some(content_hash);
    doc.fields.source = Some(source);
    let meta = &mut doc.fields.metadata;
    meta.extend(metadata);
    meta.insert("kafka_topic".into(), at.topic.to_string().into());
    meta.insert("kafka_partition".into(), at.partition.into());
    meta.insert("kafka_offset".into(), at.offset.into());
    if let Some(ts) = at.timestamp {
        meta.insert("kafka_timestamp".into(), ts.into());
    }
    doc
}

/// A document id's 64-bit hash, for the set of what a run published.
fn id_hash(id: &str) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    h.write(id.as_bytes());
    h.finish()
}

fn said_id(said: &Result<Said, Unreadable>) -> Option<&str> {
    match said {
        Ok(Said::Document { id, .. }) | Ok(Said::Deleted { id }) => Some(id),
        Err(_) => None,
    }
}

/// A record's bytes, copied out of the consumer's buffer (a value over the size limit is not).
struct RawRecord {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    oversize: Option<usize>,
}

impl RawRecord {
    fn of(m: &rdkafka::message::BorrowedMessage<'_>, topic: Arc<str>, max_bytes: u64) -> RawRecord {
        let payload = m.payload();
        let oversize = payload.map(<[u8]>::len).filter(|n| *n as u64 > max_bytes);
        RawRecord {
            topic,
            partition: m.partition(),
            offset: m.offset(),
            timestamp: m.timestamp().to_millis(),
            key: m.key().filter(|k| k.len() <= 4096).map(<[u8]>::to_vec),
            value: if oversize.is_some() {
                None
            } else {
                payload.map(<[u8]>::to_vec)
            },
            oversize,
        }
    }

    fn read(self, fields: &Fields) -> Taken {
        let said = match self.oversize {
            Some(n) => Err(Unreadable {
                id: self
                    .key
                    .as_deref()
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .map(str::to_string),
                reason: format!(
                    "{n} bytes, over --max-file-bytes (the limit of one document); raise it to \
                     read this record"
                ),
            }),
            None => record::read(fields, self.key.as_deref(), self.value.as_deref()),
        };
        Taken {
            topic: self.topic,
            partition: self.partition,
            offset: self.offset,
            timestamp: self.timestamp,
            said,
        }
    }
}

/// The offsets of a run's records, committed once the run is over.
struct KafkaSettlement {
    shown: String,
    group: String,
    session: Arc<Mutex<Option<Session>>>,
}

impl Settlement for KafkaSettlement {
    fn settle(self: Box<Self>, accounted: bool) -> Vec<String> {
        let Some(session) = self
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return Vec::new();
        };
        let held = &session.held;
        if !accounted {
            return vec![format!(
                "{}: the run stopped: no offsets committed; the next run reads its {} records \
                 again (group {})",
                self.shown, held.records, self.group
            )];
        }
        if held.next.is_empty() {
            return vec![format!(
                "{}: nothing new for group {} (lag {})",
                self.shown, self.group, held.lag
            )];
        }
        let mut list = TopicPartitionList::new();
        for ((topic, partition), offset) in &held.next {
            let _ = list.add_partition_offset(topic, *partition, Offset::Offset(*offset));
        }
        let mut note = match when_ready(|| session.consumer.commit(&list, CommitMode::Sync)) {
            Ok(()) => format!(
                "{}: {} records read, offsets of {} partitions committed (group {}); lag {}",
                self.shown,
                held.records,
                held.next.len(),
                self.group,
                held.lag
            ),
            Err(e) => format!(
                "{}: the offsets were not committed ({}); the next run reads these {} records \
                 again, and a document with the same content is unchanged",
                self.shown,
                session.context.explain(&e),
                held.records
            ),
        };
        if held.superseded > 0 {
            note.push_str(&format!(
                "; {} superseded by a later record for the same document",
                held.superseded
            ));
        }
        if held.stopped > 0 {
            note.push_str(&format!(
                "; {} partitions stopped at a second version of a document this run published: \
                 the next run or --follow pass takes it",
                held.stopped
            ));
        }
        vec![note]
    }
}

/// What `ingest --follow` asks between passes: how many records the group has not read.
pub struct Waiter {
    source: KafkaSource,
    consumer: BaseConsumer<Context>,
    context: Context,
}

impl Waiter {
    /// A consumer of the topic's group (it joins nothing: it only reads offsets).
    pub fn open(url: &str, index: &str) -> Result<Waiter, ConnectorError> {
        let source = KafkaSource::parse(url, index)?;
        let (consumer, context) = source.consumer()?;
        Ok(Waiter {
            source,
            consumer,
            context,
        })
    }

    /// The records after the group's committed offsets (its lag).
    pub fn lag(&mut self) -> Result<u64, ConnectorError> {
        let parts = self.source.partitions(&self.consumer, &self.context)?;
        Ok(parts.iter().map(|p| (p.end - p.start).max(0) as u64).sum())
    }

    /// The topic URL, without secrets.
    pub fn shown(&self) -> &str {
        self.source.shown()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_topic_url() {
        let s = KafkaSource::parse(
            "kafka://127.0.0.1:9092/docs,news?group=g1&format=debezium&id=pk&text=body&title=name",
            "sqlite://x.db",
        )
        .unwrap();
        assert_eq!(s.group, "g1");
        assert_eq!(s.url.topics, ["docs", "news"]);
        assert_eq!(s.fields.format, Format::Debezium);
        assert_eq!(s.fields.id.as_deref(), Some("pk"));
        assert_eq!(
            (s.fields.text.as_str(), s.fields.title.as_str()),
            ("body", "name")
        );
        let a = KafkaSource::parse("kafka://127.0.0.1:9092/docs", "sqlite://a.db").unwrap();
        let b = KafkaSource::parse("kafka://127.0.0.1:9092/docs", "sqlite://b.db").unwrap();
        assert!(a.group.starts_with("ragline-"));
        assert_ne!(a.group, b.group, "one group per index");
        for bad in [
            "kafka://127.0.0.1:9092",
            "kafka://127.0.0.1:9092/docs?nope=1",
            "kafka://127.0.0.1:9092/docs?format=xml",
            "kafka://127.0.0.1:9092/docs?text=",
        ] {
            assert!(KafkaSource::parse(bad, "i").is_err(), "{bad}");
        }
    }
}
