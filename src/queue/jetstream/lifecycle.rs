//! The lifecycle's per-stage work on JetStream (`ragline enrich --queue`).
//!
//! Layout, under the URL's prefix: a stream `<PREFIX>_LIFECYCLE` (work-queue retention, file
//! storage) with a subject per stage and priority level,
//! `<prefix>.lifecycle.<stage>.<interactive|fresh|backfill>`, and one durable pull consumer per
//! subject (`lifecycle-<stage>-<level>`) shared by every enrich process. A message is one
//! document's work ([`WorkItem`] as JSON), published once per claim with a message id, so a
//! publish retried after a lost acknowledgement is stored once.
//!
//! The consumer of a stage takes the stage's settings: `AckWait` is its visibility timeout
//! (kept alive with in-progress acknowledgements while a long batch runs), `MaxDeliver` its
//! retry limit. A failed attempt is negatively acknowledged with the stage's backoff as the
//! delay; its last one is terminated and dead-lettered in the store. A message the server
//! gives up on without an answer (its worker was killed every time) is announced in a
//! MaxDeliver advisory, which [`LifecycleQueue::dead_letters`] turns into a dead letter.
//!
//! Workers take the levels in order: a fetch asks `interactive` first, then `fresh`, then
//! `backfill`, so higher work always goes first (within a level, the stream's order: FIFO).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, message::PublishMessage, stream, AckKind};
use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::{Broker, BrokerError};
use crate::lifecycle::{Priority, WorkItem, WorkKey};

/// The levels, in the order workers take them.
pub const LEVELS: [Priority; 3] = [Priority::Interactive, Priority::Fresh, Priority::Backfill];

/// A stage whose work goes through the broker, with its consumers' settings.
#[derive(Clone, Debug, PartialEq)]
pub struct StageQueue {
    pub stage: String,
    /// The consumers' `AckWait`: the stage's visibility timeout.
    pub ack_wait: Duration,
    /// The consumers' `MaxDeliver`: the stage's retry limit.
    pub max_deliver: u32,
}

/// One document's work as a message.
#[derive(Serialize, Deserialize)]
struct Message {
    document_id: String,
    stage: String,
    vector_set: i64,
    priority: Priority,
    input_version: String,
    claim_seq: i64,
    cost: u64,
}

impl Message {
    fn of(item: &WorkItem) -> Message {
        Message {
            document_id: item.key.document_id.clone(),
            stage: item.key.stage.clone(),
            vector_set: item.key.vector_set,
            priority: item.priority,
            input_version: item.input_version.clone(),
            claim_seq: item.claim_seq,
            cost: item.cost,
        }
    }

    /// The work, as the `attempt`-th delivery of it.
    fn item(self, attempt: u32) -> WorkItem {
        WorkItem {
            key: WorkKey {
                document_id: self.document_id,
                stage: self.stage,
                vector_set: self.vector_set,
            },
            attempts: attempt,
            priority: self.priority,
            input_version: self.input_version,
            claim_seq: self.claim_seq,
            cost: self.cost,
        }
    }
}

/// A delivered piece of work. `item.attempts` is the delivery's number (from 1).
pub struct LifecycleDelivery {
    pub item: WorkItem,
    /// The stage's `MaxDeliver`: this is the last delivery when `item.attempts` reaches it.
    pub max_deliver: u32,
    message: jetstream::Message,
}

impl LifecycleDelivery {
    pub fn is_last(&self) -> bool {
        self.item.attempts >= self.max_deliver
    }
}

/// What becomes of a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Handled (done, or nothing left to do).
    Ack,
    /// Deliver it again after this long (a failed attempt's backoff; zero: at once).
    Retry(Duration),
    /// Never deliver it again (dead-lettered in the store).
    Term,
}

/// The lifecycle's work queues on a broker, for the stages of one enrich process.
pub struct LifecycleQueue {
    broker: Broker,
    stages: Vec<StageQueue>,
    /// (stage index, level, consumer), levels from the highest.
    consumers: Vec<(usize, Priority, consumer::PullConsumer)>,
    /// The stage a fetch asks first within a level (so no stage starves another).
    turn: AtomicUsize,
}

impl LifecycleQueue {
    pub fn stream_name(broker: &Broker) -> String {
        format!("{}_LIFECYCLE", broker.config().prefix.to_uppercase())
    }

    pub fn subject(broker: &Broker, stage: &str, level: Priority) -> String {
        format!(
            "{}.lifecycle.{stage}.{}",
            broker.config().prefix,
            level.as_str()
        )
    }

    pub fn consumer_name(stage: &str, level: Priority) -> String {
        format!("lifecycle-{stage}-{}", level.as_str())
    }

