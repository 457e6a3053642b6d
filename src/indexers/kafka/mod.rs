//! `kafka://HOST:9092/TOPIC`: chunks and vectors written to a Kafka topic for the consumers
//! downstream of it, one record per chunk keyed by its chunk id (document id, chunk id, text,
//! heading path, pages, metadata, model, and the vector as a JSON array of floats or, with
//! `?vector=base64`, little-endian f32 bytes in base64), through librdkafka's idempotent
//! producer (no duplicates from its own retries; every record acknowledged by all in-sync
//! replicas before its document counts as indexed).
//!
//! A re-run writes only what changed: what the topic holds is kept beside it, in the
//! compacted topic `TOPIC.ragline-state` (`?state=` names another): one record per document,
//! keyed by its id, with its version, the pipeline's fingerprint and its chunk ids. The run
//! reads it at the start (the incremental stage skips an unchanged document), and writes a
//! document's record once all its chunks are in. A document deleted from the source, or a
//! chunk a re-chunked document no longer has, gets a tombstone (a null value under its key),
//! so a compacted topic forgets it and its consumers see the delete.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::KnownDocument;
use super::{check_item, Backend, BackendError, BackendFactory, IndexIdentity, ItemError};
use crate::document::Document;
use crate::queue::kafka::{when_ready, Context, KafkaUrl, CONNECT_WAIT};

/// How long a batch's records may take to be acknowledged.
const DELIVERY_WAIT: Duration = Duration::from_secs(60);

/// A `kafka://` index URI, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaTarget {
    url: KafkaUrl,
    topic: String,
    state: String,
    base64: bool,
}

impl KafkaTarget {
    pub fn parse(uri: &str) -> Result<KafkaTarget, BackendError> {
        let url = KafkaUrl::parse(uri, &|v| std::env::var(v).ok())
            .map_err(|e| BackendError::Invalid(e.to_string()))?;
        let bad = |why: String| BackendError::Invalid(format!("`{}`: {why}", url.shown));
        let topic = match url.topics.as_slice() {
            [t] => t.clone(),
            _ => {
                return Err(bad(
                    "name one topic to write: kafka://HOST:9092/TOPIC".into()
                ))
            }
        };
        let mut target = KafkaTarget {
            state: format!("{topic}.ragline-state"),
            topic,
            base64: false,
            url: url.clone(),
        };
        for (key, value) in &url.others {
            match (key.as_str(), value.as_str()) {
                ("vector", "json") => target.base64 = false,
                ("vector", "base64") => target.base64 = true,
                ("vector", v) => return Err(bad(format!("vector=`{v}`: use json or base64"))),
                ("state", v) if crate::queue::kafka::valid_topic(v) => target.state = v.into(),
                _ => {
                    return Err(bad(format!(
                        "unknown setting `{key}` (vector, state, sasl_mechanism, sasl_user, \
                         sasl_password_env, tls, tls_ca, tls_cert, tls_key)"
                    )))
                }
            }
        }
        Ok(target)
    }
}

impl std::fmt::Display for KafkaTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url.shown)
    }
}

/// One chunk's record.
#[derive(Serialize)]
struct ChunkRecord<'a> {
    document_id: &'a str,
    chunk_id: &'a str,
    ordinal: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    title: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<&'a str>,
    text: &'a str,
    heading_path: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pages: Option<(u32, u32)>,
    metadata: &'a std::collections::BTreeMap<String, serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vector: Option<Vector<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector<'a> {
    Floats(&'a [f32]),
    Base64(String),
}

/// A document's record in the state topic.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct DocState {
    content_hash: String,
    fingerprint: String,
    chunks: Vec<String>,
}

/// The documents this run wrote: their version, how many chunks they have and which are in.
#[derive(Default)]
struct Written {
    parents: HashMap<String, (String, u32)>,
    chunks: HashMap<String, Vec<(u32, String)>>,
}

/// The producer's context: delivery reports into the batch that sent them.
#[derive(Clone, Default)]
struct Delivery {
    client: Context,
}

