//! A broker subject as a source: `nats://HOST:4222/docs.>` reads the documents other systems
//! publish on a NATS JetStream subject (see [`message`] for their shape) through a durable
//! pull consumer, so each run resumes where the last one stopped.
//!
//! A run takes what is pending (at most `?max_messages=`, 100,000 by default) and holds every
//! message it took, unacknowledged, until the run is accounted for: once the run has come to
//! its summary (every document indexed, failed or dropped, and the index finished) they are
//! acknowledged together; a run that stops first gives them back (NAK), so the next run gets
//! them again. Held messages get in-progress acknowledgements every third of `?ack_wait=`, so
//! a long run keeps them; a killed process loses them to the next run after `ack_wait`.
//! Delivery is at least once, which costs nothing: a document delivered again with the same
//! content is unchanged.
//!
//! The subject is a stream of changes, not the whole source: a run finds gone documents by
//! the messages that say so (`{"id": ..., "deleted": true}`; removed with `--prune`), never by
//! what it did not read. Several messages for one document in one fetch: the last wins (the
//! others are acknowledged as superseded); one for a document this run already published in
//! an earlier fetch is given back, for the next run, so a document is published once a run and
//! its newest version is the one kept.
//!
//! A message may name a `url` instead of its text; it is downloaded only from the hosts the
//! operator lists in `?fetch_hosts=` (a message never sends ragline anywhere else), with the
//! web connector's bounded GET.

pub mod message;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use async_nats::Subject;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;

use super::{version_key, Connector, ConnectorError, KnownIndex, Settlement};
use crate::document::Document;
use crate::http::fetch::{Addresses, FetchError, Fetcher};
use crate::publisher::Publisher;
use crate::queue::jetstream::{connect_client, BrokerConfig};
use message::{Body, Malformed};

/// Messages one run takes at most, by default (`?max_messages=`).
pub const DEFAULT_MAX_MESSAGES: usize = 100_000;
/// How long a message may go without an acknowledgement before the server gives it to
/// another consumer, by default (`?ack_wait=`).
const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(60);
/// Messages asked for at once.
const FETCH_BATCH: usize = 256;
/// How long a run waits for the server to answer at first.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// A subject URL, read.
#[derive(Clone, Debug)]
pub struct NatsSource {
    /// The URL without credentials, for messages and documents' `source`.
    pub shown: String,
    broker: BrokerConfig,
    pub subject: String,
    /// The stream, when the URL names it (else the one that holds the subject).
    stream: Option<String>,
    pub durable: String,
    max_messages: usize,
    ack_wait: Duration,
    /// The hosts a message's `url` may name.
    fetch_hosts: Vec<String>,
}

impl NatsSource {
    /// Read `nats://[USER:PASS@]HOST:PORT[,HOST:PORT]/SUBJECT?settings`; `index` (the index the
    /// documents go to) names the default durable consumer, so two indexes fed from one subject
    /// each get every message.
    pub fn parse(url: &str, index: &str) -> Result<NatsSource, ConnectorError> {
        let redacted = crate::secret::redact_url(url);
        let shown = redacted.split('?').next().unwrap_or("").to_string();
        let bad = |why: String| ConnectorError::Config(format!("`{redacted}`: {why}"));
        let (main, query) = url.trim().split_once('?').unwrap_or((url.trim(), ""));
        let rest = main
            .strip_prefix("nats://")
            .ok_or_else(|| bad("a broker subject is nats://HOST:PORT/SUBJECT".into()))?;
        let (servers, subject) = rest.split_once('/').unwrap_or((rest, ""));
        let subject = subject
            .replace("%3E", ">")
            .replace("%3e", ">")
            .replace("%2A", "*");
        if !valid_subject(&subject) {
            return Err(bad(format!(
                "`{subject}` is not a subject to consume: give one after the address, such as \
                 nats://HOST:4222/docs.> (tokens split by dots, `*` for one token, `>` last)"
            )));
        }
        let mut broker_query = Vec::new();
        let mut source = NatsSource {
            shown: shown.clone(),
            broker: BrokerConfig::default(),
            subject: subject.clone(),
            stream: None,
            durable: String::new(),
            max_messages: DEFAULT_MAX_MESSAGES,
            ack_wait: DEFAULT_ACK_WAIT,
            fetch_hosts: Vec::new(),
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !source.setting(key, value, &bad)? {
                broker_query.push(pair);
            }
        }
        let servers = servers
            .split(',')
            .map(|s| format!("nats://{s}"))
            .collect::<Vec<_>>()
            .join(",");
        source.broker = BrokerConfig::parse(&format!("{servers}?{}", broker_query.join("&")))
            .map_err(|e| bad(e.to_string()))?;
        if source.durable.is_empty() {
            source.durable = format!("ragline-{}", &version_key(&[index, &subject])[..16]);
        }
        Ok(source)
    }