    /// Make sure the stream and the stages' consumers exist, with the stages' settings (a
    /// consumer made with other settings is updated).
    pub fn open(broker: &Broker, stages: Vec<StageQueue>) -> Result<LifecycleQueue, BrokerError> {
        let c = broker.config().clone();
        let config = stream::Config {
            name: Self::stream_name(broker),
            subjects: vec![format!("{}.lifecycle.>", c.prefix)],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::New,
            max_messages: c.limit,
            max_bytes: c.limit_mb.saturating_mul(1 << 20),
            num_replicas: c.replicas,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        let js = broker.inner.js.clone();
        let stream = broker.retrying(&format!("creating stream {}", config.name), || {
            let (js, config) = (js.clone(), config.clone());
            async move { js.get_or_create_stream(config).await }
        })?;
        let mut consumers = Vec::new();
        for level in LEVELS {
            for (i, s) in stages.iter().enumerate() {
                let name = Self::consumer_name(&s.stage, level);
                let config = consumer::pull::Config {
                    durable_name: Some(name.clone()),
                    filter_subject: Self::subject(broker, &s.stage, level),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: s.ack_wait,
                    max_deliver: i64::from(s.max_deliver.max(1)),
                    max_ack_pending: c.max_pending,
                    num_replicas: c.replicas,
                    ..Default::default()
                };
                // Create, or update one made with other settings.
                let consumer = broker.retrying(&format!("creating consumer {name}"), || {
                    let (stream, config) = (stream.clone(), config.clone());
                    async move { stream.create_consumer(config).await }
                })?;
                consumers.push((i, level, consumer));
            }
        }
        Ok(LifecycleQueue {
            broker: broker.clone(),
            stages,
            consumers,
            turn: AtomicUsize::new(0),
        })
    }

    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Publish the claimed work, each item on its stage's subject for its level; returns when
    /// the stream has stored every one (a publish that fails is retried for up to a minute).
    pub fn publish(&self, items: &[WorkItem]) -> Result<(), BrokerError> {
        let js = self.broker.inner.js.clone();
        let messages: Vec<(String, String, Bytes)> = items
            .iter()
            .map(|item| {
                let subject = Self::subject(&self.broker, &item.key.stage, item.priority);
                let id = format!(
                    "{}|{}|{}|{}",
                    item.key.document_id, item.key.stage, item.key.vector_set, item.claim_seq
                );
                let payload = Bytes::from(serde_json::to_vec(&Message::of(item)).expect("encodes"));
                (subject, id, payload)
            })
            .collect();
        self.broker.retrying("publishing lifecycle work", || {
            let (js, messages) = (js.clone(), messages.clone());
            async move {
                let mut acks = Vec::with_capacity(messages.len());
                for (subject, id, payload) in messages {
                    let publish = PublishMessage::build().payload(payload).message_id(id);
                    let ack = js
                        .send_publish(subject, publish)
                        .await
                        .map_err(|e| e.to_string())?;
                    acks.push(ack);
                }
                for ack in acks {
                    ack.await.map_err(|e| e.to_string())?;
                }
                Ok::<(), String>(())
            }
        })
    }

    /// Take up to `size(stage)` pieces of work of one stage and level without waiting: the
    /// highest level that has any, the stages of a level in turn. Empty when there is none.
    pub fn fetch(
        &self,
        mut size: impl FnMut(&str) -> usize,
    ) -> Result<Vec<LifecycleDelivery>, BrokerError> {
        let n = self.stages.len().max(1);
        let first = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        for level in LEVELS {
            for k in 0..n {
                let i = (first + k) % n;
                let Some((_, _, consumer)) = self
                    .consumers
                    .iter()
                    .find(|(s, l, _)| *s == i && *l == level)
                else {
                    continue;
                };
                let stage = &self.stages[i];
                let max = size(&stage.stage).max(1);
                let consumer = consumer.clone();
                let got: Result<Vec<jetstream::Message>, BrokerError> =
                    self.broker.block_on(async move {
                        let mut messages = consumer
                            .fetch()
                            .max_messages(max)
                            .messages()
                            .await
                            .map_err(|e| BrokerError::api("fetching lifecycle work", e))?;
                        let mut out = Vec::new();
                        while let Some(m) = messages.next().await {
                            match m {
                                Ok(m) => out.push(m),
                                Err(e) if out.is_empty() => {
                                    return Err(BrokerError::api("fetching lifecycle work", e))
                                }
                                Err(_) => break,
                            }
                        }
                        Ok(out)
                    });
                let mut out = Vec::new();
                for m in got? {
                    let attempt = m.info().map_or(1, |i| i.delivered.max(1) as u32);
                    match serde_json::from_slice::<Message>(&m.payload) {
                        Ok(msg) => out.push(LifecycleDelivery {
                            item: msg.item(attempt),
                            max_deliver: stage.max_deliver,
                            message: m,
                        }),
                        Err(e) => {
                            // Not ours (a foreign publisher): say so and never see it again.
                            tracing::warn!(
                                "a message on {} is not lifecycle work ({e}): dropped",
                                m.subject
                            );
                            let _ = self.broker.block_on(m.ack_with(AckKind::Term));
                        }
                    }
                }
                if !out.is_empty() {
                    return Ok(out);
                }
            }
        }
        Ok(Vec::new())
    }

    /// Answer deliveries, all at once. An answer that does not reach the server is harmless:
    /// the work is delivered again and found done.
    pub fn settle(&self, answers: &[(&LifecycleDelivery, Verdict)]) {
        let kinds: Vec<(jetstream::Message, AckKind)> = answers
            .iter()
            .map(|(d, v)| {
                let kind = match v {
                    Verdict::Ack => AckKind::Ack,
                    Verdict::Retry(delay) if delay.is_zero() => AckKind::Nak(None),
                    Verdict::Retry(delay) => AckKind::Nak(Some(*delay)),
                    Verdict::Term => AckKind::Term,
                };
                (super::clone_message(&d.message), kind)
            })
            .collect();
        self.broker.block_on(async move {
            let sends = kinds.iter().map(|(m, k)| m.ack_with(*k));
            for r in futures::future::join_all(sends).await {
                if let Err(e) = r {
                    tracing::warn!("NATS: answering lifecycle work: {e}");
                }
            }
        });
    }

    /// Tell the server the work is still being done (resets its `AckWait`).
    pub fn in_progress(&self, deliveries: &[&LifecycleDelivery]) {
        let messages: Vec<jetstream::Message> = deliveries
            .iter()
            .map(|d| super::clone_message(&d.message))
            .collect();
        self.broker.block_on(async move {
            let sends = messages.iter().map(|m| m.ack_with(AckKind::Progress));
            let _ = futures::future::join_all(sends).await;
        });
    }

    /// Consumer numbers summed over the stages' consumers: (messages not delivered yet,
    /// messages delivered and not answered, or waiting for a retry).
    pub fn depth(&self) -> Result<(u64, u64), BrokerError> {
        let consumers: Vec<consumer::PullConsumer> =
            self.consumers.iter().map(|(_, _, c)| c.clone()).collect();
        self.broker.block_on(async move {
            let (mut waiting, mut held) = (0u64, 0u64);
            for mut c in consumers {
                let info = c
                    .info()
                    .await
                    .map_err(|e| BrokerError::api("reading the lifecycle consumers", e))?;
                waiting += info.num_pending;
                held += info.num_ack_pending as u64;
            }
            Ok((waiting, held))
        })
    }

    /// Messages the stream holds (work not answered yet, and work the server gave up on
    /// whose advisory is still being handled).
    pub fn stored(&self) -> Result<u64, BrokerError> {
        let js = self.broker.inner.js.clone();
        let name = Self::stream_name(&self.broker);
        self.broker.block_on(async move {
            let mut stream = js
                .get_stream(&name)
                .await
                .map_err(|e| BrokerError::api(format!("reading stream {name}"), e))?;
            let info = stream
                .info()
                .await
                .map_err(|e| BrokerError::api(format!("reading stream {name}"), e))?;
            Ok(info.state.messages)
        })
    }

    /// The work the server gave up on after `MaxDeliver` deliveries, as it happens: (the work,
    /// the deliveries made). One enrich process of the queue receives each (a queue group);
    /// the message is removed from the stream.
    pub fn dead_letters(&self) -> Result<Receiver<(WorkItem, u32)>, BrokerError> {
        let stream_name = Self::stream_name(&self.broker);
        let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream_name}.*");
        let group = format!("{}-lifecycle-dead-letters", self.broker.config().prefix);
        let client = self.broker.inner.client.clone();
        let js = self.broker.inner.js.clone();
        let mut sub = self
            .broker
            .block_on(client.queue_subscribe(subject, group))
            .map_err(|e| BrokerError::api("watching for dead letters", e))?;
        let ours: Vec<String> = self
            .consumers
            .iter()
            .map(|(i, l, _)| Self::consumer_name(&self.stages[*i].stage, *l))
            .collect();
        let (tx, rx) = bounded(1024);
        self.broker.inner.rt.spawn(async move {
            #[derive(Deserialize)]
            struct Advisory {
                stream: String,
                consumer: String,
                stream_seq: u64,
                deliveries: u64,
            }
            while let Some(msg) = sub.next().await {
                let Ok(a) = serde_json::from_slice::<Advisory>(&msg.payload) else {
                    continue;
                };
                if a.stream != stream_name || !ours.contains(&a.consumer) {
                    continue;
                }
                let Ok(stream) = js.get_stream(&a.stream).await else {
                    continue;
                };
                let Ok(m) = stream.get_raw_message(a.stream_seq).await else {
                    continue; // answered meanwhile
                };
                let _ = stream.delete_message(a.stream_seq).await;
                let Ok(work) = serde_json::from_slice::<Message>(&m.payload) else {
                    continue;
                };
                let deliveries = a.deliveries.max(1) as u32;
                if tx.send((work.item(deliveries), deliveries)).is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }
}