/// A batch in flight: one slot per record, filled by its delivery report.
type Slots = Arc<Mutex<Vec<Option<Result<(), KafkaError>>>>>;

impl ClientContext for Delivery {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        self.client.log(level, fac, message)
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.client.error(error, reason)
    }
}

impl ProducerContext for Delivery {
    type DeliveryOpaque = Box<(Slots, usize)>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        let (slots, i) = *opaque;
        let outcome = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e.clone()),
        };
        let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get_mut(i) {
            *slot = Some(outcome);
        }
    }
}

/// The run's producer and what it knows of the topic.
pub struct KafkaFactory {
    target: KafkaTarget,
    identity: IndexIdentity,
    producer: Arc<BaseProducer<Delivery>>,
    /// What the state topic said at the start.
    state: Mutex<HashMap<String, DocState>>,
    written: Arc<Mutex<Written>>,
}

impl KafkaFactory {
    /// Connect, and read what the topic holds (a wrong password or an unreachable broker stops
    /// the run here).
    pub fn open(target: &KafkaTarget, identity: IndexIdentity) -> Result<Self, BackendError> {
        let delivery = Delivery::default();
        let producer: BaseProducer<Delivery> = target
            .url
            .client
            .config()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "10")
            .set("message.max.bytes", "16000000")
            .create_with_context(delivery.clone())
            .map_err(|e| BackendError::Invalid(format!("{target}: {e}")))?;
        let meta = producer
            .client()
            .fetch_metadata(None, CONNECT_WAIT)
            .map_err(|e| {
                // librdkafka says why (a failed authentication) through its error callback,
                // which a producer serves when polled.
                for _ in 0..20 {
                    if delivery.client.last_error().is_some() {
                        break;
                    }
                    producer.poll(Duration::from_millis(100));
                }
                BackendError::Io(format!(
                    "{target}: cannot reach the brokers: {}",
                    delivery.client.explain(&e)
                ))
            })?;
        let has = |name: &str| meta.topics().iter().any(|t| t.name() == name);
        let replicas = meta.brokers().len().clamp(1, 3) as i32;
        let missing: Vec<(&str, i32)> = [(&target.topic, DATA_PARTITIONS), (&target.state, 1)]
            .into_iter()
            .filter(|(t, _)| !has(t))
            .map(|(t, p)| (t.as_str(), p))
            .collect();
        if !missing.is_empty() {
            create_compacted(target, &missing, replicas)?;
        }
        let state = read_state(target)?;
        Ok(KafkaFactory {
            target: target.clone(),
            identity,
            producer: Arc::new(producer),
            state: Mutex::new(state),
            written: Arc::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HashMap<String, DocState>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Partitions of a chunk topic the sink creates.
const DATA_PARTITIONS: i32 = 6;

/// Create `topics` (name, partitions) with `cleanup.policy=compact`: a key's newest record is
/// kept, and a tombstone removes it.
fn create_compacted(
    target: &KafkaTarget,
    topics: &[(&str, i32)],
    replicas: i32,
) -> Result<(), BackendError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::types::RDKafkaErrorCode;
    let context = Context::default();
    let admin: AdminClient<Context> = target
        .url
        .client
        .config()
        .create_with_context(context.clone())
        .map_err(|e| BackendError::Invalid(format!("{target}: {e}")))?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| {
            NewTopic::new(name, *partitions, TopicReplication::Fixed(replicas))
                .set("cleanup.policy", "compact")
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(CONNECT_WAIT));
    let answers = futures::executor::block_on(admin.create_topics(&new, &options))
        .map_err(|e| BackendError::Io(format!("{target}: {}", context.explain(&e))))?;
    for answer in answers {
        match answer {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(BackendError::Io(format!(
                    "{target}: cannot create topic {name}: {code}"
                )))
            }
        }
    }
    Ok(())
}

/// Every record of the state topic, the newest per document (none when it does not exist
/// yet).
fn read_state(target: &KafkaTarget) -> Result<HashMap<String, DocState>, BackendError> {
    let context = Context::default();
    let failed = |e: &dyn std::fmt::Display| {
        BackendError::Io(format!(
            "{target}: reading the state topic {}: {}",
            target.state,
            context.explain(e)
        ))
    };
    let consumer: BaseConsumer<Context> = target
        .url
        .client
        .config()
        .set("enable.auto.commit", "false")
        .set("group.id", "ragline-state-reader")
        .create_with_context(context.clone())
        .map_err(|e| failed(&e))?;
    let meta = consumer
        .fetch_metadata(Some(&target.state), CONNECT_WAIT)
        .map_err(|e| failed(&e))?;
    let mut out = HashMap::new();
    let Some(topic) = meta
        .topics()
        .iter()
        .find(|t| t.name() == target.state && t.error().is_none())
    else {
        return Ok(out);
    };
    let mut assign = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for p in topic.partitions() {
        let (low, high) =
            when_ready(|| consumer.fetch_watermarks(&target.state, p.id(), CONNECT_WAIT))
                .map_err(|e| failed(&e))?;
        if high > low {
            assign
                .add_partition_offset(&target.state, p.id(), Offset::Offset(low))
                .map_err(|e| failed(&e))?;
            ends.insert(p.id(), high);
        }
    }
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&assign).map_err(|e| failed(&e))?;
    read_to_ends(&consumer, ends, &mut out, target)?;
    Ok(out)
}