    /// One `key=value` of the URL's query, onto `self`: false when it is the broker's own
    /// (`creds`, `tls`...). `bad` makes the error that names the URL.
    fn setting(
        &mut self,
        key: &str,
        value: &str,
        bad: &dyn Fn(String) -> ConnectorError,
    ) -> Result<bool, ConnectorError> {
        let name = |what: &str| -> Result<String, ConnectorError> {
            if value.is_empty()
                || !value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(bad(format!(
                    "{what} `{value}` must be letters, digits, - or _"
                )));
            }
            Ok(value.to_string())
        };
        let positive = || -> Result<u64, ConnectorError> {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad(format!("`{key}={value}` must be a positive number")))
        };
        match key {
            "stream" => self.stream = Some(name("stream")?),
            "durable" => self.durable = name("durable")?,
            "max_messages" => self.max_messages = positive()? as usize,
            "ack_wait" => self.ack_wait = Duration::from_secs(positive()?.max(3)),
            "fetch_hosts" => {
                self.fetch_hosts = value
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(|h| h.to_ascii_lowercase())
                    .collect()
            }
            "creds" | "tls" | "tls_ca" | "tls_cert" | "tls_key" => return Ok(false),
            _ => {
                return Err(bad(format!(
                    "unknown setting `{key}` (stream, durable, max_messages, ack_wait, \
                     fetch_hosts, creds, tls, tls_ca, tls_cert, tls_key)"
                )))
            }
        }
        Ok(true)
    }

    /// The consumer's settings.
    fn consumer_config(&self) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(self.durable.clone()),
            description: Some(format!("ragline ingest of {}", self.subject)),
            filter_subject: self.subject.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            deliver_policy: consumer::DeliverPolicy::All,
            ack_wait: self.ack_wait,
            max_ack_pending: self.max_messages as i64,
            ..Default::default()
        }
    }

    /// The durable consumer (made the first time), on the stream that holds the subject.
    async fn consumer(
        &self,
        js: &jetstream::Context,
    ) -> Result<consumer::PullConsumer, ConnectorError> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            ConnectorError::Source(format!("{}: {what}: {e}", self.shown))
        };
        let stream = match &self.stream {
            Some(s) => s.clone(),
            None => js
                .stream_by_subject(self.subject.clone())
                .await
                .map_err(|e| {
                    ConnectorError::Source(format!(
                        "{}: no JetStream stream holds subject `{}` ({e}): create one for it \
                     (`nats stream add DOCS --subjects '{}'`), or name it with ?stream=",
                        self.shown, self.subject, self.subject
                    ))
                })?,
        };
        let stream = js
            .get_stream(&stream)
            .await
            .map_err(|e| failed(&format!("stream {stream}"), &e))?;
        let mut consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(&self.durable, self.consumer_config())
            .await
            .map_err(|e| failed(&format!("consumer {}", self.durable), &e))?;
        let info = consumer
            .info()
            .await
            .map_err(|e| failed(&format!("consumer {}", self.durable), &e))?;
        if info.config.filter_subject != self.subject {
            return Err(ConnectorError::Config(format!(
                "{}: the durable consumer `{}` follows `{}`, not `{}`: name another with \
                 ?durable=",
                self.shown, self.durable, info.config.filter_subject, self.subject
            )));
        }
        Ok(consumer)
    }
}

