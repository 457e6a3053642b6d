//! The consumer side: messages pulled and held (in-progress acknowledgements keep their
//! leases), batches handed out item by item, and `JetStreamQueue`, the `Queue` over a stream.

use super::*;

/// Messages of one consumer delivered to this process: their items pulled ahead of `pop`
/// (their tags wait in `rx`) or popped and not yet acknowledged. All of them get in-progress
/// acks, so what a live process holds stays its own; a dead process's come back after
/// AckWait. A message is acknowledged when every item of it is.
pub(super) struct Inbox {
    pub(super) rx: Receiver<u64>,
    pub(super) held: Arc<Mutex<HashMap<u64, Held>>>,
    pub(super) stop: Arc<AtomicBool>,
}

/// One item of a delivered message.
pub(super) struct Held {
    pub(super) message: Arc<HeldMessage>,
    pub(super) payload: Bytes,
    /// Delivered before (the message, or the batch it was split from).
    pub(super) redelivered: bool,
}

/// A delivered message and what its items came to so far.
pub(super) struct HeldMessage {
    pub(super) msg: jetstream::Message,
    pub(super) since: Instant,
    /// Items not acknowledged (or given back) yet.
    pub(super) left: AtomicU64,
    /// An item was given back: the whole message goes back (after the longest delay asked).
    pub(super) nak: Mutex<Option<Option<Duration>>>,
}

impl HeldMessage {
    /// One item is done with (`nak`: given back after a delay); when it is the last, what
    /// to reply to the message.
    pub(super) fn settle(&self, nak: Option<Option<Duration>>) -> Option<AckKind> {
        if let Some(delay) = nak {
            let mut n = self.nak.lock().unwrap_or_else(|e| e.into_inner());
            *n = Some(match (*n, delay) {
                (Some(Some(a)), Some(b)) => Some(a.max(b)),
                (Some(a), None) => a,
                (_, b) => b,
            });
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return None;
        }
        Some(match *self.nak.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(delay) => AckKind::Nak(delay),
            None => AckKind::Ack,
        })
    }
}

impl Inbox {
    pub(super) fn start(broker: &Broker, lane: Lane, run: RunId, prefetch: usize) -> Inbox {
        let prefetch = prefetch.max(1);
        // Unbounded: what waits here is bounded by `held` (the pull asks only for the room
        // left), and the pull must never block on it. A batch read slowly is ended by the
        // client (its expiry plus a margin) with messages still in its buffer, which then
        // come back only after AckWait.
        let (tx, rx) = crossbeam_channel::unbounded::<u64>();
        let held: Arc<Mutex<HashMap<u64, Held>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let c = broker.inner.config.clone();
        let js = broker.inner.js.clone();
        let out = broker.inner.outgoing.clone();
        let (stream_name, name) = (c.stream(lane), c.consumer(lane, run));
        let (stop2, held1) = (Arc::clone(&stop), Arc::clone(&held));
        let mut pull = Pull {
            run,
            lane,
            events_subject: c.subject(Lane::Events, run),
            held: Arc::clone(&held),
            tags: Arc::clone(&broker.inner.tags_arc),
            tx,
            out: out.clone(),
            per_message: 32.0,
        };
        broker.inner.rt.spawn(async move {
            // Pull; after any error (server restart, consumer not there yet), start again.
            'outer: while !stop2.load(Ordering::Relaxed) {
                let consumer: Option<consumer::PullConsumer> = async {
                    let stream = js.get_stream(&stream_name).await.ok()?;
                    stream.get_consumer(&name).await.ok()
                }
                .await;
                let Some(consumer) = consumer else {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                };
                while !stop2.load(Ordering::Relaxed) {
                    let holding = held1.lock().unwrap_or_else(|e| e.into_inner()).len();
                    let room = prefetch.saturating_sub(holding);
                    if room == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let want =
                        ((room as f64 / pull.per_message).floor() as usize).clamp(1, prefetch);
                    let Ok(mut messages) = consumer
                        .batch()
                        .max_messages(want)
                        .expires(Duration::from_secs(1))
                        .messages()
                        .await
                    else {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue 'outer;
                    };
                    // Replies and republishes wait until the batch is read: reading it must
                    // never wait on the output task (see `tx`).
                    let mut later: Vec<Outgoing> = Vec::new();
                    let mut broken = false;
                    while let Some(next) = messages.next().await {
                        let Ok(msg) = next else {
                            broken = true;
                            break;
                        };
                        if !pull.take(msg, &mut later) {
                            return;
                        }
                    }
                    for o in later {
                        let _ = out.send(o).await;
                    }
                    if broken {
                        continue 'outer;
                    }
                }
            }
        });
        keep_alive(broker, &c, Arc::clone(&held), Arc::clone(&stop));
        Inbox { rx, held, stop }
    }
}

