//! Queues on NATS JetStream, for runs whose stages are separate processes on any number of
//! machines (`ragline worker`, `embedder`, `indexer` and the publishing `ingest --queue`).
//!
//! Layout, under a prefix (`ragline` unless the URL says `?prefix=`):
//! - one stream per queue, `<PREFIX>_WORK`, `_EMBED`, `_INDEX`, `_EVENTS`, with work-queue
//!   retention (a message is gone once acknowledged), file storage, and a message limit with
//!   new messages refused when full: a full stream makes its producers wait, so a slow
//!   indexer slows the connector and no process buffers without bound;
//! - a subject per run in each (`<prefix>.work.<run>`), and one durable pull consumer per run
//!   and queue (`work-<run>`), shared by every process of that role;
//! - a key-value bucket `<PREFIX>_RUNS` with each run's settings and state, so a process
//!   needs nothing but the queue URL.
//!
//! Delivery is at least once. What a process publishes goes through one ordered output task
//! per connection: a message's acknowledgement is sent only after every publish issued before
//! it was confirmed by the stream (publish acks), so an item is never acknowledged before its
//! outputs are stored; publishes are pipelined, not awaited one by one. A publish that fails
//! (stream full, no leader during a failover, server restarting) is retried until it is
//! stored. Messages a process holds get in-progress acknowledgements (every third of the
//! consumer's `AckWait`), so a long batch keeps its lease while a killed process loses its
//! messages to the others after `AckWait`; after `MaxDeliver` deliveries the server gives up
//! and says so in an advisory, which the run's publisher turns into a FAIL.

use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream, AckKind};
use async_nats::ServerAddr;
use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver, Sender};
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::wire::Wire;
use super::{Delivery, DeliveryTag, PushError, Queue, QueueError};
use crate::document::RunId;

/// The format of the messages (`queue::wire`); a process reading another refuses the run.
pub const WIRE_VERSION: u32 = 1;

/// Publishes in flight (sent, not yet confirmed) per connection, at most.
const PUBLISH_WINDOW: usize = 4096;
/// Outgoing messages waiting for the output task, at most.
const OUTGOING: usize = 1024;

/// The four queues of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    Work,
    Embed,
    Index,
    Events,
}

impl Lane {
    pub const ALL: [Lane; 4] = [Lane::Work, Lane::Embed, Lane::Index, Lane::Events];

    pub fn name(self) -> &'static str {
        match self {
            Lane::Work => "work",
            Lane::Embed => "embed",
            Lane::Index => "index",
            Lane::Events => "events",
        }
    }
}

/// Where the broker is and how a run's streams are set up: `nats://HOST:PORT[,nats://...]`
/// with `?prefix=NAME` (streams, subjects and bucket names), `replicas=N` (stream replicas
/// in a cluster), `ack_wait=SECONDS`, `max_deliver=N`, `max_pending=N` (messages one consumer
/// may hold unacknowledged), `limit=N` (messages a stream holds before producers wait) and
/// `max_hold=SECONDS` (how long a process may keep one item alive with in-progress acks).
#[derive(Clone, Debug, PartialEq)]
pub struct BrokerConfig {
    pub servers: Vec<String>,
    pub prefix: String,
    pub replicas: usize,
    pub ack_wait: Duration,
    pub max_deliver: i64,
    pub max_pending: i64,
    pub limit: i64,
    /// How long a process keeps one item with in-progress acknowledgements, at most.
    pub max_hold: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            servers: vec!["nats://127.0.0.1:4222".into()],
            prefix: "ragline".into(),
            replicas: 1,
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            max_pending: 4096,
            limit: 20_000,
            max_hold: Duration::from_secs(600),
        }
    }
}