/// Read the assigned partitions of the state topic to `ends` (partition -> end offset) into
/// `out`, the newest record per document.
fn read_to_ends(
    consumer: &BaseConsumer<Context>,
    mut ends: HashMap<i32, i64>,
    out: &mut HashMap<String, DocState>,
    target: &KafkaTarget,
) -> Result<(), BackendError> {
    let failed = |why: &dyn std::fmt::Display| {
        BackendError::Io(format!(
            "{target}: reading the state topic {}: {why}",
            target.state
        ))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while !ends.is_empty() {
        if std::time::Instant::now() > deadline {
            return Err(failed(&"not read to its end in 300 s"));
        }
        let Some(m) = consumer.poll(Duration::from_millis(200)) else {
            // Compacted away or a transaction's marker: the position passes the end.
            if let Ok(pos) = consumer.position() {
                for e in pos.elements() {
                    if let (Offset::Offset(at), Some(end)) = (e.offset(), ends.get(&e.partition()))
                    {
                        if at >= *end {
                            ends.remove(&e.partition());
                        }
                    }
                }
            }
            continue;
        };
        let m = m.map_err(|e| failed(&e))?;
        if m.offset() + 1 >= ends.get(&m.partition()).copied().unwrap_or(0) {
            ends.remove(&m.partition());
        }
        let Some(id) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
            continue;
        };
        match m.payload().map(serde_json::from_slice::<DocState>) {
            Some(Ok(s)) => {
                out.insert(id.to_string(), s);
            }
            None => {
                out.remove(id);
            }
            Some(Err(e)) => tracing::warn!("{target}: state of `{id}` unreadable ({e}); ignored"),
        }
    }
    Ok(())
}