/// In-progress acknowledgements for what this process holds, every third of AckWait. A
/// process stuck on one message for longer than `max_hold` stops keeping it: it goes to
/// another process after AckWait, and after MaxDeliver to the dead letters.
pub(super) fn keep_alive(
    broker: &Broker,
    c: &BrokerConfig,
    held: Arc<Mutex<HashMap<u64, Held>>>,
    stop: Arc<AtomicBool>,
) {
    let every = (c.ack_wait / 3).max(Duration::from_millis(100));
    let max_hold = c.max_hold;
    broker.inner.rt.spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(every).await;
            let replies: Vec<jetstream::Message> = {
                let held = held.lock().unwrap_or_else(|e| e.into_inner());
                let mut seen = std::collections::HashSet::new();
                held.values()
                    .filter(|h| h.message.since.elapsed() < max_hold)
                    .filter(|h| seen.insert(Arc::as_ptr(&h.message)))
                    .map(|h| clone_message(&h.message.msg))
                    .collect()
            };
            for m in replies {
                let _ = m.ack_with(AckKind::Progress).await;
            }
        }
    });
}

/// What an inbox's pull does with the messages it gets.
pub(super) struct Pull {
    pub(super) run: RunId,
    pub(super) lane: Lane,
    pub(super) events_subject: String,
    pub(super) held: Arc<Mutex<HashMap<u64, Held>>>,
    pub(super) tags: Arc<AtomicU64>,
    pub(super) tx: crossbeam_channel::Sender<u64>,
    /// The output task's queue.
    pub(super) out: tokio::sync::mpsc::Sender<Outgoing>,
    /// Items per message seen so far (a running average): how many messages to ask for so
    /// that about the prefetch's items are held, never far more (the others' share). It
    /// starts as if messages were well filled, so that a process's first pull does not take
    /// far more than its share.
    pub(super) per_message: f64,
}

impl Pull {
    /// Hand `o` to the output task now when it has room and nothing queued after the batch
    /// would then go out of order; else after the batch.
    pub(super) fn send_now(&self, o: Outgoing, later: &mut Vec<Outgoing>) {
        if !later.is_empty() {
            later.push(o);
            return;
        }
        if let Err(e) = self.out.try_send(o) {
            later.push(e.into_inner());
        }
    }

    /// One pulled message: dead-lettered when unreadable (the run's publisher hears why,
    /// and it is never delivered again), split into single items when a batch comes again,
    /// else its items held and handed to the receiver by tag. Replies and republishes go to
    /// `later` (reading a batch must never wait on the output task). False when the
    /// receiver is gone.
    pub(super) fn take(&mut self, msg: jetstream::Message, later: &mut Vec<Outgoing>) -> bool {
        let delivered = msg.info().map_or(1, |i| i.delivered.max(1));
        let (items, flags) = match split_message(&msg.payload) {
            Ok(x) => x,
            Err(e) => {
                let seq = msg.info().map_or(0, |i| i.stream_sequence);
                let at = format!("message {}#{seq}", msg.subject);
                tracing::warn!("{at}: unreadable ({e}); dead-lettered");
                let event = unreadable(self.run, self.lane, at, &e, &msg.payload);
                // Reported at once (the run must hear of it before it can end), unless the
                // output queue is full.
                self.send_now(
                    Outgoing::PublishAlone {
                        subject: self.events_subject.clone(),
                        payload: Bytes::from(event.encode()),
                    },
                    later,
                );
                self.send_now(Outgoing::Ack(Box::new(msg), AckKind::Term), later);
                return true;
            }
        };
        self.per_message = 0.7 * self.per_message + 0.3 * items.len().max(1) as f64;
        if items.len() > 1 && delivered > 1 {
            // A batch delivered again: one of its items may be what its consumers die on.
            // Each item goes on alone, then the batch is acknowledged (after them: the
            // output task keeps the order).
            let subject = msg.subject.to_string();
            for item in items {
                later.push(Outgoing::PublishAlone {
                    subject: subject.clone(),
                    payload: encode_batch(&[item], FLAG_REDELIVERED),
                });
            }
            later.push(Outgoing::Ack(Box::new(msg), AckKind::Ack));
            return true;
        }
        let redelivered = delivered > 1 || flags & FLAG_REDELIVERED != 0;
        let message = Arc::new(HeldMessage {
            msg,
            since: Instant::now(),
            left: AtomicU64::new(items.len() as u64),
            nak: Mutex::new(None),
        });
        if items.is_empty() {
            let m = clone_message(&message.msg);
            later.push(Outgoing::Ack(Box::new(m), AckKind::Ack));
            return true;
        }
        for payload in items {
            let tag = self.tags.fetch_add(1, Ordering::Relaxed);
            self.held.lock().unwrap_or_else(|e| e.into_inner()).insert(
                tag,
                Held {
                    message: Arc::clone(&message),
                    payload,
                    redelivered,
                },
            );
            if self.tx.send(tag).is_err() {
                return false;
            }
        }
        true
    }
}