impl BrokerConfig {
    pub fn parse(url: &str) -> Result<Self, String> {
        let mut config = BrokerConfig::default();
        let (servers, query) = url.split_once('?').unwrap_or((url, ""));
        config.servers = servers
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                if !s.starts_with("nats://") && !s.starts_with("tls://") {
                    return Err(format!(
                        "queue URL `{url}`: `{s}` is not a nats:// address (nats://HOST:PORT)"
                    ));
                }
                ServerAddr::from_str(s)
                    .map(|_| s.to_string())
                    .map_err(|e| format!("queue URL `{url}`: `{s}`: {e}"))
            })
            .collect::<Result<_, _>>()?;
        if config.servers.is_empty() {
            return Err(format!(
                "queue URL `{url}` names no server (nats://HOST:PORT)"
            ));
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = |what: &str| -> Result<i64, String> {
                value.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    format!("queue URL `{url}`: `{key}={value}` must be a positive {what}")
                })
            };
            match key {
                "prefix" => {
                    if value.is_empty()
                        || !value
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                    {
                        return Err(format!(
                            "queue URL `{url}`: prefix `{value}` must be letters, digits, - or _"
                        ));
                    }
                    config.prefix = value.to_string();
                }
                "replicas" => config.replicas = number("number")? as usize,
                "ack_wait" => {
                    config.ack_wait = Duration::from_secs(number("number of seconds")? as u64)
                }
                "max_deliver" => config.max_deliver = number("number")?,
                "max_pending" => config.max_pending = number("number")?,
                "limit" => config.limit = number("number")?,
                "max_hold" => {
                    config.max_hold = Duration::from_secs(number("number of seconds")? as u64)
                }
                _ => {
                    return Err(format!(
                        "queue URL `{url}`: unknown setting `{key}` (prefix, replicas, ack_wait, \
                         max_deliver, max_pending, limit, max_hold)"
                    ))
                }
            }
        }
        Ok(config)
    }

    pub fn stream(&self, lane: Lane) -> String {
        format!(
            "{}_{}",
            self.prefix.to_uppercase(),
            lane.name().to_uppercase()
        )
    }

    pub fn subject(&self, lane: Lane, run: RunId) -> String {
        format!("{}.{}.{run}", self.prefix, lane.name())
    }

    pub fn consumer(&self, lane: Lane, run: RunId) -> String {
        format!("{}-{run}", lane.name())
    }

    fn bucket(&self) -> String {
        format!("{}_RUNS", self.prefix.to_uppercase())
    }

    /// The URL without settings, for messages.
    pub fn describe(&self) -> String {
        self.servers.join(",")
    }
}

/// What the runs bucket holds for a run: everything a worker, embedder or indexer needs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    pub run: String,
    /// The message format ([`WIRE_VERSION`]): processes of another format refuse the run.
    pub wire: u32,
    /// The ragline version that published the run.
    pub version: String,
    pub state: RunState,
    /// The run's pipeline settings (`ragline.toml` form, flags applied).
    pub config: String,
    /// The model the run embeds with, when it chunks: its fingerprint and dimension.
    pub model_fingerprint: Option<String>,
    pub dimension: Option<usize>,
    /// Whether chunks go through the embedders (false: deferred, or no model).
    pub embeds: bool,
    /// Unix seconds.
    pub started: u64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Complete,
    Aborted,
}

type Ordered = Pin<Box<dyn Future<Output = Option<(jetstream::Message, AckKind)>> + Send>>;

enum Outgoing {
    Publish {
        subject: String,
        payload: Bytes,
    },
    Ack(Box<jetstream::Message>, AckKind),
    /// Answered when everything before it is done.
    Flush(Sender<()>),
}

/// A connection to the broker, shared by the queues of a process (cheap to clone).
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    config: BrokerConfig,
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
    js: jetstream::Context,
    outgoing: tokio::sync::mpsc::Sender<Outgoing>,
    closed: AtomicBool,
    tags_arc: Arc<AtomicU64>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

fn backend(queue: &'static str, e: impl std::fmt::Display) -> QueueError {
    QueueError::Backend {
        queue,
        message: e.to_string(),
    }
}