impl BackendFactory for KafkaFactory {
    fn describe(&self) -> String {
        self.target.to_string()
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(KafkaBackend {
            target: self.target.clone(),
            model: self.identity.model.as_ref().map(|m| m.name.clone()),
            dimension: self.identity.model.as_ref().map(|m| m.dimension),
            producer: Arc::clone(&self.producer),
            written: Arc::clone(&self.written),
        }))
    }

    fn known_documents(&self) -> Result<HashMap<String, KnownDocument>, BackendError> {
        Ok(self
            .state()
            .iter()
            .map(|(id, s)| {
                (
                    id.clone(),
                    KnownDocument {
                        content_hash: s.content_hash.clone(),
                        fingerprint: s.fingerprint.clone(),
                    },
                )
            })
            .collect())
    }

    fn document_ids(&self) -> Result<Option<HashSet<String>>, BackendError> {
        Ok(Some(self.state().keys().cloned().collect()))
    }

    fn finish(&self) -> Result<Vec<String>, BackendError> {
        let written = std::mem::take(&mut *self.written.lock().unwrap_or_else(|e| e.into_inner()));
        let mut sends: Vec<(String, String, Option<Vec<u8>>)> = Vec::new();
        let mut complete = 0usize;
        let mut stale = 0usize;
        let mut state = self.state();
        for (id, (hash, children)) in &written.parents {
            let mut chunks = written.chunks.get(id).cloned().unwrap_or_default();
            if chunks.len() != *children as usize {
                continue;
            }
            chunks.sort();
            let ids: Vec<String> = chunks.into_iter().map(|(_, c)| c).collect();
            if let Some(old) = state.get(id) {
                let keep: HashSet<&String> = ids.iter().collect();
                for c in old.chunks.iter().filter(|c| !keep.contains(c)) {
                    sends.push((self.target.topic.clone(), c.clone(), None));
                    stale += 1;
                }
            }
            let s = DocState {
                content_hash: hash.clone(),
                fingerprint: self.identity.pipeline_fingerprint.clone(),
                chunks: ids,
            };
            let value = serde_json::to_vec(&s).expect("a state record encodes: this is a bug");
            sends.push((self.target.state.clone(), id.clone(), Some(value)));
            state.insert(id.clone(), s);
            complete += 1;
        }
        drop(state);
        let failed = send_all(&self.producer, &sends);
        if let Some(e) = failed.into_iter().flatten().next() {
            return Err(BackendError::Io(format!(
                "{}: writing the state of the run's documents: {e}",
                self.target
            )));
        }
        let mut note = format!(
            "{}: {complete} documents' chunks in (state in {})",
            self.target, self.target.state
        );
        if stale > 0 {
            note.push_str(&format!(
                "; {stale} chunks a document no longer has tombstoned"
            ));
        }
        Ok(vec![note])
    }

    fn delete_documents(&self, ids: &[String]) -> Result<usize, BackendError> {
        let mut sends = Vec::new();
        let mut state = self.state();
        let mut deleted = 0;
        for id in ids {
            if let Some(s) = state.remove(id) {
                for c in s.chunks {
                    sends.push((self.target.topic.clone(), c, None));
                }
                sends.push((self.target.state.clone(), id.clone(), None));
                deleted += 1;
            }
        }
        drop(state);
        if let Some(e) = send_all(&self.producer, &sends)
            .into_iter()
            .flatten()
            .next()
        {
            return Err(BackendError::Io(format!(
                "{}: writing the tombstones of deleted documents: {e}",
                self.target
            )));
        }
        Ok(deleted)
    }
}

/// Why a record did not reach the topic.
#[derive(Debug, thiserror::Error)]
enum Undelivered {
    /// The producer refused it (too large, an unknown topic...).
    #[error("refused: {0}")]
    Refused(KafkaError),
    /// The brokers answered with an error.
    #[error("{0}")]
    Failed(KafkaError),
    /// No answer in time.
    #[error("not acknowledged in {} s{}", DELIVERY_WAIT.as_secs(), .0.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    NoReport(Option<KafkaError>),
}

/// Send `(topic, key, value)` records (a None value is a tombstone) and wait for every
/// delivery report: one error (or none) per record.
fn send_all(
    producer: &BaseProducer<Delivery>,
    records: &[(String, String, Option<Vec<u8>>)],
) -> Vec<Option<Undelivered>> {
    let slots: Slots = Arc::new(Mutex::new(vec![None; records.len()]));
    let mut refused: Vec<Option<Undelivered>> = (0..records.len()).map(|_| None).collect();
    for (i, (topic, key, value)) in records.iter().enumerate() {
        let mut record =
            BaseRecord::<str, [u8], _>::with_opaque_to(topic, Box::new((Arc::clone(&slots), i)))
                .key(key.as_str());
        if let Some(v) = value {
            record = record.payload(v.as_slice());
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    r,
                )) => {
                    record = r;
                    producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => {
                    refused[i] = Some(Undelivered::Refused(e));
                    break;
                }
            }
        }
    }
    let flushed = producer.flush(DELIVERY_WAIT);
    let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
    refused
        .into_iter()
        .zip(slots.iter_mut())
        .map(|(refused, slot)| {
            refused.or_else(|| match slot.take() {
                Some(Ok(())) => None,
                Some(Err(e)) => Some(Undelivered::Failed(e)),
                None => Some(Undelivered::NoReport(flushed.clone().err())),
            })
        })
        .collect()
}