/// A subject is dot-separated tokens; `*` a whole token, `>` the last one.
fn valid_subject(s: &str) -> bool {
    let tokens: Vec<&str> = s.split('.').collect();
    !s.is_empty()
        && s.len() <= 1024
        && tokens.iter().enumerate().all(|(i, t)| {
            !t.is_empty()
                && !t.chars().any(|c| c.is_whitespace() || c.is_control())
                && (!t.contains('*') || *t == "*")
                && (!t.contains('>') || (*t == ">" && i + 1 == tokens.len()))
        })
}

/// What a run settles once it is over: the messages it took, held until then.
#[derive(Default)]
struct Held {
    /// The reply subjects of the messages accounted for by the run (acknowledged after it).
    taken: Vec<Subject>,
    /// Messages given back after the run (a document already published by it).
    given_back: Vec<Subject>,
    superseded: usize,
    /// The stream and what the consumer still had when the run stopped taking messages.
    stream: String,
    pending: u64,
    capped: bool,
}

/// What the connector and its settlement share: the connection, kept past the connector's
/// run until the messages are settled.
struct Session {
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
    held: Arc<Mutex<Held>>,
    /// Stops the in-progress acknowledgements.
    settled: Arc<AtomicBool>,
}

/// How a message's document is fetched, when the operator allows it.
pub struct FetchSettings {
    pub max_bytes: u64,
    pub timeout: Duration,
    pub concurrency: usize,
}

/// Consumes a subject.
pub struct NatsConnector {
    source: NatsSource,
    fetch: FetchSettings,
    session: Arc<Mutex<Option<Session>>>,
}

impl NatsConnector {
    pub fn new(url: &str, index: &str, fetch: FetchSettings) -> Result<Self, ConnectorError> {
        Ok(NatsConnector {
            source: NatsSource::parse(url, index)?,
            fetch,
            session: Arc::default(),
        })
    }
}

impl Connector for NatsConnector {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn whole_source(&self) -> bool {
        false
    }

    fn know(&mut self, _index: &KnownIndex) {}

    fn settlement(&mut self) -> Option<Box<dyn Settlement>> {
        Some(Box::new(NatsSettlement {
            shown: self.source.shown.clone(),
            durable: self.source.durable.clone(),
            session: Arc::clone(&self.session),
        }))
    }

    fn run(&mut self, publisher: &Publisher) -> Result<(), ConnectorError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nats-source")
            .enable_all()
            .build()
            .map_err(|e| ConnectorError::Source(format!("cannot start the I/O runtime: {e}")))?;
        let client = rt
            .block_on(connect_client(&self.source.broker, CONNECT_WAIT))
            .map_err(|e| ConnectorError::Source(format!("{}: {e}", self.source.shown)))?;
        let held = Arc::new(Mutex::new(Held::default()));
        let settled = Arc::new(AtomicBool::new(false));
        rt.spawn(keep_in_progress(
            client.clone(),
            Arc::clone(&held),
            Arc::clone(&settled),
            self.source.ack_wait / 3,
        ));
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(Session {
            rt,
            client: client.clone(),
            held: Arc::clone(&held),
            settled,
        });
        let fetcher = if self.source.fetch_hosts.is_empty() {
            None
        } else {
            publisher.count_fetches();
            Some(
                // The operator names the hosts a message may point at (`fetch_hosts`).
                Fetcher::new(self.fetch.max_bytes, self.fetch.timeout, Addresses::Any).map_err(
                    |e| ConnectorError::Source(format!("cannot start the HTTP client: {e}")),
                )?,
            )
        };
        let consume = Consume {
            source: &self.source,
            fetch: &self.fetch,
            fetcher: fetcher.as_ref(),
            publisher,
            held: &held,
        };
        let guard = self.session.lock().unwrap_or_else(|e| e.into_inner());
        let handle = guard.as_ref().expect("set above").rt.handle().clone();
        drop(guard);
        // The JetStream context is made inside the runtime (it starts a task of its own).
        handle.block_on(async move { consume.run(jetstream::new(client)).await })
    }
}