impl Broker {
    /// Connect, waiting up to `wait` for a server to answer, and make sure the streams and the
    /// runs bucket exist. The connection reconnects by itself for as long as the process runs.
    pub fn connect(config: BrokerConfig, wait: Duration) -> Result<Broker, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nats")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the broker client: {e}"))?;
        let addrs: Vec<ServerAddr> = config
            .servers
            .iter()
            .map(|s| ServerAddr::from_str(s).expect("checked by BrokerConfig::parse"))
            .collect();
        let described = config.describe();
        let client = rt.block_on(async {
            let connect = async_nats::ConnectOptions::new()
                .name("ragline")
                .retry_on_initial_connect()
                .max_reconnects(None)
                .connection_timeout(Duration::from_secs(2))
                .connect(addrs);
            let client = match tokio::time::timeout(wait, connect).await {
                Err(_) => {
                    return Err(format!(
                        "cannot reach the NATS server at {described} within {}s: is it running \
                         (`scripts/nats.sh start`), and is the address right?",
                        wait.as_secs()
                    ))
                }
                Ok(Err(e)) => return Err(format!("cannot connect to NATS at {described}: {e}")),
                Ok(Ok(client)) => client,
            };
            // A first connect that is still retrying has not reached the server yet.
            let deadline = Instant::now() + wait;
            while client.connection_state() != async_nats::connection::State::Connected {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "cannot reach the NATS server at {described} within {}s: is it \
                         running (`scripts/nats.sh start`), and is the address right?",
                        wait.as_secs()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(client)
        })?;
        let _in_runtime = rt.enter();
        let js = jetstream::new(client.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(OUTGOING);
        rt.spawn(output(js.clone(), rx));
        let broker = Broker {
            inner: Arc::new(Inner {
                config,
                rt,
                client,
                js,
                outgoing: tx,
                closed: AtomicBool::new(false),
                tags_arc: Arc::new(AtomicU64::new(1)),
            }),
        };
        broker.ensure_streams()?;
        Ok(broker)
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.inner.rt.block_on(f)
    }

    /// Retry a JetStream API call while the cluster has no leader or the server restarts.
    fn retrying<T, E: std::fmt::Display, Fut: Future<Output = Result<T, E>>>(
        &self,
        what: &str,
        mut call: impl FnMut() -> Fut,
    ) -> Result<T, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        self.block_on(async {
            loop {
                match call().await {
                    Ok(v) => return Ok(v),
                    Err(e) if Instant::now() < deadline => {
                        let _ = &e;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(format!("NATS: {what}: {e}")),
                }
            }
        })
    }

    fn ensure_streams(&self) -> Result<(), String> {
        let c = &self.inner.config;
        for lane in Lane::ALL {
            let config = stream::Config {
                name: c.stream(lane),
                subjects: vec![format!("{}.{}.*", c.prefix, lane.name())],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                discard: stream::DiscardPolicy::New,
                max_messages: match lane {
                    Lane::Events => c.limit * 8,
                    _ => c.limit,
                },
                num_replicas: c.replicas,
                ..Default::default()
            };
            let js = self.inner.js.clone();
            self.retrying(&format!("creating stream {}", config.name), || {
                let (js, config) = (js.clone(), config.clone());
                async move { js.get_or_create_stream(config).await }
            })?;
        }
        let js = self.inner.js.clone();
        let bucket = c.bucket();
        let replicas = c.replicas;
        self.retrying("creating the runs bucket", || {
            let (js, bucket) = (js.clone(), bucket.clone());
            async move {
                match js.get_key_value(&bucket).await {
                    Ok(kv) => Ok(kv),
                    Err(_) => {
                        js.create_key_value(jetstream::kv::Config {
                            bucket,
                            history: 1,
                            storage: stream::StorageType::File,
                            num_replicas: replicas,
                            ..Default::default()
                        })
                        .await
                    }
                }
            }
        })?;
        Ok(())
    }

    fn runs(&self) -> Result<jetstream::kv::Store, String> {
        let js = self.inner.js.clone();
        let bucket = self.inner.config.bucket();
        self.retrying("opening the runs bucket", || {
            let (js, bucket) = (js.clone(), bucket.clone());
            async move { js.get_key_value(bucket).await }
        })
    }

    /// Record a run (its settings and state) for the other processes.
    pub fn put_run(&self, record: &RunRecord) -> Result<(), String> {
        let kv = self.runs()?;
        let bytes = Bytes::from(serde_json::to_vec(record).expect("a record encodes"));
        let key = record.run.clone();
        self.retrying("recording the run", || {
            let (kv, key, bytes) = (kv.clone(), key.clone(), bytes.clone());
            async move { kv.put(key, bytes).await }
        })?;
        Ok(())
    }

    pub fn get_run(&self, run: &str) -> Result<Option<RunRecord>, String> {
        let kv = self.runs()?;
        let bytes = self.retrying("reading the run", || {
            let (kv, key) = (kv.clone(), run.to_string());
            async move { kv.get(key).await }
        })?;
        bytes
            .map(|b| {
                serde_json::from_slice(&b).map_err(|e| format!("run {run}: unreadable record: {e}"))
            })
            .transpose()
    }

    /// The runs recorded, oldest first.
    pub fn list_runs(&self) -> Result<Vec<RunRecord>, String> {
        let kv = self.runs()?;
        let keys: Vec<String> = self.retrying("listing runs", || {
            let kv = kv.clone();
            async move {
                match kv.keys().await {
                    Ok(keys) => Ok(keys.filter_map(|k| async { k.ok() }).collect().await),
                    Err(e) => Err(e),
                }
            }
        })?;
        let mut runs = Vec::new();
        for key in keys {
            if let Some(r) = self.get_run(&key)? {
                runs.push(r);
            }
        }
        runs.sort_by_key(|r| (r.started, r.run.clone()));
        Ok(runs)
    }

    /// Create the run's consumers (durable pull, explicit ack, the URL's AckWait, MaxDeliver
    /// and max_ack_pending).
    pub fn create_consumers(&self, run: RunId) -> Result<(), String> {
        let c = self.inner.config.clone();
        for lane in Lane::ALL {
            let name = c.consumer(lane, run);
            let config = consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: c.subject(lane, run),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: c.ack_wait,
                max_deliver: c.max_deliver,
                max_ack_pending: c.max_pending,
                num_replicas: c.replicas,
                ..Default::default()
            };
            let js = self.inner.js.clone();
            let stream = c.stream(lane);
            self.retrying(&format!("creating consumer {name}"), || {
                let (js, stream, config, name) =
                    (js.clone(), stream.clone(), config.clone(), name.clone());
                async move {
                    let stream = js.get_stream(stream).await.map_err(|e| e.to_string())?;
                    stream
                        .get_or_create_consumer(&name, config)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            })?;
        }
        Ok(())
    }

    /// Remove what is left of a finished run on the broker: its consumers and any message
    /// still on its subjects (duplicates of work already done).
    pub fn remove_run(&self, run: RunId) -> Result<(), String> {
        let c = self.inner.config.clone();
        for lane in Lane::ALL {
            let js = self.inner.js.clone();
            let (stream, name, subject) =
                (c.stream(lane), c.consumer(lane, run), c.subject(lane, run));
            self.retrying("removing the run's consumers", || {
                let (js, stream, name, subject) =
                    (js.clone(), stream.clone(), name.clone(), subject.clone());
                async move {
                    let stream = js.get_stream(stream).await.map_err(|e| e.to_string())?;
                    let _ = stream.delete_consumer(&name).await;
                    stream
                        .purge()
                        .filter(subject)
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            })?;
        }
        Ok(())
    }

    /// A queue of the run on `lane`, for pushing and (with `consume`) popping.
    pub fn queue<T: Wire + 'static>(
        &self,
        lane: Lane,
        run: RunId,
        consume: Option<usize>,
    ) -> JetStreamQueue<T> {
        let inbox = consume.map(|prefetch| Inbox::start(self, lane, run, prefetch));
        JetStreamQueue {
            broker: self.clone(),
            lane,
            prefix: self.inner.config.prefix.clone(),
            inbox,
            _item: PhantomData,
        }
    }

    /// Messages a consumer of the run still has to deliver or see acknowledged (an estimate).
    pub fn backlog(&self, lane: Lane, run: RunId) -> Option<u64> {
        let c = &self.inner.config;
        let (stream, name) = (c.stream(lane), c.consumer(lane, run));
        let js = self.inner.js.clone();
        self.block_on(async move {
            let stream = js.get_stream(stream).await.ok()?;
            let mut consumer: consumer::PullConsumer = stream.get_consumer(&name).await.ok()?;
            let info = consumer.info().await.ok()?;
            Some(info.num_pending + info.num_ack_pending as u64)
        })
    }

    /// The messages that reached MaxDeliver on the run's consumers, as they happen:
    /// (lane, the message's payload). The server stops delivering such a message; the caller
    /// decides what becomes of its document. The message is removed from its stream.
    pub fn dead_letters(&self, run: RunId) -> Result<Receiver<(Lane, Bytes)>, String> {
        let c = self.inner.config.clone();
        let (tx, rx) = bounded(1024);
        let client = self.inner.client.clone();
        let js = self.inner.js.clone();
        let subject = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>".to_string();
        let mut sub = self
            .block_on(client.subscribe(subject))
            .map_err(|e| format!("NATS: watching for dead letters: {e}"))?;
        let names: HashMap<(String, String), Lane> = Lane::ALL
            .iter()
            .map(|&l| ((c.stream(l), c.consumer(l, run)), l))
            .collect();
        self.inner.rt.spawn(async move {
            #[derive(Deserialize)]
            struct Advisory {
                stream: String,
                consumer: String,
                stream_seq: u64,
            }
            while let Some(msg) = sub.next().await {
                let Ok(a) = serde_json::from_slice::<Advisory>(&msg.payload) else {
                    continue;
                };
                let Some(&lane) = names.get(&(a.stream.clone(), a.consumer.clone())) else {
                    continue;
                };
                let Ok(stream) = js.get_stream(&a.stream).await else {
                    continue;
                };
                if let Ok(m) = stream.get_raw_message(a.stream_seq).await {
                    let _ = stream.delete_message(a.stream_seq).await;
                    if tx.send((lane, m.payload)).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }

    /// Wait until everything pushed so far is stored (or `wait` passes).
    pub fn flush(&self, wait: Duration) -> bool {
        let (tx, rx) = bounded::<()>(1);
        let out = self.inner.outgoing.clone();
        let sent = self.block_on(async move { out.send(Outgoing::Flush(tx)).await.is_ok() });
        let done = sent && rx.recv_timeout(wait).is_ok();
        let client = self.inner.client.clone();
        let _ = self.block_on(async move { tokio::time::timeout(wait, client.flush()).await });
        done
    }

    /// Set `flag` on SIGTERM or SIGINT (the process finishes what it holds and exits).
    pub fn stop_on_signals(&self, flag: Arc<AtomicBool>) {
        use tokio::signal::unix::{signal, SignalKind};
        self.inner.rt.spawn(async move {
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            eprintln!("stopping: finishing what this process holds");
            flag.store(true, Ordering::Relaxed);
        });
    }

    fn send(&self, out: Outgoing, timeout: Duration) -> Result<(), Outgoing> {
        let tx = self.inner.outgoing.clone();
        self.block_on(async move {
            match tokio::time::timeout(timeout, tx.reserve()).await {
                Ok(Ok(permit)) => {
                    permit.send(out);
                    Ok(())
                }
                _ => Err(out),
            }
        })
    }
}

/// The output task: publishes in order, pipelined, each retried until stored; an
/// acknowledgement goes out only after every publish queued before it is confirmed.
async fn output(js: jetstream::Context, mut rx: tokio::sync::mpsc::Receiver<Outgoing>) {
    let mut ordered: FuturesOrdered<Ordered> = FuturesOrdered::new();
    let mut open = true;
    loop {
        tokio::select! {
            next = rx.recv(), if open && ordered.len() < PUBLISH_WINDOW => match next {
                Some(Outgoing::Publish { subject, payload }) => {
                    ordered.push_back(Box::pin(publish(js.clone(), subject, payload)));
                }
                Some(Outgoing::Ack(msg, kind)) => {
                    ordered.push_back(Box::pin(async move { Some((*msg, kind)) }));
                }
                Some(Outgoing::Flush(done)) => {
                    ordered.push_back(Box::pin(async move {
                        let _ = done.send(());
                        None
                    }));
                }
                None => open = false,
            },
            Some(done) = ordered.next(), if !ordered.is_empty() => {
                if let Some((msg, kind)) = done {
                    let _ = msg.ack_with(kind).await;
                }
            }
            else => break,
        }
    }
}

/// Publish until the stream has stored the message.
async fn publish(
    js: jetstream::Context,
    subject: String,
    payload: Bytes,
) -> Option<(jetstream::Message, AckKind)> {
    let mut pause = Duration::from_millis(5);
    loop {
        if let Ok(ack) = js.publish(subject.clone(), payload.clone()).await {
            if ack.await.is_ok() {
                return None;
            }
        }
        // Full stream (backpressure), no leader, or no server: wait and send it again. A
        // duplicate (stored, but the ack was lost) is harmless: every stage is idempotent.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Messages of one consumer delivered to this process: pulled ahead of `pop` (their tags wait
/// in `rx`) or popped and not yet acknowledged. All of them get in-progress acks, so what a
/// live process holds stays its own; a dead process's come back after AckWait.
struct Inbox {
    rx: Receiver<u64>,
    held: Arc<Mutex<HashMap<u64, Held>>>,
    stop: Arc<AtomicBool>,
}

struct Held {
    msg: jetstream::Message,
    since: Instant,
}

impl Inbox {
    fn start(broker: &Broker, lane: Lane, run: RunId, prefetch: usize) -> Inbox {
        let (tx, rx) = bounded::<u64>(prefetch.max(1));
        let held: Arc<Mutex<HashMap<u64, Held>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let c = broker.inner.config.clone();
        let js = broker.inner.js.clone();
        let (stream_name, name) = (c.stream(lane), c.consumer(lane, run));
        let (stop2, held1) = (Arc::clone(&stop), Arc::clone(&held));
        let batch = prefetch.max(1);
        let tags = Arc::clone(&broker.inner.tags_arc);
        broker.inner.rt.spawn(async move {
            // Pull; after any error (server restart, consumer not there yet), start again.
            while !stop2.load(Ordering::Relaxed) {
                let consumer: Option<consumer::PullConsumer> = async {
                    let stream = js.get_stream(&stream_name).await.ok()?;
                    stream.get_consumer(&name).await.ok()
                }
                .await;
                let Some(consumer) = consumer else {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                };
                let Ok(mut messages) = consumer
                    .stream()
                    .max_messages_per_batch(batch)
                    .heartbeat(Duration::from_secs(5))
                    .expires(Duration::from_secs(30))
                    .messages()
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                };
                while let Some(next) = messages.next().await {
                    let Ok(msg) = next else { break };
                    let tag = tags.fetch_add(1, Ordering::Relaxed);
                    held1.lock().unwrap_or_else(|e| e.into_inner()).insert(
                        tag,
                        Held {
                            msg,
                            since: Instant::now(),
                        },
                    );
                    loop {
                        match tx.try_send(tag) {
                            Ok(()) => break,
                            Err(crossbeam_channel::TrySendError::Full(_)) => {
                                if stop2.load(Ordering::Relaxed) {
                                    return;
                                }
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            Err(crossbeam_channel::TrySendError::Disconnected(_)) => return,
                        }
                    }
                    if stop2.load(Ordering::Relaxed) {
                        return;
                    }
                }
            }
        });
        // In-progress acknowledgements for what this process holds, every third of AckWait.
        // A process stuck on one item for longer than `max_hold` stops keeping it: the item
        // goes to another process after AckWait, and after MaxDeliver to the dead letters.
        let every = (c.ack_wait / 3).max(Duration::from_millis(100));
        let max_hold = c.max_hold;
        let (held2, stop3) = (Arc::clone(&held), Arc::clone(&stop));
        broker.inner.rt.spawn(async move {
            while !stop3.load(Ordering::Relaxed) {
                tokio::time::sleep(every).await;
                let replies: Vec<jetstream::Message> = {
                    let held = held2.lock().unwrap_or_else(|e| e.into_inner());
                    held.values()
                        .filter(|h| h.since.elapsed() < max_hold)
                        .map(|h| clone_message(&h.msg))
                        .collect()
                };
                for m in replies {
                    let _ = m.ack_with(AckKind::Progress).await;
                }
            }
        });
        Inbox { rx, held, stop }
    }
}

/// A handle to reply to a message with (acks go to its reply subject).
fn clone_message(m: &jetstream::Message) -> jetstream::Message {
    jetstream::Message {
        message: m.message.clone(),
        context: m.context.clone(),
    }
}

/// A queue of one lane of one run on JetStream.
pub struct JetStreamQueue<T> {
    broker: Broker,
    lane: Lane,
    prefix: String,
    inbox: Option<Inbox>,
    _item: PhantomData<fn() -> T>,
}

impl<T> Drop for JetStreamQueue<T> {
    fn drop(&mut self) {
        // What this process pulled but never finished goes back at once, not after AckWait.
        if let Some(inbox) = &self.inbox {
            inbox.stop.store(true, Ordering::Relaxed);
            let held = std::mem::take(&mut *inbox.held.lock().unwrap_or_else(|e| e.into_inner()));
            for h in held.into_values() {
                let _ = self.broker.send(
                    Outgoing::Ack(Box::new(h.msg), AckKind::Nak(None)),
                    Duration::from_secs(1),
                );
            }
        }
    }
}

impl<T> JetStreamQueue<T> {
    fn name_static(&self) -> &'static str {
        self.lane.name()
    }

    /// Send the delivery back for another try after `delay`.
    pub fn nack(&self, tag: DeliveryTag, delay: Option<Duration>) -> Result<(), QueueError> {
        self.reply(tag, AckKind::Nak(delay))
    }

    fn reply(&self, tag: DeliveryTag, kind: AckKind) -> Result<(), QueueError> {
        let Some(inbox) = &self.inbox else {
            return Err(backend(self.name_static(), "this queue does not consume"));
        };
        let held = inbox
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&tag.0);
        let Some(msg) = held.map(|h| h.msg) else {
            return Err(backend(
                self.name_static(),
                format!("no delivery {}", tag.0),
            ));
        };
        self.broker
            .send(Outgoing::Ack(Box::new(msg), kind), Duration::from_secs(60))
            .map_err(|_| QueueError::Closed {
                queue: self.name_static(),
            })
    }
}

impl<T: Wire + 'static> Queue<T> for JetStreamQueue<T> {
    fn name(&self) -> &'static str {
        self.lane.name()
    }

    fn push(&self, item: T, timeout: Duration) -> Result<(), PushError<T>> {
        let subject = format!("{}.{}.{}", self.prefix, self.lane.name(), item.run_id());
        let payload = Bytes::from(item.encode());
        match self
            .broker
            .send(Outgoing::Publish { subject, payload }, timeout)
        {
            Ok(()) => Ok(()),
            Err(_) if self.broker.inner.closed.load(Ordering::Relaxed) => Err(PushError::Closed {
                queue: self.lane.name(),
                item,
            }),
            Err(_) => Err(PushError::Full {
                queue: self.lane.name(),
                item,
            }),
        }
    }

    fn pop(&self, timeout: Duration) -> Result<Option<Delivery<T>>, QueueError> {
        let Some(inbox) = &self.inbox else {
            return Err(backend(self.lane.name(), "this queue does not consume"));
        };
        loop {
            let tag = match inbox.rx.try_recv() {
                Ok(t) => t,
                Err(_) => match inbox.rx.recv_timeout(timeout) {
                    Ok(t) => t,
                    Err(_) => return Ok(None),
                },
            };
            let mut held = inbox.held.lock().unwrap_or_else(|e| e.into_inner());
            let Some(h) = held.get(&tag) else { continue };
            let attempt = h.msg.info().map_or(1, |i| i.delivered.max(1) as u32);
            match T::decode(&h.msg.payload) {
                Ok(mut item) => {
                    if attempt > 1 {
                        item.mark_redelivered();
                    }
                    return Ok(Some(Delivery {
                        item,
                        tag: DeliveryTag(tag),
                        attempt,
                    }));
                }
                Err(e) => {
                    // Not ours, or corrupt: say so and stop its redelivery; it belongs to no
                    // document this process could name.
                    let h = held.remove(&tag).expect("looked up above");
                    drop(held);
                    eprintln!(
                        "warning: queue `{}`: an unreadable message on {} ({e}) was dropped",
                        self.lane.name(),
                        h.msg.subject
                    );
                    let _ = self.broker.send(
                        Outgoing::Ack(Box::new(h.msg), AckKind::Term),
                        Duration::from_secs(5),
                    );
                }
            }
        }
    }

    fn ack(&self, tag: DeliveryTag) -> Result<(), QueueError> {
        self.reply(tag, AckKind::Ack)
    }

    fn nack(&self, tag: DeliveryTag, delay: Duration) -> Result<(), QueueError> {
        JetStreamQueue::nack(self, tag, Some(delay))
    }

    fn len(&self) -> usize {
        self.inbox.as_ref().map_or(0, |i| i.rx.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_url_names_servers_and_settings() {
        let c = BrokerConfig::parse(
            "nats://a:4222,nats://b:4223?prefix=docs_1&replicas=3&ack_wait=7&max_deliver=2&limit=50",
        )
        .unwrap();
        assert_eq!(c.servers, ["nats://a:4222", "nats://b:4223"]);
        assert_eq!(c.prefix, "docs_1");
        assert_eq!(c.replicas, 3);
        assert_eq!(c.ack_wait, Duration::from_secs(7));
        assert_eq!(c.max_deliver, 2);
        assert_eq!(c.limit, 50);
        assert_eq!(c.max_pending, BrokerConfig::default().max_pending);
        let run = RunId(0xab);
        assert_eq!(c.stream(Lane::Embed), "DOCS_1_EMBED");
        assert_eq!(c.subject(Lane::Work, run), "docs_1.work.00000000000000ab");
        assert_eq!(c.consumer(Lane::Index, run), "index-00000000000000ab");
    }

    #[test]
    fn a_bad_queue_url_says_what_is_wrong() {
        for (url, says) in [
            ("http://a:4222", "not a nats:// address"),
            ("", "names no server"),
            ("nats://a:4222?replicas=0", "must be a positive"),
            ("nats://a:4222?ack_wait=soon", "must be a positive"),
            ("nats://a:4222?prefix=a.b", "letters, digits"),
            ("nats://a:4222?colour=red", "unknown setting `colour`"),
        ] {
            let err = BrokerConfig::parse(url).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
    }
}