/// One indexer thread's writer.
struct KafkaBackend {
    target: KafkaTarget,
    model: Option<String>,
    dimension: Option<usize>,
    producer: Arc<BaseProducer<Delivery>>,
    written: Arc<Mutex<Written>>,
}

impl KafkaBackend {
    /// A chunk's record value.
    fn value(&self, doc: &Document) -> Result<Vec<u8>, ItemError> {
        let chunk = doc
            .chunk
            .as_deref()
            .expect("only chunks are sent: this is a bug");
        let vector = chunk.vector.as_deref().map(|v| {
            if self.target.base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                Vector::Floats(v)
            }
        });
        let record = ChunkRecord {
            document_id: doc.parent_id.as_deref().unwrap_or(&doc.id),
            chunk_id: &doc.id,
            ordinal: chunk.ordinal,
            title: doc.fields.title.as_deref(),
            source: doc.fields.source.as_deref(),
            text: &doc.fields.text,
            heading_path: &chunk.heading_path,
            pages: chunk.pages,
            metadata: &doc.fields.metadata,
            model: self.model.as_deref(),
            vector,
        };
        serde_json::to_vec(&record)
            .map_err(|e| ItemError::permanent(format!("cannot encode as JSON: {e}")))
    }
}

impl Backend for KafkaBackend {
    fn write(&mut self, batch: &[Document]) -> Vec<Result<(), ItemError>> {
        let mut results: Vec<Result<(), ItemError>> = vec![Ok(()); batch.len()];
        let mut sends = Vec::new();
        let mut sent_of = Vec::new();
        for (i, doc) in batch.iter().enumerate() {
            if doc.unchanged || doc.chunk.is_none() {
                continue;
            }
            match check_item(doc, self.dimension).and_then(|()| self.value(doc)) {
                Ok(v) => {
                    sends.push((self.target.topic.clone(), doc.id.clone(), Some(v)));
                    sent_of.push(i);
                }
                Err(e) => results[i] = Err(e),
            }
        }
        for (k, failed) in send_all(&self.producer, &sends).into_iter().enumerate() {
            if let Some(e) = failed {
                results[sent_of[k]] = Err(ItemError::retryable(format!("{}: {e}", self.target)));
            }
        }
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        for (doc, r) in batch.iter().zip(&results) {
            if r.is_err() || doc.unchanged {
                continue;
            }
            match (&doc.chunk, &doc.parent_id) {
                (Some(c), Some(parent)) => written
                    .chunks
                    .entry(parent.clone())
                    .or_default()
                    .push((c.ordinal, doc.id.clone())),
                (None, _) => {
                    written.parents.insert(
                        doc.id.clone(),
                        (doc.content_hash.clone().unwrap_or_default(), doc.children),
                    );
                }
                (Some(_), None) => {}
            }
        }
        results
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        self.producer
            .flush(DELIVERY_WAIT)
            .map_err(|e| BackendError::Io(format!("{}: {e}", self.target)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sink_url() {
        let t = KafkaTarget::parse("kafka://127.0.0.1:9092/chunks?vector=base64").unwrap();
        assert_eq!((t.topic.as_str(), t.base64), ("chunks", true));
        assert_eq!(t.state, "chunks.ragline-state");
        assert_eq!(t.to_string(), "kafka://127.0.0.1:9092/chunks");
        for bad in [
            "kafka://127.0.0.1:9092/a,b",
            "kafka://127.0.0.1:9092/",
            "kafka://127.0.0.1:9092/c?vector=f16",
            "kafka://127.0.0.1:9092/c?group=g",
        ] {
            assert!(KafkaTarget::parse(bad).is_err(), "{bad}");
        }
    }
}