/// One run's consumption of the subject.
struct Consume<'a> {
    source: &'a NatsSource,
    fetch: &'a FetchSettings,
    fetcher: Option<&'a Fetcher>,
    publisher: &'a Publisher,
    held: &'a Mutex<Held>,
}

/// A message taken from the subject.
struct Taken {
    reply: Subject,
    subject: String,
    sequence: u64,
    payload: Bytes,
}

impl Consume<'_> {
    async fn run(self, js: jetstream::Context) -> Result<(), ConnectorError> {
        let consumer = self.source.consumer(&js).await?;
        let stream = consumer.cached_info().stream_name.clone();
        self.held().stream = stream.clone();
        let mut published: HashSet<String> = HashSet::new();
        let mut count = 0usize;
        loop {
            if self.publisher.signal().is_stopped() {
                return Ok(());
            }
            if count >= self.source.max_messages {
                self.held().capped = true;
                break;
            }
            let want = FETCH_BATCH.min(self.source.max_messages - count);
            let mut batch = match consumer.fetch().max_messages(want).messages().await {
                Ok(b) => b,
                Err(e) => {
                    return Err(ConnectorError::Source(format!(
                        "{}: fetching from the consumer {}: {e}",
                        self.source.shown, self.source.durable
                    )))
                }
            };
            let mut taken = Vec::new();
            while let Some(m) = batch.next().await {
                match m {
                    Ok(m) => {
                        if let Some(t) = taken_of(m) {
                            taken.push(t);
                        }
                    }
                    Err(e) => {
                        tracing::debug!("{}: a fetch ended early: {e}", self.source.shown);
                        break;
                    }
                }
            }
            if taken.is_empty() {
                break;
            }
            count += taken.len();
            self.publish_batch(&stream, taken, &mut published).await?;
        }
        let pending = consumer
            .clone()
            .info()
            .await
            .map(|i| i.num_pending)
            .unwrap_or(0);
        self.held().pending = pending;
        Ok(())
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One fetch's messages: read, the last one per document kept, published in order.
    async fn publish_batch(
        &self,
        stream: &str,
        taken: Vec<Taken>,
        published: &mut HashSet<String>,
    ) -> Result<(), ConnectorError> {
        let read: Vec<(Taken, Result<message::Message, Malformed>)> = taken
            .into_iter()
            .map(|t| {
                let m = self.read(&t.payload);
                (t, m)
            })
            .collect();
        // The last message of each document in this fetch.
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (i, (_, m)) in read.iter().enumerate() {
            if let Ok(m) = m {
                last.insert(m.id.as_str(), i);
            }
        }
        let mut work = Vec::new();
        for (i, (t, m)) in read.iter().enumerate() {
            let source = format!("{}#{}", self.source.shown, t.sequence);
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    let id =
                        e.id.clone()
                            .unwrap_or_else(|| format!("nats:{stream}:{}", t.sequence));
                    self.publisher.publish_failed(
                        &id,
                        Some(&source),
                        "read",
                        &format!(
                            "message {} on {} (stream {stream}): {}",
                            t.sequence, t.subject, e.reason
                        ),
                    );
                    self.held().taken.push(t.reply.clone());
                    continue;
                }
            };
            if last.get(m.id.as_str()) != Some(&i) {
                let mut held = self.held();
                held.superseded += 1;
                held.taken.push(t.reply.clone());
                continue;
            }
            if !published.insert(m.id.clone()) {
                self.held().given_back.push(t.reply.clone());
                continue;
            }
            self.held().taken.push(t.reply.clone());
            work.push((t, m, source));
        }
        // Documents made in order; the downloads among them run side by side.
        let mut made = futures::stream::iter(work.into_iter().map(|(t, m, source)| async move {
            let made = self.document(t, m, &source).await;
            (m.id.clone(), source, made)
        }))
        .buffered(self.fetch.concurrency.max(1));
        while let Some((id, source, made)) = made.next().await {
            self.publish_made(&id, &source, made)?;
        }
        Ok(())
    }

    /// A message's payload read, within the size of one document.
    fn read(&self, payload: &[u8]) -> Result<message::Message, Malformed> {
        if payload.len() as u64 > self.fetch.max_bytes {
            return Err(Malformed {
                id: None,
                reason: format!(
                    "{} bytes, over --max-file-bytes={} (the limit of one document); raise it \
                     to read this message",
                    payload.len(),
                    self.fetch.max_bytes
                ),
            });
        }
        message::parse(payload)
    }

    /// What a message made, published.
    fn publish_made(&self, id: &str, source: &str, made: Made) -> Result<(), ConnectorError> {
        match made {
            Made::Document(doc) => self.publisher.publish(*doc)?,
            Made::Gone(reason) => self
                .publisher
                .publish_gone(id, Some(source), "read", &reason),
            Made::Failed(reason) => {
                self.publisher
                    .publish_failed(id, Some(source), "read", &reason)
            }
            Made::Dropped(reason) => {
                self.publisher
                    .publish_dropped(id, Some(source), "read", &reason)
            }
        }
        Ok(())
    }

    /// The document of a message.
    async fn document(&self, t: &Taken, m: &message::Message, source: &str) -> Made {
        let at = format!("message {} on {}", t.sequence, t.subject);
        let mut doc = match &m.body {
            Body::Deleted => return Made::Gone(format!("deleted: {at} says the document is gone")),
            Body::Text {
                text,
                title,
                format,
            } => {
                if text.trim().is_empty() {
                    return Made::Dropped(format!("{at}: empty text"));
                }
                let mut doc = Document::new(m.id.clone(), text.clone());
                doc.fields.title = title.clone();
                if let Some(f) = format {
                    doc.fields.metadata.insert("format".into(), (*f).into());
                }
                doc
            }
            Body::Url(url) => match self.download(url, &m.id).await {
                Ok(doc) => doc,
                Err(made) => return made,
            },
        };
        // The version: the content with what the message says of it (its metadata, title),
        // not where it sat on the stream.
        let content = blake3::hash(match &doc.raw {
            Some(raw) => raw,
            None => doc.fields.text.as_bytes(),
        })
        .to_hex();
        let said = Value::Object(m.metadata.clone()).to_string();
        doc.content_hash = Some(version_key(&[
            content.as_str(),
            &said,
            doc.fields.title.as_deref().unwrap_or(""),
            doc.fields
                .metadata
                .get("format")
                .and_then(Value::as_str)
                .unwrap_or(""),
        ]));
        doc.fields.source = Some(source.to_string());
        let meta = &mut doc.fields.metadata;
        for (k, v) in &m.metadata {
            meta.insert(k.clone(), v.clone());
        }
        meta.insert("subject".into(), t.subject.clone().into());
        meta.insert("stream_sequence".into(), t.sequence.into());
        Made::Document(Box::new(doc))
    }

    /// The page a message names, from an allowed host.
    async fn download(&self, url: &str, id: &str) -> Result<Document, Made> {
        let Some(fetcher) = self.fetcher else {
            return Err(Made::Failed(format!(
                "the message names a url ({}), and ragline downloads only from the hosts the \
                 operator lists: add `fetch_hosts=HOST` to the subject's URL, or publish the text",
                shorten(url)
            )));
        };
        let parsed = url::Url::parse(url)
            .map_err(|e| Made::Failed(format!("\"url\" {}: {e}", shorten(url))))?;
        let host = parsed.host_str().unwrap_or("").to_ascii_lowercase();
        if !matches!(parsed.scheme(), "http" | "https") || !self.source.fetch_hosts.contains(&host)
        {
            return Err(Made::Failed(format!(
                "\"url\" {}: not an http(s) URL on a host in fetch_hosts ({}); a message may \
                 only name those",
                shorten(url),
                self.source.fetch_hosts.join(",")
            )));
        }
        let page = fetcher.get(parsed.as_str()).await.map_err(|e| match e {
            FetchError::Status {
                status: 404 | 410, ..
            } => Made::Gone(format!("gone: {e}")),
            e => Made::Failed(e.to_string()),
        })?;
        self.publisher.fetched(page.body.len() as u64);
        crate::connectors::web::page_document(id, &page).map_err(|u| match u {
            crate::connectors::filesystem::Unusable::Dropped(r) => Made::Dropped(r),
            crate::connectors::filesystem::Unusable::Failed(r) => Made::Failed(r),
        })
    }
}