/// A handle to reply to a message with (acks go to its reply subject).
pub(super) fn clone_message(m: &jetstream::Message) -> jetstream::Message {
    jetstream::Message {
        message: m.message.clone(),
        context: m.context.clone(),
    }
}

/// A queue of one lane of one run on JetStream.
pub struct JetStreamQueue<T> {
    pub(super) broker: Broker,
    pub(super) lane: Lane,
    pub(super) run: RunId,
    pub(super) prefix: String,
    pub(super) inbox: Option<Inbox>,
    /// Acknowledgements bypass the output task (see [`Broker::follower`]).
    pub(super) direct_acks: bool,
    pub(super) _item: PhantomData<fn() -> T>,
}

impl<T> Drop for JetStreamQueue<T> {
    fn drop(&mut self) {
        // What this process pulled but never finished goes back at once, not after AckWait.
        if let Some(inbox) = &self.inbox {
            inbox.stop.store(true, Ordering::Relaxed);
            let held = std::mem::take(&mut *inbox.held.lock().unwrap_or_else(|e| e.into_inner()));
            let mut seen = std::collections::HashSet::new();
            for h in held.into_values() {
                if seen.insert(Arc::as_ptr(&h.message)) {
                    let _ = self.broker.send(
                        Outgoing::Ack(Box::new(clone_message(&h.message.msg)), AckKind::Nak(None)),
                        Duration::from_secs(1),
                    );
                }
            }
        }
    }
}

impl<T> JetStreamQueue<T> {
    pub(super) fn name_static(&self) -> &'static str {
        self.lane.name()
    }

    /// Send the delivery back for another try after `delay`.
    pub fn nack(&self, tag: DeliveryTag, delay: Option<Duration>) -> Result<(), QueueError> {
        self.reply(tag, AckKind::Nak(delay))
    }

    pub(super) fn reply(&self, tag: DeliveryTag, kind: AckKind) -> Result<(), QueueError> {
        let Some(inbox) = &self.inbox else {
            return Err(backend(self.name_static(), "this queue does not consume"));
        };
        let held = inbox
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&tag.0);
        let Some(h) = held else {
            return Err(backend(
                self.name_static(),
                format!("no delivery {}", tag.0),
            ));
        };
        // The message is answered when its last item is.
        let nak = match kind {
            AckKind::Nak(delay) => Some(delay),
            _ => None,
        };
        let Some(reply) = h.message.settle(nak) else {
            return Ok(());
        };
        let msg = clone_message(&h.message.msg);
        if self.direct_acks {
            self.broker.inner.rt.spawn(async move {
                let _ = msg.ack_with(reply).await;
            });
            return Ok(());
        }
        self.broker
            .send(Outgoing::Ack(Box::new(msg), reply), Duration::from_secs(60))
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

    fn max_item_bytes(&self) -> Option<usize> {
        // The server refuses a larger message every time; leave room for the envelope.
        let max = self.broker.inner.client.server_info().max_payload;
        (max > 0).then(|| max.saturating_sub(ENVELOPE_ROOM))
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
            let held = inbox.held.lock().unwrap_or_else(|e| e.into_inner());
            let Some(h) = held.get(&tag) else { continue };
            let delivered = h
                .message
                .msg
                .info()
                .map_or(1, |i| i.delivered.max(1) as u32);
            let attempt = delivered + u32::from(h.redelivered && delivered == 1);
            let decoded = T::decode(&h.payload);
            let subject = h.message.msg.subject.to_string();
            let seq = h.message.msg.info().map_or(0, |i| i.stream_sequence);
            let payload = h.payload.clone();
            drop(held);
            match decoded {
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
                    // Not ours, or corrupt: it belongs to no document this process could
                    // name. Dead-lettered: the run's publisher hears why (after this publish,
                    // the item is let go as done).
                    let at = format!("message {subject}#{seq}");
                    tracing::warn!("{at}: unreadable item ({e}); dead-lettered");
                    let event = unreadable(self.run, self.lane, at, &e, &payload);
                    let _ = self.broker.send(
                        Outgoing::PublishAlone {
                            subject: self.broker.inner.config.subject(Lane::Events, self.run),
                            payload: Bytes::from(event.encode()),
                        },
                        Duration::from_secs(60),
                    );
                    let _ = self.reply(DeliveryTag(tag), AckKind::Ack);
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