/// What a message came to.
enum Made {
    Document(Box<Document>),
    Gone(String),
    Failed(String),
    Dropped(String),
}

/// At most 200 characters of a URL, for a message.
fn shorten(url: &str) -> String {
    url.chars().take(200).collect()
}

/// What the run needs of a message; None for one that is not a JetStream message (no reply
/// subject: nothing to acknowledge, nothing to read).
fn taken_of(m: jetstream::Message) -> Option<Taken> {
    let sequence = m.info().ok()?.stream_sequence;
    let reply = m.reply.clone()?;
    let (m, _acker) = m.split();
    Some(Taken {
        reply,
        subject: m.subject.to_string(),
        sequence,
        payload: m.payload,
    })
}

/// In-progress acknowledgements for every held message, every `every`, until settled.
async fn keep_in_progress(
    client: async_nats::Client,
    held: Arc<Mutex<Held>>,
    settled: Arc<AtomicBool>,
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        if settled.load(Ordering::Relaxed) {
            return;
        }
        let replies: Vec<Subject> = {
            let h = held.lock().unwrap_or_else(|e| e.into_inner());
            h.taken.iter().chain(&h.given_back).cloned().collect()
        };
        for reply in replies {
            if settled.load(Ordering::Relaxed) {
                return;
            }
            let _ = client.publish(reply, Bytes::from_static(b"+WPI")).await;
        }
    }
}

/// The acknowledgements of a run's messages, once the run is over.
struct NatsSettlement {
    shown: String,
    durable: String,
    session: Arc<Mutex<Option<Session>>>,
}

impl Settlement for NatsSettlement {
    fn settle(self: Box<Self>, accounted: bool) -> Vec<String> {
        let Some(session) = self
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return Vec::new();
        };
        session.settled.store(true, Ordering::Relaxed);
        let held = std::mem::take(&mut *session.held.lock().unwrap_or_else(|e| e.into_inner()));
        let (done, back): (&[u8], &[u8]) = if accounted {
            (b"+ACK", b"-NAK")
        } else {
            (b"-NAK", b"-NAK")
        };
        let client = session.client.clone();
        let sent = session.rt.block_on(async {
            for reply in &held.taken {
                client
                    .publish(reply.clone(), Bytes::from_static(done))
                    .await?;
            }
            for reply in &held.given_back {
                client
                    .publish(reply.clone(), Bytes::from_static(back))
                    .await?;
            }
            tokio::time::timeout(Duration::from_secs(30), client.flush())
                .await
                .map_err(|_| std::io::Error::other("no answer in 30 s"))?
                .map_err(std::io::Error::other)?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        });
        let messages = held.taken.len() + held.given_back.len();
        let note = match sent {
            Err(e) => format!(
                "{}: the acknowledgements of {messages} messages were not all sent ({e}); the \
                 broker gives them again after ack_wait, and a document with the same content \
                 is unchanged",
                self.shown
            ),
            Ok(()) if accounted => self.acknowledged(&held),
            Ok(()) => format!(
                "{}: the run stopped: {messages} messages given back to the broker for the \
                 next run",
                self.shown
            ),
        };
        drop(client);
        session.rt.shutdown_timeout(Duration::from_secs(1));
        vec![note]
    }
}

impl NatsSettlement {
    /// The note of a run whose messages were all acknowledged or given back.
    fn acknowledged(&self, held: &Held) -> String {
        let mut note = format!(
            "{}: {} messages from stream {} acknowledged (consumer {})",
            self.shown,
            held.taken.len(),
            held.stream,
            self.durable
        );
        if held.superseded > 0 {
            note.push_str(&format!(
                "; {} superseded by a later message for the same document",
                held.superseded
            ));
        }
        if !held.given_back.is_empty() {
            note.push_str(&format!(
                "; {} given back for the next run (a document this run already published)",
                held.given_back.len()
            ));
        }
        if held.capped || held.pending > 0 {
            note.push_str(&format!(
                "; {} more waiting (a run takes at most ?max_messages=): the next run or \
                 --follow pass takes them",
                held.pending
            ));
        }
        note
    }
}

/// Waits for messages between `ingest --follow` passes.
pub struct Waiter {
    rt: tokio::runtime::Runtime,
    consumer: consumer::PullConsumer,
}

impl Waiter {
    /// Connect to the subject's consumer (made if new).
    pub fn open(url: &str, index: &str) -> Result<Waiter, ConnectorError> {
        let source = NatsSource::parse(url, index)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ConnectorError::Source(format!("cannot start the I/O runtime: {e}")))?;
        let consumer = rt.block_on(async {
            let client = connect_client(&source.broker, CONNECT_WAIT)
                .await
                .map_err(|e| ConnectorError::Source(format!("{}: {e}", source.shown)))?;
            source.consumer(&jetstream::new(client)).await
        })?;
        Ok(Waiter { rt, consumer })
    }

    /// Messages waiting for the consumer.
    pub fn pending(&mut self) -> Result<u64, ConnectorError> {
        let consumer = &mut self.consumer;
        self.rt
            .block_on(consumer.info())
            .map(|i| i.num_pending)
            .map_err(|e| ConnectorError::Source(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_subject_url() {
        let s = NatsSource::parse(
            "nats://u:secret@127.0.0.1:4222/docs.>?stream=DOCS&max_messages=50&ack_wait=30&fetch_hosts=Docs.Example.com",
            "sqlite://x.db",
        )
        .unwrap();
        assert_eq!(s.subject, "docs.>");
        assert_eq!(s.stream.as_deref(), Some("DOCS"));
        assert_eq!((s.max_messages, s.ack_wait.as_secs()), (50, 30));
        assert_eq!(s.fetch_hosts, ["docs.example.com"]);
        assert!(!s.shown.contains("secret"), "{}", s.shown);
        assert!(s.durable.starts_with("ragline-"));
        let other = NatsSource::parse("nats://127.0.0.1:4222/docs.>", "sqlite://y.db").unwrap();
        assert_ne!(s.durable, other.durable, "one consumer per index");
        for bad in [
            "nats://127.0.0.1:4222",
            "nats://127.0.0.1:4222/docs.>.x",
            "nats://127.0.0.1:4222/do*cs",
            "nats://127.0.0.1:4222/a..b",
            "nats://127.0.0.1:4222/docs?nope=1",
            "nats://127.0.0.1:4222/docs?durable=a.b",
        ] {
            assert!(NatsSource::parse(bad, "i").is_err(), "{bad}");
        }
    }
}
